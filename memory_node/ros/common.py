"""Pieces both nodes share: engine parameters, the TF/odometry pose tracker, QoS, time."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.subscription import Subscription

from memory_node.core.config import MemoryConfig
from memory_node.core.pose_history import PoseHistory
from memory_node.core.recorder_settings import with_robot_prefix
from memory_node.core.secrets import mask_secrets
from memory_node.ros import params

# Deep: when a busy process falls behind, DDS drops the oldest samples past this depth, and
# lost /tf samples are gaps in the pose history.
TF_QOS = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                    durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
# Whether rclpy hands a two-argument callback the message's MessageInfo, with the time the
# middleware received it (rclpy from Iron on; Humble's calls every callback with the message).
MESSAGE_INFO = hasattr(Subscription, "CallbackType")
# A receipt time further back than this is not a queue wait (a middleware that leaves it 0).
MAX_QUEUE_WAIT_S = 600.0
# Transient local like every /tf_static publisher; depth 100 as tf2's static listener, so
# several latched broadcasters arriving at once are all kept (a depth-1 reader can drop some).
TF_STATIC_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.TRANSIENT_LOCAL,
                           history=HistoryPolicy.KEEP_LAST)


def received_at(info: Any) -> float | None:
    """When the middleware received a message, in system-clock seconds, from its MessageInfo
    (None when it gives no usable receipt time)."""
    received = info.get("received_timestamp") if isinstance(info, dict) else None
    if not isinstance(received, int) or received <= 0:
        return None
    t = received * 1e-9  # the middleware stamps on the system clock
    return t if 0.0 <= time.time() - t < MAX_QUEUE_WAIT_S else None


def queue_wait(info: Any) -> float:
    """How long a message waited between the middleware receiving it and its callback, in
    wall seconds (0 when the middleware gives no receipt time)."""
    received = received_at(info)
    return 0.0 if received is None else max(0.0, time.time() - received)


def with_receipt(callback: Callable[[Any, float | None], None]) -> Callable[..., None]:
    """A subscription callback that hands `callback` the message and when the middleware
    received it (system-clock seconds; None on an rclpy that gives callbacks no MessageInfo,
    or a middleware that leaves the time out)."""
    if MESSAGE_INFO:
        return lambda msg, info: callback(msg, received_at(info))
    return lambda msg: callback(msg, None)


# Clients' QoS for the memory services. Every client of a service reads the server's one
# response topic and keeps only the answers addressed to it; with the default depth of 10, a
# burst of other clients' answers pushes its own out of the queue before it takes it (seen:
# 5 of 8,000 requests of 8 busy clients never answered). Deep, so none is pushed out.
CLIENT_QOS = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)


class MaskedLogger:
    """An rclpy logger whose messages have their secrets masked (core.secrets) before they
    reach the console, /rosout and ~/.ros/log.

    Each level calls rclpy from a line of its own: rclpy keys a call site by its caller's
    frame and refuses one site that logs at two severities."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def debug(self, message: Any, **kwargs: Any) -> Any:
        return self._logger.debug(mask_secrets(str(message)), **kwargs)

    def info(self, message: Any, **kwargs: Any) -> Any:
        return self._logger.info(mask_secrets(str(message)), **kwargs)

    def warning(self, message: Any, **kwargs: Any) -> Any:
        return self._logger.warning(mask_secrets(str(message)), **kwargs)

    def warn(self, message: Any, **kwargs: Any) -> Any:
        return self._logger.warning(mask_secrets(str(message)), **kwargs)

    def error(self, message: Any, **kwargs: Any) -> Any:
        return self._logger.error(mask_secrets(str(message)), **kwargs)

    def fatal(self, message: Any, **kwargs: Any) -> Any:
        return self._logger.fatal(mask_secrets(str(message)), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class MaskedLogging:
    """For a node class: `get_logger()` masks secrets in every message it logs."""

    def get_logger(self) -> Any:
        return MaskedLogger(super().get_logger())  # type: ignore[misc]


def ros_network() -> str:
    """Which ROS 2 network this process joins, as the environment sets it: what to compare
    when two processes do not see each other."""
    env = os.environ
    parts = [f"ROS_DOMAIN_ID={env.get('ROS_DOMAIN_ID') or '0 (unset)'}",
             f"ROS_AUTOMATIC_DISCOVERY_RANGE={env.get('ROS_AUTOMATIC_DISCOVERY_RANGE') or 'unset'}"]
    if env.get("ROS_LOCALHOST_ONLY"):
        parts.append(f"ROS_LOCALHOST_ONLY={env['ROS_LOCALHOST_ONLY']}")
    return ", ".join(parts)


NETWORK_HINT = ("an MCP client starts its servers without your shell's environment: give "
                "memory-mcp the same ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE (Humble: "
                "ROS_LOCALHOST_ONLY) as the robot's nodes, in the \"env\" of its configuration")


def node_now(node: Node) -> float:
    """The node clock in seconds: simulated time under use_sim_time, else wall time."""
    return node.get_clock().now().nanoseconds * 1e-9


def declare_engine_params(node: Node) -> dict[str, Any]:
    """One ROS parameter per MemoryConfig field (same names as config/memory.yaml)."""
    return params.declare(node, params.engine_param_table())


def engine_config_from_params(node: Node) -> MemoryConfig:
    """The engine's configuration from the node's parameters (ConfigError when invalid)."""
    values = declare_engine_params(node)
    return MemoryConfig.from_mapping(
        {k: v for k, v in values.items() if params.ENGINE_UNSET.get(k, object()) != v})


def pose_tracker_from_params(node: Node, host: Node | None = None, **kwargs: Any) -> PoseTracker:
    """The process's TF listener, configured from `node`'s pose parameters and subscribed on
    `host` (default: the same node)."""
    p = with_robot_prefix(params.declare(node, params.POSE_PARAMS))
    return PoseTracker(host or node, p["world_frame"], p["base_frame"],
                       kwargs.pop("odom_topic", p["odom_topic"]), p["tf_tolerance_s"],
                       cache_s=p["tf_cache_s"], max_gap_s=p["tf_max_gap_s"],
                       max_pose_age_s=p["max_pose_age_s"], **kwargs)


# The node name of the TF listener memory-node's process shares (`ros.main` makes it and
# hands it to `pose_tracker_from_params`).
TF_LISTENER_NODE = "memory_tf_listener"


class PoseTracker(PoseHistory):
    """The process's TF listener: core.pose_history.PoseHistory fed from /tf, /tf_static and
    (when `odom_topic` is given) odometry subscriptions on `node`, on the node clock.

    One per process (memory-node's `TF_LISTENER_NODE`; a node started alone makes its own),
    shared by the recorder and the query server: each /tf message is read once, from its
    bytes (`tf_wire`, a raw subscription), and joint transforms below the base frame are
    dropped before they cost anything. Always the package's own TF buffer — the one TF path,
    tested here and used on robots alike.

    `clock` (default the node clock) and `wall` (default monotonic time, which bounds the
    recorder's waits for late TF) are injectable, so ages and waits are tested by setting a
    clock instead of sleeping.
    """

    def __init__(self, node: Node, world_frame: str, base_frame: str,
                 odom_topic: str | None, tolerance_s: float = 0.5, callback_group: Any = None,
                 cache_s: float = 10.0, max_gap_s: float | None = None,
                 max_pose_age_s: float = 0.5, keep_frames: tuple[str, ...] = (), *,
                 clock: Callable[[], float] | None = None,
                 wall: Callable[[], float] = time.monotonic):
        from nav_msgs.msg import Odometry
        from tf2_msgs.msg import TFMessage

        super().__init__(world_frame, base_frame, tolerance_s,
                         clock=clock or (lambda: node_now(node)), wall=wall,
                         cache_s=cache_s, max_gap_s=max_gap_s, max_pose_age_s=max_pose_age_s,
                         keep_frames=keep_frames, logger=node.get_logger())
        self.node = node
        # raw=True: the callback gets the CDR bytes, read by tf_wire (no message objects).
        node.create_subscription(TFMessage, "/tf",
                                 self._on_tf_received if MESSAGE_INFO else self.on_tf, TF_QOS,
                                 callback_group=callback_group, raw=True)
        node.create_subscription(TFMessage, "/tf_static", self.on_tf_static, TF_STATIC_QOS,
                                 callback_group=callback_group, raw=True)
        if odom_topic:
            node.create_subscription(Odometry, odom_topic, self.on_odom, 20,
                                     callback_group=callback_group)

    def _on_tf_received(self, data: bytes, info: Any) -> None:
        # A /tf queue that is behind from the first message on would otherwise read as a
        # clock offset, not as age.
        self.on_tf(data, queued_wall_s=queue_wait(info))
