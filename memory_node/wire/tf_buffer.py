"""The package's TF buffer: the one TF path, on every machine.

pip has no tf2_ros, and a robot's tf2_ros differs where poses depend on it (no extrapolation
direction, no refusal to interpolate across lost samples, no hold-at-the-edge tolerance), so
the package always uses this buffer, fed from /tf and /tf_static (`ros.common.PoseTracker`),
on a robot as in tests. It mirrors tf2's semantics where they matter:

- edges are stored by child frame; /tf_static edges keep only the latest, /tf edges keep a
  time-sorted history pruned to `cache_time_s` behind that edge's newest sample;
- per child frame the newest kind wins, as in tf2 (`BufferCore::setTransformImpl` replaces a
  frame's cache when `is_static` changes): a driver's /tf odom → base_link replaces
  robot_state_publisher's latched identity for the same frame, and the reverse; each change
  is counted (`kind_changes`) and reported once per frame through `on_kind_change`;
- lookup(target, source, t) walks both frames up to their common ancestor, interpolating each
  dynamic edge at t (linear translation, slerp rotation), and returns T_target_source: the
  pose of `source` in `target`, which maps points in `source` to `target`;
- t == 0 means the latest time every dynamic edge on the path has data for;
- clear() drops the dynamic history but keeps static edges (tf2 does the same: /tf_static is
  latched and would not come again), and on_time() clears when time jumps backwards, as
  when a bag restarts under simulated time. A restarted bag's first transforms may be read
  before the node clock's jump back (/tf and /clock are separate topics): each edge holds
  the samples that came more than the jump threshold behind its newest, and the jump keeps
  those its new time reaches instead of losing the new timeline's first moments.

Nothing here imports rclpy.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_node.wire.geometry import (
    hamilton,
    matrix_from_quaternion,
    quaternion_conjugate,
    quaternion_from_matrix,
    quaternion_from_yaw,
    quaternion_normalize,
    seconds_to_stamp,
    slerp_unit,
    stamp_to_seconds,
    yaw_from_quaternion,
)
from memory_node.wire.time_jump import TimeJumpDetector

__all__ = [
    "ConnectivityError",
    "ExtrapolationError",
    "Transform",
    "TransformBuffer",
    "TransformError",
    "make_transform_stamped",
]

MAX_GRAPH_DEPTH = 1000


class TransformError(LookupError):
    """A transform could not be looked up."""


class ConnectivityError(TransformError):
    """The frames are unknown, or not connected in the tree (at that time)."""


class ExtrapolationError(TransformError):
    """The stamp lies outside the data an edge on the path holds.

    `by_s` is how far outside (seconds), `direction` is "past", "future" or "gap" (between two
    samples further apart than `max_gap_s`).
    """

    def __init__(
        self,
        message: str,
        *,
        frame: str | None = None,
        stamp_s: float | None = None,
        by_s: float | None = None,
        direction: str | None = None,
    ) -> None:
        super().__init__(message)
        self.frame = frame
        self.stamp_s = stamp_s
        self.by_s = by_s
        self.direction = direction


def _vec3(values: Any) -> np.ndarray:
    arr = np.array(values, dtype=np.float64).reshape(3)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Transform:
    """A rigid transform: translation (x, y, z) and unit rotation quaternion (x, y, z, w),
    both float64 arrays (read-only). As a lookup result it is T_target_source."""

    translation: np.ndarray
    rotation: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "translation", _vec3(self.translation))
        rot = quaternion_normalize(self.rotation)
        rot.setflags(write=False)
        object.__setattr__(self, "rotation", rot)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def _of_unit(cls, translation: tuple[float, float, float],
                 rotation: tuple[float, float, float, float]) -> Transform:
        """From plain floats whose quaternion is unit within rounding (the algebra below):
        renormalised in Python, without the checks and array round trips of the public
        constructor. Lookups compose thousands of these per second of a bag."""
        qx, qy, qz, qw = rotation
        n = math.sqrt(qx * qx + qy * qy + qz * qz + qw * qw)
        t = np.array(translation, dtype=np.float64)
        q = np.array((qx / n, qy / n, qz / n, qw / n), dtype=np.float64)
        t.setflags(write=False)
        q.setflags(write=False)
        out = object.__new__(cls)
        object.__setattr__(out, "translation", t)
        object.__setattr__(out, "rotation", q)
        return out

    @classmethod
    def identity(cls) -> Transform:
        return cls(np.zeros(3), np.array((0.0, 0.0, 0.0, 1.0)))

    @classmethod
    def from_xyz_yaw(cls, x: float, y: float, yaw: float, z: float = 0.0) -> Transform:
        """Planar pose: position and heading."""
        return cls(np.array((x, y, z)), np.array(quaternion_from_yaw(yaw)))

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> Transform:
        m = np.asarray(matrix, dtype=np.float64)
        return cls(m[:3, 3], quaternion_from_matrix(m))

    @classmethod
    def from_msg(cls, msg: Any) -> Transform:
        """From a geometry_msgs Transform / TransformStamped / Pose / PoseStamped /
        PoseWithCovariance (duck-typed: the field names are what count)."""
        if hasattr(msg, "translation") and hasattr(msg, "rotation"):
            t, r = msg.translation, msg.rotation
        elif hasattr(msg, "position") and hasattr(msg, "orientation"):
            t, r = msg.position, msg.orientation
        elif hasattr(msg, "transform"):
            return cls.from_msg(msg.transform)
        elif hasattr(msg, "pose"):
            return cls.from_msg(msg.pose)
        else:
            raise TypeError(f"cannot read a transform from {type(msg).__name__}")
        return cls(np.array((t.x, t.y, t.z)), np.array((r.x, r.y, r.z, r.w)))

    # -- views --------------------------------------------------------------------------
    @property
    def x(self) -> float:
        return float(self.translation[0])

    @property
    def y(self) -> float:
        return float(self.translation[1])

    @property
    def z(self) -> float:
        return float(self.translation[2])

    @property
    def yaw(self) -> float:
        """Heading in (-pi, pi]."""
        qx, qy, qz, qw = (float(v) for v in self.rotation)
        return yaw_from_quaternion(qx, qy, qz, qw)

    def as_matrix(self) -> np.ndarray:
        """4x4 homogeneous matrix."""
        out = np.eye(4, dtype=np.float64)
        out[:3, :3] = matrix_from_quaternion(self.rotation)
        out[:3, 3] = self.translation
        return out

    def to_msg(self) -> Any:
        """geometry_msgs/Transform (imported lazily)."""
        from geometry_msgs.msg import Quaternion, Vector3
        from geometry_msgs.msg import Transform as TransformMsg

        tx, ty, tz = (float(v) for v in self.translation)
        qx, qy, qz, qw = (float(v) for v in self.rotation)
        return TransformMsg(
            translation=Vector3(x=tx, y=ty, z=tz), rotation=Quaternion(x=qx, y=qy, z=qz, w=qw)
        )

    # -- algebra ------------------------------------------------------------------------
    def compose(self, other: Transform) -> Transform:
        """self * other: with self = T_a_b and other = T_b_c, the result is T_a_c."""
        if other is _IDENTITY:
            return self
        if self is _IDENTITY:
            return other
        a = self.rotation.tolist()
        ax, ay, az, aw = a
        vx, vy, vz = other.translation.tolist()
        tx, ty, tz = self.translation.tolist()
        # v rotated by a: v + w * c + q x c, with c = 2 (q x v)
        cx, cy, cz = 2.0 * (ay * vz - az * vy), 2.0 * (az * vx - ax * vz), 2.0 * (ax * vy - ay * vx)
        return Transform._of_unit(
            (tx + vx + aw * cx + (ay * cz - az * cy), ty + vy + aw * cy + (az * cx - ax * cz),
             tz + vz + aw * cz + (ax * cy - ay * cx)),
            hamilton(a, other.rotation.tolist()))

    def __matmul__(self, other: Transform) -> Transform:
        return self.compose(other)

    def inverse(self) -> Transform:
        """T_b_a from T_a_b."""
        conj = quaternion_conjugate(self.rotation)
        return Transform(-(matrix_from_quaternion(conj) @ self.translation), conj)

    def apply(self, points: np.ndarray) -> np.ndarray:
        """Map point(s) of shape (3,) or (N, 3) through the transform (float64)."""
        pts = np.asarray(points, dtype=np.float64)
        return pts @ matrix_from_quaternion(self.rotation).T + self.translation

    def interpolate(self, other: Transform, ratio: float) -> Transform:
        """Linear in translation, slerp in rotation; ratio 0 gives self, 1 gives other."""
        (ax, ay, az), (bx, by, bz) = self.translation.tolist(), other.translation.tolist()
        a, b = self.rotation.tolist(), other.rotation.tolist()
        return Transform._of_unit(
            (ax + ratio * (bx - ax), ay + ratio * (by - ay), az + ratio * (bz - az)),
            slerp_unit(a, b, ratio))

    def isclose(self, other: Transform, atol: float = 1e-9, angle_atol: float = 1e-9) -> bool:
        """Same translation within atol and same rotation within angle_atol radians
        (q and -q are the same rotation)."""
        if not np.allclose(self.translation, other.translation, rtol=0.0, atol=atol):
            return False
        dot = abs(float(self.rotation @ other.rotation))
        return 2.0 * math.acos(min(1.0, dot)) <= angle_atol

    def __repr__(self) -> str:
        t = ", ".join(f"{v:.6g}" for v in self.translation)
        q = ", ".join(f"{v:.6g}" for v in self.rotation)
        return f"Transform(translation=({t}), rotation=({q}))"


_IDENTITY = Transform.identity()


def _clean_frame(frame: str) -> str:
    # tf2 strips a leading "/" (a ROS 1 habit some drivers keep).
    return frame.removeprefix("/")


@dataclass(frozen=True)
class _Sample:
    stamp: float
    parent: str
    transform: Transform


class _DynamicEdge:
    """One child frame's /tf history, sorted by stamp, and the samples that came far behind
    it (`held`): a restarted timeline's start, if the clock jumps back to them."""

    __slots__ = ("samples", "times", "held")

    # At most this many samples held per edge (a second of a 1 kHz edge, ten of 100 Hz).
    HELD_MAX = 1000

    def __init__(self) -> None:
        self.times: list[float] = []
        self.samples: list[_Sample] = []
        self.held: deque[_Sample] = deque(maxlen=self.HELD_MAX)

    def insert(self, sample: _Sample, cache_time_s: float, behind_s: float = math.inf) -> bool:
        """Add the sample; False when it is older than the cache window. One more than
        `behind_s` behind the newest is held too (see `held`), taken or not."""
        if self.times and sample.stamp < self.times[-1] - behind_s:
            self.held.append(sample)
        if self.times and sample.stamp < self.times[-1] - cache_time_s:
            return False  # older than the cache window: tf2 drops it too
        i = bisect.bisect_left(self.times, sample.stamp)
        if i < len(self.times) and self.times[i] == sample.stamp:
            self.samples[i] = sample
        else:
            self.times.insert(i, sample.stamp)
            self.samples.insert(i, sample)
        cutoff = bisect.bisect_left(self.times, self.times[-1] - cache_time_s)
        if cutoff:
            del self.times[:cutoff]
            del self.samples[:cutoff]
        return True

    def latest(self) -> _Sample:
        return self.samples[-1]

    def at(self, child: str, stamp: float | None, tolerance_s: float,
           max_gap_s: float | None = None) -> tuple[str, Transform]:
        samples = self.samples
        if stamp is None:
            s = samples[-1]
            return s.parent, s.transform
        first, last = self.times[0], self.times[-1]
        if stamp < first or stamp > last:
            if stamp < first:
                by, direction, nearest = first - stamp, "past", samples[0]
            else:
                by, direction, nearest = stamp - last, "future", samples[-1]
            if by <= tolerance_s:
                return nearest.parent, nearest.transform
            raise ExtrapolationError(
                f"extrapolation into the {direction} by {by:.3f} s: lookup at t={stamp:.3f} "
                f"needs '{nearest.parent}' -> '{child}', which has data only from "
                f"{first:.3f} to {last:.3f} (tolerance {tolerance_s:.3f} s)",
                frame=child,
                stamp_s=stamp,
                by_s=by,
                direction=direction,
            )
        i = bisect.bisect_left(self.times, stamp)
        if self.times[i] == stamp:
            s = samples[i]
            return s.parent, s.transform
        before, after = samples[i - 1], samples[i]
        if max_gap_s is not None and after.stamp - before.stamp > max_gap_s:
            # Samples were lost (a busy subscriber, a dropped link): interpolating across the
            # gap would invent a pose.
            raise ExtrapolationError(
                f"gap in '{before.parent}' -> '{child}': no data between {before.stamp:.3f} "
                f"and {after.stamp:.3f} (longer than {max_gap_s:.3f} s) around t={stamp:.3f}",
                frame=child, stamp_s=stamp, by_s=after.stamp - before.stamp, direction="gap",
            )
        if before.parent != after.parent:
            # The frame was re-parented between the samples: no meaningful blend (tf2 alike).
            return before.parent, before.transform
        ratio = (stamp - before.stamp) / (after.stamp - before.stamp)
        return before.parent, before.transform.interpolate(after.transform, ratio)


