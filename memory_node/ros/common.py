"""Pieces both nodes share: engine parameters, the TF/odometry pose tracker, QoS, time."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from memory_node.core.config import MemoryConfig
from memory_node.core.types import Pose
from memory_node.ros.geometry import yaw_from_quaternion
from memory_node.ros.tf_buffer import Transform, TransformError, make_tf_buffer

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


class PoseTracker:
    """The robot's world pose from TF (world ← base), with the latest odometry as fallback.

    Uses tf2_ros on a robot's own ROS install, the package's TF buffer elsewhere.
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
        self._odom: Pose | None = None
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
        if self.buffer.on_time(node_now(self.node)):
            self.node.get_logger().warning("time jumped back: TF buffer cleared")
        for ts in msg.transforms:
            self.buffer.set_transform(ts, "tf", False)


    def _on_tf_static(self, msg: Any) -> None:
        for ts in msg.transforms:
            self.buffer.set_transform(ts, "tf_static", True)

    def on_odom(self, msg: Any) -> None:
        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        pose = Pose(p.x, p.y, p.z, yaw_from_quaternion(q.x, q.y, q.z, q.w),
                    msg.header.frame_id or "odom", "odom")
        with self._lock:
            self._odom = pose

    def latest_odom(self) -> Pose | None:
        """The latest odometry pose, in the world frame through the latest world ← odom
        transform when one is known (source "odom" either way), else in its own frame."""
        with self._lock:
            odom = self._odom
        if odom is None:
            return None
        try:
            world_odom = self.buffer.lookup(self.world_frame, odom.frame, 0.0)
        except TransformError:
            return odom
        p = world_odom.compose(Transform.from_xyz_yaw(odom.x, odom.y, odom.yaw, odom.z))
        return Pose(p.x, p.y, p.z, p.yaw, self.world_frame, "odom")

    def tf_pose_at(self, stamp_s: float | None, exact: bool = False) -> Pose | None:
        """TF world ← base at the stamp (within the tolerance unless `exact`), or None."""
        try:
            tr = self.buffer.lookup(self.world_frame, self.base_frame, stamp_s or 0.0,
                                    0.0 if exact else self.tolerance_s)
        except TransformError:
            return None
        return Pose(tr.x, tr.y, tr.z, tr.yaw, self.world_frame, "tf")

    def pose_at(self, stamp_s: float | None) -> Pose | None:
        """TF at the stamp (within the tolerance) → latest odometry → None."""
        return self.tf_pose_at(stamp_s) or self.latest_odom()

    def current_pose(self) -> Pose | None:
        return self.pose_at(None)
