"""The driver-stack samples (`--profile go2_ros2_sdk|unitree_ros2`, `--robots 2`) read back with
each stack's topics, frames, QoS, stamps, TF topology and timing, and agree with their ground
truth. A few seconds of recording each (about 10 s for the module)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rosbags.interfaces import QosDurability, QosReliability
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from memory_node.core.front_video import IDR, FrontVideoDecoder, nal_types, register_rosbags_type
from memory_node.sim import stacks
from memory_node.sim.generate import SampleInfo, generate_sample, main, payload_digest
from memory_node.sim.trajectory import Trajectory, build_tour, compose

SEED = 7
TYPESTORE = register_rosbags_type(get_typestore(Stores.ROS2_KILTED))


def _read(info: SampleInfo) -> tuple[dict[str, list[tuple[float, Any]]], dict[str, Any], list]:
    """topic -> [(receive time, relative s; message)], topic -> offered QoS, the topic order."""
    out: dict[str, list[tuple[float, Any]]] = defaultdict(list)
    qos: dict[str, Any] = {}
    order: list[str] = []
    epoch = info.ground_truth["epoch"]
    with Reader(info.bag_dir) as reader:
        for conn in reader.connections:
            qos[conn.topic] = conn.ext.offered_qos_profiles[0]
        for conn, stamp, raw in reader.messages():
            out[conn.topic].append((stamp / 1e9 - epoch,
                                    TYPESTORE.deserialize_cdr(raw, conn.msgtype)))
            order.append(conn.topic)
    return dict(out), qos, order


def _t(header: Any, epoch: float) -> float:
    return header.stamp.sec + header.stamp.nanosec / 1e9 - epoch


def _yaw(q: Any) -> float:
    return math.atan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z))


def _edges(msgs: list[tuple[float, Any]], parent: str, child: str,
           epoch: float) -> tuple[np.ndarray, np.ndarray]:
    """Stamps and (x, y, yaw) of one dynamic edge on /tf, duplicates of a stamp dropped."""
    seen: dict[float, np.ndarray] = {}
    for _, msg in msgs:
        for tr in msg.transforms:
            if tr.header.frame_id == parent and tr.child_frame_id == child:
                v = tr.transform.translation
                seen[round(_t(tr.header, epoch), 9)] = np.array(
                    [v.x, v.y, _yaw(tr.transform.rotation)])
    ts = np.array(sorted(seen))
    return ts, np.array([seen[t] for t in ts])


@pytest.fixture(scope="module")
def go2(tmp_path_factory: pytest.TempPathFactory) -> tuple[SampleInfo, Any]:
    info = generate_sample(tmp_path_factory.mktemp("go2"), seed=SEED, duration_s=15.0,
                           profile="go2_ros2_sdk")
    return info, _read(info)


@pytest.fixture(scope="module")
def unitree(tmp_path_factory: pytest.TempPathFactory) -> tuple[SampleInfo, Any]:
    info = generate_sample(tmp_path_factory.mktemp("unitree"), seed=SEED, duration_s=10.0,
                           profile="unitree_ros2")
    return info, _read(info)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[SampleInfo, Any]:
    info = generate_sample(tmp_path_factory.mktemp("two"), seed=SEED, duration_s=8.0,
                           profile="go2_ros2_sdk", robots=2)
    return info, _read(info)


def test_go2_topics_qos_and_latched_urdf_first(go2) -> None:
    info, (msgs, qos, order) = go2
    assert set(msgs) == {"/tf_static", "/tf", "/odom", "/joint_states", "/point_cloud2",
                         "/camera/image_raw", "/camera/camera_info"}
    assert order[0] == "/tf_static"
    assert qos["/tf_static"].durability == QosDurability.TRANSIENT_LOCAL
    for topic in ("/point_cloud2", "/camera/image_raw", "/camera/camera_info"):
        assert qos[topic].reliability == QosReliability.BEST_EFFORT and qos[topic].depth == 1
    assert qos["/odom"].reliability == QosReliability.RELIABLE
    [(_, static)] = msgs["/tf_static"]
    edges = {(t.header.frame_id, t.child_frame_id): t.transform for t in static.transforms}
    assert len(edges) == len(stacks.GO2_FIXED) == 20  # go2.urdf: 20 fixed joints
    for identity in (("map", "odom"), ("odom", "base_link")):  # robot_state_publisher's
        tr = edges[identity]
        assert (tr.translation.x, tr.translation.y, tr.rotation.w) == (0.0, 0.0, 1.0)
    assert edges[("base_link", "Head_upper")].translation.x == pytest.approx(0.285)
    cam = edges[("Head_upper", "front_camera")]
    assert cam.translation.x == pytest.approx(0.045)
    q = cam.rotation  # optical axes: z forward, x right (REP 103)
    assert (q.x, q.y, q.z, q.w) == pytest.approx((-0.5, 0.5, -0.5, 0.5), abs=1e-4)


def test_go2_tf_chain_gives_the_true_pose(go2) -> None:
    """map -> odom (SLAM) composed with the driver's odom -> base_link, each interpolated at
    the camera's stamps, is where the robot truly was; odometry alone drifts."""
    info, (msgs, _, _) = go2
    epoch, dur = info.ground_truth["epoch"], info.ground_truth["duration"]
    mo_t, mo = _edges(msgs["/tf"], "map", "odom", epoch)
    ob_t, ob = _edges(msgs["/tf"], "odom", "base_link", epoch)
    assert len(ob_t) == pytest.approx(dur * stacks.DRIVER_RATE, abs=2)
    cams = [_t(m.header, epoch) for _, m in msgs["/camera/image_raw"]]
    cams = [t for t in cams if mo_t[0] <= t <= mo_t[-1]]
    truth = Trajectory(build_tour(), dur).pose(np.array(cams))
    err = []
    for t, true in zip(cams, truth, strict=True):
        a = np.array([np.interp(t, mo_t, mo[:, i]) for i in range(3)])
        b = np.array([np.interp(t, ob_t, ob[:, i]) for i in range(3)])
        err.append(float(np.hypot(*(compose(a, b)[0, :2] - true[:2]))))
    # SLAM's correction lags (matched every 0.5 s, stamped with later scans), and 15 s of tour
    # is 10x time-compressed, so odometry drifts 10x faster in between
    assert len(err) > 100 and np.median(err) < 0.05 and max(err) < 0.3
    assert not np.allclose(mo[-1], mo[0]), "SLAM's correction never changes"


