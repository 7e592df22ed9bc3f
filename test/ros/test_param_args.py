"""What the user types last wins: the rewritten ROS arguments, fed to real rcl/rclpy, give each
node the value typed last, and the start line names the values that came from the command
line. The nodes themselves, started with these arguments, are tested in test_cli_params.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import rclpy
from rclpy.node import Node
from ros_helpers import init_undiscovered

from memory_node.ros.param_args import command_line_wins, node_name, same_value
from memory_node.ros.params import names_by_node

ROOT = Path(__file__).resolve().parents[2]
MEMORY_YAML = str(ROOT / "config" / "memory.yaml")
GO2_YAML = str(ROOT / "config" / "go2.yaml")
NODES = ["memory_server", "memory_recorder", "memory_tf_listener"]
DECLARED = names_by_node("memory_tf_listener")


def given(args: list[str], node: str = "memory_recorder", nodes=NODES) -> dict:
    """The parameters rclpy gives `node` (no namespace) for `args` after the rewrite."""
    cmdline = command_line_wins(["prog", "--ros-args", *args], nodes, DECLARED)
    ctx = rclpy.Context()
    init_undiscovered(ctx, cmdline.args)
    try:
        n = Node(node, context=ctx)
        try:
            return {k: p.value for k, p in n._parameter_overrides.items()}
        finally:
            n.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


def test_a_plain_p_wins_over_the_files_recorder_section():
    params = given(["--params-file", MEMORY_YAML, "-p", "lidar_topic:=/utlidar/cloud"])
    assert params["lidar_topic"] == "/utlidar/cloud"
    assert params["camera_topic"] == "/camera/image_raw"  # the rest still from the file


def test_several_plain_p_all_win():
    params = given(["--params-file", MEMORY_YAML, "-p", "stamp_source:=receipt",
                    "-p", "camera_topic:=/x"])
    assert (params["stamp_source"], params["camera_topic"]) == ("receipt", "/x")


def test_a_plain_p_wins_over_another_file():
    params = given(["--params-file", GO2_YAML, "-p", "lidar_topic:=/utlidar/cloud"])
    assert params["lidar_topic"] == "/utlidar/cloud"
    assert params["lidar_voxel"] == pytest.approx(0.15)  # go2.yaml's


def test_node_qualified_p_keeps_working_and_targets_one_node():
    args = ["--params-file", MEMORY_YAML, "-p", "memory_recorder:lidar_topic:=/utlidar/cloud"]
    assert given(args)["lidar_topic"] == "/utlidar/cloud"
    assert "lidar_topic" not in given(args, "memory_server")


def test_a_plain_p_reaches_every_node_of_the_process():
    args = ["--params-file", MEMORY_YAML, "-p", "world_frame:=odom"]
    for node in NODES:
        assert given(args, node)["world_frame"] == "odom"


def test_a_file_typed_after_the_p_wins(tmp_path):
    later = tmp_path / "later.yaml"
    later.write_text("memory_recorder:\n  ros__parameters:\n    lidar_topic: /from_file\n")
    args = ["--params-file", MEMORY_YAML, "-p", "lidar_topic:=/typed", "--params-file",
            str(later)]
    assert given(args)["lidar_topic"] == "/from_file"
    cmdline = command_line_wins(["--ros-args", *args], NODES, DECLARED)
    assert cmdline.notes == []  # the file's value is what the node runs with


def test_typed_value_keeps_its_yaml_type():
    params = given(["--params-file", MEMORY_YAML, "-p", "max_interval:=5", "-p",
                    "camera_topic:='123'"])
    assert params["max_interval"] == 5 and params["camera_topic"] == "123"


def test_a_namespaced_node_still_gets_the_plain_value():
    """rcl's qualified rules cannot name a namespaced node, nor does the file's section reach
    it; the plain rule, kept under /**, still does."""
    params = given(["-r", "__ns:=/robot0", "--params-file", MEMORY_YAML,
                    "-p", "lidar_topic:=/robot0/points"])
    assert params["lidar_topic"] == "/robot0/points"


def test_start_line_names_only_values_that_differ_from_the_file():
    cmdline = command_line_wins(
        ["--ros-args", "--params-file", MEMORY_YAML, "-p", "lidar_topic:=/utlidar/cloud",
         "-p", "camera_topic:=/camera/image_raw", "-p", "min_distance:=0.50",
         "-p", "memory_recorder:min_yaw:=1", "-p", "lidar_topik:=/typo"], NODES, DECLARED)
    assert cmdline.notes == ["lidar_topic = /utlidar/cloud (command line)",
                             "memory_recorder:min_yaw = 1 (command line)",
                             "lidar_topik = /typo (command line)"]
    assert cmdline.start_line(["memory_dir = /m (--memory-dir)"]) == (
        f"parameters from {MEMORY_YAML}; lidar_topic = /utlidar/cloud (command line), "
        "memory_recorder:min_yaw = 1 (command line), lidar_topik = /typo (command line), "
        "memory_dir = /m (--memory-dir)")


def test_a_flag_replaces_the_p_it_outranks_in_the_start_line():
    """memory-node's --memory-dir wins over -p memory_dir (it is a node override)."""
    cmdline = command_line_wins(["--ros-args", "-p", "memory_dir:=/a", "-p", "min_yaw:=1"],
                                NODES, DECLARED)
    assert cmdline.start_line(["memory_dir = /b (--memory-dir)"]) == (
        "parameters: min_yaw = 1 (command line), memory_dir = /b (--memory-dir)")


def test_no_file_and_nothing_typed_says_nothing():
    assert command_line_wins(["prog"], ["memory_recorder"]).start_line() == ""
    assert command_line_wins(["prog", "--ros-args", "-p", "use_sim_time:=true"],
                             ["memory_recorder"]).start_line() == (
        "parameters: use_sim_time = true (command line)")


def test_arguments_outside_ros_args_are_left_alone():
    args = ["prog", "-p", "x:=1", "--ros-args", "-p", "y:=2", "--", "-p", "z:=3"]
    assert command_line_wins(args, ["n"]).args == [
        "prog", "-p", "x:=1", "--ros-args", "-p", "y:=2", "-p", "n:y:=2", "--", "-p", "z:=3"]


def test_one_node_process_follows_a_node_name_remap():
    assert node_name(["prog", "--ros-args", "-r", "__node:=rec2"], "memory_recorder") == "rec2"
    assert node_name(["prog"], "memory_recorder") == "memory_recorder"


def test_values_compare_as_parameters():
    assert same_value(5, 5.0) and same_value("1e-3", 0.001) and same_value(["a"], ["a"])
    assert not same_value(True, 1) and not same_value("/a", "/b")


NODE_FIRST = ("memory_recorder:\n  ros__parameters:\n    lidar_topic: /node\n"
              "/**:\n  ros__parameters:\n    lidar_topic: /all\n    world_frame: odom\n")
SERVER_ONLY = "memory_server:\n  ros__parameters:\n    memory_dir: /from/file\n"
WILDCARD = "/**/memory_recorder:\n  ros__parameters:\n    lidar_topic: /wild\n"


