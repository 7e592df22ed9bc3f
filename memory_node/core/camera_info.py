"""The camera's field of view from its sensor_msgs/CameraInfo, where the driver publishes one
(go2_ros2_sdk does, from its calibration files): it replaces `camera_hfov_deg` for the views of
camera keyframes, which then match the images whatever their size. No ROS import: messages
are duck-typed (rclpy's and a bag reader's have the same fields)."""

from __future__ import annotations

import math
from typing import Any


def camera_info_topic(image_topic: str) -> str:
    """The CameraInfo topic beside an image topic, as image_transport names it:
    /camera/image_raw and /camera/image_raw/compressed -> /camera/camera_info."""
    topic = image_topic.rstrip("/")
    if topic.endswith("/compressed"):
        topic = topic.removesuffix("/compressed")
    parent = topic.rsplit("/", 1)[0] if "/" in topic else ""
    return f"{parent}/camera_info"


def hfov_deg(info: Any) -> float | None:
    """2 atan(width / 2 fx) in degrees, or None for an uncalibrated CameraInfo (fx or the
    width zero: a driver that fills neither)."""
    try:
        fx, width = float(info.k[0]), float(info.width)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    if not (fx > 0 and width > 0) or not math.isfinite(fx):
        return None
    return math.degrees(2.0 * math.atan(width / (2.0 * fx)))
