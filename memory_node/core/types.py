"""Typed values that cross module boundaries inside core and out to the ROS and agent layers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

POSE_SOURCES = ("tf", "odom", "none", "given")
_TWO_PI = 2.0 * math.pi


def normalize_angle(angle: float) -> float:
    """Wrap an angle to (-pi, pi], so headings compare and subtract without 2*pi surprises."""
    wrapped = math.fmod(angle + math.pi, _TWO_PI)
    if wrapped <= 0.0:
        wrapped += _TWO_PI
    return wrapped - math.pi


@dataclass(frozen=True)
class Pose:
    """A planar world pose (x, y, z, yaw) in `frame`, with where it came from."""

    x: float
    y: float
    z: float = 0.0
    yaw: float = 0.0
    frame: str = "map"
    source: str = "tf"
    # A pose taken at "now" (a save, near_here): the age of the newest transform it used, and
    # whether that is older than the configured bound. Not stored; not part of equality.
    age_s: float | None = field(default=None, compare=False)
    stale: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "x": round(float(self.x), 4),
            "y": round(float(self.y), 4),
            "z": round(float(self.z), 4),
            "yaw": round(float(self.yaw), 4),
            "frame": self.frame,
            "source": self.source,
        }
        if self.age_s is not None:
            out["age_s"] = round(float(self.age_s), 3)
            if self.stale:
                out["stale"] = True
        return out

    @property
    def heading_deg(self) -> float:
        return math.degrees(self.yaw)

    def distance_to(self, x: float, y: float) -> float:
        return math.hypot(self.x - x, self.y - y)


NO_POSE_DICT: dict[str, Any] = {
    "x": None,
    "y": None,
    "z": None,
    "yaw": None,
    "frame": None,
    "source": "none",
}


@dataclass
class Observation:
    """One stored observation: a row of `observations` in memory.db."""

    stream: str
    t: float
    pose: Pose | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    ref: str | None = None
    id: int | None = None
    model_id: str | None = None
    note_key: str | None = None  # identity of a note's Markdown entry

    def to_result(self, score: float | None = None) -> dict[str, Any]:
        """The JSON shape of one search result (DESIGN.md)."""
        out: dict[str, Any] = {
            "id": self.id,
            "stream": self.stream,
            "t": self.t,
            "pose": self.pose.to_dict() if self.pose else dict(NO_POSE_DICT),
            "score": None if score is None else round(float(score), 6),
            "tags": self.tags,
            "text": self.text,
            "ref": self.ref,
        }
        return out
