"""The sample flat as the Go2's two ROS 2 driver stacks put it on the wire.

`memory-sample-bag --profile go2_ros2_sdk|unitree_ros2` writes the same tour of the same flat
with the topics, frames, QoS, stamps, TF topology and timing of a real stack, so a profile
of the recorder can be checked against ground truth before it meets the robot. Facts come from
the drivers' sources: abizovnuralem/go2_ros2_sdk (`go2_robot_sdk/urdf/go2.urdf` and
`multi_go2.urdf`, `infrastructure/ros2/ros2_publisher.py`, `presentation/go2_driver_node.py`,
`launch/robot.launch.py`, `config/mapper_params_online_async.yaml`) and
unitreerobotics/unitree_ros2 (`README.md`).

go2_ros2_sdk, one robot:
- `/tf_static`: robot_state_publisher latches every fixed joint of go2.urdf first, including
  the identities map -> odom and odom -> base_link, stamped when it started (with the launch,
  RSP_LEAD before the driver streams);
- `/tf`: the driver's odom -> base_link at 17 Hz; slam_toolbox's map -> odom, published every
  20 ms with the stamp of the last scan it received plus `transform_timeout` (0.2 s), so most
  messages repeat a stamp (its TF_REPEATED_DATA) and the newest one lies ahead of the clock,
  while its value changes only when a scan is matched (every 0.5 s);
  robot_state_publisher's leg joints below base_link at 1 Hz;
- `/odom`: pose only (twist and covariances zero), the same samples as the driver's TF, but
  arriving in bursts (2-4 messages 1 ms apart, about 5 times a second) 2-3 s after their
  stamps (go2_ros2_sdk issue #231); the bag's receive times say so;
- `/point_cloud2`: the decoded voxel map chunk in frame `odom` (not a scan): the flat's
  surfaces on a 5 cm grid within 3.2 m of the robot, 7 Hz, best effort, depth 1;
- `/camera/image_raw`: bgr8, frame `front_camera` (a link of the URDF, optical axes), 15 Hz,
  best effort, depth 1, with `/camera/camera_info`. The driver's frames are 1280x720 with a
  73 degree field of view; the sample renders the flat's usual 320x240, 90 degree pinhole, so
  every ground-truth answer about views and the person holds (the recorder's handling of a
  raw bgr8 image does not depend on its size; a profile's 73 degree views are narrower than
  the rendered images, never wider).
Several robots (`robots` > 1, the driver's multi-robot mode): topics `/robotN/...`, frames
`robotN/base_link`, `robotN/front_camera`, ... (map and odom are shared and unprefixed, as in
multi_go2.urdf), clouds still in `odom`; no SLAM (slam_toolbox's base_frame is base_link, which
no robot has in that mode), so map -> odom stays the latched identity and each robot's
odometry is its pose in the shared odom frame. Robots 1, 2, ... walk the tour backwards
(each with odometry noise of its own); the ground truth's views and clouds are robot 0's.
Every robot's odom frame is the flat's frame (it booted at the flat's origin): the identities
latched at start hold until odometry drifts, and SLAM's correction starts at the identity.

unitree_ros2: no TF at all; `/utlidar/robot_odom` (odom -> base_link, twist filled) with zero
header stamps; `/utlidar/cloud` in frame `utlidar_lidar` (x, y, z, intensity, ring, time;
point_step 32), which nothing links to base_link (the sensor sits where go2.urdf's
`radar_joint` puts it, pitched 2.8782 rad); no sensor_msgs/Image: the front camera is
`/frontvideostream` (unitree_go/msg/Go2FrontVideoData, no header), one H.264 Annex-B access
unit per message (libx264, an IDR every GOP frames, SPS/PPS before each) or, with
`front_video_codec="jpeg"`, one JPEG: video720p holds the rendered 320x240 frame, video360p and
video180p the same halved and quartered. unitree_ros2's sources document neither the rates,
the QoS, the cloud's field offsets nor the video's payload: the sample uses 20 Hz odometry,
15 Hz clouds, 15 Hz video (users report about 30), reliable depth 10, and PCL's aligned layout
(x, y, z at 0, 4, 8; intensity float32 at 16; ring uint16 at 20; time float32 at 24).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.interfaces import QosDurability, QosReliability

from memory_node.sim.lidar import Lidar, LidarModel
from memory_node.sim.render import Renderer
from memory_node.sim.trajectory import Trajectory, compose, invert, simulate_odometry, wrap

PROFILES = ("default", "go2_ros2_sdk", "unitree_ros2")

# go2.urdf's fixed joints: (parent, child, xyz, rpy). robot_state_publisher latches all of them.
LEGS = ("FL", "FR", "RL", "RR")
GO2_FIXED: list[tuple[str, str, tuple[float, float, float], tuple[float, float, float]]] = [
    ("odom", "base_link", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    ("base_link", "base_footprint", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    ("map", "odom", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    ("base_link", "Head_upper", (0.285, 0.0, 0.01), (0.0, 0.0, 0.0)),
    ("Head_upper", "front_camera", (0.045, 0.0, 0.03), (-1.5708, 0.0, -1.5708)),
    ("Head_upper", "Head_lower", (0.008, 0.0, -0.07), (0.0, 0.0, 0.0)),
    *[row for leg in LEGS for row in (
        (f"{leg}_calf", f"{leg}_calflower", (0.020, 0.0, -0.148), (0.0, 0.05, 0.0)),
        (f"{leg}_calflower", f"{leg}_calflower1", (-0.01, 0.0, -0.04), (0.0, 0.48, 0.0)),
        (f"{leg}_calf", f"{leg}_foot", (0.0, 0.0, -0.213), (0.0, 0.0, 0.0)))],
    ("base_link", "imu", (-0.02557, 0.0, 0.04232), (0.0, 0.0, 0.0)),
    ("base_link", "radar", (0.28945, 0.0, -0.046825), (0.0, 2.8782, 0.0)),
]
# go2.urdf's revolute leg joints: (name, parent, child, xyz, axis index: 0 = x, 1 = y)
GO2_LEG_JOINTS = [
    row for leg in LEGS for side in [1.0 if leg[1] == "L" else -1.0]
    for fore in [1.0 if leg[0] == "F" else -1.0] for row in (
        (f"{leg}_hip_joint", "base_link", f"{leg}_hip", (0.1934 * fore, 0.0465 * side, 0.0), 0),
        (f"{leg}_thigh_joint", f"{leg}_hip", f"{leg}_thigh", (0.0, 0.0955 * side, 0.0), 1),
        (f"{leg}_calf_joint", f"{leg}_thigh", f"{leg}_calf", (0.0, 0.0, -0.213), 1))]
SHARED_FRAMES = ("map", "odom")  # not prefixed in the driver's multi-robot mode

CAMERA_IN_BASE = (0.285 + 0.045, 0.0, 0.01 + 0.03)  # front_camera, through Head_upper
RADAR_XYZ = (0.28945, 0.0, -0.046825)  # radar_joint: the L1 lidar in base_link
RADAR_PITCH = 2.8782

DRIVER_RATE = 17.0  # the driver's odometry (TF and /odom)
ODOM_BURST_PERIOD = 0.2  # /odom arrives ~5 times a second ...
ODOM_DELAY = (2.0, 3.0)  # ... this late after its stamps (s)
SLAM_PERIOD = 0.02  # transform_publish_period
SLAM_MIN_INTERVAL = 0.5  # minimum_time_interval between matched scans
SLAM_TIMEOUT = 0.2  # transform_timeout: map -> odom is stamped this far after its scan
SLAM_LATENCY = 0.1  # time to match a scan
SCAN_LATENCY = 0.01  # pointcloud_to_laserscan: /point_cloud2 -> /scan
CLOUD_RATE = 7.0
VOXEL = 0.05  # the voxel map's resolution
CHUNK_HALF = 3.2  # the chunk: 128 voxels of 5 cm around the robot (m, half width)
CHUNK_SCANS = 4  # scans accumulated into a chunk
CAMERA_RATE = 15.0
RSP_LEAD = 3.0  # robot_state_publisher starts this long before the driver streams (s)
JOINT_RATE = 1.0

UNITREE_ODOM_RATE = 20.0  # not documented in unitree_ros2; a plausible rate
UNITREE_CLOUD_RATE = 15.0
UNITREE_VIDEO_RATE = 15.0  # users report ~30 Hz; half keeps the sample quick to render
UNITREE_VIDEO_TOPIC = "/frontvideostream"

# receive latency after the stamp on an otherwise on-time topic (s)
LATENCY = {"tf": 0.004, "slam": 0.002, "cloud": 0.03, "camera": 0.04, "joints": 0.003,
           "unitree_odom": 0.005, "unitree_cloud": 0.02, "unitree_video": 0.03}


def quat_rpy(roll: float, pitch: float, yaw: float) -> tuple[float, float, float, float]:
    """(x, y, z, w) of URDF's rpy (fixed axes x, then y, then z)."""
    cr, sr = math.cos(roll / 2), math.sin(roll / 2)
    cp, sp = math.cos(pitch / 2), math.sin(pitch / 2)
    cy, sy = math.cos(yaw / 2), math.sin(yaw / 2)
    return (sr * cp * cy - cr * sp * sy, cr * sp * cy + sr * cp * sy,
            cr * cp * sy - sr * sp * cy, cr * cp * cy + sr * sp * sy)


