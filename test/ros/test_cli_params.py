"""What the user types last wins, in the running commands: a plain `-p` on memory-node's
command line overrides the parameter file's per-node sections (memory-node always loads one),
and so it does for memory-recorder and memory-server given a file; the start line names each
value that came from the command line. The README's examples are run as written.

About 1 s of start-up per command here, plus the README's launch example (~10 s)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import rclpy
from clip_support import clip_repo_files
from hub_server import HubServer
from launch_support import RUN_LAUNCH, install_prefix
from rcl_interfaces.msg import ParameterType
from ros_helpers import parameter_values

from memory_node.core.model_store import CLIP, MODELS_ENV
from memory_node.ros.param_args import same_value
from memory_node.ros.params import names_by_node

ROOT = Path(__file__).resolve().parents[2]
MEMORY_YAML = ROOT / "config" / "memory.yaml"
GO2_YAML = ROOT / "config" / "go2.yaml"
START = r"\[memory_node\]: parameters from "
RECORDING = r"\[memory_recorder\]: recording (.*) into "


def recording(proc) -> str:
    """The recorder's start line: 'camera /x, lidar /y, odom /z ... (stamps: s)'."""
    return proc.wait_for_line(RECORDING + r".*\(stamps: \w+\)", timeout=90).group(0)


@pytest.mark.parametrize(("args", "start", "recorder"), [
    # issue 28's cases, as a unitree_ros2 user types them
    (["--ros-args", "-p", "lidar_topic:=/utlidar/cloud"],
     ["lidar_topic = /utlidar/cloud (command line)"],
     "camera /camera/image_raw, lidar /utlidar/cloud, odom /odom"),
    (["--ros-args", "-p", "stamp_source:=receipt", "-p", "camera_topic:=/x"],
     ["stamp_source = receipt (command line)", "camera_topic = /x (command line)"],
     "camera /x, lidar /lidar/points, odom /odom .*\\(stamps: receipt\\)"),
    (["--config", "go2.yaml", "--ros-args", "-p", "lidar_topic:=/utlidar/cloud"],
     ["lidar_topic = /utlidar/cloud (command line)"],
     "lidar /utlidar/cloud"),
    (["--ros-args", "-p", "memory_recorder:lidar_topic:=/utlidar/cloud"],
     ["memory_recorder:lidar_topic = /utlidar/cloud (command line)"],
     "lidar /utlidar/cloud"),
], ids=["plain", "two-plain", "go2-config", "node-qualified"])
def test_memory_node_command_line_wins(ros_process, tmp_path, args, start, recorder):
    memory_dir = tmp_path / "m"
    config = [a for a in args if a.endswith(".yaml")]
    proc = ros_process(["-m", "memory_node.ros.main", "--memory-dir", str(memory_dir), *args])
    line = proc.wait_for_line(START + r".*", timeout=60).group(0)
    file = GO2_YAML if config else MEMORY_YAML
    assert f"parameters from {file}; " in line, line
    assert line.endswith(", ".join([*start, f"memory_dir = {memory_dir} (--memory-dir)"])), line
    assert re.search(recorder, recording(proc)), proc.output


def test_memory_node_file_values_left_out_of_the_start_line(ros_process, tmp_path):
    """A value typed the same as the file's is not news; the line names the file alone."""
    proc = ros_process(["-m", "memory_node.ros.main", "--config", "go2.yaml", "--ros-args",
                        "-p", f"memory_dir:={tmp_path / 'm'}", "-p", "lidar_topic:=/point_cloud2",
                        "-p", "lidar_voxel:=0.15"])
    line = proc.wait_for_line(START + r".*", timeout=60).group(0)
    assert line.endswith(f"parameters from {GO2_YAML}; memory_dir = {tmp_path / 'm'} "
                         "(command line)"), line
    assert "lidar /point_cloud2" in recording(proc)


def test_a_misspelt_name_on_the_command_line_is_still_warned_about(ros_process, tmp_path):
    proc = ros_process(["-m", "memory_node.ros.main", "--memory-dir", str(tmp_path / "m"),
                        "--ros-args", "-p", "lidar_topik:=/utlidar/cloud"])
    proc.wait_for_line(r"unknown parameter lidar_topik \(ignored\); did you mean lidar_topic\?",
                       timeout=60)
    assert "lidar /lidar/points" in recording(proc)
    assert proc.output.count("unknown parameter lidar_topik") == 1, proc.output


def test_memory_recorder_alone_with_a_file(ros_process, tmp_path):
    proc = ros_process([
        "-m", "memory_node.ros.recorder", "--ros-args", "--params-file", str(GO2_YAML),
        "-p", f"memory_dir:={tmp_path / 'm'}", "-p", "lidar_topic:=/utlidar/cloud"])
    line = proc.wait_for_line(r"\[memory_recorder\]: parameters from .*", timeout=60).group(0)
    assert "lidar_topic = /utlidar/cloud (command line)" in line, line
    assert "lidar /utlidar/cloud" in recording(proc)


