"""Pieces both nodes share: engine parameters, the TF/odometry pose tracker, QoS, time."""

from __future__ import annotations

import bisect
import dataclasses
import math
import threading
import time
from collections import deque
from typing import Any

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from memory_node.core.config import MemoryConfig
from memory_node.core.types import Pose
from memory_node.ros.geometry import normalize_angle, stamp_to_seconds, yaw_from_quaternion
from memory_node.ros.tf_buffer import (
    ExtrapolationError,
    Transform,
    TransformError,
    make_tf_buffer,
)

# Parameters whose "unset" value lets the environment fallback of MemoryConfig apply.
_UNSET = {"memory_dir": "", "onnx_threads": 0}

# Deep: when a busy process falls behind, DDS drops the oldest samples past this depth, and
# lost /tf samples are gaps in the pose history.
TF_QOS = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                    durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
# Transient local like every /tf_static publisher; depth 100 as tf2's static listener, so
# several latched broadcasters arriving at once are all kept (a depth-1 reader can drop some).
TF_STATIC_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.TRANSIENT_LOCAL,
                           history=HistoryPolicy.KEEP_LAST)


def node_now(node: Node) -> float:
    """The node clock in seconds: simulated time under use_sim_time, else wall time."""
    return node.get_clock().now().nanoseconds * 1e-9


def declare_engine_params(node: Node) -> None:
    """One ROS parameter per MemoryConfig field (same names as config/memory.yaml)."""
    for f in dataclasses.fields(MemoryConfig):
        if node.has_parameter(f.name):
            continue
        default = _UNSET.get(f.name, f.default)
        if isinstance(default, tuple):
            default = list(default)
        node.declare_parameter(f.name, default)


def engine_config_from_params(node: Node) -> MemoryConfig:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(MemoryConfig):
        value = node.get_parameter(f.name).value
        if f.name in _UNSET and value == _UNSET[f.name]:
            continue
        values[f.name] = value
    return MemoryConfig.from_mapping(values)


# Odometry samples kept for looking a pose up at a message stamp (a few seconds at 50 Hz).
ODOM_HISTORY = 500


class PoseTracker:
    """The robot's world pose from TF (world ← base), with odometry as fallback.

    Uses tf2_ros on a robot's own ROS install, the package's TF buffer elsewhere. Odometry is
    kept as a short history so the fallback pose is the one at a message's stamp (the latest
    odometry for a stamp just newer than all of it), not whatever arrived last.
    """

    def __init__(self, node: Node, world_frame: str, base_frame: str,
                 odom_topic: str | None, tolerance_s: float = 0.5, callback_group: Any = None,
                 cache_s: float = 10.0, max_gap_s: float | None = None):
        from nav_msgs.msg import Odometry
        from tf2_msgs.msg import TFMessage

        self.node = node
        self.world_frame, self.base_frame = world_frame, base_frame
        self.tolerance_s = tolerance_s
        self.buffer = make_tf_buffer(cache_s, node=node)
        if max_gap_s is not None and hasattr(self.buffer, "max_gap_s"):
            self.buffer.max_gap_s = max_gap_s
        self.last_tf_wall: float | None = None  # monotonic time of the last /tf message
        self.first_tf_wall: float | None = None  # ... and of the first
        self._odom: deque[Pose] = deque(maxlen=ODOM_HISTORY)
        self._odom_t: deque[float] = deque(maxlen=ODOM_HISTORY)  # stamps of those, ascending
        self.odom_max_gap_s = max_gap_s
        self._lock = threading.Lock()
        node.create_subscription(TFMessage, "/tf", self._on_tf, TF_QOS,
                                 callback_group=callback_group)
        node.create_subscription(TFMessage, "/tf_static", self._on_tf_static, TF_STATIC_QOS,
                                 callback_group=callback_group)
        if odom_topic:
            node.create_subscription(Odometry, odom_topic, self.on_odom, 20,
                                     callback_group=callback_group)

    def _on_tf(self, msg: Any) -> None:
        self.last_tf_wall = time.monotonic()
        if self.first_tf_wall is None:
            self.first_tf_wall = self.last_tf_wall
        if self.buffer.on_time(node_now(self.node)):
            self.node.get_logger().warning("time jumped back: TF buffer cleared")
        for ts in msg.transforms:
            self.buffer.set_transform(ts, "tf", False)


    def _on_tf_static(self, msg: Any) -> None:
        for ts in msg.transforms:
            self.buffer.set_transform(ts, "tf_static", True)

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
            if self._odom_t and t < self._odom_t[-1]:
                if t < self._odom_t[-1] - 1.0:  # time jumped back (a looping bag): start over
                    self._odom.clear()
                    self._odom_t.clear()
                else:
                    return  # out of order: keep the history sorted
            self._odom.append(pose)
            self._odom_t.append(t)

    def odom_at(self, stamp_s: float | None) -> Pose | None:
        """Odometry (in its own frame) at the stamp: interpolated between the samples around
        it; the latest (oldest) for a stamp newer (older) than all of them by no more than the
        tolerance; None beyond that, where the history says nothing about the stamp (odometry
        stopped, or the stamp is from before a time jump). None given: the latest."""
        with self._lock:
            if not self._odom:
                return None
            if stamp_s is None:
                return self._odom[-1]
            if stamp_s >= self._odom_t[-1]:
                return self._odom[-1] if stamp_s - self._odom_t[-1] <= self.tolerance_s else None
            i = bisect.bisect_left(self._odom_t, stamp_s)
            if i == 0:
                return self._odom[0] if self._odom_t[0] - stamp_s <= self.tolerance_s else None
            t0, t1, a, b = self._odom_t[i - 1], self._odom_t[i], self._odom[i - 1], self._odom[i]
        if a.frame != b.frame or (self.odom_max_gap_s is not None
                                  and t1 - t0 > self.odom_max_gap_s):
            return a if stamp_s - t0 <= t1 - stamp_s else b  # no pose invented across a gap
        r = (stamp_s - t0) / (t1 - t0) if t1 > t0 else 0.0
        dyaw = normalize_angle(b.yaw - a.yaw)
        return Pose(a.x + r * (b.x - a.x), a.y + r * (b.y - a.y), a.z + r * (b.z - a.z),
                    normalize_angle(a.yaw + r * dyaw), a.frame, "odom")

    def odom_pose_at(self, stamp_s: float | None) -> Pose | None:
        """Odometry at the stamp in the world frame, through world ← odom at that stamp (the
        latest one when TF has none there). A robot whose TF has no world ← odom at all (no
        map) gets odometry in its own frame, labelled so. Source "odom" either way."""
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
        return Pose(p.x, p.y, p.z, p.yaw, self.world_frame, "odom")

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
        the first transform, lost /tf samples)."""
        try:
            tr = self.buffer.lookup(self.world_frame, self.base_frame, stamp_s, 0.0)
        except ExtrapolationError as exc:
            return None, exc.direction not in ("past", "gap")
        except TransformError:
            return None, True
        return Pose(tr.x, tr.y, tr.z, tr.yaw, self.world_frame, "tf"), True

    def has_world_pose(self) -> bool:
        """Whether TF links the world frame to the base frame at all (at its latest time)."""
        return self.tf_pose_at(None) is not None

    def pose_at(self, stamp_s: float | None) -> Pose | None:
        """TF at the stamp (within the tolerance) → odometry at the stamp → None."""
        return self.tf_pose_at(stamp_s) or self.odom_pose_at(stamp_s)

    def current_pose(self) -> Pose | None:
        return self.pose_at(None)
