"""Node parameters: one table, typed declarations, and errors a robot engineer can act on.

rclpy types a parameter by its first value: `max_interval: 10` in a YAML file is an integer,
and declaring it with a float default ends in InvalidParameterTypeException with a traceback.
Every parameter here is declared with dynamic typing and then converted strictly to its
default's type (an integer is a valid float; "ten" is not), so a wrong value stops the node
with one line naming the parameter, the value and the type expected — before any service is
advertised. Keys nobody declares (`lidar_topik`) are warned about with the nearest known name.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node

from memory_node.core.config import ConfigError, MemoryConfig, coerce_value

# Parameters whose "unset" value lets the environment fallback of MemoryConfig apply.
ENGINE_UNSET = {"memory_dir": "", "onnx_threads": 0}

# The robot's pose: both nodes declare these (config files keep them under `/**`); the one TF
# listener of a process reads them.
POSE_PARAMS: dict[str, tuple[Any, str]] = {
    "world_frame": ("map", "frame poses are given in"),
    "base_frame": ("base_link", "the robot's body frame"),
    "odom_topic": ("/odom", "nav_msgs/Odometry: recorded, and the pose fallback"),
    "tf_tolerance_s": (0.5, "TF within this of a stamp answers for it (s)"),
    "tf_cache_s": (60.0, "TF history kept, for a recorder that is behind (s)"),
    "tf_max_gap_s": (1.0, "TF samples further apart than this are a gap, never interpolated"),
    "max_pose_age_s": (0.5, "a pose for 'now' older than this is marked stale (s)"),
}

RECORDER_PARAMS: dict[str, tuple[Any, str]] = {
    "camera_topic": ("/camera/image_raw", "sensor_msgs/Image"),
    "compressed_topic": ("/camera/image_raw/compressed", "sensor_msgs/CompressedImage"),
    "use_compressed": (False, "read compressed_topic instead of camera_topic"),
    "lidar_topic": ("/lidar/points", "sensor_msgs/PointCloud2"),
    "min_distance": (0.5, "keep a keyframe after moving this far (m)"),
    "min_yaw": (0.5, "... or turning this much (rad)"),
    "max_interval": (10.0, "... or after this long (s)"),
    "min_view_change": (0.06, "camera: keep a frame whose view changed this much (0..1)"),
    "min_view_interval": (1.0, "camera: at most one view-change frame per this long (s)"),
    "lidar_voxel": (0.1, "point cloud voxel size (m)"),
    "queue_size": (16, "keyframes waiting for the worker"),
    "pending_size": (256, "messages waiting for their pose and the gate"),
    "batch_size": (4, "camera frames embedded per call"),
    "sensor_reliability": ("best_effort", "best_effort or reliable"),
    "stats_period_s": (5.0, "how often /memory/recorder_stats is published (s)"),
    "tf_wait_s": (2.0, "how long a message waits for a late transform (wall s)"),
    "stamp_source": ("auto", "header, receipt, or auto (header unless far from the node clock)"),
    "stamp_max_offset_s": (60.0, "auto: header stamps further than this from the clock are "
                           "replaced by the receipt time (s)"),
    "topic_timeout_s": (10.0, "warn when a configured topic is silent this long (s)"),
    "camera_frame": ("", "camera frame for a keyframe's view, looked up in TF ('' = the "
                     "image header's frame_id; named, it is kept on a dynamic joint)"),
    "camera_hfov_deg": (90.0, "camera horizontal field of view (deg); 0 records no views"),
    "camera_mount_x": (0.0, "camera in base_frame when TF has no camera frame: x (m)"),
    "camera_mount_y": (0.0, "... y (m)"),
    "camera_mount_yaw": (0.0, "... heading (rad)"),
    "view_max_range": (6.0, "how far a keyframe's view reaches without a lidar scan (m)"),
    "view_lidar_max_age_s": (0.5, "a lidar keyframe this close in time sets the view's range"),
}

SERVER_PARAMS: dict[str, tuple[Any, str]] = {
    "autostart": (True, "configure and activate at start (memory-server)"),
    "backend": ("local", "local: the store in memory_dir; fleet: the shared PostgreSQL store"),
    "fleet_url": ("", "PostgreSQL URL of the fleet store, no password ('' = $MEMORY_FLEET_URL)"),
    "robot_id": ("", "this robot's id in a fleet ('' = the host name)"),
    "map_id": ("", "the map this robot's poses are in ('' = <robot_id>/map)"),
    "max_pending_requests": (64, "requests waiting for the engine; more are refused"),
    "service_queue_depth": (1000, "requests the middleware keeps for each service"),
    "clock_wait_s": (2.0, "with use_sim_time: how long a request waits for a first /clock"),
    "answer_resend_s": (10.0, "how long an answer is re-sent to a client not discovered yet"),
}

CHOICES: dict[str, tuple[str, ...]] = {
    "sensor_reliability": ("best_effort", "reliable"),
    "stamp_source": ("header", "receipt", "auto"),
    "backend": ("local", "fleet"),
}

# Parameters every ROS 2 node has.
ROS_PARAMS = {"use_sim_time", "start_type_description_service"}


class ParameterError(ValueError):
    """A parameter value that cannot be used; the message is one line."""


def engine_param_table() -> dict[str, tuple[Any, str]]:
    table = {}
    for f in dataclasses.fields(MemoryConfig):
        default = ENGINE_UNSET.get(f.name, f.default)
        table[f.name] = (list(default) if isinstance(default, tuple) else default, "")
    return table


def known_names() -> set[str]:
    return (set(engine_param_table()) | set(POSE_PARAMS) | set(RECORDER_PARAMS)
            | set(SERVER_PARAMS) | ROS_PARAMS)


def names_by_node(tf_listener: str) -> dict[str, set[str]]:
    """The parameters each node of memory-node reads (the server, the recorder, and the TF
    listener named `tf_listener`)."""
    engine = set(engine_param_table())
    return {"memory_server": engine | set(POSE_PARAMS) | set(SERVER_PARAMS) | ROS_PARAMS,
            "memory_recorder": engine | set(POSE_PARAMS) | set(RECORDER_PARAMS) | ROS_PARAMS,
            tf_listener: set(POSE_PARAMS) | ROS_PARAMS}


def _type_name(default: Any) -> str:
    if isinstance(default, bool):
        return "a boolean"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, list):
        return "a list of strings"
    return "a string"


def declare(node: Node, table: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Declare each parameter of `table` (skipping ones already declared) and return their
    values converted to the defaults' types. Raises ParameterError."""
    values = {}
    for name, (default, description) in table.items():
        if not node.has_parameter(name):
            node.declare_parameter(name, default, ParameterDescriptor(
                description=description, dynamic_typing=True))
        raw = node.get_parameter(name).value
        values[name] = convert(name, raw, default)
    return values


