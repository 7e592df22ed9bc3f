"""Launch memory_node on a robot: recorder + query server in one process (`memory-node`),
configured and activated, with a parameter file and optional simulated time.

    ros2 launch memory_node memory.launch.py
    ros2 launch memory_node memory.launch.py config:=go2.yaml use_sim_time:=true
    ros2 launch memory_node memory.launch.py memory_dir:=/data/robot_memory

The process runs three nodes — memory_server, memory_recorder and memory_tf_listener — each
reading its own section of the parameter file, so the Node action gets no `name`: launch_ros
would turn it into a `__node:=` remap that renames every node of the process.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def _nodes(context):
    config = LaunchConfiguration("config").perform(context)
    if not os.path.isabs(config) and not os.path.exists(config):
        config = os.path.join(get_package_share_directory("memory_node"), "config", config)
    sim = LaunchConfiguration("use_sim_time").perform(context).lower() in ("true", "1")
    memory_dir = LaunchConfiguration("memory_dir").perform(context)
    args = ["--config", config]
    if memory_dir:
        args += ["--memory-dir", memory_dir]
    if sim:
        args.append("--use-sim-time")
    return [Node(package="memory_node", executable="memory-node", output="screen",
                 arguments=args, emulate_tty=True)]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value="memory.yaml",
                              description="parameter file (a name under share/config or a path)"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="use /clock, e.g. while replaying a bag"),
        DeclareLaunchArgument("memory_dir", default_value="",
                              description="memory directory (default: from the config file)"),
        OpaqueFunction(function=_nodes),
    ])
