"""The shipped YAML files and the launch file: every key is a real parameter (a typo would be
silently ignored by ROS) and the Go2 file really changes topics. The launch file itself runs
under real launch_ros in test_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import rclpy
import yaml

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
    rclpy.init(args=args, context=ctx)
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
