"""The sample flat: rooms, walls, doorways and coloured landmarks in the `map` frame.

Everything the camera renderer and the lidar ray-caster see comes from here, and so does the
ground truth that tests compare memory answers against. Walls are one-sided faces whose normal
points into their room, so an interior wall is two faces (one per room, each with that room's
colour) and ray casting needs no wall thickness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

RGB = tuple[int, int, int]
Point = tuple[float, float]

CEILING_HEIGHT = 2.5

WINDOW_RGB: RGB = (252, 252, 246)


@dataclass(frozen=True)
class Band:
    """A horizontal stripe of a wall face between heights z0 and z1 (metres above the floor)."""

    z0: float
    z1: float
    rgb: RGB
    emissive: bool = False
    reflectivity: float = 0.5


@dataclass(frozen=True)
class Face:
    """A one-sided vertical face from `a` to `b`; its normal points into the room it bounds."""

    a: Point
    b: Point
    bands: tuple[Band, ...]
    owner: str

    @property
    def normal(self) -> Point:
        dx, dy = self.b[0] - self.a[0], self.b[1] - self.a[1]
        n = math.hypot(dx, dy)
        return (-dy / n, dx / n)


@dataclass(frozen=True)
class Room:
    """An axis-aligned room box (xmin, ymin, xmax, ymax) with its wall colour."""

    name: str
    box: tuple[float, float, float, float]
    wall_rgb: RGB

    def contains(self, x: float, y: float) -> bool:
        x0, y0, x1, y1 = self.box
        return x0 <= x <= x1 and y0 <= y <= y1

    @property
    def center(self) -> Point:
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2, (y0 + y1) / 2)


@dataclass(frozen=True)
class Doorway:
    """An opening between two rooms on a wall line, from p0 to p1."""

    name: str
    rooms: tuple[str, str]
    p0: Point
    p1: Point


@dataclass(frozen=True)
class WallFeature:
    """Something painted into a wall (the front door, the window, a TV) between p0 and p1."""

    name: str
    kind: str
    room: str
    p0: Point
    p1: Point
    bands: tuple[Band, ...]
    color: str

    @property
    def center(self) -> Point:
        return ((self.p0[0] + self.p1[0]) / 2, (self.p0[1] + self.p1[1]) / 2)

    @property
    def width(self) -> float:
        return math.hypot(self.p1[0] - self.p0[0], self.p1[1] - self.p0[1])


@dataclass(frozen=True)
class Prop:
    """A free-standing object: a convex polygon footprint extruded to `height`."""

    name: str
    kind: str
    room: str
    polygon: tuple[Point, ...]
    height: float
    rgb: RGB
    color: str
    reflectivity: float = 0.5

    @property
    def center(self) -> Point:
        xs = [p[0] for p in self.polygon]
        ys = [p[1] for p in self.polygon]
        return (sum(xs) / len(xs), sum(ys) / len(ys))

    def faces(self) -> list[Face]:
        """Outward faces (counter-clockwise polygon, so the right-hand normal points out)."""
        pts = list(self.polygon)
        band = (Band(0.0, self.height, self.rgb, reflectivity=self.reflectivity),)
        return [Face(pts[(i + 1) % len(pts)], pts[i], band, self.name) for i in range(len(pts))]

    def contains(self, x: float, y: float, margin: float = 0.0) -> bool:
        xs = [p[0] for p in self.polygon]
        ys = [p[1] for p in self.polygon]
        return (
            min(xs) - margin <= x <= max(xs) + margin and min(ys) - margin <= y <= max(ys) + margin
        )


@dataclass(frozen=True)
class PersonSpec:
    """A person standing still at (x, y), facing `yaw`, visible during a window of the tour."""

    x: float
    y: float
    yaw: float
    height: float = 1.75
    radius: float = 0.2


@dataclass
class FaceArrays:
    """Faces packed as arrays so rays can be intersected with all of them at once."""

    a: np.ndarray  # (F, 2)
    e: np.ndarray  # (F, 2) b - a
    n: np.ndarray  # (F, 2) unit normal
    z0: np.ndarray  # (F, B)
    z1: np.ndarray  # (F, B)
    rgb: np.ndarray  # (F, B, 3) float32
    emissive: np.ndarray  # (F, B) bool
    refl: np.ndarray  # (F, B)
    height: np.ndarray  # (F,) top of the highest band
    owner: np.ndarray  # (F,) int index into owners
    owners: list[str] = field(default_factory=list)


def pack_faces(faces: list[Face], owners: list[str]) -> FaceArrays:
    """Pad every face to the same number of bands; empty bands have z0 == z1."""
    nb = max(len(f.bands) for f in faces)
    nf = len(faces)
    a = np.array([f.a for f in faces], dtype=np.float64)
    b = np.array([f.b for f in faces], dtype=np.float64)
    z0 = np.zeros((nf, nb))
    z1 = np.zeros((nf, nb))
    rgb = np.zeros((nf, nb, 3), dtype=np.float32)
    emissive = np.zeros((nf, nb), dtype=bool)
    refl = np.zeros((nf, nb))
    for i, f in enumerate(faces):
        top = f.bands[-1].z1
        for j in range(nb):
            band = f.bands[min(j, len(f.bands) - 1)]
            if j < len(f.bands):
                z0[i, j], z1[i, j] = band.z0, band.z1
            else:
                z0[i, j] = z1[i, j] = top
            rgb[i, j] = band.rgb
            emissive[i, j] = band.emissive
            refl[i, j] = band.reflectivity
    e = b - a
    n = np.stack([-e[:, 1], e[:, 0]], axis=1) / np.linalg.norm(e, axis=1, keepdims=True)
    owner = np.array([owners.index(f.owner) for f in faces], dtype=np.int64)
    return FaceArrays(a, e, n, z0, z1, rgb, emissive, refl, z1.max(axis=1), owner, owners)


@dataclass(frozen=True)
class FloorPlan:
    """The whole flat; built once by `build_flat`."""

    rooms: tuple[Room, ...]
    doorways: tuple[Doorway, ...]
    features: tuple[WallFeature, ...]
    props: tuple[Prop, ...]
    person: PersonSpec
    ceiling_height: float = CEILING_HEIGHT

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        xs = [r.box[0] for r in self.rooms] + [r.box[2] for r in self.rooms]
        ys = [r.box[1] for r in self.rooms] + [r.box[3] for r in self.rooms]
        return (min(xs), min(ys), max(xs), max(ys))

    def feature(self, name: str) -> WallFeature:
        return next(f for f in self.features if f.name == name)

    def room_at(self, x: float, y: float) -> str | None:
        for room in self.rooms:
            if room.contains(x, y):
                return room.name
        return None

    def is_free(self, x: float, y: float, margin: float = 0.0) -> bool:
        """Inside the flat and at least `margin` from every wall face and prop."""
        if self.room_at(x, y) is None:
            return False
        if any(p.contains(x, y, margin) for p in self.props):
            return False
        return all(_segment_distance(x, y, f.a, f.b) >= margin for f in self.wall_faces())

    def wall_faces(self) -> list[Face]:
        """Inward faces of every room side, cut at doorways and split at wall features."""
        faces: list[Face] = []
        h = self.ceiling_height
        for room in self.rooms:
            x0, y0, x1, y1 = room.box
            # counter-clockwise corners: the left-hand normal of each side points inward
            corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
            plain = (Band(0.0, h, room.wall_rgb, reflectivity=0.55),)
            for i in range(4):
                a, b = corners[i], corners[(i + 1) % 4]
                for s0, s1, bands in self._side_pieces(room, a, b, plain):
                    pa = (a[0] + (b[0] - a[0]) * s0, a[1] + (b[1] - a[1]) * s0)
                    pb = (a[0] + (b[0] - a[0]) * s1, a[1] + (b[1] - a[1]) * s1)
                    faces.append(Face(pa, pb, bands, room.name))
        return faces

    def _side_pieces(
        self, room: Room, a: Point, b: Point, plain: tuple[Band, ...]
    ) -> list[tuple[float, float, tuple[Band, ...]]]:
        length = math.hypot(b[0] - a[0], b[1] - a[1])

        def param(p: Point) -> float | None:
            # position of p along a->b in [0, 1], or None when p is off the side's line
            ux, uy = (b[0] - a[0]) / length, (b[1] - a[1]) / length
            dx, dy = p[0] - a[0], p[1] - a[1]
            if abs(dx * uy - dy * ux) > 1e-6:
                return None
            return (dx * ux + dy * uy) / length

        cuts: list[tuple[float, float, tuple[Band, ...] | None]] = []
        for d in self.doorways:
            if room.name in d.rooms:
                s0, s1 = param(d.p0), param(d.p1)
                if s0 is not None and s1 is not None:
                    cuts.append((min(s0, s1), max(s0, s1), None))
        for f in self.features:
            if f.room == room.name:
                s0, s1 = param(f.p0), param(f.p1)
                if s0 is not None and s1 is not None:
                    cuts.append((min(s0, s1), max(s0, s1), f.bands))
        cuts.sort(key=lambda c: c[0])
        pieces: list[tuple[float, float, tuple[Band, ...]]] = []
        pos = 0.0
        for s0, s1, bands in cuts:
            if s0 > pos + 1e-9:
                pieces.append((pos, s0, plain))
            if bands is not None:
                pieces.append((s0, s1, bands))
            pos = s1
        if pos < 1.0 - 1e-9:
            pieces.append((pos, 1.0, plain))
        return pieces

    def prop_faces(self) -> list[Face]:
        return [face for p in self.props for face in p.faces()]


def _segment_distance(x: float, y: float, a: Point, b: Point) -> float:
    ex, ey = b[0] - a[0], b[1] - a[1]
    s = ((x - a[0]) * ex + (y - a[1]) * ey) / (ex * ex + ey * ey)
    s = min(1.0, max(0.0, s))
    return math.hypot(x - a[0] - s * ex, y - a[1] - s * ey)


def _box(x0: float, y0: float, x1: float, y1: float) -> tuple[Point, ...]:
    return ((x0, y0), (x1, y0), (x1, y1), (x0, y1))


def _octagon(cx: float, cy: float, r: float) -> tuple[Point, ...]:
    return tuple(
        (
            round(cx + r * math.cos(math.pi / 8 + i * math.pi / 4), 6),
            round(cy + r * math.sin(math.pi / 8 + i * math.pi / 4), 6),
        )
        for i in range(8)
    )


def build_flat() -> FloorPlan:
    """The fixed sample flat (10 m x 8 m); seed-independent so every run shares one world.

    ```
    y=8 +-------------+----------[ window ]---------+
        | fridge      |                       plant |
        | counter     :        living room          |
        |   kitchen   |                          tv |
    4.5 +-------::----+                             |
        |             :    sofa                     |
        |   hallway   +------------------::---------+ y=3
      door  person    |     bedroom            bed  |
        |             | wardrobe                    |
    y=0 +-------------+-----------------------------+
       x=0          x=3.5                         x=10     (':' doorways)
    ```
    """
    h = CEILING_HEIGHT
    rooms = (
        Room("hallway", (0.0, 0.0, 3.5, 4.5), (152, 141, 124)),
        Room("kitchen", (0.0, 4.5, 3.5, 8.0), (128, 139, 147)),
        Room("living_room", (3.5, 3.0, 10.0, 8.0), (145, 134, 119)),
        Room("bedroom", (3.5, 0.0, 10.0, 3.0), (136, 124, 143)),
    )
    doorways = (
        Doorway("hallway_kitchen", ("hallway", "kitchen"), (2.0, 4.5), (3.0, 4.5)),
        Doorway("hallway_living", ("hallway", "living_room"), (3.5, 3.3), (3.5, 4.3)),
        Doorway("kitchen_living", ("kitchen", "living_room"), (3.5, 6.2), (3.5, 7.2)),
        Doorway("living_bedroom", ("living_room", "bedroom"), (8.0, 3.0), (9.0, 3.0)),
    )
    hall_wall = rooms[0].wall_rgb
    living_wall = rooms[2].wall_rgb
    features = (
        WallFeature(
            "front_door",
            "door",
            "hallway",
            (0.0, 1.5),
            (0.0, 2.5),
            (
                Band(0.0, 2.05, (176, 38, 34), reflectivity=0.6),
                Band(2.05, h, hall_wall, reflectivity=0.55),
            ),
            "red",
        ),
        WallFeature(
            "window",
            "window",
            "living_room",
            (5.8, 8.0),
            (8.8, 8.0),
            (
                Band(0.0, 0.5, living_wall, reflectivity=0.55),
                Band(0.5, 2.3, WINDOW_RGB, emissive=True, reflectivity=0.05),
                Band(2.3, h, living_wall, reflectivity=0.55),
            ),
            "white",
        ),
        WallFeature(
            "tv",
            "tv",
            "living_room",
            (10.0, 4.6),
            (10.0, 5.8),
            (
                Band(0.0, 0.75, living_wall, reflectivity=0.55),
                Band(0.75, 1.45, (22, 22, 28), reflectivity=0.1),
                Band(1.45, h, living_wall, reflectivity=0.55),
            ),
            "black",
        ),
    )
    props = (
        Prop(
            "sofa",
            "sofa",
            "living_room",
            _box(4.7, 3.1, 6.9, 3.95),
            0.85,
            (62, 138, 64),
            "green",
            0.4,
        ),
        Prop(
            "plant",
            "plant",
            "living_room",
            _octagon(9.45, 7.45, 0.28),
            1.3,
            (34, 96, 44),
            "dark green",
            0.3,
        ),
        Prop(
            "kitchen_counter",
            "counter",
            "kitchen",
            _box(0.0, 5.0, 0.65, 7.3),
            0.9,
            (214, 182, 48),
            "yellow",
            0.6,
        ),
        Prop(
            "fridge",
            "fridge",
            "kitchen",
            _box(0.0, 7.35, 0.7, 8.0),
            1.8,
            (158, 164, 170),
            "grey",
            0.7,
        ),
        Prop(
            "bed", "bed", "bedroom", _box(8.0, 0.05, 9.95, 1.75), 0.55, (58, 80, 172), "blue", 0.45
        ),
        Prop(
            "wardrobe",
            "wardrobe",
            "bedroom",
            _box(3.55, 0.2, 4.15, 1.9),
            2.0,
            (122, 82, 46),
            "brown",
            0.5,
        ),
    )
    person = PersonSpec(x=0.55, y=2.9, yaw=0.0)
    return FloorPlan(rooms, doorways, features, props, person)


def cast_rays(
    origin: np.ndarray, dirs: np.ndarray, faces: FaceArrays
) -> tuple[np.ndarray, np.ndarray]:
    """Intersect rays origin + t * dirs with every face seen from its front.

    Returns (t, index) of the nearest face per ray; t is inf where nothing is hit. `t` is in
    units of each direction vector's length, so non-unit directions give depth directly.
    """
    t = cast_rays_all(origin, dirs, faces)
    idx = np.argmin(t, axis=1)
    return t[np.arange(len(t)), idx], idx


def cast_rays_all(origin: np.ndarray, dirs: np.ndarray, faces: FaceArrays) -> np.ndarray:
    """Like `cast_rays` but keeps every face: (R, F) distances, inf where missed."""
    dx, dy = dirs[:, 0:1], dirs[:, 1:2]
    ex, ey = faces.e[None, :, 0], faces.e[None, :, 1]
    apx = faces.a[None, :, 0] - origin[0]
    apy = faces.a[None, :, 1] - origin[1]
    denom = dx * ey - dy * ex
    facing = (dx * faces.n[None, :, 0] + dy * faces.n[None, :, 1]) < 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (apx * ey - apy * ex) / denom
        s = (apx * dy - apy * dx) / denom
    hit = facing & (t > 1e-6) & (s >= 0.0) & (s <= 1.0)
    return np.where(hit, t, np.inf)
