"""The recorder's policy driven offline, as a bag importer drives it: plain duck-typed messages
(the fields a bag reader's deserialized messages have), the bag's receive times as the clock,
no rclpy, no threads, no sleeping."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace as NS

import pytest
from engine_support import make_engine

from memory_node.core.recorder import RecorderPolicy


def stamp(t: float) -> NS:
    sec = math.floor(t)
    return NS(sec=sec, nanosec=round((t - sec) * 1e9))


def odom(x: float, t: float, frame: str = "odom", vx: float = 0.0, y: float = 0.0,
         yaw: float = 0.0) -> NS:
    q = NS(x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2))
    return NS(header=NS(stamp=stamp(t), frame_id=frame), child_frame_id="base_link",
              pose=NS(pose=NS(position=NS(x=x, y=y, z=0.0), orientation=q)),
              twist=NS(twist=NS(linear=NS(x=vx, y=0.0, z=0.0))))


def tf(parent: str, child: str, t: float, x: float = 0.0, y: float = 0.0,
       yaw: float = 0.0) -> NS:
    """A TransformStamped-shaped transform."""
    return NS(header=NS(stamp=stamp(t), frame_id=parent), child_frame_id=child,
              transform=NS(translation=NS(x=x, y=y, z=0.0),
                           rotation=NS(x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2))))


def rows(engine, stream: str = "odom") -> list[dict]:
    answer = engine.ask_search(json.dumps({"stream": stream, "k": 100, "order_by": "time"})
                               ).model_dump()
    assert answer["ok"], answer
    return answer["results"]


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(tmp_path / "mem")
    yield eng
    eng.close()


T0 = 1_764_460_800.0


def test_a_message_waits_for_the_tf_that_comes_after_it(engine):
    """Odometry recorded a moment before its TF gets the map pose, not its odometry-frame one:
    the wait the node does on the wall clock happens on the bag's clock."""
    policy = RecorderPolicy.offline({"tf_wait_s": 2.0, "min_distance": 0.01}, engine)
    policy.on_odom(odom(0.0, T0), arrived_s=T0)
    assert policy.waiting == 1  # no TF yet, and it may still come
    policy.on_tf([tf("map", "base_link", T0 - 0.1, x=4.0), tf("map", "base_link", T0 + 0.1, x=4.2)],
                 arrived_s=T0 + 0.3)
    assert policy.waiting == 0
    [row] = rows(engine)
    assert (row["pose"]["frame"], row["pose"]["source"]) == ("map", "tf")
    assert row["pose"]["x"] == pytest.approx(4.1)


def test_without_tf_the_wait_runs_out_on_the_bags_clock(engine):
    """No TF at all: the first message waits tf_wait_s of bag time, then every message takes
    odometry in its own frame; flush() stores what is left."""
    policy = RecorderPolicy.offline({"tf_wait_s": 1.0, "min_distance": 0.01}, engine)
    for i in range(30):
        policy.on_odom(odom(0.1 * i, T0 + 0.1 * i), arrived_s=T0 + 0.1 * i)
    assert policy.waiting == 0  # decided once a second of bag time had passed
    policy.flush()
    got = rows(engine)
    assert len(got) == 30
    assert all((r["pose"]["frame"], r["pose"]["source"]) == ("odom", "odom") for r in got)
    assert [r["pose"]["x"] for r in got] == pytest.approx([0.1 * i for i in range(30)])
    assert policy.counters["odom"].tf_timeouts == 1  # one wait, not one per message


def test_the_keyframe_gate_and_counters_match_the_node(engine):
    """Same gate as the node: a keyframe per min_distance; the rest counted as skipped."""
    policy = RecorderPolicy.offline({"tf_wait_s": 0.0, "min_distance": 0.5,
                                     "max_interval": 100.0}, engine)
    for i in range(21):  # 2 m in 0.1 m steps
        policy.on_odom(odom(0.1 * i, T0 + 0.1 * i), arrived_s=T0 + 0.1 * i)
    policy.flush()
    c = policy.counters["odom"]
    assert (c.received, c.kept, c.skipped, c.stored) == (21, 5, 16, 5)
    assert [r["pose"]["x"] for r in rows(engine)] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])


