"""The robot's pose history without ROS: TF buffer, odometry history and freshness.

What a node's TF listener and an offline bag importer share. Time comes in through injected
callables — `clock` (the node clock: simulated time in a replay, the bag's time offline) and
`wall` (the monotonic time that bounds waits for late TF) — so the same history answers on a
robot, in a replay and in an import, and is tested without sleeping. The ROS layer's
`PoseTracker` (ros/common.py) only subscribes and feeds it.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from memory_node.core.types import Pose
from memory_node.wire.geometry import normalize_angle, stamp_to_seconds, yaw_from_quaternion
from memory_node.wire.tf_buffer import (
    ExtrapolationError,
    Transform,
    TransformBuffer,
    TransformError,
)
from memory_node.wire.tf_wire import TfEdgeFilter, TfWireError, WireTransform, parse_tf_message
from memory_node.wire.time_jump import TimeJumpDetector

# The pose source of odometry interpolated between the two samples around a stamp.
ODOM_INTERPOLATED = "odom_interpolated"
# Odometry samples kept for looking a pose up at a message stamp (a few seconds at 50 Hz).
ODOM_HISTORY = 500


class Logger(Protocol):
    """What the core logs through: an rclpy node's logger or a `logging.Logger`."""

    def info(self, message: str) -> Any: ...

    def warning(self, message: str) -> Any: ...

    def debug(self, message: str) -> Any: ...


def default_logger(name: str) -> Logger:
    return logging.getLogger(name)


class Freshness:
    """How old the newest sample of each source is, on the node clock.

    A sample's age is `now - stamp - offset`, where `offset` is the smallest receipt-minus-stamp
    delay seen lately: a listener that falls behind /tf shows as age (its samples arrive ever
    later than stamped), while a publisher whose stamps run on another clock (a skewed RTC, a
    simulator's header time) does not make every pose stale.

    `queued_s`, when the middleware says when it received a sample, is how long the sample then
    waited for our callback: taken off the delay (down to zero, never below), so the offset is
    the transport's and the clocks' only, and a listener whose queue was already behind at its
    first sample (a busy host from the start) shows that wait as age instead of learning it as
    an offset. A node clock that stands still (a finished or paused replay) ages nothing.
    """

    WINDOW_S = 30.0
    JITTER_S = 1.0

    def __init__(self) -> None:
        # key -> [latest stamp, offset of this window, offset of the last window, window start]
        self._seen: dict[str, list[float]] = {}

    def seen(self, key: str, stamp: float, now: float, queued_s: float = 0.0) -> None:
        if now <= 0.0:  # use_sim_time before the first /clock: a delay of -stamp, not one
            return
        entry = self._seen.get(key)
        # When it reached us, not when we read it; but a wait never takes the delay below
        # zero. The wait is wall time converted at the clock's recent rate, and the node clock
        # need not have run on through it (a replay that ended or paused while the sample sat
        # in the queue, a /clock subscription held up with it): counted in full, it would be
        # learnt as a negative offset, and every pose after it would look that much older.
        raw = now - stamp
        delay = raw - min(queued_s, max(raw, 0.0))
        if -self.JITTER_S < delay < 0.0:
            # A transform stamped a moment ahead of our clock (a /clock that updates at 50 Hz
            # under simulated time, NTP jitter) is on time, not a clock offset: taken as the
            # minimum it would add its lead to every later age.
            delay = 0.0
        if entry is None or now < entry[3]:  # new source, or the clock jumped back
            self._seen[key] = [stamp, delay, delay, now]
            return
        entry[0] = max(entry[0], stamp)
        if now - entry[3] > self.WINDOW_S:
            entry[1], entry[2], entry[3] = delay, entry[1], now
        else:
            entry[1] = min(entry[1], delay)

    def age(self, key: str, now: float) -> float | None:
        entry = self._seen.get(key)
        if entry is None:
            return None
        return max(0.0, now - entry[0] - min(entry[1], entry[2]))

    def clear(self) -> None:
        self._seen.clear()


