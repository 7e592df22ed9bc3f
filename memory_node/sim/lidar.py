"""Multi-ring lidar: ray-cast the flat (walls, objects, floor, ceiling, the person) from a pose.

Each ring is a cone at a fixed elevation; its horizontal reach to a wall decides whether the
beam meets that wall or the floor/ceiling first. Points come out in the `lidar` frame as float32
(x, y, z, intensity), ring by ring, which is what sensor_msgs/PointCloud2 carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from memory_node.sim.floorplan import FloorPlan, PersonSpec, cast_rays, cast_rays_all, pack_faces

FLOOR_REFLECTIVITY = 0.35
PERSON_REFLECTIVITY = 0.3


@dataclass(frozen=True)
class LidarModel:
    """Beam layout and range limits; `z` is the sensor's height above the floor."""

    beams: int = 360
    elevations_deg: tuple[float, ...] = (-12.0, 0.0, 10.0)
    min_range: float = 0.15
    max_range: float = 10.0
    range_noise: float = 0.01
    z: float = 0.46


class Lidar:
    """Scans one floor plan; reuse it across scans."""

    def __init__(self, plan: FloorPlan, model: LidarModel) -> None:
        self.plan = plan
        self.model = model
        self.walls = pack_faces(plan.wall_faces(), [r.name for r in plan.rooms])
        self.props = pack_faces(plan.prop_faces(), [p.name for p in plan.props])
        self.prop_heights = np.array([p.height for p in plan.props])
        self.prop_refl = np.array([p.reflectivity for p in plan.props])
        self.azimuths = np.arange(model.beams) * (2 * math.pi / model.beams)
        self.elev = np.radians(np.array(model.elevations_deg))

    def scan(
        self,
        x: float,
        y: float,
        yaw: float,
        person: PersonSpec | None = None,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Points (N, 4) float32 in the sensor frame for a sensor at (x, y) facing `yaw`."""
        origin = np.array([x, y])
        world = self.azimuths + yaw
        dirs = np.stack([np.cos(world), np.sin(world)], axis=1)
        rows = np.arange(len(dirs))
        hits = _Hits(*cast_rays(origin, dirs, self.walls))
        hits.cos_wall = np.maximum(np.abs((dirs * self.walls.n[hits.f_wall]).sum(axis=1)), 0.2)
        t_props = cast_rays_all(origin, dirs, self.props)
        n_props = len(self.plan.props)
        hits.t_prop = np.full((len(dirs), n_props), np.inf)
        hits.cos_prop = np.zeros((len(dirs), n_props))
        for p in range(n_props):
            sel = np.flatnonzero(self.props.owner == p)
            j = np.argmin(t_props[:, sel], axis=1)
            hits.t_prop[:, p] = t_props[rows, sel[j]]
            cos = np.abs((dirs * self.props.n[sel[j]]).sum(axis=1))
            hits.cos_prop[:, p] = np.maximum(cos, 0.2)
        hits.t_person = np.full(len(dirs), np.inf)
        if person is not None:
            hits.t_person = _ray_circle(origin, dirs, (person.x, person.y), person.radius)
            hits.person_height = person.height
        with np.errstate(invalid="ignore"):  # inf * 0 on the level ring: a miss anyway
            rings = [self._ring(float(el), hits, rng) for el in self.elev]
        return np.concatenate(rings).astype(np.float32)

    def _ring(self, el: float, hits: _Hits, rng: np.random.Generator | None) -> np.ndarray:
        """One cone of beams: nearest of wall, floor/ceiling, objects and person, as points."""
        model = self.model
        n = len(self.azimuths)
        tan_el = math.tan(el)
        # horizontal distance at which this ring reaches the floor or the ceiling
        if tan_el < -1e-9:
            t_fc = np.full(n, model.z / -tan_el)
        elif tan_el > 1e-9:
            t_fc = np.full(n, (self.plan.ceiling_height - model.z) / tan_el)
        else:
            t_fc = np.full(n, np.inf)
        best = np.minimum(hits.t_wall, t_fc)
        # reflectivity of the wall band the beam meets (the window's glass returns little)
        z_at_wall = model.z + hits.t_wall * tan_el
        band = (z_at_wall[:, None] >= self.walls.z1[hits.f_wall]).sum(axis=1)
        band = np.minimum(band, self.walls.refl.shape[1] - 1)
        wall_refl = self.walls.refl[hits.f_wall, band] * hits.cos_wall
        refl = np.where(hits.t_wall <= t_fc, wall_refl, FLOOR_REFLECTIVITY)
        for p in range(hits.t_prop.shape[1]):
            tp = hits.t_prop[:, p]
            zp = model.z + tp * tan_el
            hit = (tp < best) & (zp >= 0.0) & (zp <= self.prop_heights[p])
            best = np.where(hit, tp, best)
            refl = np.where(hit, self.prop_refl[p] * hits.cos_prop[:, p], refl)
        zq = model.z + hits.t_person * tan_el
        hit = (hits.t_person < best) & (zq >= 0.0) & (zq <= hits.person_height)
        best = np.where(hit, hits.t_person, best)
        refl = np.where(hit, PERSON_REFLECTIVITY, refl)

        slant = best / math.cos(el)
        if rng is not None and model.range_noise > 0:
            slant = slant + rng.normal(0.0, model.range_noise, size=n)
        keep = np.isfinite(slant) & (slant >= model.min_range) & (slant <= model.max_range)
        horiz = slant * math.cos(el)
        pts = np.stack(
            [
                horiz * np.cos(self.azimuths),
                horiz * np.sin(self.azimuths),
                slant * math.sin(el),
                np.clip(refl * 255.0, 0.0, 255.0),
            ],
            axis=1,
        )
        return pts[keep]


@dataclass
class _Hits:
    """Per-beam horizontal hits shared by every ring of one scan."""

    t_wall: np.ndarray
    f_wall: np.ndarray
    cos_wall: np.ndarray = field(default_factory=lambda: np.zeros(0))
    t_prop: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    cos_prop: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    t_person: np.ndarray = field(default_factory=lambda: np.zeros(0))
    person_height: float = 0.0


def _ray_circle(
    origin: np.ndarray, dirs: np.ndarray, centre: tuple[float, float], radius: float
) -> np.ndarray:
    """Distance along unit rays to a vertical cylinder (a standing person), inf if missed."""
    oc = origin - np.asarray(centre)
    b = dirs @ oc
    c = float(oc @ oc) - radius * radius
    disc = b * b - c
    with np.errstate(invalid="ignore"):
        t = -b - np.sqrt(disc)
    return np.where((disc >= 0) & (t > 0), t, np.inf)
