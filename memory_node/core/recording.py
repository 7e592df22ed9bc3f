"""The recorder's policy, without ROS: when time jumped back, which messages to keep as
keyframes, and which pose to store for a message.

The ROS recorder only converts messages and calls these; each is tested here with plain
values, a fake clock and no sleeps (test/core/test_recording.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from memory_node.core.types import Pose
from memory_node.wire.geometry import normalize_angle
from memory_node.wire.time_jump import DEFAULT_JUMP_THRESHOLD_S, TimeJumpDetector


class Timeline:
    """Numbers the node clock's timelines: each jump back starts a new epoch. A message keeps
    the epoch it arrived in; one stamped on the old timeline but delivered just after the jump
    belongs to the old one. A message whose epoch is not the current one can no longer be
    posed: the TF and odometry it needs are gone."""

    def __init__(self, threshold_s: float = DEFAULT_JUMP_THRESHOLD_S) -> None:
        self.detector = TimeJumpDetector(threshold_s)
        self.epoch = 0
        self.jumped_from: float | None = None  # the clock before the last jump back

    def observe(self, now: float) -> bool:
        """Feed the node clock; True when it jumped back (a new epoch began)."""
        before = self.detector.high
        if self.detector.jumped_back(now):
            self.epoch += 1
            self.jumped_from = before
            return True
        return False

    def epoch_of(self, stamp: float, now: float) -> int:
        """The epoch of a message stamped `stamp` arriving at `now` (after `observe(now)`)."""
        threshold = self.detector.threshold_s
        if self.jumped_from is not None and now + threshold < stamp <= self.jumped_from + threshold:
            return self.epoch - 1  # stamped before the jump, delivered after it
        return self.epoch


@dataclass
class KeyframeGate:
    """Keep a keyframe when the robot moved, turned, or enough time passed since the last —
    or, for images, when the view changed (someone walked in) while the robot stood still.
    `view` is any array-like thumbnail with values in 0..1 (mean absolute difference), or a
    callable returning one (or None): called only when the thumbnail is needed — a frame kept,
    or the view-change test — so a frame that the pose and the clock already decide costs no
    image decode."""

    min_distance: float
    min_yaw: float
    max_interval: float
    min_view_change: float = 0.0
    min_view_interval: float = 1.0
    last_pose: Pose | None = None
    last_t: float | None = None
    last_view: Any = None

    def admit(self, t: float, pose: Pose | None, view: Any = None) -> bool:
        if self.last_t is None or t < self.last_t:  # first frame, or time jumped back
            return self._take(t, pose, view)
        if t - self.last_t >= self.max_interval:
            return self._take(t, pose, view)
        if pose is not None and self.last_pose is not None:
            moved = math.hypot(pose.x - self.last_pose.x, pose.y - self.last_pose.y)
            turned = abs(normalize_angle(pose.yaw - self.last_pose.yaw))
            if moved >= self.min_distance or turned >= self.min_yaw:
                return self._take(t, pose, view)
        elif pose is not None and self.last_pose is None:
            return self._take(t, pose, view)
        if (self.min_view_change > 0 and view is not None and self.last_view is not None
                and t - self.last_t >= self.min_view_interval):
            view = view() if callable(view) else view
            if (view is not None
                    and float(abs(view - self.last_view).mean()) >= self.min_view_change):
                return self._take(t, pose, view)
        return False

    def _take(self, t: float, pose: Pose | None, view: Any) -> bool:
        view = view() if callable(view) else view
        self.last_t, self.last_pose = t, pose
        if view is not None:
            self.last_view = view
        return True

    def reset(self) -> None:
        self.last_t, self.last_pose, self.last_view = None, None, None


class PoseSource(Protocol):
    """What pose resolution asks of TF and odometry (the ROS layer's PoseTracker)."""

    last_tf_wall: float | None  # monotonic time of the newest /tf message, None before any
    first_tf_wall: float | None
    latest_tf_stamp: float | None  # the newest /tf stamp read (its timeline), None before any

    def tf_pose_exact(self, stamp_s: float) -> tuple[Pose | None, bool]:
        """TF world ← base exactly at the stamp, and whether a transform for it may still
        come (not for a stamp before the data or in a gap of it)."""

    def pose_at(self, stamp_s: float) -> Pose | None:
        """TF within the tolerance, else odometry at the stamp, else None."""

    def has_world_pose(self) -> bool:
        """Whether TF links the world and base frames at all."""

    def has_moving_world_pose(self) -> bool:
        """... through at least one dynamic (/tf) transform."""

    @property
    def latest_odom_stamp(self) -> float | None:
        """The newest odometry sample's stamp, None before any."""


class PoseResolver:
    """The pose to store for a message: TF exactly at its stamp, waiting up to `wait_s`
    (from when the message arrived) for a transform that comes after the message; else TF
    within the tolerance, else odometry at the stamp, else None.

    No wait while no transform has arrived since a wait last ran out (a robot without TF, or
    whose TF stopped, pays for one wait, not one per message), nor once TF has flowed for
    `wait_s` without ever linking world and base through a /tf transform (odometry and no
    map; static transforms only), nor for a stamp TF will never cover (before its first
    sample, inside a gap).

    Without TF world ← base, odometry is the pose: a message newer than the newest odometry
    sample waits (the same `wait_s`) for the odometry that covers its stamp — a driver whose
    odometry arrives late and in bursts — and is then posed between the samples around it.
    Once such a wait runs out, later messages wait again only after odometry moved on.

    `node_clock` is the clock the messages' epochs follow. When TF's newest stamp lies ahead
    of it by more than `jump_threshold_s`, the clock jumped back and TF's reader (its own
    node, its own /clock) has not seen that yet: its buffer still holds the last timeline, so
    the message waits (the same `wait_s`) for it to catch up rather than being posed from the
    old timeline or not at all.
    `clock` and `sleep` are injectable so the waits are tested without waiting.
    """

    def __init__(self, source: PoseSource, wait_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, poll_s: float = 0.01,
                 node_clock: Callable[[], float] | None = None,
                 jump_threshold_s: float = DEFAULT_JUMP_THRESHOLD_S) -> None:
        self.source = source
        self.wait_s = wait_s
        self.clock, self.sleep, self.poll_s = clock, sleep, poll_s
        self.node_clock, self.jump_threshold_s = node_clock, jump_threshold_s
        self._left_timeline_wait_out: float | None = None  # node clock when such a wait ran out
        self._stalled_at: tuple[float | None] | None = None  # (last_tf_wall,) at a timeout
        self._odom_stalled_at: float | None = None  # latest odometry stamp at a timeout

    def resolve(self, stamp: float, arrived: float,
                cancelled: Callable[[], bool] = lambda: False) -> tuple[Pose | None, bool]:
        """(pose, whether a wait for TF ran out). `arrived` is the message's arrival on
        `clock`; `cancelled` ends a wait early (the clock jumped back)."""
        while True:
            decided, pose, timed_out = self.try_resolve(stamp, arrived, cancelled)
            if decided:
                return pose, timed_out
            self.sleep(self.poll_s)

    def try_resolve(self, stamp: float, arrived: float,
                    cancelled: Callable[[], bool] = lambda: False
                    ) -> tuple[bool, Pose | None, bool]:
        """One look, never waiting: (decided, pose, whether the wait ran out). Undecided
        while a transform for the stamp may still come within `wait_s` of `arrived` — an
        offline importer, whose clock is the bag's, asks again after feeding more TF."""
        node_now = None if cancelled() else self._node_time_if_tf_left_behind(stamp)
        if node_now is not None:
            if self.clock() < arrived + self.wait_s:
                return False, None, False
            # TF stays ahead of the node clock: skewed clocks, not a jump. No more such waits
            # until the node clock jumps back below this point.
            self._left_timeline_wait_out = node_now
        pose, may_come = self.source.tf_pose_exact(stamp)
        if pose is not None:
            return True, pose, False  # the common case: one lookup
        if may_come and self._tf_expected() and not cancelled():
            if self.clock() < arrived + self.wait_s:
                return False, None, False
            # Until another transform arrives, later messages take the fallback at once.
            self._stalled_at = (self.source.last_tf_wall,)
            return True, self.source.pose_at(stamp), True
        if self._odom_expected(stamp) and not cancelled():
            if self.clock() < arrived + self.wait_s:
                return False, None, False
            self._odom_stalled_at = self.source.latest_odom_stamp
            return True, self.source.pose_at(stamp), True
        return True, self.source.pose_at(stamp), False

    def _node_time_if_tf_left_behind(self, stamp: float) -> float | None:
        """The node clock when TF still holds a timeline that clock jumped back from (see
        the class docstring), else None. The node clock is read only when TF is far ahead of
        the stamp."""
        latest = self.source.latest_tf_stamp
        if self.node_clock is None or latest is None or latest <= stamp + self.jump_threshold_s:
            return None
        now = self.node_clock()
        given_up = self._left_timeline_wait_out
        if given_up is not None and now >= given_up - self.jump_threshold_s:
            return None
        return now if latest > now + self.jump_threshold_s else None

    def _odom_expected(self, stamp: float) -> bool:
        """Whether odometry covering the stamp may still come: the pose will be odometry's
        (no TF world ← base through a /tf transform), odometry flows, and its newest sample
        is older than the stamp (and not the one a wait already ran out at)."""
        latest = self.source.latest_odom_stamp
        if latest is None or latest >= stamp or latest == self._odom_stalled_at:
            return False
        return not self.source.has_moving_world_pose()

    def _tf_expected(self) -> bool:
        source = self.source
        if self._stalled_at == (source.last_tf_wall,):
            return False
        if source.first_tf_wall is None or source.has_moving_world_pose():
            return True
        return self.clock() - source.first_tf_wall < self.wait_s
