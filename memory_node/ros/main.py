"""`memory-node`: recorder + query server in one process, configured and activated, from one
YAML file (ROS parameter-file format, as config/memory.yaml)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import rclpy
from rclpy.parameter import Parameter

from memory_node.ros.recorder import MemoryRecorder
from memory_node.ros.server import MemoryServer, spin_nodes


def resolve_config(name: str | Path = "memory.yaml") -> Path | None:
    """A path as given if it exists; else a file of that name in the package's config
    directory (installed share/memory_node/config, or the source tree's config/)."""
    given = Path(name)
    if given.exists():
        return given
    if given.parent != Path("."):
        return None
    candidates = [Path(__file__).resolve().parents[2] / "config" / given.name]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.insert(0, Path(get_package_share_directory("memory_node")) / "config"
                          / given.name)
    except Exception:  # noqa: BLE001 - not installed through ament: use the source tree
        pass
    return next((p for p in candidates if p.exists()), None)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="memory-node", description=__doc__)
    parser.add_argument("--config", help="parameter YAML: a path, or a name in the package's "
                        "config directory such as go2.yaml (default: memory.yaml)")
    parser.add_argument("--memory-dir", help="memory directory (overrides the YAML)")
    parser.add_argument("--use-sim-time", action="store_true",
                        help="use /clock (bag replay) for every time the nodes read")
    parser.add_argument("--no-recorder", action="store_true", help="serve queries only")
    ros_args: list[str] = []
    if "--ros-args" in argv:
        i = argv.index("--ros-args")
        argv, ros_args = argv[:i], argv[i:]
    return parser.parse_args(argv), ros_args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, ros_args = parse_args(argv)
    config = resolve_config(args.config or "memory.yaml")
    if config is None and args.config:
        print(f"memory-node: config file {args.config} does not exist (neither as a path nor "
              "in the package's config directory)", file=sys.stderr)
        return 2
    rargs = ["memory-node", "--ros-args"]
    if config is not None:
        rargs += ["--params-file", str(config)]
    rargs += [a for a in ros_args if a != "--ros-args"]
    rclpy.init(args=rargs)
    overrides = []
    if args.memory_dir:
        overrides.append(Parameter("memory_dir", Parameter.Type.STRING, args.memory_dir))
    if args.use_sim_time:
        overrides.append(Parameter("use_sim_time", Parameter.Type.BOOL, True))
    server = MemoryServer(parameter_overrides=overrides)
    server.trigger_configure()
    if server.engine is None:
        server.get_logger().error("not configured: see the line above; exiting")
        server.destroy_node()
        rclpy.try_shutdown()
        return 1
    server.trigger_activate()
    extra = []
    if not args.no_recorder:
        # The recorder's callbacks on an executor of their own, single-threaded: they are
        # cheap, and rclpy's multi-threaded executor lost messages at 5x replay speed.
        from rclpy.executors import SingleThreadedExecutor

        recorder = MemoryRecorder(engine=server.engine, parameter_overrides=overrides)
        extra.append((SingleThreadedExecutor(), [recorder]))
    spin_nodes([server], extra=extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