class ClockRate:
    """Node-clock seconds per wall-clock second, measured over spans of at least `SPAN_S` of
    wall time: what turns a wait measured on the wall clock into node-clock time (2 while a
    replay plays at 2x under simulated time, 0 while it pauses, 1 on a robot)."""

    SPAN_S = 1.0
    MAX_RATE = 1000.0

    def __init__(self) -> None:
        self.rate = 1.0
        self._ref: tuple[float, float] | None = None  # (wall, node) at the span's start

    def update(self, wall: float, node: float) -> float:
        """The rate after a reading of both clocks (the last measured one until a span ends)."""
        if node <= 0.0:  # use_sim_time before the first /clock
            return self.rate
        ref = self._ref
        if ref is None or node < ref[1] or wall < ref[0]:  # first reading, or a jump back
            self._ref = (wall, node)
        elif wall - ref[0] >= self.SPAN_S:
            self.rate = min(self.MAX_RATE, (node - ref[1]) / (wall - ref[0]))
            self._ref = (wall, node)
        return self.rate


class PoseHistory:
    """The robot's world pose from TF (world ← base), with odometry as fallback.

    Fed with /tf and /tf_static (serialized bytes, read by `tf_wire` with joint edges below
    the base frame dropped unread, or transform objects) and odometry messages; answers the
    pose at a stamp and the pose for "now". Odometry is kept as a short history so the
    fallback pose is the one at a message's stamp, not whatever arrived last.
    """

    def __init__(self, world_frame: str, base_frame: str, tolerance_s: float = 0.5, *,
                 clock: Callable[[], float], wall: Callable[[], float] = time.monotonic,
                 cache_s: float = 10.0, max_gap_s: float | None = None,
                 max_pose_age_s: float = 0.5, keep_frames: tuple[str, ...] = (),
                 logger: Logger | None = None):
        self.clock, self.wall = clock, wall
        self.log = logger or default_logger(__name__)
        self.world_frame, self.base_frame = world_frame, base_frame
        self.tolerance_s = tolerance_s
        self.max_pose_age_s = max_pose_age_s
        self.buffer = TransformBuffer(cache_s)
        self._moves: tuple[tuple[int, str, str], bool] | None = None  # _chain_moves' answer
        self.buffer.max_gap_s = max_gap_s
        self.buffer.on_kind_change = self._kind_changed
        self.edge_filter = TfEdgeFilter(base_frame, keep_frames)
        self.last_tf_wall: float | None = None  # `wall` time of the last /tf message
        self.first_tf_wall: float | None = None  # ... and of the first
        self.tf_messages = 0  # /tf messages read
        self.tf_edges = 0  # transforms stored (after the filter)
        self.tf_malformed = 0
        self.latest_tf_stamp: float | None = None  # newest stamp on /tf (its timeline)
        self._fresh = Freshness()
        self._rate = ClockRate()  # node-clock seconds per wall second, for queue waits
        self._odom: deque[Pose] = deque(maxlen=ODOM_HISTORY)
        self._odom_t: deque[float] = deque(maxlen=ODOM_HISTORY)  # stamps of those, ascending
        self.odom_max_gap_s = max_gap_s
        self._odom_jump = TimeJumpDetector()
        self._lock = threading.Lock()

    # ---- feeding ----------------------------------------------------------------------------
    def _read(self, data: bytes | Iterable[Any], is_static: bool) -> list[WireTransform]:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            return self._from_objects(data, is_static)
        try:
            return parse_tf_message(data, None if is_static else self.edge_filter)
        except TfWireError as exc:
            self.tf_malformed += 1
            if self.tf_malformed == 1:
                self.log.warning(f"ignoring a malformed TF message: {exc}")
            return []

    def _from_objects(self, transforms: Iterable[Any], is_static: bool) -> list[WireTransform]:
        """TransformStamped-like objects (rclpy's, or a bag reader's) as wire transforms."""
        out = []
        for ts in transforms:
            try:
                parent, child = str(ts.header.frame_id), str(ts.child_frame_id)
                t, r = ts.transform.translation, ts.transform.rotation
                edge = WireTransform(parent, child, stamp_to_seconds(ts.header.stamp),
                                     (float(t.x), float(t.y), float(t.z)),
                                     (float(r.x), float(r.y), float(r.z), float(r.w)))
            except (AttributeError, TypeError, ValueError) as exc:
                self.tf_malformed += 1
                if self.tf_malformed == 1:
                    self.log.warning(f"ignoring a malformed transform: {exc}")
                continue
            if is_static or self.edge_filter(parent, child):
                out.append(edge)
        return out

    def on_tf(self, data: bytes | Iterable[Any], is_static: bool = False,
              queued_wall_s: float = 0.0) -> None:
        """A /tf (or, `is_static`, /tf_static) message: its serialized bytes or its
        transforms (objects with header, child_frame_id and transform); `queued_wall_s`, how
        long it waited between the middleware receiving it and this call, in wall seconds
        (turned into node-clock time at the rate the two clocks run at)."""
        if is_static:
            self.on_tf_static(data)
            return
        self.last_tf_wall = self.wall()
        if self.first_tf_wall is None:
            self.first_tf_wall = self.last_tf_wall
        now = self.clock()
        queued_s = (queued_wall_s * self._rate.update(self.last_tf_wall, now)
                    if queued_wall_s > 0.0 else 0.0)
        if self.buffer.on_time(now):
            self._fresh.clear()
            self.latest_tf_stamp = self.buffer.newest_stamp()
            # A new timeline starts now: its first messages wait for its TF again, rather than
            # taking "TF has flowed for tf_wait_s without a map" from the last timeline and
            # falling back to odometry's own frame at once.
            self.first_tf_wall = self.last_tf_wall
            kept = self.buffer.restored
            self.log.warning("time jumped back: TF buffer cleared" + (
                f", keeping the {kept} transform(s) of the new timeline read before its clock"
                if kept else ""))
        self.tf_messages += 1
        for e in self._read(data, False):
            if self.buffer.set_edge(e.parent, e.child, e.stamp, e.translation, e.rotation,
                                    "/tf", False):
                self.tf_edges += 1
                self._fresh.seen(e.child, e.stamp, now, queued_s)
                if self.latest_tf_stamp is None or e.stamp > self.latest_tf_stamp:
                    self.latest_tf_stamp = e.stamp

    def on_tf_static(self, data: bytes | Iterable[Any]) -> None:
        for e in self._read(data, True):
            self.buffer.set_edge(e.parent, e.child, e.stamp, e.translation, e.rotation,
                                 "/tf_static", True)

    def _kind_changed(self, child: str, change: tuple[str, str, str, str, str, str]) -> None:
        """A frame that changed kind: said once per frame, naming both authorities (a URDF's
        fixed joint latched on /tf_static for a frame a driver moves on /tf, as go2_ros2_sdk's
        map -> odom -> base_link)."""
        old_kind, old_parent, old_by, kind, parent, by = change
        self.log.warning(
            f"TF frame '{child}': the {kind} transform {parent} -> {child} from {by or '?'} "
            f"replaces the {old_kind} {old_parent} -> {child} from {old_by or '?'}; as in tf2 "
            "the newest kind wins (counted in tf_kind_changes)")

    def tf_stats(self) -> dict[str, Any]:
        """TF counters for /memory/recorder_stats: messages, edges kept and filtered, kind
        changes, and rejected transforms by reason (malformed_message: a /tf message whose
        bytes could not be read)."""
        rejected = dict(self.buffer.rejections)
        if self.tf_malformed:
            rejected["malformed_message"] = self.tf_malformed
        return {"tf_messages": self.tf_messages, "tf_edges": self.tf_edges,
                "tf_filtered": self.edge_filter.dropped, "tf_malformed": self.tf_malformed,
                "tf_kind_changes": self.buffer.kind_changes, "tf_rejected": rejected}

    def on_odom(self, msg: Any, stamp_s: float | None = None) -> None:
        """Add an odometry sample, at `stamp_s` when given (an unstamped message's arrival),
        else at its header stamp."""
        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        t = stamp_to_seconds(msg.header.stamp) if stamp_s is None else stamp_s
        pose = Pose(p.x, p.y, p.z, yaw_from_quaternion(q.x, q.y, q.z, q.w),
                    msg.header.frame_id or "odom", "odom")
        if not all(math.isfinite(v) for v in (t, pose.x, pose.y, pose.z, pose.yaw)):
            return  # a NaN pose would poison every fallback after it
        with self._lock:
            if self._odom_jump.jumped_back(t):  # a looping bag: start over
                self._odom.clear()
                self._odom_t.clear()
            elif self._odom_t and t < self._odom_t[-1]:
                return  # out of order: keep the history sorted
            self._odom.append(pose)
            self._odom_t.append(t)
        self._fresh.seen("odom", t, self.clock())

    # ---- reading ----------------------------------------------------------------------------
    @property
    def latest_odom_stamp(self) -> float | None:
        """The newest odometry sample's stamp (None before any)."""
        with self._lock:
            return self._odom_t[-1] if self._odom_t else None

    def odom_at(self, stamp_s: float | None) -> Pose | None:
        """Odometry (in its own frame) at the stamp: interpolated between the samples around
        it (source "odom_interpolated"); a sample's own stamp gives that sample, and the latest
        (oldest) answers for a stamp newer (older) than all of them by no more than the
        tolerance (source "odom"); None beyond that, where the history says nothing about the
        stamp (odometry stopped, or the stamp is from before a time jump). None given: the
        latest."""
        with self._lock:
            if not self._odom:
                return None
            if stamp_s is None:
                return self._odom[-1]
            if stamp_s >= self._odom_t[-1]:
                return self._odom[-1] if stamp_s - self._odom_t[-1] <= self.tolerance_s else None
            i = bisect.bisect_left(self._odom_t, stamp_s)
            if self._odom_t[i] == stamp_s:
                return self._odom[i]  # a sample's own stamp
            if i == 0:
                return self._odom[0] if self._odom_t[0] - stamp_s <= self.tolerance_s else None
            t0, t1, a, b = self._odom_t[i - 1], self._odom_t[i], self._odom[i - 1], self._odom[i]
        if a.frame != b.frame or (self.odom_max_gap_s is not None
                                  and t1 - t0 > self.odom_max_gap_s):
            return a if stamp_s - t0 <= t1 - stamp_s else b  # no pose invented across a gap
        r = (stamp_s - t0) / (t1 - t0) if t1 > t0 else 0.0
        dyaw = normalize_angle(b.yaw - a.yaw)
        return Pose(a.x + r * (b.x - a.x), a.y + r * (b.y - a.y), a.z + r * (b.z - a.z),
                    normalize_angle(a.yaw + r * dyaw), a.frame, ODOM_INTERPOLATED)

    def odom_pose_at(self, stamp_s: float | None) -> Pose | None:
        """Odometry at the stamp in the world frame, through world ← odom at that stamp (the
        latest one when TF has none there). A robot whose TF has no world ← odom at all (no
        map) gets odometry in its own frame, labelled so. The source says odometry either way
        ("odom", or "odom_interpolated" between two samples)."""
        odom = self.odom_at(stamp_s)
        if odom is None:
            return None
        world_odom = None
        for stamp, tol in ((stamp_s, self.tolerance_s), (0.0, 0.0)):
            if stamp is None:
                continue
            try:
                world_odom = self.buffer.lookup(self.world_frame, odom.frame, stamp, tol)
                break
            except TransformError:
                continue
        if world_odom is None:
            return odom
        p = world_odom.compose(Transform.from_xyz_yaw(odom.x, odom.y, odom.yaw, odom.z))
        return Pose(p.x, p.y, p.z, p.yaw, self.world_frame, odom.source)

    def tf_pose_at(self, stamp_s: float | None) -> Pose | None:
        """TF world ← base at the stamp (within the tolerance), or None."""
        try:
            tr = self.buffer.lookup(self.world_frame, self.base_frame, stamp_s or 0.0,
                                    self.tolerance_s)
        except TransformError:
            return None
        return Pose(tr.x, tr.y, tr.z, tr.yaw, self.world_frame, "tf")

    def tf_pose_exact(self, stamp_s: float) -> tuple[Pose | None, bool]:
        """TF world ← base exactly at the stamp (interpolated, never clamped), and whether a
        transform for it may still come: not when the stamp lies before the data an edge holds
        or in a gap of it, which later /tf messages do not fill (a message that came before
        the first transform, lost /tf samples).

        A chain of static transforms only is not a moving robot's pose yet: go2_ros2_sdk's
        URDF latches map -> odom -> base_link as identities before its driver publishes the
        real odom -> base_link, so that answer is "may still come" (after the bounded wait,
        `pose_at` takes it)."""
        try:
            tr = self.buffer.lookup(self.world_frame, self.base_frame, stamp_s, 0.0)
        except ExtrapolationError as exc:
            return None, exc.direction not in ("past", "gap")
        except TransformError:
            return None, True
        if not self._chain_moves():
            return None, True
        return Pose(tr.x, tr.y, tr.z, tr.yaw, self.world_frame, "tf"), True

    def has_world_pose(self) -> bool:
        """Whether TF links the world frame to the base frame at all (at its latest time)."""
        return self.tf_pose_at(None) is not None

    def has_moving_world_pose(self) -> bool:
        """Whether TF links world and base through at least one /tf (dynamic) transform."""
        return self.has_world_pose() and self._chain_moves()

    def _chain_moves(self) -> bool:
        key = (self.buffer.topology, self.world_frame, self.base_frame)
        if self._moves is None or self._moves[0] != key:  # the tree changed: walk it again
            self._moves = (key, any(self.buffer.is_dynamic(frame)
                                    for frame in self._tf_chain()))
        return self._moves[1]

    def pose_at(self, stamp_s: float | None) -> Pose | None:
        """TF at the stamp (within the tolerance) → odometry at the stamp → None. Odometry
        comes first while TF links world and base by static transforms only (a URDF's fixed
        identities, no driver on /tf)."""
        tf = self.tf_pose_at(stamp_s)
        if tf is not None and not self._chain_moves():
            return self.odom_pose_at(stamp_s) or tf
        return tf or self.odom_pose_at(stamp_s)

    def lookup(self, frame: str, stamp_s: float) -> Transform | None:
        """world ← `frame` at the stamp (within the tolerance), or None."""
        try:
            return self.buffer.lookup(self.world_frame, frame, stamp_s, self.tolerance_s)
        except TransformError:
            return None

    def current_pose(self, now: float | None = None) -> Pose | None:
        """The pose at `now` (default the clock's): TF at its latest time, else the latest
        odometry; with `age_s`, the age at `now` of the newest sample it used, and `stale` past
        max_pose_age_s. A caller on another node passes its own now: under simulated time each
        node steps its clock from /clock on its own executor, and a listener whose thread is
        held up has a clock as old as its newest /tf, so by its clock an old pose looks new."""
        now = self.clock() if now is None else now
        pose = self.tf_pose_at(None)
        if pose is not None and not self._chain_moves() and self.odom_at(None) is not None:
            pose = None  # static transforms only: odometry says where the robot is
        keys = self._tf_chain() if pose is not None else ["odom"]
        if pose is None:
            pose = self.odom_pose_at(None)
            if pose is None:
                return None
        ages = [a for a in (self._fresh.age(k, now) for k in keys) if a is not None]
        age = max(ages, default=0.0)  # a static-only chain is always current
        return dataclasses.replace(pose, age_s=age, stale=age > self.max_pose_age_s)

    def frames_above(self, frame: str, limit: int = 64) -> list[str]:
        """The frames above `frame` in TF, nearest first, up to the root (at most `limit`)."""
        parents = self.buffer.frames()
        out: list[str] = []
        while frame in parents and len(out) < limit:
            frame = parents[frame]
            out.append(frame)
        return out

    def _tf_chain(self) -> list[str]:
        """The frames from the base frame up towards the world frame (each an edge's child)."""
        parents = self.buffer.frames()
        chain: list[str] = []
        for frame in (self.base_frame, *self.frames_above(self.base_frame)):
            if frame == self.world_frame or frame not in parents or len(chain) >= 64:
                break
            chain.append(frame)
        return chain
