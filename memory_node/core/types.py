"""Typed values that cross module boundaries inside core and out to the ROS and agent layers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memory_node.wire.geometry import normalize_angle

POSE_SOURCES = ("tf", "odom", "odom_interpolated", "none", "given")


@dataclass(frozen=True)
class Pose:
    """A planar world pose (x, y, z, yaw) in `frame`, with where it came from."""

    x: float
    y: float
    z: float = 0.0
    yaw: float = 0.0
    frame: str = "map"
    source: str = "tf"
    # A pose taken at "now" (a save, near_here): the age of the newest transform it used, and
    # whether that is older than the configured bound. Not stored; not part of equality.
    age_s: float | None = field(default=None, compare=False)
    stale: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "x": round(float(self.x), 4),
            "y": round(float(self.y), 4),
            "z": round(float(self.z), 4),
            "yaw": round(float(self.yaw), 4),
            "frame": self.frame,
            "source": self.source,
        }
        if self.age_s is not None:
            out["age_s"] = round(float(self.age_s), 3)
            if self.stale:
                out["stale"] = True
        return out

    @property
    def heading_deg(self) -> float:
        return math.degrees(self.yaw)

    def distance_to(self, x: float, y: float) -> float:
        return math.hypot(self.x - x, self.y - y)


@dataclass
class Observation:
    """One stored observation: a row of `observations` in memory.db."""

    stream: str
    t: float
    pose: Pose | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    ref: str | None = None
    id: int | None = None
    model_id: str | None = None
    note_key: str | None = None  # identity of a note's Markdown entry
    view: View | None = None  # what a camera frame covered (seen_near); stored apart
    archived: bool = False  # read from the archive (a search with include_archived)


@dataclass(frozen=True)
class RowFilter:
    """What a store filters rows by: the part of a search every store implements the same way.

    Times are absolute seconds; `near` is a centre (x, y) in the world frame with `radius`.
    `robots` and `map_id` are a fleet store's: the rows of these robots (None: all), and the
    map `near` is on (a place means nothing on another map; without `near` it filters
    nothing). A robot's own store holds one robot on one map and leaves both None."""

    streams: tuple[str, ...] | None = None
    near: tuple[float, float] | None = None
    radius: float = 2.0
    t_min: float | None = None
    t_max: float | None = None
    tags: Mapping[str, Any] = field(default_factory=dict)
    # near matches camera frames whose view covers the disc, and rows standing in it.
    seen_near: bool = False
    # rows that compaction moved to the archive pass the filters too.
    include_archived: bool = False
    robots: tuple[str, ...] | None = None
    map_id: str | None = None

    @property
    def has_filters(self) -> bool:
        """True when anything beyond the stream restricts the rows."""
        return bool(self.near is not None or self.t_min is not None or self.t_max is not None
                    or self.tags or self.robots)

    @property
    def empty_window(self) -> bool:
        return self.t_min is not None and self.t_max is not None and self.t_min > self.t_max

    def matches(self, obs: Observation, robot: str | None = None,
                map_id: str | None = None) -> bool:
        """Whether a stored row passes: the reference semantics that every compiler of the
        filter (SQLite, PostgreSQL, the numpy mask) is checked against.

        The row is `obs` as a store holds it (its `view` and `archived` flag included) and,
        for a fleet row, the `robot` that recorded it and the `map_id` its pose or view is
        on. Every field must pass: `streams` and `robots` (empty or None: all); `t_min` <=
        t <= `t_max`; `near`: a pose in the closed disc, `(x-nx)² + (y-ny)² <= r²` in
        float64 (no pose is never near), or with `seen_near` a view whose sector meets the
        disc, and with `map_id` on that map only; `tags`: None is the tag missing or null, a
        {gt, gte, lt, lte} range passes numbers only (not true/false), any other value
        equals the tag or a member of a list tag (true and false equal 1 and 0, as SQLite's
        json_extract reads them); archived rows pass only with `include_archived`."""
        if obs.archived and not self.include_archived:
            return False
        if self.streams and obs.stream not in self.streams:
            return False
        if self.robots and robot not in self.robots:
            return False
        if self.t_min is not None and not obs.t >= self.t_min:
            return False
        if self.t_max is not None and not obs.t <= self.t_max:
            return False
        if self.near is not None and not self._near(obs, map_id, self.near):
            return False
        return all(_tag_passes(obs.tags.get(key), want) for key, want in self.tags.items())

    def _near(self, obs: Observation, map_id: str | None, near: tuple[float, float]) -> bool:
        if self.map_id is not None and map_id != self.map_id:
            return False
        nx, ny = near
        r = self.radius
        p = obs.pose
        # The same float64 expression, in the same order, as the SQL and numpy compilers.
        if p is not None and (p.x - nx) * (p.x - nx) + (p.y - ny) * (p.y - ny) <= r * r:
            return True
        return self.seen_near and obs.view is not None and obs.view.covers(nx, ny, r)


