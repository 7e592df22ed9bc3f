"""What a camera keyframe covered (the recorder's policy, pure): the camera's position and
heading in the world, its horizontal field of view, and how far it saw — the lidar distance
along the view when a scan is close in time, else a configured maximum."""

from __future__ import annotations

import math

import numpy as np

from memory_node.core.types import Pose, View
from memory_node.wire.geometry import normalize_angle


def forward_yaw(rotation: np.ndarray, optical: bool) -> float:
    """World heading of a camera frame's viewing axis: +z for an optical frame (REP 103's
    `*_optical_frame`: z forward, x right), +x for a body-style camera frame."""
    axis = rotation[:3, 2] if optical else rotation[:3, 0]
    return math.atan2(float(axis[1]), float(axis[0]))


def is_optical(frame: str) -> bool:
    return "optical" in frame


def mounted(base: Pose, mount: tuple[float, float, float]) -> tuple[float, float, float]:
    """(x, y, yaw) of a camera mounted at (mx, my, myaw) on the base."""
    mx, my, myaw = mount
    c, s = math.cos(base.yaw), math.sin(base.yaw)
    return base.x + c * mx - s * my, base.y + s * mx + c * my, normalize_angle(base.yaw + myaw)


def view_range(points_xy: np.ndarray | None, x: float, y: float, yaw: float, hfov: float,
               max_range: float, min_points: int = 5) -> float:
    """How far the view reaches: the 90th percentile of the distances of the scan's points
    inside the view's wedge (walls and furniture it faces), at most `max_range`; `max_range`
    without a scan or with too few points in the wedge."""
    if points_xy is None or len(points_xy) == 0:
        return max_range
    d = points_xy - np.array([x, y])
    dist = np.hypot(d[:, 0], d[:, 1])
    bearing = np.arctan2(d[:, 1], d[:, 0]) - yaw
    bearing = (bearing + np.pi) % (2 * np.pi) - np.pi
    inside = (np.abs(bearing) <= hfov / 2) & (dist > 0.05)
    if int(inside.sum()) < min_points:
        return max_range
    return float(min(max_range, np.percentile(dist[inside], 90)))


def make_view(x: float, y: float, yaw: float, hfov_deg: float, rng: float) -> View:
    return View(float(x), float(y), float(normalize_angle(yaw)), math.radians(hfov_deg),
                float(rng))
