"""Visits: when the robot was within a radius of a point, from its pose history.

The pose history is every stored row with a pose (odometry keyframes, camera and lidar
keyframes, kept or archived by compaction), in time order. A visit is a run of samples inside
the circle; its start and end are where the straight line between the last sample outside and
the first inside (and back) crosses the circle, as long as those samples are no further apart
than the gap threshold. Samples further apart than that are a gap in the pose history: a visit
never spans one, and the answer says where the gaps are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from memory_node.core.store.pose_index import PoseExcerpt


@dataclass(frozen=True)
class VisitSpan:
    start: float
    end: float

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


def _crossing(t0: float, p0: np.ndarray, t1: float, p1: np.ndarray, centre: np.ndarray,
              radius: float) -> float:
    """The time the segment p0 -> p1 crosses the circle (exactly one end inside)."""
    d = p1 - p0
    f = p0 - centre
    a = float(d @ d)
    if a < 1e-12:
        return (t0 + t1) / 2
    b = 2 * float(f @ d)
    c = float(f @ f) - radius * radius
    disc = b * b - 4 * a * c
    if disc < 0:
        return (t0 + t1) / 2
    sq = math.sqrt(disc)
    roots = [r for r in ((-b - sq) / (2 * a), (-b + sq) / (2 * a)) if 0.0 <= r <= 1.0]
    if not roots:
        return (t0 + t1) / 2
    inside0 = c <= 0
    s = max(roots) if inside0 else min(roots)
    return t0 + s * (t1 - t0)


def find_visits(track: np.ndarray, centre: tuple[float, float], radius: float, gap_s: float,
                t_min: float | None = None, t_max: float | None = None,
                now: float | None = None
                ) -> tuple[list[VisitSpan], list[tuple[float, float]]]:
    """(visits, gaps) of a pose track: an (n, 3) array of (t, x, y) sorted by t.

    Visits are clipped to [t_min, t_max]; gaps are the stretches longer than `gap_s` without a
    pose inside the window (including before the first and after the last sample). `now`: the
    track is the whole history up to now, and a robot whose newest pose is inside the circle
    and no older than `gap_s` is still there (a standing robot keeps a keyframe only every
    `max_interval`), so that visit lasts until now."""
    visits: list[VisitSpan] = []
    gaps: list[tuple[float, float]] = []
    if len(track) == 0:
        if t_min is not None and t_max is not None:
            gaps.append((t_min, t_max))
        return visits, gaps
    t = track[:, 0]
    pts = track[:, 1:3]
    c = np.asarray(centre, dtype=np.float64)
    inside = np.hypot(pts[:, 0] - c[0], pts[:, 1] - c[1]) <= radius
    start: float | None = None
    end = 0.0  # meaningful while start is set
    # Only a sample inside, or the first outside after one, changes anything (after an outside
    # sample no visit is open): the loop visits those, over Python lists (numpy's scalar
    # indexing costs more than the loop's work).
    tl, ins = t.tolist(), inside.tolist()
    steps = np.nonzero(inside | np.concatenate([[False], inside[:-1]]))[0].tolist()
    for i in steps:
        linked = i > 0 and tl[i] - tl[i - 1] <= gap_s
        if ins[i]:
            if start is not None and linked:
                end = tl[i]
                continue
            if start is not None:  # a gap inside the circle: the visit ends at its last pose
                visits.append(VisitSpan(start, end))
            start = (_crossing(tl[i - 1], pts[i - 1], tl[i], pts[i], c, radius)
                     if linked and not ins[i - 1] else tl[i])
            end = tl[i]
        elif start is not None:
            end = _crossing(tl[i - 1], pts[i - 1], tl[i], pts[i], c, radius) if linked else end
            visits.append(VisitSpan(start, end))
            start = None
    if start is not None:
        if now is not None and 0 <= now - tl[-1] <= gap_s:
            end = float(now)
        visits.append(VisitSpan(start, end))
    lo = -math.inf if t_min is None else t_min
    hi = math.inf if t_max is None else t_max
    clipped = [VisitSpan(max(v.start, lo), min(v.end, hi)) for v in visits
               if v.end >= lo and v.start <= hi]
    wide = np.nonzero(np.diff(t) > gap_s)[0]
    pairs = [(float(t[i]), float(t[i + 1])) for i in wide]
    return clipped, window_gaps(float(t[0]), float(t[-1]), pairs, gap_s, t_min, t_max)


def window_gaps(first_t: float, last_t: float, pairs: list[tuple[float, float]], gap_s: float,
                t_min: float | None, t_max: float | None) -> list[tuple[float, float]]:
    """The gaps that reach into [t_min, t_max], with their whole length, of a pose history
    whose first and last samples are at `first_t` and `last_t` and whose consecutive samples
    further apart than `gap_s` are `pairs` (more may be given: the rest are dropped)."""
    lo = -math.inf if t_min is None else t_min
    hi = math.inf if t_max is None else t_max
    gaps: list[tuple[float, float]] = []
    if t_min is not None and first_t > t_min and first_t - t_min > gap_s:
        gaps.append((t_min, float(min(first_t, hi))))
    gaps += [(a, b) for a, b in pairs if b - a > gap_s and b > lo and a < hi]
    if t_max is not None and last_t < t_max and t_max - last_t > gap_s:
        gaps.append((float(max(last_t, lo)), t_max))
    return gaps


def find_visits_in(excerpt: PoseExcerpt, centre: tuple[float, float], radius: float,
                   gap_s: float, t_min: float | None = None, t_max: float | None = None,
                   now: float | None = None
                   ) -> tuple[list[VisitSpan], list[tuple[float, float]]]:
    """`find_visits` from the pose-history index's excerpt for this circle: the same visits
    and gaps as from the whole track of the excerpt's window (the samples it leaves out are
    outside the circle, and its gaps are the track's)."""
    if gap_s < excerpt.gap_min_s:
        raise ValueError(f"the excerpt knows gaps longer than {excerpt.gap_min_s:g} s only")
    if excerpt.first_t is None or excerpt.last_t is None:
        return find_visits(excerpt.track[:0], centre, radius, gap_s, t_min, t_max, now)
    visits, _ = find_visits(excerpt.track, centre, radius, gap_s, t_min, t_max, now)
    return visits, window_gaps(excerpt.first_t, excerpt.last_t, excerpt.gaps, gap_s, t_min,
                               t_max)


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def gap_notes(gaps: list[tuple[float, float]], gap_s: float, limit: int = 5) -> list[str]:
    """Lines saying where the pose history is missing."""
    out = []
    for a, b in gaps[:limit]:
        out.append(f"no pose history from {_clock(a)} to {_clock(b)} ({b - a:.0f} s, more "
                   f"than the {gap_s:g} s gap threshold): visits then are not known")
    if len(gaps) > limit:
        out.append(f"... and {len(gaps) - limit} more gaps in the pose history")
    return out