class TransformBuffer:
    """Thread-safe TF buffer (see the module docstring for the semantics).

    Fed from /tf and /tf_static callbacks with `set_transform`, read from worker threads with
    `lookup`; one lock guards both.
    """

    def __init__(self, cache_time_s: float = 10.0, jump_threshold_s: float = 1.0) -> None:
        if cache_time_s <= 0.0:
            raise ValueError(f"cache_time_s must be > 0, got {cache_time_s}")
        self.cache_time_s = float(cache_time_s)
        self._lock = threading.RLock()
        self._static: dict[str, tuple[str, Transform]] = {}
        self._dynamic: dict[str, _DynamicEdge] = {}
        self._parents: set[str] = set()
        self._jump = TimeJumpDetector(jump_threshold_s)
        self.restored = 0  # held samples kept at the last jump back (see on_time)
        self.rejected = 0
        # rejections by reason: malformed, empty_frame, self_transform, non_finite,
        # older_than_cache
        self.rejections: dict[str, int] = {}
        # Refuse to interpolate between samples further apart than this (None: no limit).
        self.max_gap_s: float | None = None
        self.last_rejection: str | None = None
        self.kind_changes = 0  # child frames that changed kind (static <-> dynamic)
        # child frame -> (old kind, old parent, old authority, new kind, new parent, new
        # authority) of its first change, for the one warning per frame
        self.kind_changed: dict[str, tuple[str, str, str, str, str, str]] = {}
        # called (outside the lock) with the frame and that tuple at a frame's first change
        self.on_kind_change: Any = None
        self._authority: dict[str, str] = {}  # child frame -> who last set it
        # Bumped whenever a frame's parent or kind may have changed: what `frames()` and the
        # callers that walk the tree on every message key their caches on.
        self.topology = 0
        self._frames: tuple[int, dict[str, str]] | None = None

    # -- feeding ------------------------------------------------------------------------
    def set_transform(self, ts: Any, authority: str = "", is_static: bool = False) -> bool:
        """Store one TransformStamped-like edge (header.frame_id = parent, child_frame_id =
        child). Returns False, counting it in `rejected` with the reason in
        `last_rejection`, when the edge is malformed, older than the cache window, or of the
        other kind than the child frame was first seen as; never raises on bad data, so one
        bad edge cannot break a callback."""
        try:
            t, r = ts.transform.translation, ts.transform.rotation
            return self.set_edge(str(ts.header.frame_id), str(ts.child_frame_id),
                                 stamp_to_seconds(ts.header.stamp), (t.x, t.y, t.z),
                                 (r.x, r.y, r.z, r.w), authority, is_static)
        except (AttributeError, TypeError, ValueError) as exc:
            return self._reject("malformed", f"malformed transform from '{authority}': {exc}")

    def set_edge(self, parent: str, child: str, stamp: float, translation: Any,
                 rotation: Any, authority: str = "", is_static: bool = False) -> bool:
        """`set_transform` from plain values (what the wire-level /tf reader produces)."""
        parent, child = _clean_frame(parent), _clean_frame(child)
        try:
            transform = Transform(translation, rotation)
        except (TypeError, ValueError) as exc:
            return self._reject("malformed", f"malformed transform from '{authority}': {exc}")
        if not parent or not child:
            return self._reject("empty_frame",
                                f"empty frame id ('{parent}' -> '{child}') from '{authority}'")
        if parent == child:
            return self._reject("self_transform",
                                f"self-transform of frame '{child}' from '{authority}'")
        if not np.all(np.isfinite(transform.translation)) or not math.isfinite(stamp):
            return self._reject("non_finite", f"non-finite transform '{parent}' -> '{child}'")
        changed: tuple[str, str, str, str, str, str] | None = None
        with self._lock:
            if is_static:
                if child in self._dynamic:
                    changed = self._change_kind(child, self._dynamic.pop(child).latest().parent,
                                                "dynamic", parent, "static", authority)
                old = self._static.get(child)
                if old is None or old[0] != parent:
                    self.topology += 1
                self._static[child] = (parent, transform)
            else:
                if child in self._static:
                    changed = self._change_kind(child, self._static.pop(child)[0], "static",
                                                parent, "dynamic", authority)
                edge = self._dynamic.get(child)
                if edge is None:
                    edge = self._dynamic[child] = _DynamicEdge()
                    self.topology += 1
                latest_parent = edge.samples[-1].parent if edge.samples else None
                if not edge.insert(_Sample(stamp, parent, transform), self.cache_time_s,
                                   self._jump.threshold_s):
                    return self._reject(
                        "older_than_cache",
                        f"edge '{parent}' -> '{child}' at t={stamp:.3f} is older than the "
                        f"cache window (newest {edge.times[-1]:.3f}, {self.cache_time_s} s)"
                    )
                if edge.samples[-1].parent != latest_parent:
                    self.topology += 1
            self._authority[child] = authority
            self._parents.add(parent)
        if changed is not None and self.on_kind_change is not None:
            self.on_kind_change(child, changed)
        return True

    def _change_kind(self, child: str, old_parent: str, old_kind: str, parent: str, kind: str,
                     authority: str) -> tuple[str, str, str, str, str, str] | None:
        """The frame's old edge is gone (popped by the caller); count the change. Returns the
        change when it is the frame's first (to be reported), else None."""
        self.kind_changes += 1
        self.topology += 1
        if child in self.kind_changed:
            return None
        change = (old_kind, old_parent, self._authority.get(child, ""), kind, parent, authority)
        self.kind_changed[child] = change
        return change

    def _reject(self, key: str, reason: str) -> bool:
        with self._lock:
            self.rejected += 1
            self.rejections[key] = self.rejections.get(key, 0) + 1
            self.last_rejection = reason
        return False

    def clear(self, include_static: bool = False) -> None:
        """Drop the dynamic history (and the static edges too if asked)."""
        with self._lock:
            self.topology += 1
            self._dynamic.clear()
            if include_static:
                self._static.clear()
            self._parents = {parent for parent, _ in self._static.values()}

    def on_time(self, now_s: float) -> bool:
        """Feed the node clock; clears the dynamic history and returns True when time went
        backwards by more than the jump threshold (a bag restart under simulated time).

        The held samples the new time reaches (stamped up to the threshold past it) stay:
        they are the restarted timeline's, read before its clock; `restored` counts them."""
        with self._lock:
            if not self._jump.jumped_back(now_s):
                return False
            horizon = now_s + self._jump.threshold_s
            held = sorted(((s, child) for child, edge in self._dynamic.items()
                           for s in edge.held if s.stamp <= horizon),
                          key=lambda pair: pair[0].stamp)
            self.clear()
            for sample, child in held:
                self._dynamic.setdefault(child, _DynamicEdge()).insert(sample, self.cache_time_s)
                self._parents.add(sample.parent)
            self.topology += 1
            self.restored = len(held)
            return True

    def newest_stamp(self) -> float | None:
        """The newest /tf stamp held in the dynamic history (None when it is empty)."""
        with self._lock:
            return max((edge.times[-1] for edge in self._dynamic.values() if edge.times),
                       default=None)

    def set_transforms(
        self, transforms: Iterable[Any], authority: str = "", is_static: bool = False
    ) -> int:
        """Store a TFMessage's worth of edges; returns how many were accepted."""
        return sum(self.set_transform(ts, authority, is_static) for ts in transforms)

    def can_transform(
        self,
        target_frame: str,
        source_frame: str,
        stamp_s: float | None = 0.0,
        tolerance_s: float = 0.0,
    ) -> bool:
        try:
            self.lookup(target_frame, source_frame, stamp_s, tolerance_s)
        except TransformError:
            return False
        return True

    # -- reading ------------------------------------------------------------------------
    def frames(self) -> dict[str, str]:
        """child -> parent for every edge (the latest parent for dynamic ones); for logs."""
        with self._lock:
            if self._frames is None or self._frames[0] != self.topology:
                out = {child: parent for child, (parent, _) in self._static.items()}
                out.update({child: e.latest().parent for child, e in self._dynamic.items()})
                self._frames = (self.topology, out)
            return dict(self._frames[1])

    def is_dynamic(self, frame: str) -> bool:
        """Whether the frame's edge to its parent comes from /tf (not /tf_static)."""
        with self._lock:
            return _clean_frame(frame) in self._dynamic

    def has_frame(self, frame: str) -> bool:
        frame = _clean_frame(frame)
        with self._lock:
            return frame in self._static or frame in self._dynamic or frame in self._parents

    def lookup(
        self,
        target_frame: str,
        source_frame: str,
        stamp_s: float | None = 0.0,
        tolerance_s: float = 0.0,
    ) -> Transform:
        """T_target_source at stamp_s (0 or None: the latest common time).

        tolerance_s lets each dynamic edge answer for a stamp up to that far outside its
        data with its nearest sample (no extrapolation beyond holding the value).
        Raises ConnectivityError or ExtrapolationError."""
        target = _clean_frame(target_frame)
        source = _clean_frame(source_frame)
        tolerance = max(0.0, float(tolerance_s))
        with self._lock:
            for frame in (target, source):
                if not (frame in self._static or frame in self._dynamic or frame in self._parents):
                    raise ConnectivityError(
                        f"frame '{frame}' does not exist (known: {self._known_list()})"
                    )
            if target == source:
                return _IDENTITY
            stamp: float | None
            if stamp_s is None or stamp_s == 0.0:
                stamp = self._latest_common_time(target, source)
            else:
                stamp = float(stamp_s)
            return self._walk(target, source, stamp, tolerance)

    def latest_common_time(self, target_frame: str, source_frame: str) -> float | None:
        """The stamp a stamp-0 lookup uses; None when the path is static only (any time)."""
        with self._lock:
            return self._latest_common_time(_clean_frame(target_frame), _clean_frame(source_frame))

    # -- internals (called with the lock held) ------------------------------------------
    def _known_list(self) -> str:
        names = sorted(set(self._static) | set(self._dynamic) | self._parents)
        shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
        return shown or "none"

    def _edge(
        self, frame: str, stamp: float | None, tolerance_s: float
    ) -> tuple[str, Transform] | None:
        static = self._static.get(frame)
        if static is not None:
            return static
        edge = self._dynamic.get(frame)
        if edge is None:
            return None  # a root
        return edge.at(frame, stamp, tolerance_s, self.max_gap_s)

    def _latest_common_time(self, target: str, source: str) -> float | None:
        # Newest stamp per frame on the way up: min over dynamic edges passed so far.
        def chain(start: str) -> list[tuple[str, float | None]]:
            out: list[tuple[str, float | None]] = [(start, None)]
            seen = {start}
            newest: float | None = None
            frame = start
            for _ in range(MAX_GRAPH_DEPTH):
                if frame in self._static:
                    parent = self._static[frame][0]
                elif frame in self._dynamic:
                    latest = self._dynamic[frame].latest()
                    parent = latest.parent
                    newest = latest.stamp if newest is None else min(newest, latest.stamp)
                else:
                    return out
                if parent in seen:
                    raise ConnectivityError(f"loop in the TF tree at frame '{parent}'")
                seen.add(parent)
                out.append((parent, newest))
                frame = parent
            raise ConnectivityError(f"TF tree deeper than {MAX_GRAPH_DEPTH} above '{start}'")

        source_chain = dict(chain(source))
        for frame, newest_t in chain(target):
            if frame in source_chain:
                times = [t for t in (newest_t, source_chain[frame]) if t is not None]
                return min(times) if times else None
        raise self._not_connected(target, source)

    def _not_connected(self, target: str, source: str) -> ConnectivityError:
        return ConnectivityError(
            f"'{target}' and '{source}' are not connected: their trees have different roots "
            f"('{self._root(target)}' and '{self._root(source)}')"
        )

    def _root(self, frame: str) -> str:
        for _ in range(MAX_GRAPH_DEPTH):
            if frame in self._static:
                frame = self._static[frame][0]
            elif frame in self._dynamic:
                frame = self._dynamic[frame].latest().parent
            else:
                break
        return frame

    def _walk(self, target: str, source: str, stamp: float | None, tolerance_s: float) -> Transform:
        # Up from the source: T_frame_source for each ancestor reached.
        from_source: dict[str, Transform] = {source: _IDENTITY}
        source_error: ExtrapolationError | None = None
        frame, acc = source, _IDENTITY
        for _ in range(MAX_GRAPH_DEPTH):
            try:
                edge = self._edge(frame, stamp, tolerance_s)
            except ExtrapolationError as exc:
                source_error = exc
                break
            if edge is None:
                break
            parent, t_parent_frame = edge
            if parent in from_source:
                raise ConnectivityError(f"loop in the TF tree at frame '{parent}'")
            acc = t_parent_frame.compose(acc)
            if parent == target:
                return acc
            from_source[parent] = acc
            frame = parent
        else:
            raise ConnectivityError(f"TF tree deeper than {MAX_GRAPH_DEPTH} above '{source}'")

        # Up from the target until a frame the source reached: T_frame_target.
        frame, acc = target, _IDENTITY
        seen = {target}
        for _ in range(MAX_GRAPH_DEPTH):
            if frame in from_source:
                return acc.inverse().compose(from_source[frame])
            edge = self._edge(frame, stamp, tolerance_s)  # an ExtrapolationError here is final
            if edge is None:
                break
            parent, t_parent_frame = edge
            if parent in seen:
                raise ConnectivityError(f"loop in the TF tree at frame '{parent}'")
            seen.add(parent)
            acc = t_parent_frame.compose(acc)
            frame = parent
        else:
            raise ConnectivityError(f"TF tree deeper than {MAX_GRAPH_DEPTH} above '{target}'")
        if source_error is not None:
            raise source_error
        raise self._not_connected(target, source)


def make_transform_stamped(parent: str, child: str, transform: Transform, stamp_s: float) -> Any:
    """geometry_msgs/TransformStamped (imported lazily): for tests and the sample bag."""
    from geometry_msgs.msg import TransformStamped

    ts = TransformStamped()
    ts.header.frame_id = parent
    ts.header.stamp = seconds_to_stamp(stamp_s)
    ts.child_frame_id = child
    ts.transform = transform.to_msg()
    return ts
