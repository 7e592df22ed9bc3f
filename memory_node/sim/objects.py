"""Named objects in the sample flat, when each was in the camera's view, and the object
questions `memory-eval` asks about them ("Where did you see the fridge?").

The objects are the flat's furniture (`FloorPlan.props`: sofa, tv, plant, kitchen counter,
fridge, bed, wardrobe), rendered into every camera frame of the sample. An object is in view
of a frame when its centre lies inside the camera's horizontal field of view, no further than
`IN_VIEW_M`, with no wall between. Everything here is computed from the seeded world (the
trajectory and the flat), so it needs no change to the recorded bag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from memory_node.sim.floorplan import cast_rays, pack_faces

IN_VIEW_M = 4.0  # further away, a piece of furniture is a few pixels of a 320x240 frame
SEEN_FROM_STEP = 3  # every third camera frame (4 Hz) is enough for where-was-I-when-I-saw-it


@dataclass(frozen=True)
class ObjectTruth:
    name: str  # as a user says it: "kitchen counter"
    x: float
    y: float
    color: str
    seen_from: tuple[tuple[float, float, float], ...]  # (t, x, y): base poses while in view


def spoken(name: str) -> str:
    return name.replace("_", " ")


class ObjectViews:
    """Which of the flat's objects a camera pose sees (see the module docstring)."""

    def __init__(self, world: Any):
        from memory_node.sim.generate import CAMERA

        self.world = world
        plan = world.plan
        self.props = list(plan.props)
        self.walls = pack_faces(plan.wall_faces(), [r.name for r in plan.rooms])
        self.half_fov = CAMERA.cx / CAMERA.fx  # tan of half the horizontal field of view

    def visible(self, cx: float, cy: float, yaw: float) -> list[str]:
        """Names of the objects a camera at (cx, cy) facing yaw sees, nearest first."""
        out = []
        for p in self.props:
            ox, oy = p.center
            dx, dy = ox - cx, oy - cy
            dist = math.hypot(dx, dy)
            depth = dx * math.cos(yaw) + dy * math.sin(yaw)
            lateral = -dx * math.sin(yaw) + dy * math.cos(yaw)
            if depth <= 0.2 or dist > IN_VIEW_M or abs(lateral / depth) > self.half_fov:
                continue
            hit, _ = cast_rays(np.array([cx, cy]), np.array([[dx / dist, dy / dist]]),
                               self.walls)
            if hit[0] >= dist - 0.3:
                out.append((dist, p.name))
        return [name for _d, name in sorted(out)]

    def at(self, t_rel: float) -> list[str]:
        """Objects in view of the camera at `t_rel` seconds into the recording."""
        from memory_node.sim.generate import CAMERA_XYZ

        cx, cy, yaw = self.world.sensor_pose(float(t_rel), CAMERA_XYZ)
        return self.visible(cx, cy, yaw)


@lru_cache(maxsize=4)
def _world(seed: int, duration: float) -> Any:
    from memory_node.sim.generate import _build_world

    return _build_world(seed, duration)


def object_views(seed: int, duration: float) -> ObjectViews:
    return ObjectViews(_world(seed, float(duration)))


def object_truth(seed: int, duration: float) -> dict[str, ObjectTruth]:
    """Every object seen during the sample recording, with the poses it was seen from."""
    from memory_node.sim.generate import EPOCH_S

    views = object_views(seed, duration)
    world = views.world
    seen: dict[str, list[tuple[float, float, float]]] = {}
    for t in world.camera_t[::SEEN_FROM_STEP]:
        names = views.at(float(t))
        if names:
            x, y, _yaw = world.traj.pose(np.array([float(t)]))[0]
            for name in names:
                seen.setdefault(name, []).append(
                    (round(EPOCH_S + float(t), 3), round(float(x), 3), round(float(y), 3)))
    out = {}
    for p in views.props:
        if p.name in seen:
            cx, cy = p.center
            out[p.name] = ObjectTruth(spoken(p.name), round(cx, 3), round(cy, 3), p.color,
                                      tuple(seen[p.name]))
    return out


def object_questions(seed: int, duration: float, tolerance_m: float = 1.0
                     ) -> list[dict[str, Any]]:
    """"Where did you see the X?": right when the answer is a place within `tolerance_m` of
    a pose the robot saw X from."""
    qs = []
    for key, obj in sorted(object_truth(seed, duration).items()):
        qs.append({
            "id": f"object-{key}", "kind": "object",
            "question": f"Where did you see the {obj.name}?",
            "ask": {"type": "object_seen", "object": obj.name},
            "answer": {"x": obj.x, "y": obj.y,
                       "seen_from": [[x, y] for _t, x, y in obj.seen_from]},
            "tolerance": tolerance_m})
    return qs


def caption(names: list[str]) -> str:
    """The caption a perfect captioner would give a frame showing `names` (nearest first)."""
    words = [spoken(n) for n in names]
    if not words:
        return "an indoor view of walls and floor, no furniture in sight"
    if len(words) == 1:
        return f"a room with a {words[0]}"
    return "a room with a " + ", a ".join(words[:-1]) + f" and a {words[-1]}"