def interp_poses(t: np.ndarray, ts: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """SE(2) poses at times t, linear between samples (yaw unwrapped), clamped at the ends."""
    yaw = np.unwrap(poses[:, 2])
    return np.stack([np.interp(t, ts, poses[:, 0]), np.interp(t, ts, poses[:, 1]),
                     wrap(np.interp(t, ts, yaw))], axis=1)


class ReversedTour:
    """The tour walked backwards in time (robot 1 of a two-robot recording)."""

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.duration = traj.duration

    def pose(self, t: np.ndarray) -> np.ndarray:
        return self.traj.pose(self.duration - np.asarray(t, dtype=np.float64))


@dataclass
class RobotRun:
    """One robot of a recording: its true motion and the odometry its driver reports."""

    index: int
    prefix: str  # frame prefix: "" or "robot0/"
    ns: str  # topic namespace: "" or "/robot0"
    traj: Any  # .pose(t) -> (N, 3) in the map
    odom_t: np.ndarray  # driver ticks (relative s)
    odom: np.ndarray  # (N, 3) base_link in the published odom frame
    twist: np.ndarray  # (N, 3) body-frame vx, vy, wz

    def frame(self, name: str) -> str:
        return name if name in SHARED_FRAMES else self.prefix + name

    def truth(self, t: np.ndarray | float) -> np.ndarray:
        return self.traj.pose(np.atleast_1d(np.asarray(t, dtype=np.float64)))

    def odom_at(self, t: np.ndarray | float) -> np.ndarray:
        return interp_poses(np.atleast_1d(np.asarray(t, dtype=np.float64)), self.odom_t,
                            self.odom)

    def map_to_odom(self, t: np.ndarray | float) -> np.ndarray:
        """The correction that puts the odometry on the truth (what SLAM estimates)."""
        return compose(self.truth(t), invert(self.odom_at(t)))


def make_robots(world: Any, robots: int, rate: float) -> list[RobotRun]:
    """The robots of a recording; odometry seeded per robot. Each robot's odom frame is the
    flat's frame (it booted at the flat's origin and walked to where the recording starts), so
    odometry starts at the true start pose: SLAM's map -> odom starts at the identity the URDF
    latches, as slam_toolbox's does, and drifts from there."""
    runs = []
    for i in range(robots):
        traj = world.traj if i == 0 else ReversedTour(world.traj)
        track = simulate_odometry(traj, rate, world.seed + 1000 * i)
        odom = compose(traj.pose(np.array([0.0]))[0], track.odom)
        multi = robots > 1
        runs.append(RobotRun(i, f"robot{i}/" if multi else "", f"/robot{i}" if multi else "",
                             traj, track.t, odom, track.twist))
    return runs


@dataclass
class Event:
    """One message: when the bag received it, its topic, and how to build it."""

    log: float  # receive time (relative s)
    order: int  # tie-break for equal receive times
    topic: str
    build: Callable[[], Any]


@dataclass
class StackOutput:
    """What the ground truth needs from the writer."""

    topics: dict[str, dict[str, Any]]
    frames: dict[str, Any]
    clouds: list[dict[str, Any]]
    robots: list[RobotRun]


def _qos_for(gen: Any, depth: int, reliable: bool = True, latched: bool = False) -> Any:
    return gen._qos(depth, QosDurability.TRANSIENT_LOCAL if latched else QosDurability.VOLATILE,
                    QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT)


class _Builder:
    """Message builders shared by both stacks."""

    def __init__(self, gen: Any, world: Any) -> None:
        self.gen = gen
        self.world = world
        self.m = gen._Messages()
        t = self.m.ts.types
        self.JointState = t["sensor_msgs/msg/JointState"]

    def header(self, t_rel: float | None, frame: str) -> Any:
        ns = 0 if t_rel is None else self.gen._ns(t_rel)
        return self.m.header(ns, frame)

    def odometry(self, t_rel: float | None, parent: str, child: str, pose: np.ndarray,
                 twist: np.ndarray | None) -> Any:
        m = self.m
        v = np.zeros(3) if twist is None else twist
        return m.Odometry(
            self.header(t_rel, parent), child,
            m.PoseCov(m.Pose(m.Point(float(pose[0]), float(pose[1]), self.gen.BASE_HEIGHT),
                             m.Quaternion(*self.gen._quat_yaw(float(pose[2])))), np.zeros(36)),
            m.TwistCov(m.Twist(m.Vector3(float(v[0]), float(v[1]), 0.0),
                               m.Vector3(0.0, 0.0, float(v[2]))), np.zeros(36)))

    def cloud(self, t_rel: float, frame: str, fields: list[tuple[str, int, int]],
              point_step: int, rows: np.ndarray) -> Any:
        m = self.m
        pf = [m.PointField(name, off, dt, 1) for name, off, dt in fields]
        data = np.ascontiguousarray(rows).view(np.uint8).reshape(-1)
        return m.PointCloud2(self.header(t_rel, frame), 1, len(rows), pf, False, point_step,
                             point_step * len(rows), data, True)


def _ticks(rate: float, phase: float, duration: float) -> np.ndarray:
    n = int(math.floor((duration - phase) * rate + 1e-9)) + 1
    return phase + np.arange(n) / rate


def _odom_bursts(stamps: np.ndarray, duration: float, rng: np.random.Generator) -> np.ndarray:
    """Receive times of late, bursty odometry: every ~0.2 s the samples stamped at least the
    current delay (a slow walk within 2-3 s) ago arrive together, 1 ms apart."""
    arrive = np.full(len(stamps), np.inf)
    delay = float(np.mean(ODOM_DELAY))
    nxt = 0
    b = ODOM_DELAY[0]
    while nxt < len(stamps) and b <= duration:
        delay = float(np.clip(delay + rng.normal(0.0, 0.08), *ODOM_DELAY))
        k = 0
        while nxt < len(stamps) and stamps[nxt] <= b - delay:
            arrive[nxt] = b + 0.001 * k
            nxt += 1
            k += 1
        b += ODOM_BURST_PERIOD + rng.uniform(-0.03, 0.03)
    return arrive


def _scan_world(lidar: Lidar, world: Any, run: RobotRun, t: float, idx: int,
                mount: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """One lidar scan from the true sensor pose: points (N, 4) in the level sensor frame, and
    the sensor pose (x, y, yaw) in the map."""
    base = run.truth(t)[0]
    x, y, yaw = compose(base, np.array([mount[0], mount[1], 0.0]))[0]
    person = world.plan.person if world.person_at(t) else None
    rng = np.random.default_rng([world.seed, 2, run.index, idx])
    return lidar.scan(x, y, yaw, person, rng), np.array([x, y, yaw])


def _to_map(pts: np.ndarray, sensor: np.ndarray) -> np.ndarray:
    c, s = math.cos(sensor[2]), math.sin(sensor[2])
    out = pts.copy()
    out[:, 0] = sensor[0] + c * pts[:, 0] - s * pts[:, 1]
    out[:, 1] = sensor[1] + s * pts[:, 0] + c * pts[:, 1]
    return out


GO2_CLOUD_FIELDS = [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("intensity", 12, 7)]


class _Go2:
    """go2_ros2_sdk's messages, one source at a time (driver, robot_state_publisher,
    lidar decoder, camera, slam_toolbox)."""

    def __init__(self, gen: Any, world: Any, runs: list[RobotRun], frames_out: list[Any],
                 clouds_out: list[dict[str, Any]]) -> None:
        self.gen, self.world, self.runs = gen, world, runs
        self.frames_out, self.clouds_out = frames_out, clouds_out
        self.b = _Builder(gen, world)
        self.m = self.b.m
        self.events: list[Event] = []
        self.topics: dict[str, Any] = {}
        self.height = gen.BASE_HEIGHT
        self.lidar = Lidar(world.plan, LidarModel(z=self.height + RADAR_XYZ[2]))
        self.renderer = Renderer(world.plan, world.camera)
        self.tf_static = self.topic("/tf_static", "tf2_msgs/msg/TFMessage", 1, None, None,
                                    latched=True)
        self.tf = self.topic("/tf", "tf2_msgs/msg/TFMessage", 10, None, None)

    def topic(self, name: str, msgtype: str, depth: int, frame: str | None,
              rate: float | None, reliable: bool = True, latched: bool = False) -> str:
        self.topics[name] = {"type": msgtype, "qos": _qos_for(self.gen, depth, reliable, latched),
                             "frame_id": frame, "rate_hz": rate}
        return name

    def add(self, log: float, order: int, topic: str, build: Callable[[], Any]) -> None:
        self.events.append(Event(log, order, topic, build))

    def run(self) -> tuple[list[Event], dict[str, Any]]:
        for run in self.runs:
            self.static(run)
            self.driver(run)
            self.legs(run)
            self.clouds(run)
            self.camera(run)
        multi = len(self.runs) > 1
        if not multi:
            self.slam(self.runs[0])
        return self.events, {"topics": self.topics, "frames": _go2_frames(self.runs, multi)}

    def static(self, run: RobotRun) -> None:
        """robot_state_publisher latches every fixed joint of the URDF, stamped when it
        started with the launch, RSP_LEAD seconds before the driver's connection came up."""
        gen, m = self.gen, self.m
        stamp = gen._ns(-RSP_LEAD)

        def statics() -> Any:
            return m.TFMessage([m.transform(stamp, run.frame(p), run.frame(c), xyz,
                                            quat_rpy(*rpy)) for p, c, xyz, rpy in GO2_FIXED])

        self.add(0.001 * run.index, 0, self.tf_static, statics)

    def driver(self, run: RobotRun) -> None:
        """odom -> base_link on /tf (on time) and the same samples on /odom (late, in bursts,
        pose only)."""
        gen, m, b = self.gen, self.m, self.b
        base = run.frame("base_link")
        odom_topic = self.topic(f"{run.ns}/odom", "nav_msgs/msg/Odometry", 10, "odom",
                                DRIVER_RATE)
        arrive = _odom_bursts(run.odom_t, self.world.duration,
                              np.random.default_rng([self.world.seed, 5, run.index]))
        for i, t in enumerate(run.odom_t.tolist()):
            pose = run.odom[i]

            def driver_tf(t: float = t, pose: np.ndarray = pose) -> Any:
                return m.TFMessage([m.transform(gen._ns(t), "odom", base,
                                                (pose[0], pose[1], self.height),
                                                gen._quat_yaw(float(pose[2])))])

            def odom(t: float = t, pose: np.ndarray = pose) -> Any:
                return b.odometry(t, "odom", base, pose, None)

            self.add(t + LATENCY["tf"], 1, self.tf, driver_tf)
            self.add(float(arrive[i]), 2, odom_topic, odom)

    def legs(self, run: RobotRun) -> None:
        """/joint_states and robot_state_publisher's leg transforms below base_link."""
        gen, m, b, f = self.gen, self.m, self.b, run.frame
        js_topic = self.topic(f"{run.ns}/joint_states", "sensor_msgs/msg/JointState", 10, None,
                              JOINT_RATE)
        for k, t in enumerate(_ticks(JOINT_RATE, 0.25, self.world.duration).tolist()):
            angles = [0.05 * math.sin(0.7 * k + j) + (0.0, 0.67, -1.3)[j % 3]
                      for j in range(len(GO2_LEG_JOINTS))]

            def legs(t: float = t, angles: list[float] = angles) -> Any:
                out = []
                for (_, parent, child, xyz, axis), a in zip(GO2_LEG_JOINTS, angles, strict=True):
                    rpy = (a, 0.0, 0.0) if axis == 0 else (0.0, a, 0.0)
                    out.append(m.transform(gen._ns(t), f(parent), f(child), xyz, quat_rpy(*rpy)))
                return m.TFMessage(out)

            def joint_state(t: float = t, angles: list[float] = angles) -> Any:
                return b.JointState(b.header(t, ""), [f(j[0]) for j in GO2_LEG_JOINTS],
                                    np.array(angles), np.zeros(0), np.zeros(0))

            self.add(t, 3, js_topic, joint_state)
            self.add(t + LATENCY["joints"], 4, self.tf, legs)

    def clouds(self, run: RobotRun) -> None:
        """The decoded voxel map chunk around the robot, in odom (a world frame)."""
        gen, b, world = self.gen, self.b, self.world
        topic = self.topic(f"{run.ns}/point_cloud2", "sensor_msgs/msg/PointCloud2", 1, "odom",
                           CLOUD_RATE, reliable=False)
        scans: list[np.ndarray] = []
        for i, t in enumerate(_ticks(CLOUD_RATE, 0.05 + 0.013 * run.index,
                                     world.duration).tolist()):
            pts, sensor = _scan_world(self.lidar, world, run, t, i, RADAR_XYZ)
            scans = [*scans[-(CHUNK_SCANS - 1):], _to_map(pts, sensor)]
            acc = np.concatenate(scans)
            centre = run.odom_at(t)[0]
            odom_pts = _to_map(acc, compose(centre, invert(run.truth(t)))[0])  # odom <- map
            keep = ((np.abs(odom_pts[:, 0] - centre[0]) <= CHUNK_HALF)
                    & (np.abs(odom_pts[:, 1] - centre[1]) <= CHUNK_HALF))
            vox, first = np.unique(np.round(odom_pts[keep, :3] / VOXEL).astype(np.int64),
                                   axis=0, return_index=True)
            xyz = vox * VOXEL
            # scan z is relative to the sensor; odom's origin is on the floor below base_link
            xyz[:, 2] += self.lidar.model.z
            rows = np.zeros(len(vox), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                                             ("intensity", "<f4")])
            rows["x"], rows["y"], rows["z"] = xyz[:, 0], xyz[:, 1], xyz[:, 2]
            rows["intensity"] = odom_pts[keep, 3][first]
            if run.index == 0:  # where the robot was in odom, how far the points lie from it
                d = np.hypot(xyz[:, 0] - centre[0], xyz[:, 1] - centre[1])
                self.clouds_out.append({
                    "t": gen._stamp(t), "robot_odom_x": gen._r(centre[0]),
                    "robot_odom_y": gen._r(centre[1]), "points": len(rows),
                    "max_range_from_robot": gen._r(float(d.max())),
                    "mean_range_from_robot": gen._r(float(d.mean())),
                    "max_range_from_odom_origin": gen._r(float(np.hypot(xyz[:, 0],
                                                                        xyz[:, 1]).max()))})

            def cloud(t: float = t, rows: np.ndarray = rows) -> Any:
                return b.cloud(t, "odom", GO2_CLOUD_FIELDS, 16, rows)

            self.add(t + LATENCY["cloud"], 5, topic, cloud)

    def camera(self, run: RobotRun) -> None:
        """bgr8 frames in front_camera (a URDF link: the head, optical axes) and their info."""
        gen, m, b, world = self.gen, self.m, self.b, self.world
        cam_frame = run.frame("front_camera")
        img_topic = self.topic(f"{run.ns}/camera/image_raw", "sensor_msgs/msg/Image", 1,
                               cam_frame, CAMERA_RATE, reliable=False)
        info_topic = self.topic(f"{run.ns}/camera/camera_info", "sensor_msgs/msg/CameraInfo",
                                1, cam_frame, CAMERA_RATE, reliable=False)
        cam_t = world.camera_t if run.index == 0 else _ticks(CAMERA_RATE, 0.031, world.duration)
        luma_w = np.array([0.299, 0.587, 0.114], dtype=np.float32)
        for t in cam_t.tolist():

            def image(t: float = t) -> Any:
                base = run.truth(t)[0]
                pose = compose(base, np.array([CAMERA_IN_BASE[0], CAMERA_IN_BASE[1], 0.0]))[0]
                person = world.plan.person if world.person_at(t) else None
                img, info = self.renderer.render(pose[0], pose[1], pose[2], person)
                if run.index == 0:
                    luma = float((img.reshape(-1, 3).astype(np.float32) @ luma_w).mean())
                    self.frames_out.append(gen._FrameRecord(t, info, luma, pose, base))
                bgr = np.ascontiguousarray(img[:, :, ::-1])
                h, w, _ = bgr.shape
                return m.Image(b.header(t, cam_frame), h, w, "bgr8", 0, w * 3, bgr.reshape(-1))

            def info(t: float = t) -> Any:
                return gen._camera_info(m, gen._ns(t), world.camera, cam_frame)

            self.add(t + LATENCY["camera"], 6, img_topic, image)
            self.add(t + LATENCY["camera"], 7, info_topic, info)

    def slam(self, run: RobotRun) -> None:
        """slam_toolbox's publishTransformLoop: map -> odom every 20 ms, stamped with the last
        scan it received plus transform_timeout (the stamp advances with /scan, ~7 Hz, and
        repeats in between); the value changes only when a scan is matched, at most every
        minimum_time_interval, SLAM_LATENCY after that scan."""
        gen, m = self.gen, self.m
        scans = _ticks(CLOUD_RATE, 0.05, self.world.duration)
        received = scans + LATENCY["cloud"] + SCAN_LATENCY
        matched: list[float] = []
        for s in scans.tolist():
            if not matched or s - matched[-1] >= SLAM_MIN_INTERVAL - 1e-9:
                matched.append(s)
        corrections = run.map_to_odom(np.array(matched))
        j = k = -1
        for p in _ticks(1.0 / SLAM_PERIOD, 0.007, self.world.duration).tolist():
            while j + 1 < len(scans) and received[j + 1] <= p:
                j += 1
            while k + 1 < len(matched) and matched[k + 1] + SLAM_LATENCY <= p:
                k += 1
            if j < 0 or k < 0:
                continue
            stamp, c = float(scans[j]) + SLAM_TIMEOUT, corrections[k]

            def slam(stamp: float = stamp, c: np.ndarray = c) -> Any:
                return m.TFMessage([m.transform(gen._ns(stamp), "map", "odom",
                                                (c[0], c[1], 0.0), gen._quat_yaw(float(c[2])))])

            self.add(p + LATENCY["slam"], 8, self.tf, slam)


def _go2_frames(runs: list[RobotRun], multi: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in runs:
        f = run.frame
        for p, c, xyz, rpy in GO2_FIXED:
            out[f(c)] = {"parent": f(p), "topic": "/tf_static", "xyz": list(xyz),
                         "rpy": list(rpy)}
        out[f("base_link")] = {"parent": "odom", "topic": "/tf", "rate_hz": DRIVER_RATE,
                               "also_static_identity": True}
        for _, parent, child, xyz, _axis in GO2_LEG_JOINTS:
            out[f(child)] = {"parent": f(parent), "topic": "/tf", "rate_hz": JOINT_RATE,
                             "xyz": list(xyz)}
    out["map"] = {"parent": None}
    out["odom"] = ({"parent": "map", "topic": "/tf_static"} if multi else
                   {"parent": "map", "topic": "/tf", "rate_hz": 1.0 / SLAM_PERIOD,
                    "stamp": f"last matched scan + {SLAM_TIMEOUT} s", "also_static_identity":
                    True})
    return out


UNITREE_FIELDS = [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("intensity", 16, 7), ("ring", 20, 4),
                  ("time", 24, 7)]


def unitree_video_events(gen: Any, world: Any, run: RobotRun, frames_out: list[Any],
                         codec: str) -> list[Event]:
    """The front camera on /frontvideostream: each rendered frame encoded into the message's
    three resolution fields (built in time order, as the encoder needs)."""
    from memory_node.core.front_video import MSG_TYPE
    from memory_node.sim.front_video import FrontVideoWriter

    renderer = Renderer(world.plan, world.camera)
    cls = gen._Messages().ts.types[MSG_TYPE]
    writer = FrontVideoWriter(world.camera.width, world.camera.height, world.camera_rate, codec)
    luma_w = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    events = []
    for t in world.camera_t.tolist():

        def video(t: float = t) -> Any:
            base = run.truth(t)[0]
            pose = compose(base, np.array([CAMERA_IN_BASE[0], CAMERA_IN_BASE[1], 0.0]))[0]
            person = world.plan.person if world.person_at(t) else None
            img, info = renderer.render(pose[0], pose[1], pose[2], person)
            luma = float((img.reshape(-1, 3).astype(np.float32) @ luma_w).mean())
            frames_out.append(gen._FrameRecord(t, info, luma, pose, base))
            p = writer.payloads(np.ascontiguousarray(img[:, :, ::-1]))
            # time_frame: its unit is documented nowhere; the sample writes milliseconds
            return cls(gen._ns(t) // 1_000_000, *(np.frombuffer(p[r], np.uint8)
                                                   for r in ("720p", "360p", "180p")))

        events.append(Event(t + LATENCY["unitree_video"], 3, UNITREE_VIDEO_TOPIC, video))
    return events


def unitree_events(gen: Any, world: Any, runs: list[RobotRun],
                   clouds_out: list[dict[str, Any]], frames_out: list[Any] | None = None,
                   video_codec: str = "h264") -> tuple[list[Event], dict[str, Any]]:
    """Every message of a unitree_ros2 recording: odometry with zero stamps, lidar clouds in
    the tilted sensor frame and, given `frames_out`, the front video."""
    b = _Builder(gen, world)
    run = runs[0]
    dur = world.duration
    topics: dict[str, Any] = {
        "/utlidar/robot_odom": {"type": "nav_msgs/msg/Odometry", "qos": _qos_for(gen, 10),
                                "frame_id": "odom", "rate_hz": UNITREE_ODOM_RATE},
        "/utlidar/cloud": {"type": "sensor_msgs/msg/PointCloud2", "qos": _qos_for(gen, 10),
                           "frame_id": "utlidar_lidar", "rate_hz": UNITREE_CLOUD_RATE},
    }
    events: list[Event] = []
    if frames_out is not None:
        from memory_node.core.front_video import MSG_TYPE

        topics[UNITREE_VIDEO_TOPIC] = {"type": MSG_TYPE, "qos": _qos_for(gen, 10),
                                       "frame_id": None, "rate_hz": world.camera_rate}
        events += unitree_video_events(gen, world, run, frames_out, video_codec)
    for i, t in enumerate(run.odom_t):
        t = float(t)

        def odom(i: int = i) -> Any:
            return b.odometry(None, "odom", "base_link", run.odom[i], run.twist[i])

        events.append(Event(t + LATENCY["unitree_odom"], 1, "/utlidar/robot_odom", odom))
    lidar = Lidar(world.plan, LidarModel(z=gen.BASE_HEIGHT + RADAR_XYZ[2]))
    cp, sp = math.cos(RADAR_PITCH), math.sin(RADAR_PITCH)
    for i, t in enumerate(_ticks(UNITREE_CLOUD_RATE, 0.04, dur)):
        t = float(t)
        pts, sensor = _scan_world(lidar, world, run, t, i, RADAR_XYZ)
        # the level scan (sensor at its true height) into the pitched sensor frame: R_y^T p
        rel = pts[:, :3].astype(np.float64)  # relative to the sensor, level
        x = cp * rel[:, 0] - sp * rel[:, 2]
        z = sp * rel[:, 0] + cp * rel[:, 2]
        rows = np.zeros(len(pts), dtype=np.dtype({
            "names": ["x", "y", "z", "intensity", "ring", "time"],
            "formats": ["<f4", "<f4", "<f4", "<f4", "<u2", "<f4"],
            "offsets": [0, 4, 8, 16, 20, 24], "itemsize": 32}))
        rows["x"], rows["y"], rows["z"] = x, rel[:, 1], z
        rows["intensity"] = pts[:, 3]
        n_ring = len(pts) // max(1, len(lidar.model.elevations_deg))
        rows["ring"] = np.minimum(np.arange(len(pts)) // max(1, n_ring), 255)
        rows["time"] = np.linspace(0.0, 1.0 / UNITREE_CLOUD_RATE, len(pts), endpoint=False)
        d = np.hypot(rel[:, 0], rel[:, 1])
        clouds_out.append({"t": gen._stamp(t), "points": len(rows),
                           "sensor_x": gen._r(sensor[0]), "sensor_y": gen._r(sensor[1]),
                           "max_range_from_sensor": gen._r(float(d.max()) if len(d) else 0.0)})

        def cloud(t: float = t, rows: np.ndarray = rows) -> Any:
            return b.cloud(t, "utlidar_lidar", UNITREE_FIELDS, 32, rows)

        events.append(Event(t + LATENCY["unitree_cloud"], 2, "/utlidar/cloud", cloud))
    frames = {"odom": {"parent": None, "note": "no TF: odometry only"},
              "base_link": {"parent": "odom", "topic": "/utlidar/robot_odom",
                            "rate_hz": UNITREE_ODOM_RATE, "stamp": "zero"},
              "utlidar_lidar": {"parent": None, "mount_in_base_link": {
                  "xyz": list(RADAR_XYZ), "rpy": [0.0, RADAR_PITCH, 0.0]},
                  "note": "nothing publishes this transform"}}
    return events, {"topics": topics, "frames": frames}


def write_stack_bag(gen: Any, world: Any, bag_dir: Path, fmt: str, profile: str,
                    robots: int, video_codec: str = "h264") -> tuple[list[Any], StackOutput]:
    """Write a driver stack's recording; return the camera frames of robot 0 and what the
    ground truth needs. `video_codec`: unitree_ros2's front video, "h264" or "jpeg"."""
    if profile == "go2_ros2_sdk":
        runs = make_robots(world, robots, DRIVER_RATE)
    else:
        runs = make_robots(world, 1, UNITREE_ODOM_RATE)
    frames: list[Any] = []
    clouds: list[dict[str, Any]] = []
    if profile == "go2_ros2_sdk":
        events, info = _Go2(gen, world, runs, frames, clouds).run()
    else:
        events, info = unitree_events(gen, world, runs, clouds, frames, video_codec)
    events = [e for e in events if e.log <= world.duration + 1e-9]
    events.sort(key=lambda e: (e.log, e.order))
    writer = gen._open_writer(bag_dir, fmt)
    writer.open()
    counts = dict.fromkeys(info["topics"], 0)
    try:
        ts = gen._Messages().ts
        conns = {name: writer.add_connection(name, t["type"], typestore=ts,
                                             offered_qos_profiles=[t["qos"]])
                 for name, t in info["topics"].items()}
        serialize = gen._Messages().serialize
        for e in events:
            writer.write(conns[e.topic], gen._ns(e.log), serialize(e.build()))
            counts[e.topic] += 1
    except BaseException:
        writer.abort()
        import shutil

        shutil.rmtree(bag_dir, ignore_errors=True)
        raise
    writer.close()
    topics = {name: {"type": t["type"], "count": counts[name], "rate_hz": t["rate_hz"],
                     "frame_id": t["frame_id"],
                     "reliability": "reliable" if t["qos"].reliability ==
                     QosReliability.RELIABLE else "best_effort",
                     "durability": "transient_local" if t["qos"].durability ==
                     QosDurability.TRANSIENT_LOCAL else "volatile",
                     "depth": t["qos"].depth}
              for name, t in info["topics"].items()}
    return frames, StackOutput(topics, info["frames"], clouds, runs)