def test_unknown_stream_and_parameters_are_refused(engine):
    from memory_node.core.config import ConfigError

    with pytest.raises(ConfigError, match="stamp_source"):
        RecorderPolicy.offline({"stamp_source": "gps"}, engine)
    policy = RecorderPolicy.offline({}, engine)
    with pytest.raises(ValueError, match="unknown stream"):
        policy.on_message("sonar", odom(0.0, T0), arrived_s=T0)
    assert rows(engine) == []


def test_the_policy_loads_without_rclpy():
    """An offline importer runs where no ROS is installed: nothing the policy imports pulls
    rclpy in."""
    import subprocess
    import sys

    code = ("import sys, memory_node.core.recorder, memory_node.core.pose_history; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('rclpy', 'rcl_interfaces', 'builtin_interfaces')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


# -- go2_ros2_sdk and unitree_ros2 shapes -------------------------------------------------------
def cloud(points, t: float, frame: str) -> NS:
    """A PointCloud2-shaped message (x, y, z float32), as a bag reader hands it over."""
    import numpy as np

    pts = np.asarray(points, np.float32).reshape(-1, 3)
    f = [NS(name=n, offset=4 * i, datatype=7, count=1) for i, n in enumerate("xyz")]
    return NS(header=NS(stamp=stamp(t), frame_id=frame), height=1, width=len(pts), fields=f,
              is_bigendian=False, point_step=12, row_step=12 * len(pts), data=pts.tobytes(),
              is_dense=True)


def go2_urdf_statics(policy, t: float) -> None:
    """robot_state_publisher's latched fixed joints of go2_ros2_sdk's URDF."""
    head = tf("base_link", "Head_upper", 0.0, x=0.285)
    cam = tf("Head_upper", "front_camera", 0.0, x=0.045)
    q = cam.transform.rotation  # rpy (-pi/2, 0, -pi/2): an optical frame without the name
    q.x, q.y, q.z, q.w = -0.5, 0.5, -0.5, 0.5
    policy.on_tf([tf("map", "odom", 0.0), tf("odom", "base_link", 0.0), head, cam],
                 is_static=True, arrived_s=t)


def test_a_world_frame_cloud_gets_ranges_from_the_robot_and_keeps_its_frame(engine):
    """go2_ros2_sdk's /point_cloud2 is a voxel-map chunk in odom: range tags are distances
    from where the robot stood, not from the odom origin, and the row says the frame."""
    import numpy as np

    policy = RecorderPolicy.offline({"tf_wait_s": 1.0}, engine)
    go2_urdf_statics(policy, T0)
    policy.on_tf([tf("odom", "base_link", T0 - 0.05, x=8.0, y=3.0),
                  tf("odom", "base_link", T0 + 0.05, x=8.0, y=3.0)], arrived_s=T0 + 0.05)
    ring = [(8.0 + 2.0 * math.cos(a), 3.0 + 2.0 * math.sin(a), 0.3)
            for a in np.linspace(0, 2 * math.pi, 60, endpoint=False)]
    policy.on_message("lidar", cloud(ring, T0, "odom"), arrived_s=T0 + 0.06)
    policy.flush()
    [row] = rows(engine, "lidar")
    assert row["tags"]["frame"] == "odom"
    assert row["tags"]["max_range"] == pytest.approx(2.0, abs=0.15)  # not 10.4 from the origin
    assert row["tags"]["mean_range"] == pytest.approx(2.0, abs=0.15)
    assert (row["pose"]["x"], row["pose"]["y"]) == (pytest.approx(8.0), pytest.approx(3.0))
    stored = np.load(engine.config.root / row["ref"])
    assert np.hypot(stored[:, 0] - 8.0, stored[:, 1] - 3.0).max() < 2.2  # still odom coords


def test_speed_from_successive_poses_when_the_twist_is_empty(engine):
    """go2_ros2_sdk fills the pose only: the speed comes from the poses, never a false 0;
    the first sample, with nothing to compare with, has no speed tag."""
    policy = RecorderPolicy.offline({"tf_wait_s": 0.0, "min_distance": 0.01,
                                     "max_interval": 100.0}, engine)
    for i in range(12):  # 0.6 m/s along x at 17 Hz, twist all zero
        t = T0 + i / 17
        policy.on_odom(odom(0.6 * (t - T0), t), arrived_s=t)
    policy.flush()
    got = rows(engine)
    assert "speed" not in got[0]["tags"]
    assert all(r["tags"]["speed"] == pytest.approx(0.6, abs=0.01) for r in got[5:])
    # a driver that fills the twist is believed
    policy.on_odom(odom(0.6 * 12 / 17 + 1.0, T0 + 1.0, vx=0.25), arrived_s=T0 + 1.0)
    policy.flush()
    assert rows(engine)[-1]["tags"]["speed"] == 0.25


def truth(t: float) -> tuple[float, float]:
    """Where the robot was at time t: a 0.5 m/s walk with a sideways sway."""
    return 0.5 * (t - T0), 0.8 * math.sin(0.4 * (t - T0))


def test_late_bursty_odometry_poses_frames_at_their_stamps(engine):
    """Odometry stamped at 17 Hz but delivered in bursts ~2.5 s late (go2_ros2_sdk issue
    #231), no TF world <- base: each lidar frame waits (tf_wait_s) for the odometry that
    covers its stamp and is posed between the samples around it, within 2 cm of the truth."""
    policy = RecorderPolicy.offline({"tf_wait_s": 4.0, "min_distance": 0.0,
                                     "max_interval": 0.0}, engine)
    events = []
    for i in range(17 * 12):  # 12 s of odometry, each delivered at the next 0.2 s burst
        s = T0 + i / 17
        x, y = truth(s)
        events.append((math.ceil((s + 2.5) / 0.2) * 0.2, "odom", odom(x, s, y=y)))
    for i in range(7 * 8):  # lidar at 7 Hz, on time
        s = T0 + 1.0 + i / 7
        events.append((s + 0.02, "lidar", cloud([(1.0, 0.0, 0.2)], s, "utlidar_lidar")))
    for arrived, stream, msg in sorted(events, key=lambda e: e[0]):
        policy.on_message(stream, msg, arrived_s=arrived)
    policy.flush()
    got = rows(engine, "lidar")
    assert len(got) == 56
    errors = sorted(math.hypot(r["pose"]["x"] - truth(r["t"])[0], r["pose"]["y"] - truth(r["t"])[1])
                    for r in got)
    assert errors[len(errors) // 2] < 0.01 and errors[-1] < 0.02, errors[-5:]
    assert {r["pose"]["source"] for r in got} <= {"odom_interpolated", "odom"}
    # every 7th frame is stamped with an odometry sample's own stamp: that sample, "odom"
    assert sum(r["pose"]["source"] == "odom_interpolated" for r in got) == 48
    assert policy.counters["lidar"].no_pose == 0


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, m: str) -> None:
        self.lines.append("I " + m)

    def warning(self, m: str) -> None:
        self.lines.append("W " + m)

    def debug(self, m: str) -> None:
        pass


UNITREE = {"tf_wait_s": 1.0, "min_distance": 0.0, "max_interval": 0.0,
           "odom_topic": "/utlidar/robot_odom", "lidar_topic": "/utlidar/cloud",
           "camera_topic": "", "lidar_frame": "utlidar_lidar", "lidar_mount_x": 0.28945,
           "lidar_mount_z": -0.046825, "lidar_mount_pitch": 2.8782}


def test_unitree_zero_stamps_and_a_lidar_clock_an_hour_off_still_get_poses(engine):
    """unitree_ros2: no TF, /utlidar/robot_odom with zero stamps (receipt time), and a lidar
    whose clock is an hour off: the lidar rows are stored at arrival time and posed from
    odometry at that time, in odometry's frame (issue 28's second case)."""
    log = Log()
    policy = RecorderPolicy.offline(UNITREE, engine, logger=log)
    for i in range(60):  # 20 Hz odometry, stamps zero; lidar at 10 Hz, header 3600 s behind
        t = T0 + 0.05 * i
        x, y = truth(t)
        policy.on_odom(odom(x, 0.0, y=y), arrived_s=t)
        if i % 2:
            policy.on_message("lidar", cloud([(1.0, 0.0, 0.0)], t - 3600.0, "utlidar_lidar"),
                              arrived_s=t + 0.001)
    policy.flush()
    got = rows(engine, "lidar")
    assert len(got) == 30 and policy.counters["lidar"].no_pose == 0
    assert all(r["pose"]["frame"] == "odom" and r["pose"]["source"].startswith("odom")
               for r in got)
    assert all(abs(r["t"] - T0) < 4 for r in got)  # arrival times, not the lidar's clock
    worst = max(math.hypot(r["pose"]["x"] - truth(r["t"])[0], r["pose"]["y"] - truth(r["t"])[1])
                for r in got)
    assert worst < 0.05
    warned = [line for line in log.lines if line.startswith("W ")]
    assert sum("odom messages carry no stamp" in w for w in warned) == 1
    assert sum("lidar: storing arrival times" in w for w in warned) == 1
    # the mount stands in for the transform nobody publishes
    mount = policy.poses.buffer.lookup("base_link", "utlidar_lidar", 0.0)
    assert (mount.x, mount.z) == (pytest.approx(0.28945), pytest.approx(-0.046825))


def test_rows_without_a_pose_are_said_once_with_the_count_and_why(engine):
    """No TF and no odometry: the lidar rows are stored without a pose, and one warning names
    the stream, how many, and why."""
    log = Log()
    policy = RecorderPolicy.offline(UNITREE, engine, logger=log)
    for i in range(25):
        t = T0 + 0.1 * i
        policy.on_message("lidar", cloud([(1.0, 0.0, 0.0)], t, "utlidar_lidar"), arrived_s=t)
    policy.flush()
    assert policy.counters["lidar"].no_pose == 25
    [warning] = [line for line in log.lines if "without a pose" in line]
    assert warning.startswith("W lidar: 10 of ") and "no odometry arrived" in warning
    assert "/utlidar/robot_odom" in warning


def test_a_published_mount_replaces_the_parameters():
    """A stack that does publish the lidar's transform wins over the mount parameters."""
    from memory_node.core.recorder import RecorderPolicy as Policy

    policy = Policy.offline(UNITREE, engine=None)
    policy.on_tf([tf("base_link", "utlidar_lidar", 0.0, x=0.1)], is_static=True, arrived_s=T0)
    assert policy.poses.buffer.lookup("base_link", "utlidar_lidar", 0.0).x == pytest.approx(0.1)


def test_the_camera_view_of_an_optical_frame_without_the_name(engine):
    """go2_ros2_sdk's front_camera (rpy -pi/2 0 -pi/2 below Head_upper) looks along its z
    axis: the view looks where the robot looks, 0.33 m ahead of base_link."""
    from memory_node.core.recorder import Job

    policy = RecorderPolicy.offline({}, engine)
    go2_urdf_statics(policy, T0)
    policy.on_tf([tf("odom", "base_link", T0, x=1.0, yaw=math.pi / 2)], arrived_s=T0)
    image = NS(header=NS(stamp=stamp(T0), frame_id="front_camera"))
    view = policy.camera_view(Job("camera", T0, image, "raw", lookup_t=T0))
    assert view.yaw == pytest.approx(math.pi / 2)
    assert (view.x, view.y) == (pytest.approx(1.0), pytest.approx(0.33))


def test_robot_prefix_as_go2_ros2_sdks_multi_robot_mode():
    from memory_node.core.recorder_settings import recorder_settings, with_robot_prefix

    cfg = recorder_settings({"robot_prefix": "robot0", "lidar_frame": "utlidar_lidar",
                             "compressed_topic": "camera/image_raw/compressed"})
    assert (cfg["odom_topic"], cfg["lidar_topic"], cfg["camera_topic"]) == (
        "/robot0/odom", "/robot0/lidar/points", "/robot0/camera/image_raw")
    assert cfg["compressed_topic"] == "/robot0/camera/image_raw/compressed"
    assert (cfg["base_frame"], cfg["lidar_frame"], cfg["world_frame"]) == (
        "robot0/base_link", "robot0/utlidar_lidar", "map")
    assert cfg["camera_frame"] == ""  # '' stays '' (the image header's frame)
    assert with_robot_prefix(cfg) == cfg  # applied twice: the same
    assert recorder_settings({"robot_prefix": "/robot0/", "odom_topic": ""})["odom_topic"] == ""


def test_two_robots_on_one_tf_tree_each_get_their_own_poses(engine):
    """Both robots' odometry hangs below the shared odom frame; each policy, with its
    prefix, poses its own robot."""
    got = {}
    for robot in ("robot0", "robot1"):
        policy = RecorderPolicy.offline({"robot_prefix": robot, "tf_wait_s": 0.5}, engine)
        policy.on_tf([tf("map", "odom", 0.0)], is_static=True, arrived_s=T0)
        policy.on_tf([tf("odom", "robot0/base_link", T0, x=1.0),
                      tf("odom", "robot1/base_link", T0, x=-4.0, y=2.0)], arrived_s=T0)
        pose = policy.poses.tf_pose_at(T0)
        got[robot] = (pose.x, pose.y, pose.frame)
    assert got == {"robot0": (1.0, 0.0, "map"), "robot1": (-4.0, 2.0, "map")}


def test_a_frame_before_the_drivers_first_transform_is_not_posed_at_the_urdf_identity(engine):
    """go2_ros2_sdk starting up: robot_state_publisher has latched map -> odom -> base_link
    as identities; a frame that comes before the driver's first odom -> base_link must wait
    for it, not be stored at the odom origin."""
    policy = RecorderPolicy.offline({"tf_wait_s": 4.0, "min_distance": 0.0,
                                     "max_interval": 0.0}, engine)
    go2_urdf_statics(policy, T0 - 1.0)
    policy.on_message("lidar", cloud([(1.0, 0.0, 0.2)], T0, "odom"), arrived_s=T0 + 0.01)
    assert policy.waiting == 1  # the identities are no moving robot's pose
    for i in range(1, 6):  # the driver starts at T0 + 0.06, robot at x = 3.7
        t = T0 + 0.06 * i
        policy.on_tf([tf("odom", "base_link", t, x=3.7 + 0.01 * i)], arrived_s=t + 0.01)
    policy.flush()
    [row] = rows(engine, "lidar")
    assert row["pose"]["source"] == "tf" and row["pose"]["x"] == pytest.approx(3.71)


def test_static_identities_and_odometry_only_take_the_odometry(engine):
    """A driver that publishes /odom but no /tf beside the URDF's identities: rows take the
    odometry's pose, not the identities' (0, 0)."""
    policy = RecorderPolicy.offline({"tf_wait_s": 1.0, "min_distance": 0.0,
                                     "max_interval": 0.0}, engine)
    go2_urdf_statics(policy, T0 - 1.0)
    for i in range(30):
        t = T0 + 0.1 * i
        policy.on_odom(odom(2.0 + 0.05 * i, t), arrived_s=t)
    policy.flush()
    got = rows(engine)
    assert [r["pose"]["x"] for r in got] == pytest.approx([2.0 + 0.05 * i for i in range(30)])
    assert {(r["pose"]["frame"], r["pose"]["source"]) for r in got} == {("map", "odom")}


def test_a_message_is_stamped_when_it_arrived_never_after_now(engine):
    """A zero-stamped message that arrived 1.5 s of node clock before its callback ran is
    stored then; an arrival past the node clock (a reading from before a jump back) is now."""
    policy = RecorderPolicy.offline({"min_distance": 0.01}, engine)
    policy.manual_clock.set(T0)
    assert policy.receive_odom(odom(1.0, 0.0), arrived=T0 - 1.5).t == T0 - 1.5
    assert policy.receive_odom(odom(2.0, 0.0), arrived=T0 + 60.0).t == T0
    assert policy.receive_odom(odom(3.0, 0.0)).t == T0
