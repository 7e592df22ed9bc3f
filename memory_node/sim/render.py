"""Column ray-cast camera: what the robot's front camera sees of the flat, as an RGB image.

A level pinhole camera seen as Wolfenstein-style columns: one ray per image column finds the
nearest wall, lower objects are painted far to near, and a standing person is drawn as a
shaded billboard. Walls keep vertical edges vertical because the camera is level; the
principal point sits below the image centre (a shifted sensor, like looking slightly up) so a
standing adult fits the frame from about 1.5 m. Flat shading without noise keeps the frames
small once the bag compresses them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memory_node.sim.floorplan import FloorPlan, PersonSpec, cast_rays, cast_rays_all, pack_faces

FLOOR_RGB = np.array([112, 94, 76], dtype=np.float32)
CEILING_RGB = np.array([172, 172, 167], dtype=np.float32)

JACKET = (46, 52, 78)
TROUSERS = (36, 38, 50)
SHOES = (20, 18, 18)
SKIN = (214, 172, 140)
HAIR = (46, 30, 22)
EYES = (28, 22, 22)
MOUTH = (150, 78, 78)


@dataclass(frozen=True)
class CameraModel:
    """Pinhole intrinsics (pixels) and the optical centre's height above the floor (m)."""

    width: int = 320
    height: int = 240
    fx: float = 160.0
    fy: float = 160.0
    cx: float = 160.0
    cy: float = 150.0
    z: float = 0.40

    @property
    def hfov_deg(self) -> float:
        return math.degrees(2 * math.atan(self.width / 2 / self.fx))

    def k_matrix(self) -> list[float]:
        return [self.fx, 0.0, self.cx, 0.0, self.fy, self.cy, 0.0, 0.0, 1.0]


@dataclass(frozen=True)
class PersonView:
    """Where the person landed in one frame (for ground truth and detector tests)."""

    distance: float
    bbox: tuple[int, int, int, int]  # u0, v0, u1, v1 (clipped to the image)
    visible_fraction: float  # drawn pixels / pixels of the whole unclipped, unoccluded sprite


@dataclass(frozen=True)
class FrameInfo:
    """Ground truth about one rendered frame."""

    person: PersonView | None
    window_fraction: float  # share of pixels showing the (emissive) window


def _distance_shade(t: np.ndarray) -> np.ndarray:
    """Near surfaces are lit more than far ones (light falls off away from the camera)."""
    return 0.5 + 0.5 * np.exp(-t / 5.0)


def _normal_shade(n: np.ndarray) -> np.ndarray:
    """Walls facing different ways get different brightness, so corners show as edges."""
    return 0.86 + 0.10 * n[..., 0] - 0.06 * n[..., 1]


def _cyl(r: np.ndarray) -> np.ndarray:
    """Lambert-like shading across a cylinder (limbs, torso) from its centre line."""
    return 0.62 + 0.38 * np.sqrt(np.clip(1.0 - r * r, 0.0, 1.0))


def person_sprite(x: np.ndarray, z: np.ndarray, height: float) -> tuple[np.ndarray, np.ndarray]:
    """A standing adult seen from the front: (mask, rgb) at body coordinates in metres.

    x is to the viewer's right of the body's centre line, z is up from the floor. Dark clothes,
    skin-coloured face and hands, legs apart with a gap between them: the outline and the
    limb shading carry the gradients a pedestrian detector looks for.
    """
    s = height / 1.75
    x, z = np.broadcast_arrays(x / s, z / s)
    mask = np.zeros(x.shape, dtype=bool)
    rgb = np.zeros((*x.shape, 3), dtype=np.float32)

    def paint(part: np.ndarray, colour: tuple[int, int, int], shade: np.ndarray | float) -> None:
        k = shade[part] if isinstance(shade, np.ndarray) else np.full(int(part.sum()), shade)
        rgb[part] = np.asarray(colour, dtype=np.float32)[None, :] * k[:, None]
        mask[part] = True

    for side in (-1.0, 1.0):
        f = np.clip((0.95 - z) / 0.88, 0.0, 1.0)
        c = side * (0.092 + 0.04 * f)
        w = 0.078 - 0.018 * f
        r = (x - c) / w
        paint((np.abs(r) <= 1.0) & (z >= 0.06) & (z <= 0.97), TROUSERS, _cyl(r))
        shoe = ((x - side * 0.14) / 0.07) ** 2 + ((z - 0.035) / 0.045) ** 2 <= 1.0
        paint(shoe & (z >= 0.0), SHOES, 1.0)
    # torso: waist to rounded shoulders
    f = np.clip((z - 0.86) / 0.52, 0.0, 1.0)
    w = 0.165 + 0.03 * f
    above = np.clip((z - 1.36) / 0.1, 0.0, 1.0)
    w = w * np.sqrt(np.clip(1.0 - above * above, 0.0, 1.0)) + 0.06 * above
    torso = (np.abs(x) <= w) & (z >= 0.86) & (z <= 1.46)
    paint(torso, JACKET, _cyl(x / 0.2))
    # arms hang slightly away from the body, hands below the hem
    for side in (-1.0, 1.0):
        f = np.clip((1.40 - z) / 0.62, 0.0, 1.0)
        c = side * (0.215 + 0.035 * f)
        r = (x - c) / 0.046
        top = ((x - side * 0.2) / 0.07) ** 2 + ((z - 1.37) / 0.07) ** 2 <= 1.0
        paint(((np.abs(r) <= 1.0) & (z >= 0.80) & (z <= 1.40)) | top, JACKET, _cyl(r) * 0.92)
        hand = ((x - side * 0.252) / 0.04) ** 2 + ((z - 0.75) / 0.07) ** 2 <= 1.0
        paint(hand, SKIN, _cyl((x - side * 0.252) / 0.04))
    paint((np.abs(x) <= 0.045) & (z >= 1.44) & (z <= 1.53), SKIN, 0.85)
    head = (x / 0.088) ** 2 + ((z - 1.635) / 0.115) ** 2 <= 1.0
    paint(head, SKIN, _cyl(x / 0.088))
    hair = head & ((z > 1.685) | ((np.abs(x) > 0.07) & (z > 1.6)))
    paint(hair, HAIR, 1.0)
    for side in (-1.0, 1.0):
        eye = ((x - side * 0.032) / 0.014) ** 2 + ((z - 1.645) / 0.009) ** 2 <= 1.0
        paint(eye, EYES, 1.0)
    paint((np.abs(x) <= 0.026) & (np.abs(z - 1.588) <= 0.006), MOUTH, 1.0)
    return mask, rgb