@pytest.mark.parametrize(("files", "rules"), [
    ([MEMORY_YAML], ["-p", "lidar_topic:=/typed"]),
    (["NODE_FIRST"], ["-p", "lidar_topic:=/typed"]),
    (["NODE_FIRST"], ["-p", "memory_recorder:lidar_topic:=/typed"]),  # /** after it wins
    (["NODE_FIRST"], ["-p", "world_frame:=odom", "-p", "lidar_topic:=/all"]),  # as the file
    (["SERVER_ONLY"], ["-p", "memory_dir:=/typed"]),
    (["WILDCARD", MEMORY_YAML], ["-p", "lidar_topic:=/typed", "-p", "stamp_source:=header"]),
])
def test_start_line_agrees_with_what_rclpy_gives(tmp_path, files, rules):
    """The oracle is rclpy itself: the values each node gets with the rules, against those it
    gets from the files alone. The start line names exactly the ones that differ."""
    texts = {"NODE_FIRST": NODE_FIRST, "SERVER_ONLY": SERVER_ONLY, "WILDCARD": WILDCARD}
    paths = []
    for f in files:
        if f in texts:
            (tmp_path / f"{f}.yaml").write_text(texts[f])
            f = str(tmp_path / f"{f}.yaml")
        paths.append(f)
    file_args = [a for p in paths for a in ("--params-file", p)]
    changed = set()
    for node in NODES:
        with_rules = given(file_args + rules, node)
        files_alone = given(file_args, node, nodes=[])
        changed |= {name for name, value in with_rules.items()
                    if name in DECLARED[node] and (name not in files_alone
                                                   or not same_value(files_alone[name], value))}
    notes = command_line_wins(["--ros-args", *file_args, *rules], NODES, DECLARED).notes
    noted = {n.split(" = ")[0].split(":")[-1] for n in notes}
    assert noted == changed, notes
