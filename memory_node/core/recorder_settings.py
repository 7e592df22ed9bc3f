"""The recorder's and the pose tracker's parameters: names, defaults, descriptions.

The ROS nodes declare them (ros/params.py); code without ROS (an offline importer driving
core.recorder.RecorderPolicy) fills the same defaults with `recorder_settings`, so both run
the one policy with the one set of values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_node.core.config import ConfigError, coerce_value
from memory_node.core.front_video import FRONT_VIDEO
from memory_node.core.streams import stream_topic_params

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
    "robot_prefix": ("", "one of several robots on one graph: prefix of its topics (/P/odom) "
                     "and its frames (P/base_link); map and odom stay shared"),
}

RECORDER_PARAMS: dict[str, tuple[Any, str]] = {
    "camera_topic": ("/camera/image_raw", "sensor_msgs/Image"),
    "compressed_topic": ("/camera/image_raw/compressed", "sensor_msgs/CompressedImage"),
    "use_compressed": (False, "read compressed_topic instead of camera_topic"),
    **FRONT_VIDEO.params,  # the Go2's front video (unitree_ros2), before both when set
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
    "tf_wait_s": (2.0, "how long a message waits for late TF or odometry (wall s)"),
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
    "lidar_frame": ("", "the lidar's frame, mounted on base_frame by lidar_mount_* when no "
                    "transform publishes it ('' = no mount)"),
    "lidar_mount_x": (0.0, "lidar in base_frame: x (m)"),
    "lidar_mount_y": (0.0, "... y (m)"),
    "lidar_mount_z": (0.0, "... z (m)"),
    "lidar_mount_roll": (0.0, "... roll (rad)"),
    "lidar_mount_pitch": (0.0, "... pitch (rad)"),
    "lidar_mount_yaw": (0.0, "... yaw (rad)"),
}

RECORDER_CHOICES: dict[str, tuple[str, ...]] = {
    "sensor_reliability": ("best_effort", "reliable"),
    "stamp_source": ("header", "receipt", "auto"),
    **FRONT_VIDEO.choices,
}


# What robot_prefix prefixes: go2_ros2_sdk's multi-robot mode publishes robotN/odom,
# robotN/point_cloud2, robotN/camera/image_raw with frames robotN/base_link and
# robotN/front_camera, while map, odom and /tf stay shared by all robots.
PREFIXED_TOPICS = ("camera_topic", "compressed_topic", "front_video_topic", "lidar_topic",
                   "odom_topic")
PREFIXED_FRAMES = ("base_frame", "camera_frame", "lidar_frame")


def with_robot_prefix(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with `robot_prefix` applied to its topics and robot frames (those present and
    not empty). Idempotent: a name that already carries the prefix keeps it."""
    out = dict(values)
    prefix = str(out.get("robot_prefix") or "").strip("/")
    if not prefix:
        return out
    for key in PREFIXED_TOPICS:
        topic = out.get(key)
        if topic and not str(topic).startswith(f"/{prefix}/"):
            out[key] = f"/{prefix}/{str(topic).lstrip('/')}"
    for key in PREFIXED_FRAMES:
        frame = out.get(key)
        if frame and not str(frame).lstrip("/").startswith(f"{prefix}/"):
            out[key] = f"{prefix}/{str(frame).lstrip('/')}"
    return out


def recorder_settings(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every recorder and pose parameter (registered streams' topics included, see
    core/streams.py): `values` over the defaults, each converted to its
    default's type, with `robot_prefix` applied. Raises ConfigError naming an unknown key, a
    wrong type or a bad choice."""
    table = {**POSE_PARAMS, **RECORDER_PARAMS, **stream_topic_params()}
    out = {name: default for name, (default, _) in table.items()}
    for name, value in (values or {}).items():
        if name not in table:
            raise ConfigError(f"unknown recorder parameter {name}")
        out[name] = coerce_value(name, value, table[name][0])
        choices = RECORDER_CHOICES.get(name)
        if choices and out[name] not in choices:
            raise ConfigError(f"{name} = {value!r} is not one of {', '.join(choices)}")
    return with_robot_prefix(out)