class Renderer:
    """Renders frames of one floor plan for one camera model; reuse it across frames."""

    def __init__(self, plan: FloorPlan, camera: CameraModel) -> None:
        self.plan = plan
        self.camera = camera
        self.walls = pack_faces(plan.wall_faces(), [r.name for r in plan.rooms])
        self.props = pack_faces(plan.prop_faces(), [p.name for p in plan.props])
        self.prop_heights = np.array([p.height for p in plan.props])
        self.prop_rgb = np.array([p.rgb for p in plan.props], dtype=np.float32)
        cols = np.arange(camera.width) + 0.5
        rows = np.arange(camera.height) + 0.5
        self.k = (camera.cx - cols) / camera.fx  # leftward ray offset per unit depth
        self.dz = ((camera.cy - rows) / camera.fy).astype(np.float32)  # height per unit depth
        self.row_index = np.arange(camera.height, dtype=np.int64)
        self.background = self._background()

    def _background(self) -> np.ndarray:
        """Floor and ceiling depend only on the row for a level camera: compute them once."""
        cam = self.camera
        h = self.plan.ceiling_height
        img = np.empty((cam.height, cam.width, 3), dtype=np.float32)
        with np.errstate(divide="ignore"):
            floor_d = np.where(self.dz < 0, cam.z / -self.dz, np.inf)
            ceil_d = np.where(self.dz > 0, (h - cam.z) / self.dz, np.inf)
        floor = FLOOR_RGB[None, :] * _distance_shade(floor_d)[:, None]
        ceil = CEILING_RGB[None, :] * _distance_shade(ceil_d)[:, None]
        img[:] = np.where((self.dz < 0)[:, None], floor, ceil)[:, None, :]
        return np.clip(img + 0.5, 0, 255).astype(np.uint8)

    def _dirs(self, yaw: float) -> np.ndarray:
        f = np.array([math.cos(yaw), math.sin(yaw)])
        left = np.array([-math.sin(yaw), math.cos(yaw)])
        return f[None, :] + self.k[:, None] * left[None, :]

    def render(
        self, x: float, y: float, yaw: float, person: PersonSpec | None = None
    ) -> tuple[np.ndarray, FrameInfo]:
        """The camera image (H, W, 3) uint8 rgb8 for a camera at (x, y) facing `yaw`.

        Pixels first get a label (0 floor/ceiling, then wall bands, then objects far to near),
        and one gather from a per-column colour table turns labels into colours: cheaper than
        blending full RGB layers.
        """
        cam = self.camera
        origin = np.array([x, y])
        dirs = self._dirs(yaw)
        cols = np.arange(cam.width)
        walls = self.walls
        n_bands = walls.z1.shape[1]

        t_wall, f_wall = cast_rays(origin, dirs, walls)
        t_wall = np.where(np.isfinite(t_wall), t_wall, 1e3).astype(np.float32)
        z_pix = cam.z + self.dz[:, None] * t_wall[None, :]
        label = ((z_pix >= 0.0) & (z_pix < self.plan.ceiling_height)).astype(np.uint8)
        for b in range(n_bands - 1):
            label += (z_pix >= walls.z1[f_wall, b][None, :].astype(np.float32)) & (label > 0)
        shade = _distance_shade(t_wall) * _normal_shade(walls.n[f_wall])
        table = [np.zeros((cam.width, 3))]
        for b in range(n_bands):
            lit = np.where(walls.emissive[f_wall, b], 1.0, shade)
            table.append(walls.rgb[f_wall, b] * lit[:, None])

        window_px = 0
        for b in range(n_bands):
            lit_cols = walls.emissive[f_wall, b]
            if lit_cols.any():
                window_px += int(((label == b + 1) & lit_cols[None, :]).sum())

        nearest = t_wall.copy()
        t_props = cast_rays_all(origin, dirs, self.props)  # (W, faces)
        if np.isfinite(t_props).any():
            owner = self.props.owner
            n_props = len(self.plan.props)
            per_prop = np.full((cam.width, n_props), np.inf)
            per_face = np.full((cam.width, n_props), -1, dtype=np.int64)
            for p in range(n_props):
                sel = np.flatnonzero(owner == p)
                tp = t_props[:, sel]
                j = np.argmin(tp, axis=1)
                per_prop[:, p] = tp[cols, j]
                per_face[:, p] = sel[j]
            per_prop = np.where(per_prop < t_wall[:, None], per_prop, np.inf)
            order = np.argsort(-np.where(np.isfinite(per_prop), per_prop, -1.0), axis=1)
            for rank in range(n_props):
                props = order[:, rank]
                tp = per_prop[cols, props]
                ok = np.isfinite(tp)
                if not ok.any():
                    continue
                tp32 = np.where(ok, tp, 1e3).astype(np.float32)
                zp = cam.z + self.dz[:, None] * tp32[None, :]
                m = ok[None, :] & (zp >= 0.0) & (zp <= self.prop_heights[props][None, :])
                if window_px:  # objects in front of the window hide part of it
                    band_of = np.clip(label.astype(np.int64) - 1, 0, n_bands - 1)
                    hidden = m & (label > 0) & (label <= n_bands)
                    hidden &= walls.emissive[f_wall[None, :], band_of]
                    window_px -= int(hidden.sum())
                label[m] = len(table)
                face = per_face[cols, props]
                sh = _distance_shade(tp32) * _normal_shade(self.props.n[face])
                table.append(self.prop_rgb[props] * sh[:, None])
                nearest = np.where(ok, np.minimum(nearest, tp32), nearest)

        n_labels = len(table)
        lut = np.clip(np.stack(table, axis=1) + 0.5, 0, 255).astype(np.uint8)  # (W, L, 3)
        packed = np.zeros((cam.width * n_labels + cam.height, 4), dtype=np.uint8)
        packed[: cam.width * n_labels, :3] = lut.reshape(-1, 3)
        packed[cam.width * n_labels :, :3] = self.background[:, 0, :]
        index = np.where(
            label == 0,
            (cam.width * n_labels + self.row_index)[:, None],
            cols[None, :] * n_labels + label,
        )
        img = packed.view(np.uint32).ravel().take(index).view(np.uint8)
        img = img.reshape(cam.height, cam.width, 4)[:, :, :3].copy()
        view = None
        if person is not None:
            view = self._draw_person(img, origin, yaw, person, nearest)
        return img, FrameInfo(view, window_px / label.size)

    def _draw_person(
        self,
        img: np.ndarray,
        origin: np.ndarray,
        yaw: float,
        person: PersonSpec,
        nearest: np.ndarray,
    ) -> PersonView | None:
        """Draw the person into `img` in place where nothing nearer hides it."""
        cam = self.camera
        rel = np.array([person.x, person.y]) - origin
        depth = rel[0] * math.cos(yaw) + rel[1] * math.sin(yaw)
        lateral = -rel[0] * math.sin(yaw) + rel[1] * math.cos(yaw)
        if depth < 0.3:
            return None
        u_c = cam.cx - cam.fx * lateral / depth
        half_w = 0.36 * person.height / 1.75
        u0 = math.floor(u_c - cam.fx * half_w / depth)
        u1 = math.ceil(u_c + cam.fx * half_w / depth)
        v0 = math.floor(cam.cy - cam.fy * (person.height * 1.01 - cam.z) / depth)
        v1 = math.ceil(cam.cy + cam.fy * cam.z / depth)
        cu0, cu1 = max(u0, 0), min(u1, cam.width)
        cv0, cv1 = max(v0, 0), min(v1, cam.height)
        if cu0 >= cu1 or cv0 >= cv1:
            return None
        full_x = ((np.arange(u0, u1) + 0.5) - u_c) * depth / cam.fx
        full_z = cam.z + (cam.cy - (np.arange(v0, v1) + 0.5)) * depth / cam.fy
        full_mask, full_rgb = person_sprite(full_x[None, :], full_z[:, None], person.height)
        total = int(full_mask.sum())
        mask = full_mask[cv0 - v0 : cv1 - v0, cu0 - u0 : cu1 - u0]
        rgb = full_rgb[cv0 - v0 : cv1 - v0, cu0 - u0 : cu1 - u0]
        mask = mask & (nearest[cu0:cu1] > depth)[None, :]
        shade = float(_distance_shade(np.array(depth)))
        sub = img[cv0:cv1, cu0:cu1]
        sub[mask] = np.clip(rgb[mask] * shade + 0.5, 0, 255).astype(np.uint8)
        drawn = int(mask.sum())
        if drawn == 0:
            return None
        return PersonView(float(depth), (cu0, cv0, cu1, cv1), drawn / max(total, 1))
