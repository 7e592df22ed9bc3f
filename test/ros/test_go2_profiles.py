"""The Go2 driver stacks' profiles in a real `memory-node` process: what its start line says it
records, with the prefix of one of several robots. (The profiles' contents are checked in
test_launch_config.py; replays of each stack's recordings run in test/e2e.)"""

from __future__ import annotations


def test_memory_node_with_a_robot_prefix_records_that_robots_topics(ros_process, tmp_path):
    proc = ros_process(["-m", "memory_node.ros.main", "--config", "go2_ros2_sdk.yaml",
                        "--memory-dir", str(tmp_path / "m"), "--robot-prefix", "robot1"])
    proc.wait_for_line(r"robot_prefix = robot1 \(--robot-prefix\)", timeout=120)
    proc.wait_for_line(r"\[memory_recorder\]: recording camera /robot1/camera/image_raw, lidar "
                       r"/robot1/point_cloud2, odom /robot1/odom", timeout=120)
    proc.wait_for_line(r"active: /memory/search", timeout=120)


def test_memory_node_with_the_unitree_profile_records_the_front_video(ros_process, tmp_path):
    proc = ros_process(["-m", "memory_node.ros.main", "--config", "unitree_ros2.yaml",
                        "--memory-dir", str(tmp_path / "m")])
    line = proc.wait_for_line(r"\[memory_recorder\]: recording .*", timeout=120).group(0)
    assert ("camera /frontvideostream, lidar /utlidar/cloud, odom /utlidar/robot_odom"
            in line)


def test_front_video_without_unitree_go_says_how_to_get_it(monkeypatch):
    """A robot whose unitree_ros2 workspace is not sourced (and whose build skipped
    unitree_go): one clear line before anything is subscribed, not an ImportError."""
    import sys

    import pytest

    from memory_node.core.parameters import ParameterError
    from memory_node.ros.recorder import front_video_type

    assert front_video_type().__name__ == "Go2FrontVideoData"
    monkeypatch.setitem(sys.modules, "unitree_go.msg", None)
    with pytest.raises(ParameterError, match="Go2FrontVideoData is not importable: source "
                       "unitree_ros2's workspace"):
        front_video_type()