def disc_slack(near: tuple[float, float], radius: float) -> float:
    """How far past the disc a box or circle that pre-selects rows for the exact disc test
    must reach: float64 rounding can put a row a few ulps outside |x - nx| <= r in the disc
    (and a difference below 1.6e-162 squares to 0)."""
    return (abs(near[0]) + abs(near[1]) + radius) * 1e-12 + 1e-150


_RANGE_OPS: dict[str, Any] = {"gt": lambda a, b: a > b, "gte": lambda a, b: a >= b,
                              "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b}
# The same comparisons in SQL, for the store's and the fleet's filter compilers.
RANGE_OPS_SQL = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def _tag_passes(have: Any, want: Any) -> bool:
    """One tag filter against a row's value of that tag (None: missing or null)."""
    if want is None:
        return have is None
    if isinstance(want, Mapping):
        if isinstance(have, bool) or not isinstance(have, (int, float)):
            return False
        return all(_RANGE_OPS[op](have, bound) for op, bound in want.items())
    if isinstance(have, list):
        return any(_tag_equal(h, want) for h in have)
    return _tag_equal(have, want)


def _tag_equal(have: Any, want: Any) -> bool:
    """JSON scalars equal: numbers by value (true is 1, false is 0), strings exactly."""
    if isinstance(have, str) or isinstance(want, str):
        return isinstance(have, str) and isinstance(want, str) and have == want
    if isinstance(have, (int, float)) and isinstance(want, (int, float)):
        return have == want
    return False


@dataclass(frozen=True)
class View:
    """What a camera frame covered on the floor plan: a sector from the camera's position
    (x, y) along its heading `yaw`, `hfov` radians wide, `range` metres deep."""

    x: float
    y: float
    yaw: float
    hfov: float
    range: float

    def covers(self, px: float, py: float, radius: float = 0.0) -> bool:
        """Whether the disc of `radius` around (px, py) meets the sector."""
        return view_covers(self.x, self.y, self.yaw, self.hfov, self.range, px, py, radius)

    def bbox(self) -> tuple[float, float, float, float]:
        """(min_x, max_x, min_y, max_y) of the sector."""
        half = self.hfov / 2
        xs, ys = [self.x], [self.y]
        angles = [self.yaw - half, self.yaw + half]
        for k in range(-4, 5):  # the axis directions the arc passes through
            a = k * math.pi / 2
            if abs(normalize_angle(a - self.yaw)) <= half:
                angles.append(a)
        for a in angles:
            xs.append(self.x + self.range * math.cos(a))
            ys.append(self.y + self.range * math.sin(a))
        return min(xs), max(xs), min(ys), max(ys)

    def to_dict(self) -> dict[str, float]:
        return {"x": round(self.x, 4), "y": round(self.y, 4), "yaw": round(self.yaw, 4),
                "hfov": round(self.hfov, 4), "range": round(self.range, 3)}


def view_covers(x: float, y: float, yaw: float, hfov: float, rng: float, px: float, py: float,
                radius: float) -> bool:
    """Whether the disc (px, py, radius) meets the sector at (x, y) along yaw (pure numbers:
    the SQLite store calls it as a function). Written operation for operation as the fleet's
    `memory_view_covers` (fleet/schema.sql), so both decide alike to the last bit."""
    d = math.sqrt((px - x) * (px - x) + (py - y) * (py - y))
    if d <= radius:
        return True
    if d > rng + radius:
        return False
    half = hfov / 2
    # the bearing's angle to the heading, wrapped to (-pi, pi]
    w = math.atan2(py - y, px - x) - yaw + math.pi
    w = w - 2 * math.pi * float(math.trunc(w / (2 * math.pi)))
    if w <= 0:
        w = w + 2 * math.pi
    if abs(w - math.pi) <= half:
        return True
    for a in (yaw - half, yaw + half):  # the sector's two edges: the disc's distance to each
        dx = rng * math.cos(a)
        dy = rng * math.sin(a)
        l2 = dx * dx + dy * dy
        s = 0.0 if l2 == 0 else max(0.0, min(1.0, ((px - x) * dx + (py - y) * dy) / l2))
        qx = px - (x + s * dx)
        qy = py - (y + s * dy)
        if math.sqrt(qx * qx + qy * qy) <= radius:
            return True
    return False
