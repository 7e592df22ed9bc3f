"""Node parameters on a ROS graph: typed declarations and warnings about unknown keys.

The tables and the strict conversion are ROS-free (core/parameters.py, shared with offline
tools); here each parameter is declared with dynamic typing, read back and converted, so a
wrong value stops the node with one line before any service is advertised, and keys nobody
declares (`lidar_topik`) are warned about with the nearest known name.
"""

from __future__ import annotations

from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node

from memory_node.core.parameters import (  # noqa: F401 - the nodes' names for the tables
    CHOICES,
    ENGINE_UNSET,
    POSE_PARAMS,
    RECORDER_PARAMS,
    ROS_PARAMS,
    SERVER_PARAMS,
    ParameterError,
    convert,
    engine_param_table,
    known_names,
    names_by_node,
    unknown_with_nearest,
)


def declare(node: Node, table: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Declare each parameter of `table` (skipping ones already declared) and return their
    values converted to the defaults' types. Raises ParameterError."""
    values = {}
    for name, (default, description) in table.items():
        if not node.has_parameter(name):
            node.declare_parameter(name, default, ParameterDescriptor(
                description=description, dynamic_typing=True))
        raw = node.get_parameter(name).value
        values[name] = convert(name, raw, default)
    return values


_warned: set[str] = set()


def warn_unknown(node: Node) -> list[str]:
    """Warn (once per process and key) about parameters given to this node that no node of
    the package knows — a misspelt key would otherwise be ignored silently."""
    # rclpy keeps what --params-file and -p gave a node in _parameter_overrides (every
    # distro since Foxy); nothing public lists them.
    given = set(getattr(node, "_parameter_overrides", {}) or {})
    unknown = unknown_with_nearest(given)
    for key, near in unknown:
        if key in _warned:
            continue
        _warned.add(key)
        hint = f"; did you mean {near}?" if near else ""
        node.get_logger().warning(f"unknown parameter {key} (ignored){hint}")
    return [key for key, _ in unknown]
