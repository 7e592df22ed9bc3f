"""Write the sample recording: a rosbag2 (MCAP or sqlite3) plus its ground truth as JSON.

`generate_sample` is the library entry (tests and the demo call it in-process); `main` is the
`memory-sample-bag` command. Everything is a pure function of the seed and the duration: the
same arguments give the same ground truth file and the same message bytes, so tests can pin
expected answers and CI can cache the output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.interfaces import (
    Qos,
    QosDurability,
    QosHistory,
    QosLiveliness,
    QosReliability,
    QosTime,
)
from rosbags.rosbag2 import Writer
from rosbags.rosbag2.enums import CompressionFormat, CompressionMode, StoragePlugin
from rosbags.typesys import Stores, get_typestore

from memory_node.core.front_video import register_rosbags_type
from memory_node.sim.floorplan import FaceArrays, FloorPlan, build_flat, cast_rays, pack_faces
from memory_node.sim.lidar import Lidar, LidarModel
from memory_node.sim.render import CameraModel, FrameInfo, Renderer
from memory_node.sim.trajectory import (
    DOOR_VIEW_NEAR,
    NOMINAL_DURATION,
    OdometryTrack,
    Trajectory,
    build_tour,
    compose,
    simulate_odometry,
)

GENERATOR_VERSION = 1
# The question set in ground_truth.json (issue 14): a function of the world and the rest of
# the ground truth, so an earlier sample gains it without re-rendering the bag. 7: visits
# solved from the tour's segments, no longer by the code under test (core.visits).
QUESTIONS_VERSION = 7
QUESTION_KINDS = ("where", "when", "yes_no", "how_long", "count")
VIEW_RANGE = 6.0  # how far a camera view counts as "seeing" for the seen questions (m)
EPOCH_S = 1_764_460_800  # 2025-11-30T00:00:00Z: a fixed start so stamps never depend on the clock
EPOCH_NS = EPOCH_S * 1_000_000_000
BAG_NAME = "flat_bag"
GROUND_TRUTH_NAME = "ground_truth.json"

CAMERA_RATE = 12.0
LIDAR_RATE = 8.0
ODOM_RATE = 20.0
CAMERA_PHASE = 0.02  # s: sensors are not triggered together on a real robot
LIDAR_PHASE = 0.035
PATH_RATE = 2.0
PERSON_WINDOW_NOMINAL = (40.0, 70.0)  # s of the nominal tour
REVISIT_RADIUS = 0.5
REVISIT_MIN_GAP_NOMINAL = 20.0  # s: closer in time is standing still, not coming back
NEVER_VISITED_DISTANCE = 1.5
WINDOW_VIEW_FRACTION = 0.1  # a frame "faces the window" when it fills this share of the image
HOG_RANGE = (1.75, 3.0)  # camera-to-person distances where a 64x128 HOG window fits the person

BASE_HEIGHT = 0.32  # base_link above the floor while standing
CAMERA_XYZ = (0.30, 0.0, 0.08)  # camera_link in base_link
LIDAR_XYZ = (0.28, 0.0, 0.14)  # lidar in base_link
CAMERA = CameraModel(z=BASE_HEIGHT + CAMERA_XYZ[2])
LIDAR = LidarModel(z=BASE_HEIGHT + LIDAR_XYZ[2])

FRAME_MAP, FRAME_ODOM, FRAME_BASE = "map", "odom", "base_link"
FRAME_CAMERA, FRAME_OPTICAL, FRAME_LIDAR = "camera_link", "camera_optical_frame", "lidar"

TOPIC_IMAGE = "/camera/image_raw"
TOPIC_INFO = "/camera/camera_info"
TOPIC_LIDAR = "/lidar/points"
TOPIC_ODOM = "/odom"
TOPIC_TF = "/tf"
TOPIC_TF_STATIC = "/tf_static"

MSGTYPES = {
    TOPIC_TF_STATIC: "tf2_msgs/msg/TFMessage",
    TOPIC_TF: "tf2_msgs/msg/TFMessage",
    TOPIC_ODOM: "nav_msgs/msg/Odometry",
    TOPIC_LIDAR: "sensor_msgs/msg/PointCloud2",
    TOPIC_INFO: "sensor_msgs/msg/CameraInfo",
    TOPIC_IMAGE: "sensor_msgs/msg/Image",
}
TOPIC_ORDER = list(MSGTYPES)  # write order for messages sharing a stamp


@dataclass(frozen=True)
class SampleInfo:
    """Where a sample lives and what it contains."""

    out_dir: Path
    bag_dir: Path
    ground_truth_path: Path
    ground_truth: dict[str, Any]
    reused: bool
    size_bytes: int
    elapsed_s: float


def _qos(depth: int, durability: QosDurability,
         reliability: QosReliability = QosReliability.RELIABLE) -> Qos:
    zero = QosTime(0, 0)
    return Qos(
        QosHistory.KEEP_LAST,
        depth,
        reliability,
        durability,
        zero,
        zero,
        QosLiveliness.AUTOMATIC,
        zero,
        False,
    )


def _quat_yaw(yaw: float) -> tuple[float, float, float, float]:
    return (0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))


def _ns(t_rel: float) -> int:
    return EPOCH_NS + int(round(t_rel * 1e9))


def _ticks(rate: float, phase: float, duration: float) -> np.ndarray:
    n = int(math.floor((duration - phase) * rate + 1e-9)) + 1
    return phase + np.arange(n) / rate


class _Messages:
    """Builds the ROS messages from the typestore's classes (no rclpy needed)."""

    def __init__(self) -> None:
        # unitree_go's Go2FrontVideoData too (the unitree_ros2 profile's front video)
        self.ts = register_rosbags_type(get_typestore(Stores.ROS2_KILTED))
        t = self.ts.types
        self.Time = t["builtin_interfaces/msg/Time"]
        self.Header = t["std_msgs/msg/Header"]
        self.Vector3 = t["geometry_msgs/msg/Vector3"]
        self.Quaternion = t["geometry_msgs/msg/Quaternion"]
        self.Transform = t["geometry_msgs/msg/Transform"]
        self.TransformStamped = t["geometry_msgs/msg/TransformStamped"]
        self.TFMessage = t["tf2_msgs/msg/TFMessage"]
        self.Point = t["geometry_msgs/msg/Point"]
        self.Pose = t["geometry_msgs/msg/Pose"]
        self.PoseCov = t["geometry_msgs/msg/PoseWithCovariance"]
        self.Twist = t["geometry_msgs/msg/Twist"]
        self.TwistCov = t["geometry_msgs/msg/TwistWithCovariance"]
        self.Odometry = t["nav_msgs/msg/Odometry"]
        self.Image = t["sensor_msgs/msg/Image"]
        self.CameraInfo = t["sensor_msgs/msg/CameraInfo"]
        self.RegionOfInterest = t["sensor_msgs/msg/RegionOfInterest"]
        self.PointCloud2 = t["sensor_msgs/msg/PointCloud2"]
        self.PointField: Any = t["sensor_msgs/msg/PointField"]

    def header(self, ns: int, frame: str) -> Any:
        return self.Header(self.Time(ns // 1_000_000_000, ns % 1_000_000_000), frame)

    def transform(
        self,
        ns: int,
        parent: str,
        child: str,
        xyz: tuple[float, float, float],
        quat: tuple[float, float, float, float],
    ) -> Any:
        return self.TransformStamped(
            self.header(ns, parent),
            child,
            self.Transform(self.Vector3(*map(float, xyz)), self.Quaternion(*map(float, quat))),
        )

    def serialize(self, msg: Any) -> bytes:
        return bytes(self.ts.serialize_cdr(msg, msg.__msgtype__))


def _static_transforms(m: _Messages, ns: int) -> Any:
    # optical frame: z forward, x right, y down (REP 103)
    optical = (-0.5, 0.5, -0.5, 0.5)
    return m.TFMessage(
        [
            m.transform(ns, FRAME_BASE, FRAME_CAMERA, CAMERA_XYZ, (0.0, 0.0, 0.0, 1.0)),
            m.transform(ns, FRAME_CAMERA, FRAME_OPTICAL, (0.0, 0.0, 0.0), optical),
            m.transform(ns, FRAME_BASE, FRAME_LIDAR, LIDAR_XYZ, (0.0, 0.0, 0.0, 1.0)),
        ]
    )


def _odom_messages(m: _Messages, track: OdometryTrack, i: int) -> tuple[Any, Any]:
    ns = _ns(float(track.t[i]))
    mo = track.map_to_odom[i]
    ob = track.odom[i]
    tf = m.TFMessage(
        [
            m.transform(ns, FRAME_MAP, FRAME_ODOM, (mo[0], mo[1], 0.0), _quat_yaw(mo[2])),
            m.transform(ns, FRAME_ODOM, FRAME_BASE, (ob[0], ob[1], BASE_HEIGHT), _quat_yaw(ob[2])),
        ]
    )
    pose_cov = np.zeros(36)
    pose_cov[[0, 7, 14, 21, 28, 35]] = [0.02, 0.02, 1e-4, 1e-4, 1e-4, 0.01]
    twist_cov = np.zeros(36)
    twist_cov[[0, 7, 14, 21, 28, 35]] = [0.01, 0.01, 1e-4, 1e-4, 1e-4, 0.005]
    v = track.twist[i]
    odom = m.Odometry(
        m.header(ns, FRAME_ODOM),
        FRAME_BASE,
        m.PoseCov(
            m.Pose(
                m.Point(float(ob[0]), float(ob[1]), BASE_HEIGHT),
                m.Quaternion(*_quat_yaw(float(ob[2]))),
            ),
            pose_cov,
        ),
        m.TwistCov(
            m.Twist(m.Vector3(float(v[0]), float(v[1]), 0.0), m.Vector3(0.0, 0.0, float(v[2]))),
            twist_cov,
        ),
    )
    return tf, odom


def _image_message(m: _Messages, ns: int, img: np.ndarray) -> Any:
    h, w, _ = img.shape
    return m.Image(m.header(ns, FRAME_OPTICAL), h, w, "rgb8", 0, w * 3, img.reshape(-1))


def _camera_info(m: _Messages, ns: int, cam: CameraModel, frame: str = FRAME_OPTICAL) -> Any:
    k = np.array(cam.k_matrix())
    p = np.array([cam.fx, 0.0, cam.cx, 0.0, 0.0, cam.fy, cam.cy, 0.0, 0.0, 0.0, 1.0, 0.0])
    return m.CameraInfo(
        m.header(ns, frame),
        cam.height,
        cam.width,
        "plumb_bob",
        np.zeros(5),
        k,
        np.eye(3).reshape(-1),
        p,
        0,
        0,
        m.RegionOfInterest(0, 0, 0, 0, False),
    )


def _cloud_message(m: _Messages, ns: int, pts: np.ndarray) -> Any:
    f32 = m.PointField.FLOAT32
    fields = [m.PointField(name, 4 * i, f32, 1)
              for i, name in enumerate(["x", "y", "z", "intensity"])]
    data = np.ascontiguousarray(pts, dtype="<f4").view(np.uint8).reshape(-1)
    return m.PointCloud2(
        m.header(ns, FRAME_LIDAR), 1, len(pts), fields, False, 16, 16 * len(pts), data, True
    )


@dataclass
class _World:
    """Everything the recording is made of, before any message is written."""

    plan: FloorPlan
    traj: Trajectory
    track: OdometryTrack
    duration: float
    seed: int
    person_window: tuple[float, float]  # relative seconds
    camera_t: np.ndarray
    lidar_t: np.ndarray
    camera_xyz: tuple[float, float, float] = CAMERA_XYZ  # the rendering camera in base_link
    camera: CameraModel = CAMERA
    camera_rate: float = CAMERA_RATE

    def person_at(self, t: float) -> bool:
        return self.person_window[0] <= t < self.person_window[1]

    def sensor_pose(self, t: float, xyz: tuple[float, float, float]) -> np.ndarray:
        base = self.traj.pose(np.array([t]))
        return compose(base, np.array([xyz[0], xyz[1], 0.0]))[0]


def _build_world(seed: int, duration: float, camera_rate: float = CAMERA_RATE,
                 camera_xyz: tuple[float, float, float] = CAMERA_XYZ) -> _World:
    plan = build_flat()
    traj = Trajectory(build_tour(), duration)
    track = simulate_odometry(traj, ODOM_RATE, seed)
    scale = duration / NOMINAL_DURATION
    window = (PERSON_WINDOW_NOMINAL[0] * scale, PERSON_WINDOW_NOMINAL[1] * scale)
    camera = CAMERA if camera_xyz == CAMERA_XYZ else CameraModel(z=BASE_HEIGHT + camera_xyz[2])
    return _World(
        plan,
        traj,
        track,
        duration,
        seed,
        window,
        _ticks(camera_rate, CAMERA_PHASE, duration),
        _ticks(LIDAR_RATE, LIDAR_PHASE, duration),
        camera_xyz,
        camera,
        camera_rate,
    )


def _events(world: _World) -> Iterator[tuple[int, str, int]]:
    """(stamp ns, topic, index) for every message, in stamp order."""
    items: list[tuple[int, int, str, int]] = [(EPOCH_NS, 0, TOPIC_TF_STATIC, 0)]
    for i, t in enumerate(world.track.t):
        items.append((_ns(float(t)), TOPIC_ORDER.index(TOPIC_TF), TOPIC_TF, i))
        items.append((_ns(float(t)), TOPIC_ORDER.index(TOPIC_ODOM), TOPIC_ODOM, i))
    for i, t in enumerate(world.lidar_t):
        items.append((_ns(float(t)), TOPIC_ORDER.index(TOPIC_LIDAR), TOPIC_LIDAR, i))
    for i, t in enumerate(world.camera_t):
        items.append((_ns(float(t)), TOPIC_ORDER.index(TOPIC_INFO), TOPIC_INFO, i))
        items.append((_ns(float(t)), TOPIC_ORDER.index(TOPIC_IMAGE), TOPIC_IMAGE, i))
    items.sort()
    for ns, _, topic, i in items:
        yield ns, topic, i


@dataclass
class _FrameRecord:
    """What the generator knows about one camera frame: when, from where, what it showed."""

    t: float
    info: FrameInfo
    luma: float
    camera: np.ndarray  # camera pose (x, y, yaw) in map
    base: np.ndarray  # base_link pose (x, y, yaw) in map


def _open_writer(bag_dir: Path, fmt: str) -> Writer:
    """A bag writer (not yet opened) with the sample's compression."""
    plugin = StoragePlugin.MCAP if fmt == "mcap" else StoragePlugin.SQLITE3
    writer = Writer(bag_dir, version=Writer.VERSION_LATEST, storage_plugin=plugin)
    if fmt == "mcap":
        writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)  # chunks
    else:
        writer.set_compression(CompressionMode.MESSAGE, CompressionFormat.ZSTD)
    return writer


def _write_bag(world: _World, bag_dir: Path, fmt: str) -> list[_FrameRecord]:
    """Render, scan and serialize every message into a new bag; return per-frame truth."""
    m = _Messages()
    renderer = Renderer(world.plan, CAMERA)
    lidar = Lidar(world.plan, LIDAR)
    writer = _open_writer(bag_dir, fmt)
    frames: list[_FrameRecord] = []
    odom_cache: dict[int, tuple[Any, Any]] = {}
    luma_w = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    writer.open()
    try:
        conns = {}
        for topic, msgtype in MSGTYPES.items():
            if topic == TOPIC_TF_STATIC:
                qos = _qos(1, QosDurability.TRANSIENT_LOCAL)
            else:
                qos = _qos(100 if topic == TOPIC_TF else 10, QosDurability.VOLATILE)
            conns[topic] = writer.add_connection(
                topic, msgtype, typestore=m.ts, offered_qos_profiles=[qos]
            )
        for ns, topic, i in _events(world):
            if topic == TOPIC_TF_STATIC:
                msg = _static_transforms(m, ns)
            elif topic in (TOPIC_TF, TOPIC_ODOM):
                if i not in odom_cache:
                    odom_cache.clear()
                    odom_cache[i] = _odom_messages(m, world.track, i)
                msg = odom_cache[i][0 if topic == TOPIC_TF else 1]
            elif topic == TOPIC_LIDAR:
                t = float(world.lidar_t[i])
                x, y, yaw = world.sensor_pose(t, LIDAR_XYZ)
                person = world.plan.person if world.person_at(t) else None
                rng = np.random.default_rng([world.seed, 2, i])
                msg = _cloud_message(m, ns, lidar.scan(x, y, yaw, person, rng))
            elif topic == TOPIC_INFO:
                msg = _camera_info(m, ns, CAMERA)
            else:
                t = float(world.camera_t[i])
                pose = world.sensor_pose(t, CAMERA_XYZ)
                person = world.plan.person if world.person_at(t) else None
                img, info = renderer.render(pose[0], pose[1], pose[2], person)
                luma = float((img.reshape(-1, 3).astype(np.float32) @ luma_w).mean())
                base = world.traj.pose(np.array([t]))[0]
                frames.append(_FrameRecord(t, info, luma, pose, base))
                msg = _image_message(m, ns, img)
            writer.write(conns[topic], ns, m.serialize(msg))
    except BaseException:  # an interrupted bag is useless: leave nothing half-written
        writer.abort()
        shutil.rmtree(bag_dir, ignore_errors=True)
        raise
    writer.close()
    return frames


def _r(v: float, nd: int = 4) -> float:
    return round(float(v), nd)


def _stamp(t_rel: float) -> float:
    return round(EPOCH_S + float(t_rel), 6)


def _intervals(
    frames: list[_FrameRecord], pred: Callable[[_FrameRecord], bool], gap: float
) -> list[dict[str, Any]]:
    """Merge the frames where `pred` holds into time intervals (absolute stamps)."""
    out: list[dict[str, Any]] = []
    for f in frames:
        if not pred(f):
            continue
        if out and f.t - out[-1]["_last"] <= gap:
            out[-1]["_last"] = f.t
            out[-1]["frames"] += 1
        else:
            out.append({"_first": f.t, "_last": f.t, "frames": 1})
    return [
        {"t_start": _stamp(o["_first"]), "t_end": _stamp(o["_last"]), "frames": o["frames"]}
        for o in out
    ]


def _door_visible(world: _World, faces: FaceArrays, f: _FrameRecord, max_dist: float = 4.5) -> bool:
    """The door's centre is in the field of view, near enough, and no wall hides it."""
    door = world.plan.feature("front_door").center
    x, y, yaw = f.camera
    dx, dy = door[0] - x, door[1] - y
    depth = dx * math.cos(yaw) + dy * math.sin(yaw)
    lateral = -dx * math.sin(yaw) + dy * math.cos(yaw)
    if depth <= 0.2 or math.hypot(dx, dy) > max_dist:
        return False
    if abs(lateral / depth) > world.camera.cx / world.camera.fx * 0.9:
        return False
    # line of sight: the nearest wall along the ray must be the door's wall
    d = np.array([[dx, dy]]) / math.hypot(dx, dy)
    t, _ = cast_rays(np.array([x, y]), d, faces)
    return bool(t[0] >= math.hypot(dx, dy) - 0.05)


def _ground_truth(world: _World, frames: list[_FrameRecord], fmt: str) -> dict[str, Any]:
    plan = world.plan
    dur = world.duration
    scale = dur / NOMINAL_DURATION
    tp = np.arange(int(math.floor(dur * PATH_RATE + 1e-9)) + 1) / PATH_RATE
    path = world.traj.pose(tp)
    path_list = [
        {"t": _stamp(t), "x": _r(p[0]), "y": _r(p[1]), "yaw": _r(p[2])}
        for t, p in zip(tp, path, strict=True)
    ]

    # revisits: a later path sample within REVISIT_RADIUS of a sample long enough before it
    gap = REVISIT_MIN_GAP_NOMINAL * scale
    dist = np.hypot(path[:, None, 0] - path[None, :, 0], path[:, None, 1] - path[None, :, 1])
    earlier = (tp[:, None] - tp[None, :]) >= gap
    close = np.where(earlier, dist, np.inf)
    best_j = np.argmin(close, axis=1)
    best_d = close[np.arange(len(tp)), best_j]
    hits = np.flatnonzero(best_d <= REVISIT_RADIUS)
    rooms = [plan.room_at(p[0], p[1]) for p in path]
    breaks = [
        k + 1
        for k in range(len(hits) - 1)
        if hits[k + 1] - hits[k] > 1 or rooms[hits[k + 1]] != rooms[hits[k]]
    ]
    episodes = np.split(hits, breaks) if len(hits) else []
    revisits: list[dict[str, Any]] = []
    for ep in episodes:  # one entry per return, at its closest approach
        i = int(ep[np.argmin(best_d[ep])])
        j = int(best_j[i])
        revisits.append(
            {
                "t": _stamp(tp[i]),
                "x": _r(path[i, 0]),
                "y": _r(path[i, 1]),
                "earlier_t": _stamp(tp[j]),
                "earlier_x": _r(path[j, 0]),
                "earlier_y": _r(path[j, 1]),
                "distance": _r(best_d[i]),
                "room": plan.room_at(path[i, 0], path[i, 1]),
            }
        )
    k = len(tp) - 1
    j = int(np.argmin(close[k]))
    final = {
        "t": _stamp(tp[k]),
        "x": _r(path[k, 0]),
        "y": _r(path[k, 1]),
        "yaw": _r(path[k, 2]),
        "room": plan.room_at(path[k, 0], path[k, 1]),
        "earlier_t": _stamp(tp[j]) if np.isfinite(close[k, j]) else None,
        "distance": _r(close[k, j]) if np.isfinite(close[k, j]) else None,
        "revisit": bool(close[k, j] <= REVISIT_RADIUS),
    }

    # never visited: free points far from the whole path, spread out by farthest-point picking
    fine = world.traj.pose(np.linspace(0.0, dur, 3001))[:, :2]
    x0, y0, x1, y1 = plan.bounds
    grid = [
        (gx, gy)
        for gx in np.arange(x0 + 0.25, x1, 0.25)
        for gy in np.arange(y0 + 0.25, y1, 0.25)
        if plan.is_free(gx, gy, 0.3)
    ]
    cand = np.array(grid)
    dmin = np.sqrt(((cand[:, None, :] - fine[None, :, :]) ** 2).sum(-1)).min(axis=1)
    cand, dmin = cand[dmin > NEVER_VISITED_DISTANCE], dmin[dmin > NEVER_VISITED_DISTANCE]
    chosen: list[int] = []
    if len(cand):
        chosen.append(int(np.argmax(dmin)))
        while len(chosen) < min(5, len(cand)):
            diff = cand[:, None, :] - cand[None, chosen, :]
            spread = np.sqrt((diff**2).sum(-1)).min(axis=1)
            chosen.append(int(np.argmax(spread)))
    never = [
        {
            "x": _r(cand[i, 0], 3),
            "y": _r(cand[i, 1], 3),
            "distance_to_path": _r(dmin[i], 3),
            "room": plan.room_at(cand[i, 0], cand[i, 1]),
        }
        for i in chosen
    ]

    landmarks: dict[str, Any] = {}
    for feat in plan.features:
        c = feat.center
        landmarks[feat.name] = {
            "x": _r(c[0]),
            "y": _r(c[1]),
            "color": feat.color,
            "kind": feat.kind,
            "room": feat.room,
        }
    for p in plan.props:
        c = p.center
        landmarks[p.name] = {
            "x": _r(c[0]),
            "y": _r(c[1]),
            "color": p.color,
            "kind": p.kind,
            "room": p.room,
            "height": p.height,
        }
    win = plan.feature("window")
    lit = next(b for b in win.bands if b.emissive)
    door = plan.feature("front_door")
    person = plan.person

    person_frames = []
    for f in frames:
        v = f.info.person
        if v is None:
            continue
        u0, v0, u1, v1 = v.bbox
        px_h = world.camera.fy * person.height / v.distance
        margin = 0.34 * px_h  # half a HOG window's width around the person's centre
        centre = (u0 + u1) / 2
        detectable = (
            v.visible_fraction >= 0.99
            and HOG_RANGE[0] <= v.distance <= HOG_RANGE[1]
            and margin <= centre <= world.camera.width - margin
        )
        person_frames.append(
            {
                "t": _stamp(f.t),
                "distance": _r(v.distance, 3),
                "bbox": list(v.bbox),
                "visible_fraction": _r(v.visible_fraction, 3),
                "detectable": detectable,
            }
        )
    lumas = np.array([f.luma for f in frames], dtype=np.float64)
    order = np.argsort(-lumas, kind="stable")[:10]
    brightest = [
        {
            "t": _stamp(frames[i].t),
            "mean_luma": _r(lumas[i], 2),
            "x": _r(frames[i].base[0]),
            "y": _r(frames[i].base[1]),
            "yaw": _r(frames[i].base[2]),
            "window_fraction": _r(frames[i].info.window_fraction, 3),
        }
        for i in order
    ]
    dt_cam = 1.5 / world.camera_rate
    walls = pack_faces(plan.wall_faces(), [r.name for r in plan.rooms])
    track = world.track
    odom_in_map0 = compose(track.truth[0], track.odom)  # where odometry alone puts the robot
    drift = np.hypot(*(odom_in_map0[:, :2] - track.truth[:, :2]).T)

    counts = {
        TOPIC_TF_STATIC: 1,
        TOPIC_TF: len(track.t),
        TOPIC_ODOM: len(track.t),
        TOPIC_LIDAR: len(world.lidar_t),
        TOPIC_INFO: len(world.camera_t),
        TOPIC_IMAGE: len(world.camera_t),
    }
    rates = {
        TOPIC_TF_STATIC: None,
        TOPIC_TF: ODOM_RATE,
        TOPIC_ODOM: ODOM_RATE,
        TOPIC_LIDAR: LIDAR_RATE,
        TOPIC_INFO: CAMERA_RATE,
        TOPIC_IMAGE: CAMERA_RATE,
    }
    frame_ids = {
        TOPIC_TF_STATIC: None,
        TOPIC_TF: None,
        TOPIC_ODOM: FRAME_ODOM,
        TOPIC_LIDAR: FRAME_LIDAR,
        TOPIC_INFO: FRAME_OPTICAL,
        TOPIC_IMAGE: FRAME_OPTICAL,
    }
    return {
        "generator_version": GENERATOR_VERSION,
        "seed": world.seed,
        "epoch": EPOCH_S,
        "duration": dur,
        "time_scale": _r(scale, 6),
        "bag": {
            "dir": BAG_NAME,
            "format": fmt,
            "compression": "zstd chunks" if fmt == "mcap" else "zstd per message",
        },
        "rooms": {
            r.name: {
                "box": list(r.box),
                "center": [_r(c) for c in r.center],
                "polygon": [
                    [r.box[0], r.box[1]],
                    [r.box[2], r.box[1]],
                    [r.box[2], r.box[3]],
                    [r.box[0], r.box[3]],
                ],
            }
            for r in plan.rooms
            for c in [r.center]
        },
        "doorways": {
            d.name: {
                "x": _r((d.p0[0] + d.p1[0]) / 2),
                "y": _r((d.p0[1] + d.p1[1]) / 2),
                "rooms": list(d.rooms),
            }
            for d in plan.doorways
        },
        "landmarks": landmarks,
        "window": {
            "x": _r(win.center[0]),
            "y": _r(win.center[1]),
            "width": _r(win.width),
            "z_min": lit.z0,
            "z_max": lit.z1,
            "room": win.room,
            "wall": "north",
            "rgb": list(lit.rgb),
        },
        "front_door": {
            "x": _r(door.center[0]),
            "y": _r(door.center[1]),
            "width": _r(door.width),
            "room": door.room,
            "color": door.color,
        },
        "person": {
            "x": person.x,
            "y": person.y,
            "height": person.height,
            "room": plan.room_at(person.x, person.y),
            "t_start": _stamp(world.person_window[0]),
            "t_end": _stamp(world.person_window[1]),
        },
        "marks": {k: _stamp(world.traj.at_mark(k)) for k in world.traj.tour.marks},
        "path": path_list,
        "revisits": revisits,
        "final": final,
        "never_visited": never,
        "views": {
            "person_frames": person_frames,
            "front_door": _intervals(frames, lambda f: _door_visible(world, walls, f), dt_cam),
            "window": _intervals(
                frames, lambda f: f.info.window_fraction >= WINDOW_VIEW_FRACTION, dt_cam
            ),
            "brightest": brightest,
            "median_luma": _r(float(np.median(lumas)), 2) if len(lumas) else None,
        },
        "odometry": {"final_drift_m": _r(drift[-1]), "max_drift_m": _r(drift.max())},
        "topics": {
            topic: {
                "type": MSGTYPES[topic],
                "count": counts[topic],
                "rate_hz": rates[topic],
                "frame_id": frame_ids[topic],
            }
            for topic in TOPIC_ORDER
        },
        "frames": {
            FRAME_MAP: {"parent": None},
            FRAME_ODOM: {"parent": FRAME_MAP, "topic": TOPIC_TF, "rate_hz": ODOM_RATE},
            FRAME_BASE: {
                "parent": FRAME_ODOM,
                "topic": TOPIC_TF,
                "rate_hz": ODOM_RATE,
                "height": BASE_HEIGHT,
            },
            FRAME_CAMERA: {
                "parent": FRAME_BASE,
                "topic": TOPIC_TF_STATIC,
                "xyz": list(CAMERA_XYZ),
                "quat_xyzw": [0.0, 0.0, 0.0, 1.0],
            },
            FRAME_OPTICAL: {
                "parent": FRAME_CAMERA,
                "topic": TOPIC_TF_STATIC,
                "xyz": [0.0, 0.0, 0.0],
                "quat_xyzw": [-0.5, 0.5, -0.5, 0.5],
            },
            FRAME_LIDAR: {
                "parent": FRAME_BASE,
                "topic": TOPIC_TF_STATIC,
                "xyz": list(LIDAR_XYZ),
                "quat_xyzw": [0.0, 0.0, 0.0, 1.0],
            },
        },
        "camera": {
            "width": world.camera.width,
            "height": world.camera.height,
            "fx": world.camera.fx,
            "fy": world.camera.fy,
            "cx": world.camera.cx,
            "cy": world.camera.cy,
            "height_above_floor": _r(world.camera.z),
            "hfov_deg": _r(world.camera.hfov_deg, 2),
        },
        "lidar": {
            "beams": LIDAR.beams,
            "elevations_deg": list(LIDAR.elevations_deg),
            "max_range": LIDAR.max_range,
            "height_above_floor": _r(LIDAR.z),
            "fields": ["x", "y", "z", "intensity"],
        },
    }


def _true_visits(world: _World, x: float, y: float, radius: float) -> list[tuple[float, float]]:
    """(start, end) of the robot's visits to a circle (absolute stamps), as one watching it
    would say: each unbroken stretch of time its base is within `radius` of (x, y), from the
    tour's own moves, turns and pauses (`Trajectory.within`). Not from `core.visits`, the code
    the answers are checked against, nor from samples of the path. The tour stays in each
    place 1.4 s or more and away 17 s or more between visits (150 s recording), so no rule
    joins or drops short stretches."""
    return [(a + EPOCH_S, b + EPOCH_S) for a, b in world.traj.within(x, y, radius)]


def _seen(world: _World, walls: FaceArrays, x: float, y: float) -> bool:
    """Whether any camera frame had (x, y) in view, within VIEW_RANGE, with no wall between."""
    for t in world.camera_t[::3]:
        cx, cy, yaw = world.sensor_pose(float(t), world.camera_xyz)
        dx, dy = x - cx, y - cy
        dist = math.hypot(dx, dy)
        depth = dx * math.cos(yaw) + dy * math.sin(yaw)
        lateral = -dx * math.sin(yaw) + dy * math.cos(yaw)
        fov = world.camera.cx / world.camera.fx
        if depth <= 0.2 or dist > VIEW_RANGE or abs(lateral / depth) > fov:
            continue
        hit, _ = cast_rays(np.array([cx, cy]), np.array([[dx / dist, dy / dist]]), walls)
        if hit[0] >= dist - 0.3:
            return True
    return False


def _yes_no_questions(world: _World, gt: dict[str, Any], places: dict[str, dict[str, float]],
                      person_seen: bool, add: Callable[..., None]) -> None:
    """Been there? Seen that? Anyone there?"""
    plan = world.plan

    def clock(t: float) -> str:
        return f"{t - EPOCH_S:.0f} s into the recording"

    for i, nv in enumerate(gt["never_visited"]):
        add("yes_no", f"been-never-{i}", f"Have you been at x={nv['x']}, y={nv['y']}?",
            {"type": "been_at", "x": nv["x"], "y": nv["y"], "radius": 1.0}, False)
    for i, rv in enumerate(gt["revisits"][:3]):
        add("yes_no", f"been-revisit-{i}",
            f"Had you been at x={rv['x']}, y={rv['y']} before {clock(rv['t'])}?",
            {"type": "been_at", "x": rv["x"], "y": rv["y"], "radius": 1.0,
             "before": rv["t"] - 10.0}, True)
    walls = pack_faces(plan.wall_faces(), [r.name for r in plan.rooms])
    for name in ("window", "plant", "tv", "fridge", "bed", "wardrobe", "kitchen_counter"):
        lm = gt["landmarks"][name]
        add("yes_no", f"seen-{name}", f"Did you see the {name} (x={lm['x']}, y={lm['y']})?",
            {"type": "seen_near", "x": lm["x"], "y": lm["y"], "radius": 0.75},
            _seen(world, walls, lm["x"], lm["y"]))
    for i, nv in enumerate(gt["never_visited"]):
        add("yes_no", f"seen-never-{i}",
            f"Did you see the floor at x={nv['x']}, y={nv['y']} (where you never went)?",
            {"type": "seen_near", "x": nv["x"], "y": nv["y"], "radius": 0.3},
            _seen(world, walls, nv["x"], nv["y"]))
    x0, y0, x1, y1 = plan.bounds
    outside = {"north": ((x0 + x1) / 2, y1 + 1.0), "south": ((x0 + x1) / 2, y0 - 1.0),
               "east": (x1 + 1.0, (y0 + y1) / 2), "west": (x0 - 1.0, (y0 + y1) / 2)}
    for side, (ox, oy) in outside.items():
        add("yes_no", f"seen-outside-{side}",
            f"Did you see the spot x={ox:.2f}, y={oy:.2f} (outside the {side} wall)?",
            {"type": "seen_near", "x": _r(ox), "y": _r(oy), "radius": 0.3},
            _seen(world, walls, ox, oy))
    door = gt["front_door"]
    add("yes_no", "person-at-door", "Did you see anyone near the front door?",
        {"type": "seen_with", "x": door["x"], "y": door["y"], "radius": 3.5,
         "tags": {"person": True}}, person_seen)
    kitchen = places["kitchen"]
    add("yes_no", "person-in-kitchen", "Did you see anyone while you were in the kitchen?",
        {"type": "seen_with", "x": kitchen["x"], "y": kitchen["y"],
         "radius": kitchen["radius"], "tags": {"person": True}}, False)


def _places(world: _World) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The places the questions name (rooms, doorways, spots the robot stood at), each a
    circle, and which of them are spots."""
    plan = world.plan
    places: dict[str, dict[str, float]] = {}
    for r in plan.rooms:
        x0, y0, x1, y1 = r.box
        places[r.name.replace("_", " ")] = {
            "x": _r((x0 + x1) / 2), "y": _r((y0 + y1) / 2),
            "radius": _r(0.45 * min(x1 - x0, y1 - y0), 2)}
    for d in plan.doorways:
        places[f"{d.rooms[0].replace('_', ' ')}-{d.rooms[1].replace('_', ' ')} doorway"] = {
            "x": _r((d.p0[0] + d.p1[0]) / 2), "y": _r((d.p0[1] + d.p1[1]) / 2),
            "radius": 0.4}  # a doorway's waypoints lie 0.5 m or more from its middle
    spots = {"window spot": world.traj.pose(np.array([world.traj.at_mark("window_1")]))[0],
             "tv spot": world.traj.pose(np.array([world.traj.at_mark("tv")]))[0],
             "door watch spot": np.array([*DOOR_VIEW_NEAR, 0.0]),
             "bedroom spot": world.traj.pose(
                 np.array([world.traj.at_mark("bedroom_look_around")]))[0]}
    for name, p in spots.items():
        places[name] = {"x": _r(p[0]), "y": _r(p[1]), "radius": 0.6}
    return places, list(spots)


def _questions(world: _World, gt: dict[str, Any]) -> dict[str, Any]:
    """The question set: what a robot's user asks (where, when, what/yes-no, how long, how
    many), each with the expected answer, a tolerance and `ask`, the structured form that
    `memory-eval` maps to skill calls. Places are named first (`places`), as a user would."""
    plan = world.plan
    places, spots = _places(world)
    visits = {n: _true_visits(world, p["x"], p["y"], p["radius"]) for n, p in places.items()}
    qs: list[dict[str, Any]] = []

    def add(kind: str, qid: str, question: str, ask: dict[str, Any], answer: Any,
            tolerance: float | None = None) -> None:
        qs.append({"id": qid, "kind": kind, "question": question, "ask": ask,
                   "answer": answer, "tolerance": tolerance})

    def clock(t: float) -> str:
        return f"{t - EPOCH_S:.0f} s into the recording"

    # where: the robot's position at a moment; where the brightest view was
    for mark in sorted(world.traj.tour.marks, key=world.traj.at_mark):
        t = world.traj.at_mark(mark)
        p = world.traj.pose(np.array([t]))[0]
        add("where", f"where-{mark}", f"Where were you {clock(_stamp(t))} ({mark})?",
            {"type": "pose_at", "t": _stamp(t)}, {"x": _r(p[0]), "y": _r(p[1])}, 0.75)
    b = gt["views"]["brightest"][0]
    add("where", "where-brightest", "Where were you when you saw the brightest view?",
        {"type": "brightest"}, {"x": b["x"], "y": b["y"]}, 1.0)
    # when: first and last time in each room; first and last sight of a person
    for name in [r.name.replace("_", " ") for r in plan.rooms]:
        v = visits[name]
        if not v:
            continue
        add("when", f"when-first-{name}", f"When were you first in the {name}?",
            {"type": "first_visit", "place": name}, _r(v[0][0], 3), 3.0)
        add("when", f"when-last-{name}", f"When were you last in the {name}?",
            {"type": "last_visit", "place": name}, _r(v[-1][1], 3), 3.0)
    seen = [f["t"] for f in gt["views"]["person_frames"] if f["detectable"]]
    if seen:
        add("when", "when-person-first", "When did you first see a person?",
            {"type": "first_seen", "tags": {"person": True}}, seen[0], 6.0)
        add("when", "when-person-last", "When did you last see a person?",
            {"type": "last_seen", "tags": {"person": True}}, seen[-1], 6.0)
    _yes_no_questions(world, gt, places, bool(seen), add)
    # how long, how many
    for name in [*[r.name.replace("_", " ") for r in plan.rooms], *spots]:
        total = sum(b - a for a, b in visits[name])
        add("how_long", f"how-long-{name}", f"How long were you in the {name}, in all?",
            {"type": "time_in", "place": name}, _r(total, 2), _r(max(2.0, 0.1 * total), 2))
    for name in [*[r.name.replace("_", " ") for r in plan.rooms],
                 *[n for n in places if n.endswith("doorway")]]:
        add("count", f"count-{name}", f"How many times were you in the {name}?",
            {"type": "visits_count", "place": name}, len(visits[name]), 0)
    return {"questions_version": QUESTIONS_VERSION, "places": places, "questions": qs}


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _existing(out_dir: Path, seed: int, duration: float, fmt: str, profile: str = "default",
              robots: int = 1, front_video_codec: str | None = None) -> dict[str, Any] | None:
    """The ground truth of a complete earlier output with the same arguments, else None."""
    gt_path = out_dir / GROUND_TRUTH_NAME
    if not gt_path.is_file() or not (out_dir / BAG_NAME / "metadata.yaml").is_file():
        return None
    try:
        gt = json.loads(gt_path.read_text())
    except (OSError, ValueError):
        return None
    same = (
        gt.get("generator_version") == GENERATOR_VERSION
        and gt.get("seed") == seed
        and gt.get("duration") == duration
        and gt.get("bag", {}).get("format") == fmt
        and gt.get("profile", "default") == profile
        and gt.get("robot_count", 1) == robots
        and gt.get("front_video", {}).get("codec") == front_video_codec
    )
    if not same:
        msg = (
            f"{out_dir} holds a sample made with other arguments (seed {gt.get('seed')}, "
            f"duration {gt.get('duration')}, format {gt.get('bag', {}).get('format')}, "
            f"profile {gt.get('profile', 'default')}, robots {gt.get('robot_count', 1)}, "
            f"front video {gt.get('front_video', {}).get('codec')}); "
            "use force=True / --force to regenerate"
        )
        raise FileExistsError(msg)
    if profile == "default" and gt.get("questions_version") != QUESTIONS_VERSION:
        # An earlier sample of the same recording: add the question set (the bag is as is).
        gt.update(_questions(_build_world(seed, duration), gt))
        tmp = gt_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(gt, indent=1, sort_keys=True) + "\n")
        tmp.replace(gt_path)
    return gt


def generate_sample(
    out_dir: Path,
    seed: int = 7,
    duration_s: float = NOMINAL_DURATION,
    fmt: str = "mcap",
    force: bool = False,
    profile: str = "default",
    robots: int = 1,
    front_video_codec: str = "h264",
) -> SampleInfo:
    """Write OUT_DIR/flat_bag (rosbag2) and OUT_DIR/ground_truth.json, or reuse them.

    `profile` picks the wire format: the default sample, or a Go2 driver stack's topics,
    frames, QoS, stamps and timing (`go2_ros2_sdk`, `unitree_ros2`; see sim/stacks.py);
    `robots` > 1 is go2_ros2_sdk's multi-robot mode; `front_video_codec` (h264 or jpeg) is
    unitree_ros2's front video payload. The ground truth file is written last, so
    its presence marks a complete output; an existing complete output made with the same
    arguments is reused unless `force`.
    """
    from memory_node.sim.stacks import PROFILES

    if fmt not in ("mcap", "sqlite3"):
        raise ValueError(f"format must be mcap or sqlite3, not {fmt!r}")
    if duration_s <= 0:
        raise ValueError("duration must be positive")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if robots < 1 or (robots > 1 and profile != "go2_ros2_sdk"):
        raise ValueError("robots must be 1, or more with profile go2_ros2_sdk (its "
                         "multi-robot mode)")
    from memory_node.sim.front_video import CODECS

    if front_video_codec not in CODECS:
        raise ValueError(f"front video codec must be one of {', '.join(CODECS)}, not "
                         f"{front_video_codec!r}")
    codec = front_video_codec if profile == "unitree_ros2" else None
    duration = float(duration_s)
    out_dir = Path(out_dir)
    bag_dir = out_dir / BAG_NAME
    gt_path = out_dir / GROUND_TRUTH_NAME
    start = time.monotonic()
    if not force:
        gt = _existing(out_dir, seed, duration, fmt, profile, robots, codec)
        if gt is not None:
            return SampleInfo(
                out_dir, bag_dir, gt_path, gt, True, _dir_size(bag_dir), time.monotonic() - start
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    gt_path.unlink(missing_ok=True)
    if bag_dir.exists():
        shutil.rmtree(bag_dir)
    if profile == "default":
        world = _build_world(seed, duration)
        frames = _write_bag(world, bag_dir, fmt)
        gt = _ground_truth(world, frames, fmt)
        gt.update(_questions(world, gt))
    else:
        gt = _stack_sample(seed, duration, fmt, profile, robots, bag_dir, codec or "h264")
    tmp = gt_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(gt, indent=1, sort_keys=True) + "\n")
    tmp.replace(gt_path)
    return SampleInfo(
        out_dir, bag_dir, gt_path, gt, False, _dir_size(bag_dir), time.monotonic() - start
    )


PROFILE_PATH_RATE = 10.0  # Hz of the per-robot paths in a profile's ground truth


def _stack_sample(seed: int, duration: float, fmt: str, profile: str, robots: int,
                  bag_dir: Path, front_video_codec: str = "h264") -> dict[str, Any]:
    """A driver stack's recording and its ground truth: the flat's (as the default sample's),
    the stack's topics and frames, each robot's true path in the map and the path its pose
    source gives (`expected_path`: what a correct recorder stores), and the clouds' geometry."""
    from memory_node.sim import stacks
    from memory_node.sim.front_video import GOP

    go2 = profile == "go2_ros2_sdk"
    world = (_build_world(seed, duration, stacks.CAMERA_RATE, stacks.CAMERA_IN_BASE) if go2
             else _build_world(seed, duration, stacks.UNITREE_VIDEO_RATE, stacks.CAMERA_IN_BASE))
    frames, out = stacks.write_stack_bag(sys.modules[__name__], world, bag_dir, fmt, profile,
                                         robots, front_video_codec)
    gt = _ground_truth(world, frames, fmt)
    if frames:
        gt.update(_questions(world, gt))
    t = np.arange(int(math.floor(duration * PROFILE_PATH_RATE + 1e-9)) + 1) / PROFILE_PATH_RATE

    def samples(p: np.ndarray) -> list[list[float]]:
        return [[_stamp(a), _r(b[0]), _r(b[1]), _r(b[2])] for a, b in zip(t, p, strict=True)]

    runs = []
    for run in out.robots:
        if go2 and robots == 1:
            frame, source, expected = "map", "map <- base_link: SLAM map -> odom and the "\
                "driver's odom -> base_link on /tf", run.truth(t)
        elif go2:
            frame, source, expected = "map", "the driver's odometry in the shared odom frame "\
                "(map -> odom is the latched identity)", run.odom_at(t)
        else:
            frame, source, expected = "odom", "/utlidar/robot_odom (no TF)", run.odom_at(t)
        runs.append({"index": run.index, "frame_prefix": run.prefix, "namespace": run.ns,
                     "base_frame": run.frame("base_link"),
                     "true_path": samples(run.truth(t)),
                     "expected_path": {"frame": frame, "source": source,
                                       "samples": samples(expected)}})
    gt.update({
        "profile": profile,
        "robot_count": robots,
        "robots": runs,
        "topics": out.topics,
        "frames": out.frames,
        "clouds": out.clouds,
        "path_rate_hz": PROFILE_PATH_RATE,
    })
    if go2:
        gt["camera"]["frame"] = "front_camera"
        gt["camera"]["xyz_in_base_link"] = list(stacks.CAMERA_IN_BASE)
        gt["camera"]["encoding"] = "bgr8"
        gt["camera"]["driver_size"] = [1280, 720]
        gt["lidar"]["fields"] = ["x", "y", "z", "intensity"]
        gt["lidar"]["content"] = (f"voxel map chunk in odom: {stacks.VOXEL} m voxels within "
                                  f"{stacks.CHUNK_HALF} m (x and y) of the robot")
    else:
        gt["camera"]["frame"] = None  # no header: placed by camera_mount_* (no TF)
        gt["camera"]["xyz_in_base_link"] = list(stacks.CAMERA_IN_BASE)
        gt["camera"]["encoding"] = front_video_codec
        gt["front_video"] = {"topic": stacks.UNITREE_VIDEO_TOPIC, "codec": front_video_codec,
                             "gop": GOP if front_video_codec == "h264" else None,
                             "sizes": {"720p": [CAMERA.width, CAMERA.height],
                                       "360p": [CAMERA.width // 2, CAMERA.height // 2],
                                       "180p": [CAMERA.width // 4, CAMERA.height // 4]},
                             "time_frame": "milliseconds since the epoch (the sample's choice: "
                                           "the real unit is undocumented)"}
        gt["lidar"]["fields"] = [f[0] for f in stacks.UNITREE_FIELDS]
        gt["lidar"]["point_step"] = 32
        gt["lidar"]["frame"] = "utlidar_lidar"
    gt["lidar"]["mount_in_base_link"] = {"xyz": list(stacks.RADAR_XYZ),
                                         "rpy": [0.0, stacks.RADAR_PITCH, 0.0]}
    gt["lidar"]["height_above_floor"] = _r(BASE_HEIGHT + stacks.RADAR_XYZ[2])
    return gt


def payload_digest(bag_dir: Path) -> str:
    """SHA-256 over (topic, stamp, bytes) of every message: equal digests, equal recordings."""
    from rosbags.rosbag2 import Reader

    h = hashlib.sha256()
    with Reader(bag_dir) as reader:
        for conn, stamp, data in reader.messages():
            h.update(conn.topic.encode())
            h.update(stamp.to_bytes(8, "little"))
            h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    """`memory-sample-bag OUT_DIR [--seed N] [--duration S] [--format F] [--profile P]
    [--robots N] [--force]`."""
    parser = argparse.ArgumentParser(
        prog="memory-sample-bag",
        description="Write a deterministic sample recording of a Go2-like robot exploring a "
        "small flat: OUT_DIR/flat_bag (rosbag2) and OUT_DIR/ground_truth.json.",
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--duration",
        type=float,
        default=NOMINAL_DURATION,
        help="seconds of recording (the same tour, time-scaled)",
    )
    parser.add_argument("--format", choices=("mcap", "sqlite3"), default="mcap")
    parser.add_argument(
        "--profile", choices=("default", "go2_ros2_sdk", "unitree_ros2"), default="default",
        help="wire format: the default sample, or a Go2 driver stack's topics, frames, QoS, "
        "stamps and timing (replay it into memory-node --config config/<profile>.yaml)")
    parser.add_argument(
        "--robots", type=int, default=1,
        help="go2_ros2_sdk only: robots in the bag; 2 or more is the driver's multi-robot "
        "mode (topics /robotN/..., frames robotN/base_link, ...)")
    parser.add_argument(
        "--front-video-codec", choices=("h264", "jpeg"), default="h264",
        help="unitree_ros2 only: the front video's payload on /frontvideostream, H.264 "
        "Annex-B access units (libx264) or JPEG images (default h264)")
    parser.add_argument("--force", action="store_true", help="regenerate even if present")
    args = parser.parse_args(argv)
    try:
        info = generate_sample(args.out_dir, args.seed, args.duration, args.format, args.force,
                               args.profile, args.robots, args.front_video_codec)
    except ValueError as exc:
        print(f"memory-sample-bag: {exc}", file=sys.stderr)
        return 2
    except FileExistsError as exc:
        print(f"memory-sample-bag: {exc}", file=sys.stderr)
        return 2
    gt = info.ground_truth
    verb = "reused existing" if info.reused else "generated"
    print(f"{verb} {gt.get('profile', 'default')} sample in {info.out_dir} "
          f"({info.elapsed_s:.1f} s)")
    print(f"  bag: {info.bag_dir} ({gt['bag']['format']}, {info.size_bytes / 1e6:.1f} MB)")
    print(f"  ground truth: {info.ground_truth_path}")
    for topic, t in gt["topics"].items():
        print(f"  {topic}: {t['count']} x {t['type']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
