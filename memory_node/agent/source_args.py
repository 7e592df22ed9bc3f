"""Where a command's memory is — a directory searched in-process, the memory server's ROS
services, or the fleet store — as one set of command-line options and checks, so memory-mcp
and memory-view take the same words for the same thing."""

from __future__ import annotations

import argparse
from pathlib import Path

from memory_node.agent.client import EngineClient, MemoryClient

MEMORY_DIR_DEFAULT = "default: $AGENT_MEMORY_DIR, else ./agent_memory"


def add_memory_source_args(parser: argparse.ArgumentParser, memory_dir_help: str,
                           exclusive: bool) -> None:
    """--memory-dir, --ros, --fleet-url and the options that go with them. `exclusive`: the
    three name one source each (memory-mcp); otherwise --ros may come with --memory-dir
    (memory-view reads the server's directory for its map) and `check_memory_source_args`
    keeps --fleet-url alone."""
    group: argparse._ActionsContainer = (parser.add_mutually_exclusive_group() if exclusive
                                         else parser)
    group.add_argument("--memory-dir", metavar="D", help=memory_dir_help)
    group.add_argument("--ros", action="store_true",
                       help="use the memory server's ROS services (/memory/*)")
    group.add_argument("--fleet-url", metavar="URL",
                       help="the fleet store (PostgreSQL; no password here: $PGPASSWORD or "
                            "~/.pgpass; '' takes $MEMORY_FLEET_URL)")
    parser.add_argument("--robot-id", default=None, metavar="R",
                        help="with --fleet-url: the asking robot (its map is the default for "
                             "spatial filters; default the host name)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="with --ros: seconds to wait for a service answer (default 5)")


def check_memory_source_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                             ros_args: list[str]) -> None:
    """Options that go with a source other than the one given end the command (exit 2)."""
    if args.fleet_url is not None and (args.ros or args.memory_dir):
        parser.error("--fleet-url goes alone: not with --ros or --memory-dir")
    if ros_args and not args.ros:
        parser.error("--ros-args goes with --ros")
    if args.timeout is not None and not args.ros:
        parser.error("--timeout goes with --ros")
    if args.robot_id is not None and args.fleet_url is None:
        parser.error("--robot-id goes with --fleet-url")


def memory_dir_of(args: argparse.Namespace) -> Path:
    """--memory-dir, else the default every node and command takes (MemoryConfig:
    $AGENT_MEMORY_DIR, else ./agent_memory)."""
    from memory_node.core.config import MemoryConfig

    return MemoryConfig.from_mapping({"memory_dir": args.memory_dir} if args.memory_dir
                                     else {}).root


def ros_memory_client(args: argparse.Namespace, ros_args: list[str], prog: str) -> MemoryClient:
    """--ros: the memory server's services, through the agent's ROS client."""
    from memory_node.agent.ros_client import RosClient

    return RosClient(timeout_s=args.timeout, args=[prog, *ros_args])


def fleet_memory_client(args: argparse.Namespace) -> MemoryClient:
    """--fleet-url: an in-process engine on the fleet store, as robot --robot-id."""
    from memory_node.core.config import MemoryConfig
    from memory_node.fleet.engine import open_engine

    return EngineClient(open_engine(MemoryConfig.from_mapping({}),
                                    fleet_url=args.fleet_url or None, robot_id=args.robot_id),
                        close_engine=True)