def test_go2_slam_stamps_repeat_and_lead(go2) -> None:
    info, (msgs, _, _) = go2
    epoch = info.ground_truth["epoch"]
    lead, stamps = [], []
    for recv, msg in msgs["/tf"]:
        for tr in msg.transforms:
            if tr.child_frame_id == "odom":
                stamps.append(_t(tr.header, epoch))
                lead.append(stamps[-1] - recv)
    assert len(stamps) > 5 * len(set(stamps))  # ~7 messages per stamp: 50 Hz, scans at 7 Hz
    assert max(lead) > 0.05  # the newest map -> odom lies ahead of the clock


def test_go2_odometry_pose_only_late_and_bursty(go2) -> None:
    info, (msgs, _, _) = go2
    epoch = info.ground_truth["epoch"]
    recv = np.array([r for r, _ in msgs["/odom"]])
    stamps = np.array([_t(m.header, epoch) for _, m in msgs["/odom"]])
    late = recv - stamps
    assert late.min() >= stacks.ODOM_DELAY[0] - 0.05 and late.max() <= stacks.ODOM_DELAY[1] + 0.3
    assert np.all(np.diff(stamps) > 0)
    gaps = np.diff(recv)
    assert np.mean(gaps < 0.005) > 0.5 and np.max(gaps) > 0.15  # bunches, then a pause
    for _, m in msgs["/odom"]:
        v = m.twist.twist
        assert (v.linear.x, v.linear.y, v.angular.z) == (0.0, 0.0, 0.0)
        assert m.header.frame_id == "odom" and m.child_frame_id == "base_link"


def test_go2_clouds_are_world_frame_chunks_around_the_robot(go2) -> None:
    info, (msgs, _, _) = go2
    gt = info.ground_truth
    assert gt["topics"]["/point_cloud2"]["frame_id"] == "odom"
    for (_, msg), truth in zip(msgs["/point_cloud2"], gt["clouds"], strict=True):
        assert msg.header.frame_id == "odom" and msg.point_step == 16
        pts = np.frombuffer(bytes(msg.data), dtype="<f4").reshape(-1, 4)
        dx = pts[:, 0] - truth["robot_odom_x"]
        dy = pts[:, 1] - truth["robot_odom_y"]
        assert np.abs(dx).max() <= stacks.CHUNK_HALF + 0.03
        assert np.abs(dy).max() <= stacks.CHUNK_HALF + 0.03
        assert np.all(np.round(pts[:, :2] / stacks.VOXEL, 3) % 1 == 0)  # on the voxel grid
    far = [c for c in gt["clouds"] if c["max_range_from_odom_origin"] > 6.0]
    assert far and all(c["max_range_from_robot"] < 4.6 for c in far)


