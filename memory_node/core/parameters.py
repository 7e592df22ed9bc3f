"""Node parameters without a ROS graph: the tables every node of memory-node declares, and
strict conversion to each default's type.

rclpy types a parameter by its first value: `max_interval: 10` in a YAML file is an integer,
and declaring it with a float default ends in InvalidParameterTypeException with a traceback.
The nodes declare every parameter with dynamic typing (ros/params.py) and convert it here,
strictly, to its default's type (an integer is a valid float; "ten" is not), so a wrong value
stops the node with one line naming the parameter, the value and the type expected. Offline
tools (memory-import, core/param_file.py) convert a parameter file with the same tables, so a
value the node refuses is refused there with the same line.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from memory_node.core.config import ConfigError, MemoryConfig, coerce_value
from memory_node.core.recorder_settings import POSE_PARAMS, RECORDER_CHOICES, RECORDER_PARAMS
from memory_node.core.streams import stream_topic_params

# Parameters whose "unset" value lets the environment fallback of MemoryConfig apply.
ENGINE_UNSET = {"memory_dir": "", "onnx_threads": 0}

SERVER_PARAMS: dict[str, tuple[Any, str]] = {
    "autostart": (True, "configure and activate at start (memory-server)"),
    "backend": ("local", "local: the store in memory_dir; fleet: the shared PostgreSQL store"),
    "fleet_url": ("", "PostgreSQL URL of the fleet store, no password ('' = $MEMORY_FLEET_URL)"),
    "robot_id": ("", "this robot's id in a fleet ('' = the host name)"),
    "map_id": ("", "the map this robot's poses are in ('' = <robot_id>/map)"),
    "max_pending_requests": (64, "requests waiting for the engine; more are refused"),
    "service_queue_depth": (1000, "requests the middleware keeps for each service"),
    "clock_wait_s": (2.0, "with use_sim_time: how long a request waits for a first /clock"),
    "answer_resend_s": (10.0, "how long an answer is re-sent to a client not discovered yet"),
    "view_port": (0, "serve the memory view (memory-view's page) on 127.0.0.1 at this port "
                     "while active (0 = off)"),
}

CHOICES: dict[str, tuple[str, ...]] = {**RECORDER_CHOICES, "backend": ("local", "fleet")}

# Parameters every ROS 2 node has.
ROS_PARAMS = {"use_sim_time", "start_type_description_service"}


class ParameterError(ValueError):
    """A parameter value that cannot be used; the message is one line."""


def split_ros_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the program's own arguments, `--ros-args ...`): launch_ros and `ros2 run` append ROS
    arguments after the program's."""
    if "--ros-args" not in argv:
        return argv, []
    i = argv.index("--ros-args")
    return argv[:i], argv[i:]


def engine_param_table() -> dict[str, tuple[Any, str]]:
    table = {}
    for f in dataclasses.fields(MemoryConfig):
        default = ENGINE_UNSET.get(f.name, f.default)
        table[f.name] = (list(default) if isinstance(default, tuple) else default, "")
    return table


def known_names() -> set[str]:
    return (set(engine_param_table()) | set(POSE_PARAMS) | set(RECORDER_PARAMS)
            | set(stream_topic_params()) | set(SERVER_PARAMS) | ROS_PARAMS)


def names_by_node(tf_listener: str) -> dict[str, set[str]]:
    """The parameters each node of memory-node reads (the server, the recorder, and the TF
    listener named `tf_listener`)."""
    engine = set(engine_param_table())
    return {"memory_server": engine | set(POSE_PARAMS) | set(SERVER_PARAMS) | ROS_PARAMS,
            "memory_recorder": (engine | set(POSE_PARAMS) | set(RECORDER_PARAMS)
                                | set(stream_topic_params()) | ROS_PARAMS),
            tf_listener: set(POSE_PARAMS) | ROS_PARAMS}


def _type_name(default: Any) -> str:
    if isinstance(default, bool):
        return "a boolean"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, list):
        return "a list of strings"
    return "a string"


def convert(name: str, value: Any, default: Any) -> Any:
    """`value` as the type of `default`, strictly (ints are valid floats). ParameterError."""
    if value is None:
        raise ParameterError(f"parameter {name} has no value; expected {_type_name(default)}")
    try:
        if isinstance(default, list):
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(name)
            out: Any = list(value)
        elif isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(name)
        elif isinstance(default, (int, float)) and isinstance(value, str):
            raise ConfigError(name)  # "10" in a YAML file is a quoted string: say so
        else:
            out = coerce_value(name, value, default)
    except ConfigError:
        raise ParameterError(
            f"parameter {name} = {value!r} ({type(value).__name__}) is not valid; expected "
            f"{_type_name(default)} (default {default!r})") from None
    choices = CHOICES.get(name)
    if choices and out not in choices:
        raise ParameterError(f"parameter {name} = {value!r} is not one of {', '.join(choices)}")
    return out


def unknown_with_nearest(given: set[str] | list[str]) -> list[tuple[str, str | None]]:
    """The given keys no node of the package knows (qos_overrides aside), sorted, each with
    the nearest known name (None when nothing is near)."""
    known = known_names()
    out: list[tuple[str, str | None]] = []
    for key in sorted(set(given) - known):
        if key.startswith("qos_overrides."):
            continue
        near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        out.append((key, near[0] if near else None))
    return out


def unknown_names(given: set[str] | list[str]) -> list[str]:
    """`unknown_with_nearest` as lines: "lidar_topik (did you mean lidar_topic?)"."""
    return [f"{key} (did you mean {near}?)" if near else key
            for key, near in unknown_with_nearest(given)]