def convert(name: str, value: Any, default: Any) -> Any:
    """`value` as the type of `default`, strictly (ints are valid floats). ParameterError."""
    if value is None:
        raise ParameterError(f"parameter {name} has no value; expected {_type_name(default)}")
    try:
        if isinstance(default, list):
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(name)
            out: Any = list(value)
        elif isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(name)
        elif isinstance(default, (int, float)) and isinstance(value, str):
            raise ConfigError(name)  # "10" in a YAML file is a quoted string: say so
        else:
            out = coerce_value(name, value, default)
    except ConfigError:
        raise ParameterError(
            f"parameter {name} = {value!r} ({type(value).__name__}) is not valid; expected "
            f"{_type_name(default)} (default {default!r})") from None
    choices = CHOICES.get(name)
    if choices and out not in choices:
        raise ParameterError(f"parameter {name} = {value!r} is not one of {', '.join(choices)}")
    return out


_warned: set[str] = set()


def warn_unknown(node: Node) -> list[str]:
    """Warn (once per process and key) about parameters given to this node that no node of
    the package knows — a misspelt key would otherwise be ignored silently."""
    # rclpy keeps what --params-file and -p gave a node in _parameter_overrides (every
    # distro since Foxy); nothing public lists them.
    given = set(getattr(node, "_parameter_overrides", {}) or {})
    known = known_names()
    unknown = sorted(k for k in given - known if not k.startswith("qos_overrides."))
    for key in unknown:
        if key in _warned:
            continue
        _warned.add(key)
        near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else ""
        node.get_logger().warning(f"unknown parameter {key} (ignored){hint}")
    return unknown
