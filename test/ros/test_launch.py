"""The launch file run the way `ros2 launch memory_node memory.launch.py config:=go2.yaml` runs
it: real `launch` and `launch_ros` (test/wheels), an install prefix with the package's
executable and share files, and the ROS graph checked from outside: three uniquely named
nodes, the recorder subscribed to the Go2's topics, and the launch arguments arriving as
parameters."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import rclpy
from launch_support import RUN_LAUNCH, install_prefix
from ros_helpers import parameter_values

from memory_node.ros.cli import ServiceCaller

NODES = {"memory_server", "memory_recorder", "memory_tf_listener"}

def test_launch_file_with_go2_config(ros_process, tmp_path):
    launch_file = install_prefix(tmp_path / "install")
    env = {"AMENT_PREFIX_PATH": os.pathsep.join(
        [str(tmp_path / "install"), os.environ.get("AMENT_PREFIX_PATH", "")]).rstrip(os.pathsep)}
    memory_dir = tmp_path / "robot_memory"
    proc = ros_process(["-c", RUN_LAUNCH, str(launch_file), "config:=go2.yaml",
                        f"memory_dir:={memory_dir}", "use_sim_time:=false"], env=env)
    proc.wait_for_line(r"active: /memory/search", timeout=120)

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("launch_test_observer", context=ctx)
    executor = rclpy.executors.SingleThreadedExecutor(context=ctx)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names = [n for n, _ in node.get_node_names_and_namespaces()]
            recorder_subs = dict(node.get_subscriber_names_and_types_by_node(
                "memory_recorder", "/")) if "memory_recorder" in names else {}
            if set(names) >= NODES and "/point_cloud2" in recorder_subs:
                break
            time.sleep(0.3)
        ours = sorted(n for n in names if n.startswith("memory_"))
        assert ours == sorted(NODES), f"node names not unique or missing: {ours}"
        # go2.yaml's memory_recorder section applies: the Go2's lidar topic, not the default
        assert "/point_cloud2" in recorder_subs, recorder_subs
        assert "/lidar/points" not in recorder_subs
        assert {"/camera/image_raw", "/odom"} <= set(recorder_subs)
        listener_subs = dict(node.get_subscriber_names_and_types_by_node(
            "memory_tf_listener", "/"))
        assert {"/tf", "/tf_static"} <= set(listener_subs)
        assert "/tf" not in dict(node.get_subscriber_names_and_types_by_node("memory_server",
                                                                             "/"))
        [lidar, voxel] = parameter_values(node, executor, "memory_recorder",
                                          ["lidar_topic", "lidar_voxel"])
        assert lidar.string_value == "/point_cloud2"
        assert voxel.double_value == pytest.approx(0.15)  # go2.yaml's, not the default 0.1
        [mem, sim] = parameter_values(node, executor, "memory_server",
                                      ["memory_dir", "use_sim_time"])
        assert mem.string_value == str(memory_dir)
        assert sim.bool_value is False
        caller = ServiceCaller("launch_test_caller", context=ctx)
        try:
            saved = json.loads(caller.call("save", "launched on a Go2", 20.0))
        finally:
            caller.close()
        assert saved["ok"] is True, saved
        assert list((memory_dir / "notes").glob("*_notes.md")), "note not in memory_dir"
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    assert "already registered" not in proc.output  # rcl's duplicate node-name warning
    assert "ignoring the node-name remap" not in proc.output  # the launch file names no node
    os.kill(proc.pid, 2)
    try:
        proc.popen.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail("the launch did not stop within 20 s of one SIGINT; its output:\n"
                    + proc.output)
    assert proc.popen.returncode == 0, proc.output
    assert "Traceback" not in proc.output


def test_node_name_remap_is_dropped_with_a_warning(ros_process, tmp_path):
    """`-r __node:=X` would rename all three nodes of memory-node; it is dropped, said so."""
    proc = ros_process(["-m", "memory_node.ros.main", "--config", "go2.yaml", "--memory-dir",
                        str(tmp_path / "m"), "--ros-args", "-r", "__node:=memory_node"])
    proc.wait_for_line(r"ignoring the node-name remap __node:=memory_node", timeout=60)
    proc.wait_for_line(r"\[memory_recorder\]: recording .*lidar /point_cloud2", timeout=90)


def test_launch_arguments_win_over_the_config_file(ros_process, tmp_path):
    """`lidar_topic:=...` and the other common overrides given to the launch file win over
    go2.yaml's memory_recorder section, and the start line names them."""
    launch_file = install_prefix(tmp_path / "install")
    env = {"AMENT_PREFIX_PATH": os.pathsep.join(
        [str(tmp_path / "install"), os.environ.get("AMENT_PREFIX_PATH", "")]).rstrip(os.pathsep)}
    typed = {"camera_topic": "/cam", "lidar_topic": "/utlidar/cloud",
             "odom_topic": "/utlidar/robot_odom", "world_frame": "odom", "base_frame": "base",
             "stamp_source": "receipt"}
    proc = ros_process(["-c", RUN_LAUNCH, str(launch_file), "config:=go2.yaml",
                        f"memory_dir:={tmp_path / 'm'}",
                        *[f"{k}:={v}" for k, v in typed.items()]], env=env)
    line = proc.wait_for_line(r"\[memory_node\]: parameters from .*", timeout=120).group(0)
    for name, value in typed.items():
        assert f"{name} = {value} (command line)" in line, line
    proc.wait_for_line(r"\[memory_recorder\]: recording camera /cam, lidar /utlidar/cloud, "
                       r"odom /utlidar/robot_odom into .* \(stamps: receipt\)", timeout=60)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("launch_override_observer", context=ctx)
    executor = rclpy.executors.SingleThreadedExecutor(context=ctx)
    try:
        frames = parameter_values(node, executor, "memory_tf_listener",
                                  ["world_frame", "base_frame"])
        assert [f.string_value for f in frames] == ["odom", "base"]
        [voxel] = parameter_values(node, executor, "memory_recorder", ["lidar_voxel"])
        assert voxel.double_value == pytest.approx(0.15)  # the rest still from go2.yaml
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=ctx)
