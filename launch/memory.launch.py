"""Launch memory_node on a robot: recorder + query server in one process (`memory-node`),
configured and activated, with a parameter file and optional simulated time.

    ros2 launch memory_node memory.launch.py
    ros2 launch memory_node memory.launch.py config:=go2.yaml use_sim_time:=true
    ros2 launch memory_node memory.launch.py memory_dir:=/data/robot_memory
    ros2 launch memory_node memory.launch.py config:=go2.yaml lidar_topic:=/utlidar/cloud
    MEMORY_FLEET_URL=postgresql://robot@fleet-db/memory ros2 launch memory_node memory.launch.py

The common settings are launch arguments too, and win over the parameter file (an empty value,
the default, leaves the file's): `camera_topic`, `lidar_topic`, `odom_topic`, `world_frame`,
`base_frame`, `stamp_source`, `robot_prefix` (prefixes every topic and frame of a profile, for
a robot among several on one ROS graph) and `memory_dir`. They reach memory-node as
`--ros-args -p NAME:=VALUE` (quoted, so a value stays a string), and its start line names
each one that differs from the file: `lidar_topic = /utlidar/cloud (command line)`.

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

# Launch arguments passed on as plain `-p NAME:=VALUE` (they win over the parameter file).
OVERRIDES = {
    "camera_topic": "sensor_msgs/Image topic",
    "lidar_topic": "sensor_msgs/PointCloud2 topic",
    "odom_topic": "nav_msgs/Odometry topic",
    "world_frame": "frame poses are given in",
    "base_frame": "the robot's body frame",
    "stamp_source": "header, receipt or auto: which time a row is stored at",
    "robot_prefix": "prefix of every topic and frame of the profile (several robots)",
}


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
    overrides = [(name, LaunchConfiguration(name).perform(context)) for name in OVERRIDES]
    overrides = [(name, value) for name, value in overrides if value]
    if overrides:
        args.append("--ros-args")
        for name, value in overrides:
            args += ["-p", f"{name}:={_quoted(value)}"]
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


def _quoted(value):
    """A YAML single-quoted string: `-p` values are YAML, and a frame named `1` or `on`
    must stay a string."""
    return "'" + value.replace("'", "''") + "'"


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
        *[DeclareLaunchArgument(name, default_value="",
                                description=f"{description} (default: from the config file)")
          for name, description in OVERRIDES.items()],
        OpaqueFunction(function=_nodes),
    ])
