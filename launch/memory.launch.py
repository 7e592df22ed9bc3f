"""Launch memory_node on a robot: recorder + query server in one process (`memory-node`),
configured and activated, with a parameter file and optional simulated time.

    ros2 launch memory_node memory.launch.py
    ros2 launch memory_node memory.launch.py config:=go2.yaml use_sim_time:=true
    ros2 launch memory_node memory.launch.py memory_dir:=/data/robot_memory
    MEMORY_FLEET_URL=postgresql://robot@fleet-db/memory ros2 launch memory_node memory.launch.py

With a fleet URL (launch argument `fleet_url`, or $MEMORY_FLEET_URL) `memory-sync` runs beside
the node and pushes the store to the fleet's PostgreSQL; the URL reaches it through the
environment, never a command line (a password there would show in `ps`).

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
    nodes = [Node(package="memory_node", executable="memory-node", output="screen",
                  arguments=args, emulate_tty=True)]
    fleet_url = LaunchConfiguration("fleet_url").perform(context) or os.environ.get(
        "MEMORY_FLEET_URL", "")
    if fleet_url:
        sync = ["--memory-dir", memory_dir or _memory_dir_of(config)]
        robot_id = LaunchConfiguration("robot_id").perform(context)
        if robot_id:
            sync += ["--robot-id", robot_id]
        nodes.append(Node(package="memory_node", executable="memory-sync", output="screen",
                          arguments=sync, additional_env={"MEMORY_FLEET_URL": fleet_url}))
    return nodes


def _memory_dir_of(config):
    """The memory directory memory-node will use with this parameter file (its `/**` or
    memory_recorder section, else $AGENT_MEMORY_DIR, else ./agent_memory)."""
    import yaml

    with open(config) as f:
        data = yaml.safe_load(f) or {}
    for section in ("memory_recorder", "/**"):
        value = ((data.get(section) or {}).get("ros__parameters") or {}).get("memory_dir")
        if value:
            return value
    return os.environ.get("AGENT_MEMORY_DIR") or "./agent_memory"


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value="memory.yaml",
                              description="parameter file (a name under share/config or a path)"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="use /clock, e.g. while replaying a bag"),
        DeclareLaunchArgument("memory_dir", default_value="",
                              description="memory directory (default: from the config file)"),
        DeclareLaunchArgument("fleet_url", default_value="",
                              description="fleet PostgreSQL URL: also start memory-sync "
                              "(default $MEMORY_FLEET_URL; keep passwords out of it)"),
        DeclareLaunchArgument("robot_id", default_value="",
                              description="this robot's id in the fleet (default: host name)"),
        OpaqueFunction(function=_nodes),
    ])