def test_memory_server_alone_with_a_file(ros_process, tmp_path):
    own = tmp_path / "server.yaml"
    own.write_text(f"memory_server:\n  ros__parameters:\n    memory_dir: {tmp_path / 'file'}\n")
    proc = ros_process(["-m", "memory_node.ros.server", "--ros-args", "--params-file", str(own),
                        "-p", f"memory_dir:={tmp_path / 'typed'}"])
    proc.wait_for_line(rf"\[memory_server\]: configured: memory at {tmp_path / 'typed'}$",
                       timeout=60)
    assert not (tmp_path / "file").exists()


# ---- the README's examples, as written -------------------------------------------------------

# Launch arguments that are not parameter overrides.
LAUNCH_ONLY = ("config", "memory_dir", "use_sim_time", "fleet_url", "robot_id")


def readme_commands(prefix: str) -> list[str]:
    """README lines (in code blocks) that start with `prefix` and set parameters: with
    `--ros-args -p`, or launch arguments that are parameters."""
    text = (ROOT / "README.md").read_text()
    lines = [line.split("  #")[0].strip() for block in re.findall(r"```sh\n(.*?)```", text,
                                                                    re.S)
             for line in block.splitlines()]
    return [line for line in lines if line.startswith(prefix) and (
        "--ros-args" in line and " -p " in line if prefix == "memory-node"
        else any(a.split(":=")[0] not in LAUNCH_ONLY for a in line.split() if ":=" in a))]


def get_parameters(node, target: str, names: list[str]) -> dict:
    executor = rclpy.executors.SingleThreadedExecutor(context=node.context)
    try:
        got = parameter_values(node, executor, target, names)
    finally:
        executor.shutdown()
    values = {}
    for name, value in zip(names, got, strict=True):
        assert value.type != ParameterType.PARAMETER_NOT_SET, f"{target} lacks {name}"
        values[name] = rclpy.parameter.parameter_value_to_python(value)
    return values


def check_typed_values_apply(ros, proc, typed: dict[str, str]) -> None:
    """Each typed value is in the start line and is what the node that reads it runs with."""
    line = proc.wait_for_line(START + r".*", timeout=120).group(0)
    _, _, node = ros
    readers = names_by_node("memory_tf_listener")
    for name, value in typed.items():
        assert f"{name} = {value} (" in line, line
        for target in sorted(n for n, names in readers.items() if name in names):
            got = get_parameters(node, target, [name])[name]
            assert same_value(got, value), (target, name, got, value)


MEMORY_NODE_EXAMPLES = readme_commands("memory-node")
LAUNCH_EXAMPLES = readme_commands("ros2 launch memory_node memory.launch.py")


def test_readme_has_override_examples():
    assert len(MEMORY_NODE_EXAMPLES) >= 2 and LAUNCH_EXAMPLES, (MEMORY_NODE_EXAMPLES,
                                                                 LAUNCH_EXAMPLES)


@pytest.mark.parametrize("command", MEMORY_NODE_EXAMPLES)
def test_readme_memory_node_examples(ros, ros_process, tmp_path, command):
    argv = shlex.split(command.replace("~/robot_memory", str(tmp_path / "robot_memory")))
    ros_args = argv[argv.index("--ros-args"):]
    typed = dict(a.split(":=", 1) for a in ros_args if ":=" in a)
    env = None
    if typed.get("image_embedder") == "clip":
        # The README fetches the model first: `memory-models fetch clip`, here from a local
        # hub stand-in serving tiny CLIP-shaped towers, into a models directory of the test's.
        models_dir = tmp_path / "models"
        env = {**os.environ, MODELS_ENV: str(models_dir)}
        with HubServer(CLIP.repo_id, CLIP.revision, clip_repo_files()) as hub:
            fetch = subprocess.run(
                [sys.executable, "-m", "memory_node.models", "fetch", "clip"],
                env={**env, "HF_ENDPOINT": hub.url}, capture_output=True, text=True,
                timeout=120)
        assert fetch.returncode == 0, fetch.stderr
    proc = ros_process(["-m", "memory_node.ros.main", *argv[1:]], env=env)
    check_typed_values_apply(ros, proc, typed)
    if "lidar_topic" in typed:
        assert f"lidar {typed['lidar_topic']}," in recording(proc)


@pytest.mark.parametrize("command", LAUNCH_EXAMPLES)
def test_readme_launch_examples(ros, ros_process, tmp_path, command):
    launch_file = install_prefix(tmp_path / "install")
    env = {"AMENT_PREFIX_PATH": os.pathsep.join(
        [str(tmp_path / "install"), os.environ.get("AMENT_PREFIX_PATH", "")]).rstrip(os.pathsep)}
    arguments = shlex.split(command)[4:]
    if not any(a.startswith("memory_dir:=") for a in arguments):
        arguments.append(f"memory_dir:={tmp_path / 'robot_memory'}")
    proc = ros_process(["-c", RUN_LAUNCH, str(launch_file), *arguments], env=env)
    typed = dict(a.split(":=", 1) for a in arguments
                 if a.split(":=", 1)[0] not in LAUNCH_ONLY)
    check_typed_values_apply(ros, proc, typed)
    assert "Traceback" not in proc.output
