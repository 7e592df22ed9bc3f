"""memory-node's parameter file read without ROS (what memory-import configures itself from):
merged like rclpy merges node sections, converted as strictly as the nodes convert."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_node.core import param_file
from memory_node.core.parameters import ParameterError

FILE = """\
/**:
  ros__parameters:
    world_frame: map
    onnx_threads: 0
memory_recorder:
  ros__parameters:
    lidar_topic: /point_cloud2
    lidar_topik: /typo
memory_server:
  ros__parameters:
    k_default: 7
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_sections_merge_as_the_nodes_see_them(tmp_path):
    settings, config, unknown = param_file.load(write(tmp_path, FILE),
                                                {"memory_dir": str(tmp_path / "m")})
    assert settings["lidar_topic"] == "/point_cloud2" and settings["world_frame"] == "map"
    assert config.k_default == 7 and config.memory_dir == str(tmp_path / "m")
    assert unknown == ["lidar_topik (did you mean lidar_topic?)"]


def test_a_value_the_node_refuses_is_refused_with_the_same_line(tmp_path):
    bad = FILE.replace("k_default: 7", 'k_default: "7"')
    with pytest.raises(ParameterError, match=r"parameter k_default = '7' \(str\) is not valid; "
                       r"expected an integer"):
        param_file.load(write(tmp_path, bad))
    with pytest.raises(ParameterError, match="is not a mapping of node sections"):
        param_file.load(write(tmp_path, "- a list\n"))


def test_config_names_resolve_in_the_package(tmp_path):
    assert param_file.resolve_config("go2.yaml").name == "go2.yaml"
    assert param_file.resolve_config("no_such.yaml") is None
    assert param_file.resolve_config(tmp_path / "missing" / "x.yaml") is None
    given = write(tmp_path, FILE)
    assert param_file.resolve_config(given) == given