def test_go2_camera_bgr8_in_front_camera_at_15_hz(go2) -> None:
    info, (msgs, _, _) = go2
    epoch = info.ground_truth["epoch"]
    imgs = msgs["/camera/image_raw"]
    assert {m.encoding for _, m in imgs} == {"bgr8"}
    assert {m.header.frame_id for _, m in imgs} == {"front_camera"}
    stamps = np.array([_t(m.header, epoch) for _, m in imgs])
    assert np.median(np.diff(stamps)) == pytest.approx(1 / 15, abs=1e-3)
    # bgr8: the warm floor (more red than blue) is in the first channel as blue
    img = np.frombuffer(bytes(imgs[0][1].data), np.uint8).reshape(imgs[0][1].height, -1, 3)
    floor = img[-5:].reshape(-1, 3).mean(axis=0)
    assert floor[2] > floor[0]
    assert info.ground_truth["camera"]["frame"] == "front_camera"


def test_unitree_no_tf_zero_stamps_tilted_cloud(unitree) -> None:
    info, (msgs, qos, _) = unitree
    assert set(msgs) == {"/utlidar/robot_odom", "/utlidar/cloud", "/frontvideostream"}
    assert qos["/utlidar/cloud"].depth == 10 and qos["/frontvideostream"].depth == 10
    assert info.ground_truth["camera"]["frame"] is None  # no header: placed by the mount
    for _, m in msgs["/utlidar/robot_odom"]:
        assert (m.header.stamp.sec, m.header.stamp.nanosec) == (0, 0)
        assert m.header.frame_id == "odom" and m.child_frame_id == "base_link"
    speeds = [math.hypot(m.twist.twist.linear.x, m.twist.twist.linear.y)
              for _, m in msgs["/utlidar/robot_odom"]]
    assert max(speeds) > 0.1
    _, cloud = msgs["/utlidar/cloud"][len(msgs["/utlidar/cloud"]) // 2]
    assert cloud.header.frame_id == "utlidar_lidar" and cloud.point_step == 32
    assert [(f.name, f.offset) for f in cloud.fields] == [
        (n, o) for n, o, _ in stacks.UNITREE_FIELDS]
    raw = np.frombuffer(bytes(cloud.data), np.uint8).reshape(-1, 32)
    xyz = raw[:, :12].copy().view("<f4").astype(np.float64)
    # through the mount (radar_joint: pitched 2.8782 rad) into base_link: the floor ring
    # lies BASE_HEIGHT below base_link
    cp, sp = math.cos(stacks.RADAR_PITCH), math.sin(stacks.RADAR_PITCH)
    z_base = -sp * xyz[:, 0] + cp * xyz[:, 2] + stacks.RADAR_XYZ[2]
    floor = z_base[z_base < -0.2]
    assert len(floor) > 50 and np.median(floor) == pytest.approx(-0.32, abs=0.02)
    assert np.median(xyz[z_base < -0.2, 2]) > 0.0  # read as level, the floor is overhead


def _check_front_video(info: SampleInfo, msgs: dict[str, list[tuple[float, Any]]],
                       codec: str) -> None:
    """/frontvideostream: one payload per rendered frame in each resolution field, decoding to
    the sizes the ground truth gives."""
    gt = info.ground_truth
    video = msgs["/frontvideostream"]
    assert len(video) == gt["topics"]["/frontvideostream"]["count"]
    assert len(video) == pytest.approx(gt["duration"] * stacks.UNITREE_VIDEO_RATE, abs=1)
    assert gt["front_video"]["codec"] == codec and gt["camera"]["encoding"] == codec
    for res, (w, h) in gt["front_video"]["sizes"].items():
        dec = FrontVideoDecoder(res)
        pics = [dec.decode(m) for _, m in video]
        assert dec.counters.decoded == len(video) and dec.counters.skipped_until_keyframe == 0
        assert pics[-1].to_bgr().shape == (h, w, 3)
    times = [m.time_frame for _, m in video]
    assert times == sorted(times)
    if codec == "h264":
        idr = [i for i, (_, m) in enumerate(video) if IDR in nal_types(bytes(m.video720p))]
        assert idr[:2] == [0, gt["front_video"]["gop"]]
        assert [nal_types(bytes(video[0][1].video720p))[:2]] == [[7, 8]]  # SPS, PPS first
    else:
        assert all(bytes(m.video180p[:3]) == b"\xff\xd8\xff" for _, m in video)


def test_unitree_front_video_h264(unitree) -> None:
    info, (msgs, _, _) = unitree
    _check_front_video(info, msgs, "h264")
    assert info.ground_truth["camera"]["xyz_in_base_link"] == list(stacks.CAMERA_IN_BASE)


def test_unitree_front_video_jpeg(tmp_path: Path) -> None:
    info = generate_sample(tmp_path, seed=SEED, duration_s=3.0, profile="unitree_ros2",
                           front_video_codec="jpeg")
    _check_front_video(info, _read(info)[0], "jpeg")
    with pytest.raises(FileExistsError, match="front video jpeg"):
        generate_sample(tmp_path, seed=SEED, duration_s=3.0, profile="unitree_ros2")


def test_two_robots_prefixed_topics_and_frames(two) -> None:
    info, (msgs, _, _) = two
    gt = info.ground_truth
    epoch = gt["epoch"]
    for i in (0, 1):
        for name in ("odom", "point_cloud2", "camera/image_raw", "joint_states"):
            assert f"/robot{i}/{name}" in msgs
        assert {m.header.frame_id for _, m in msgs[f"/robot{i}/camera/image_raw"]} == {
            f"robot{i}/front_camera"}
        assert {m.child_frame_id for _, m in msgs[f"/robot{i}/odom"]} == {f"robot{i}/base_link"}
        assert {m.header.frame_id for _, m in msgs[f"/robot{i}/point_cloud2"]} == {"odom"}
    statics = [m for _, m in msgs["/tf_static"]]
    assert len(statics) == 2
    children = {t.child_frame_id for m in statics for t in m.transforms}
    assert {"odom", "robot0/base_link", "robot1/base_link", "robot1/front_camera"} <= children
    assert not any(t.child_frame_id == "odom" for _, m in msgs["/tf"] for t in m.transforms)
    paths = []
    for run in gt["robots"]:
        ts, poses = _edges(msgs["/tf"], "odom", run["base_frame"], epoch)
        exp = np.array(run["expected_path"]["samples"])
        x = np.interp(exp[:, 0] - epoch, ts, poses[:, 0])
        y = np.interp(exp[:, 0] - epoch, ts, poses[:, 1])
        ok = (exp[:, 0] - epoch >= ts[0]) & (exp[:, 0] - epoch <= ts[-1])
        assert np.hypot(x - exp[:, 1], y - exp[:, 2])[ok].max() < 0.05
        paths.append(exp[:, 1:3])
    assert np.hypot(*(paths[0] - paths[1]).T).max() > 2.0  # two robots, two places


def test_same_arguments_same_bytes(two, tmp_path: Path) -> None:
    info, _ = two
    again = generate_sample(tmp_path / "again", seed=SEED, duration_s=8.0,
                            profile="go2_ros2_sdk", robots=2)
    assert payload_digest(again.bag_dir) == payload_digest(info.bag_dir)
    assert again.ground_truth == info.ground_truth


def test_cli_profiles_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "u"
    assert main([str(out), "--profile", "unitree_ros2", "--duration", "2"]) == 0
    assert "generated unitree_ros2 sample" in capsys.readouterr().out
    assert main([str(out), "--profile", "unitree_ros2", "--duration", "2"]) == 0
    assert "reused" in capsys.readouterr().out
    assert main([str(out), "--profile", "go2_ros2_sdk", "--duration", "2"]) == 2  # other args
    assert "profile unitree_ros2" in capsys.readouterr().err
    assert main([str(tmp_path / "x"), "--profile", "unitree_ros2", "--robots", "2"]) == 2
    assert "multi-robot" in capsys.readouterr().err
    assert main([str(tmp_path / "j"), "--profile", "unitree_ros2", "--duration", "1",
                 "--front-video-codec", "jpeg"]) == 0
    assert "/frontvideostream: 15 x unitree_go/msg/Go2FrontVideoData" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()
