"""`memory-node`: recorder + query server in one process, configured and activated, from one
YAML file (ROS parameter-file format, as config/memory.yaml)."""

from __future__ import annotations

import argparse
import sys

import rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter

from memory_node.core.param_file import resolve_config
from memory_node.core.parameters import split_ros_args
from memory_node.ros import params
from memory_node.ros.common import TF_LISTENER_NODE, pose_tracker_from_params
from memory_node.ros.process import StopRequest, init_ros, spin_nodes
from memory_node.ros.recorder import MemoryRecorder
from memory_node.ros.server import MemoryServer

# The nodes of the process, each reading its own section of the parameter file.
NODES = ("memory_server", "memory_recorder", TF_LISTENER_NODE)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="memory-node", description=__doc__,
        epilog="ROS arguments go after --ros-args (e.g. --ros-args -p lidar_topic:=/points); a "
        "plain -p wins over every section of the --config file. The first line logged names the "
        "values that did not come from the file.")
    parser.add_argument("--config", help="parameter YAML: a path, or a name in the package's "
                        "config directory such as go2.yaml (default: memory.yaml)")
    parser.add_argument("--memory-dir", help="memory directory (overrides the YAML)")
    parser.add_argument("--use-sim-time", action="store_true",
                        help="use /clock (bag replay) for every time the nodes read")
    parser.add_argument("--no-recorder", action="store_true", help="serve queries only")
    parser.add_argument("--robot-prefix", metavar="P",
                        help="one of several robots on one graph: record /P/<topic> with "
                        "frames P/<frame> (robot_prefix; map and odom stay shared)")
    argv, ros_args = split_ros_args(argv)
    return parser.parse_args(argv), ros_args


def drop_node_name_remaps(ros_args: list[str]) -> tuple[list[str], list[str]]:
    """ROS arguments without `-r __node:=NAME` (which rclpy applies to every node of the
    process: three nodes of one name, and the recorder's parameter section ignored), and the
    remaps dropped. launch_ros adds one for `Node(name=...)`."""
    kept, dropped = [], []
    i = 0
    while i < len(ros_args):
        arg = ros_args[i]
        if arg in ("-r", "--remap") and i + 1 < len(ros_args) \
                and ros_args[i + 1].split(":", 1)[0] in ("__node", "__name"):
            dropped.append(ros_args[i + 1])
            i += 2
            continue
        kept.append(arg)
        i += 1
    return kept, dropped


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, ros_args = parse_args(argv)
    config = resolve_config(args.config or "memory.yaml")
    if config is None and args.config:
        print(f"memory-node: config file {args.config} does not exist (neither as a path nor "
              "in the package's config directory)", file=sys.stderr)
        return 2
    ros_args, dropped = drop_node_name_remaps([a for a in ros_args if a != "--ros-args"])
    if dropped:
        print(f"memory-node: ignoring the node-name remap {', '.join(dropped)}: this process "
              "runs memory_server, memory_recorder and memory_tf_listener, each reading its "
              "own section of the parameter file", file=sys.stderr)
    rargs = ["memory-node", "--ros-args"]
    if config is not None:
        rargs += ["--params-file", str(config)]
    overrides, notes = [], []
    if args.memory_dir:
        overrides.append(Parameter("memory_dir", Parameter.Type.STRING, args.memory_dir))
        notes.append(f"memory_dir = {args.memory_dir} (--memory-dir)")
    if args.use_sim_time:
        overrides.append(Parameter("use_sim_time", Parameter.Type.BOOL, True))
        notes.append("use_sim_time = true (--use-sim-time)")
    if args.robot_prefix is not None:
        notes.append(f"robot_prefix = {args.robot_prefix} (--robot-prefix)")
    # A plain -p after the file wins over its per-node sections, for all three nodes.
    stop = init_ros("memory-node", rargs + ros_args, nodes=NODES, notes=notes,
                    declared=params.names_by_node(TF_LISTENER_NODE))
    try:
        return _run(args, overrides, stop)
    except params.ParameterError as exc:
        print(f"memory-node: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2


def _run(args: argparse.Namespace, overrides: list, stop: StopRequest) -> int:
    """Every node's parameters are checked before any service is advertised."""
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

    if args.robot_prefix is not None:  # every node: the listener's frames, the recorder's topics
        overrides = [*overrides, Parameter("robot_prefix", Parameter.Type.STRING,
                                           args.robot_prefix)]
    # One TF listener for the process, on a node and a thread of its own: /tf is read once,
    # and a burst of camera frames or queries never holds it up.
    listener = Node(TF_LISTENER_NODE, parameter_overrides=overrides)
    poses = pose_tracker_from_params(listener, **({} if args.no_recorder else {"odom_topic": None}))
    params.warn_unknown(listener)
    server = MemoryServer(parameter_overrides=overrides, poses=poses, advertise=False)
    server.trigger_configure()
    if server.engine is None:
        server.get_logger().error("not configured: see the line above; exiting")
        for node in (server, listener):
            node.destroy_node()
        rclpy.try_shutdown()
        return 1
    extra = [(SingleThreadedExecutor(), [listener])]
    if not args.no_recorder:
        # The recorder's callbacks on an executor of their own, single-threaded: they are
        # cheap, and rclpy's multi-threaded executor lost messages at 5x replay speed.
        try:
            recorder = MemoryRecorder(engine=server.engine, poses=poses,
                                      parameter_overrides=overrides)
        except params.ParameterError:
            server.close_engine()
            raise
        extra.insert(0, (SingleThreadedExecutor(), [recorder]))
    server.advertise()
    server.trigger_activate()
    spin_nodes([server], stop, MultiThreadedExecutor(num_threads=server.executor_threads()),
               extra=extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
