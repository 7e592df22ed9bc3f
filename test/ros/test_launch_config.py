"""The shipped YAML files and the launch file: every key is a real parameter (a typo would be
silently ignored by ROS) and the Go2 file really changes topics. The launch file itself runs
under real launch_ros in test_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import rclpy
import yaml
from ros_helpers import init_undiscovered

from memory_node.ros.recorder import MemoryRecorder
from memory_node.ros.server import MemoryServer

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "config").glob("*.yaml"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engine_support import make_engine  # noqa: PLC0415 - test/core helper

    eng = make_engine(tmp_path_factory.mktemp("mem"))
    yield eng
    eng.close()


def _nodes(engine, args):
    ctx = rclpy.Context()
    init_undiscovered(ctx, args)
    server = MemoryServer(context=ctx)
    recorder = MemoryRecorder(engine=engine, context=ctx)
    return ctx, server, recorder


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_yaml_key_is_a_declared_parameter(path, engine):
    ctx, server, recorder = _nodes(engine, ["--ros-args", "--params-file", str(path)])
    try:
        declared = {"memory_server": set(server._parameters), "memory_recorder":
                    set(recorder._parameters)}
        data = yaml.safe_load(path.read_text())
        for section, body in data.items():
            keys = set(body["ros__parameters"])
            targets = declared.values() if section == "/**" else [declared[section]]
            known = set().union(*targets)
            assert keys <= known, f"{path.name} [{section}]: unknown {sorted(keys - known)}"
    finally:
        recorder.close()
        recorder.destroy_node()
        server.destroy_node()
        rclpy.shutdown(context=ctx)


def test_go2_file_changes_the_lidar_topic(engine):
    ctx, server, recorder = _nodes(
        engine, ["--ros-args", "--params-file", str(ROOT / "config" / "go2.yaml")])
    try:
        assert recorder.get_parameter("lidar_topic").value == "/point_cloud2"
        assert recorder.get_parameter("camera_topic").value == "/camera/image_raw"
        assert server.get_parameter("world_frame").value == "map"
    finally:
        recorder.close()
        recorder.destroy_node()
        server.destroy_node()
        rclpy.shutdown(context=ctx)


def test_config_names_resolve_in_the_package_config_directory(tmp_path):
    from memory_node.ros.main import main, resolve_config

    assert resolve_config("go2.yaml") == ROOT / "config" / "go2.yaml"
    assert resolve_config() == ROOT / "config" / "memory.yaml"
    own = tmp_path / "robot.yaml"
    own.write_text("/**:\n  ros__parameters: {}\n")
    assert resolve_config(str(own)) == own
    assert resolve_config("missing.yaml") is None
    assert main(["--config", "missing.yaml"]) == 2  # refused before anything starts


def test_default_file_repeats_the_declared_defaults():
    """config/memory.yaml documents the defaults; the declarations in ros/params.py (built
    from MemoryConfig for the engine's keys) are where they are defined. The file may not
    drift from them."""
    from memory_node.ros import params

    table = {**params.engine_param_table(), **params.POSE_PARAMS, **params.RECORDER_PARAMS,
             **params.SERVER_PARAMS}
    data = yaml.safe_load((ROOT / "config" / "memory.yaml").read_text())
    drift = {(section, key): (value, table[key][0])
             for section, body in data.items()
             for key, value in body["ros__parameters"].items() if value != table[key][0]}
    assert drift == {}


# -- the Go2 driver stacks' profiles --------------------------------------------------------
def test_go2_is_the_go2_ros2_sdk_profile():
    """config/go2.yaml (its older name) loads exactly as config/go2_ros2_sdk.yaml."""
    assert ((ROOT / "config" / "go2.yaml").read_bytes()
            == (ROOT / "config" / "go2_ros2_sdk.yaml").read_bytes())


def test_go2_ros2_sdk_profile_sets_the_drivers_topics_and_waits(engine):
    ctx, server, recorder = _nodes(
        engine, ["--ros-args", "--params-file", str(ROOT / "config" / "go2_ros2_sdk.yaml")])
    try:
        stats = recorder.stats()
        assert {s: stats[s]["topic"] for s in ("camera", "lidar", "odom")} == {
            "camera": "/camera/image_raw", "lidar": "/point_cloud2", "odom": "/odom"}
        assert recorder.policy.settings["tf_wait_s"] == 4.0  # odometry 2-3 s late
        assert recorder.policy.settings["camera_mount_x"] == pytest.approx(0.33)
        assert recorder.policy.settings["sensor_reliability"] == "best_effort"
    finally:
        recorder.close()
        recorder.destroy_node()
        server.destroy_node()
        rclpy.shutdown(context=ctx)


def test_unitree_ros2_profile_records_the_front_video_and_mounts_the_lidar(engine):
    ctx, server, recorder = _nodes(
        engine, ["--ros-args", "--params-file", str(ROOT / "config" / "unitree_ros2.yaml")])
    try:
        stats = recorder.stats()
        assert stats["camera"]["topic"] == "/frontvideostream"
        assert "skipped_until_keyframe" not in stats["camera"]  # said once a GOP is joined
        assert recorder.front_video is not None
        assert recorder.front_video.decoder.field == "video720p"
        assert recorder.settings["camera_mount_x"] == pytest.approx(0.33)
        assert stats["lidar"]["topic"] == "/utlidar/cloud"
        assert stats["odom"]["topic"] == "/utlidar/robot_odom"
        assert server.get_parameter("odom_topic").value == "/utlidar/robot_odom"
        mount = recorder.poses.buffer.lookup("base_link", "utlidar_lidar", 0.0)
        assert (mount.x, mount.z) == (pytest.approx(0.28945), pytest.approx(-0.046825))
    finally:
        recorder.close()
        recorder.destroy_node()
        server.destroy_node()
        rclpy.shutdown(context=ctx)


def test_robot_prefix_prefixes_the_profiles_topics_and_frames(engine, tmp_path):
    """One of several robots: /robot1/... topics and robot1/base_link for both nodes' poses;
    map (and odom, the frame every robot's odometry shares) stay unprefixed."""
    text = (ROOT / "config" / "go2_ros2_sdk.yaml").read_text()
    robot1 = tmp_path / "robot1.yaml"
    robot1.write_text(text.replace('robot_prefix: ""', "robot_prefix: robot1"))
    ctx, server, recorder = _nodes(engine, ["--ros-args", "--params-file", str(robot1)])
    try:
        stats = recorder.stats()
        assert {s: stats[s]["topic"] for s in ("camera", "lidar", "odom")} == {
            "camera": "/robot1/camera/image_raw", "lidar": "/robot1/point_cloud2",
            "odom": "/robot1/odom"}
        for poses in (recorder.poses, server.poses):
            assert (poses.world_frame, poses.base_frame) == ("map", "robot1/base_link")
    finally:
        recorder.close()
        recorder.destroy_node()
        server.destroy_node()
        rclpy.shutdown(context=ctx)
