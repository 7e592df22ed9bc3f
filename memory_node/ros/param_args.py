"""What the user types last wins: plain `-p NAME:=VALUE` on the command line over the parameter
file's per-node sections.

rcl files a plain `-p` under `/**`, and rclpy applies a node's own section of a parameter file
after `/**`: with `--params-file memory.yaml` (which memory-node always loads) a plain
`-p lidar_topic:=/utlidar/cloud` is silently outranked by the file's `memory_recorder:` section.
Every ROS 2 user expects the opposite. rcl applies the rules of one section in the order they
are typed, so each plain `-p` is kept and repeated as a node-qualified rule
(`-p memory_recorder:lidar_topic:=...`) for every node of the process, in place: it wins over
the files before it, a `--params-file` typed after it still wins over it, and `/**` still
carries it to a node under a namespace (which neither the file's nor a qualified rule reach).

The same walk over the arguments tells which values come from the command line and differ
from the files, for the start line (`lidar_topic = /utlidar/cloud (command line)`).
Pure Python: no rclpy, so it is checked without a ROS graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import yaml

# rcl's ROS-argument flags that take the next argument as their value.
_VALUE_FLAGS = {"-r", "--remap", "-p", "--param", "--params-file", "-e", "--enclave",
                "--log-level", "--log-config-file", "--log-file-name"}
_PARAM_FLAGS = {"-p", "--param"}


@dataclasses.dataclass
class CommandLine:
    """`args`: the arguments to give rclpy.init. `files`: the parameter files, in order.
    `notes`: "name = value (command line)" for each value typed on the command line that the
    files do not already give (in the order typed)."""

    args: list[str]
    files: list[str]
    notes: list[str]

    def start_line(self, extra: Sequence[str] = ()) -> str:
        """One line for the log: where the parameters come from ('' when from nowhere)."""
        notes = list(self.notes) + list(extra)
        parts = []
        if self.files:
            parts.append("parameters from " + ", ".join(self.files))
        if notes:
            parts.append(("" if parts else "parameters: ") + ", ".join(notes))
        return "; ".join(parts)


@dataclasses.dataclass
class _Setting:
    value: Any
    node_scope: bool  # from a node's own section or a node-qualified rule (outranks `/**`)
    label: str = ""  # as typed, for the start line ('' = from a file)
    order: int = 0  # where it was typed


def command_line_wins(args: Sequence[str], nodes: Sequence[str],
                      declared: Mapping[str, Collection[str]] | None = None) -> CommandLine:
    """`args` (a whole argv or ROS arguments alone, with `--ros-args`) with every plain `-p`
    also given to each of `nodes` (node names without namespace), and what it changes.
    `declared`: the names each node declares; a value is then noted only for the nodes that
    read it (a name no node declares is noted as typed: the unknown-name warning follows)."""
    walk = _Walk(nodes, declared or {})
    in_ros = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--ros-args" or arg == "--" and in_ros:
            in_ros = arg == "--ros-args"
        elif in_ros and arg in _VALUE_FLAGS and i + 1 < len(args):
            walk.out.append(arg)
            walk.rule(arg, args[i + 1])
            i += 2
            continue
        walk.out.append(arg)
        i += 1
    return CommandLine(walk.out, walk.files, walk.notes())


class _Walk:
    """The ROS arguments seen so far, rewritten, and the parameters they give each node."""

    def __init__(self, nodes: Sequence[str], declared: Mapping[str, Collection[str]]) -> None:
        self.nodes = list(nodes)
        self.declared = declared
        self.anywhere = set().union(*declared.values()) if declared else set()
        self.out: list[str] = []
        self.files: list[str] = []
        self.state: dict[str, dict[str, _Setting]] = {n: {} for n in nodes}  # rcl + rclpy's
        self.from_files: dict[str, dict[str, _Setting]] = {n: {} for n in nodes}

    def rule(self, flag: str, value: str) -> None:
        self.out.append(value)
        if flag == "--params-file":
            self.files.append(value)
            for node in self.nodes:
                for name, (setting, node_scope) in _file_values(value, node).items():
                    _assign(self.state[node], name, _Setting(setting, node_scope))
                    _assign(self.from_files[node], name, _Setting(setting, node_scope))
            return
        if flag not in _PARAM_FLAGS or ":=" not in value:
            return
        target, raw = value.split(":=", 1)
        parsed = _parse_value(raw)
        label = f"{target} = {show(parsed)}"
        order = len(self.out)
        if ":" in target:  # node-qualified: `memory_recorder:lidar_topic:=...`
            node, name = target.split(":", 1)
            if node in self.state:
                _assign(self.state[node], name, _Setting(parsed, True, label, order))
            return
        for node in self.nodes:
            self.out += [flag, f"{node}:{value}"]
            _assign(self.state[node], target, _Setting(parsed, True, label, order))

    def notes(self) -> list[str]:
        """Values from the command line that the files alone would not give, as typed, in the
        order typed."""
        labels: dict[str, int] = {}
        for node in self.nodes:
            for name, setting in self.state[node].items():
                if not setting.label or setting.label in labels:
                    continue
                if name in self.anywhere and name not in self.declared.get(node, ()):
                    continue  # `lidar_topic` given to the server too, which never reads it
                in_file = self.from_files[node].get(name)
                if in_file is None or not same_value(in_file.value, setting.value):
                    labels[setting.label] = setting.order
        return [f"{label} (command line)" for label in sorted(labels, key=labels.__getitem__)]


def _assign(target: dict[str, _Setting], name: str, setting: _Setting) -> None:
    """rcl keeps the last value per (section, name); rclpy lets a node's section win."""
    old = target.get(name)
    if old is not None and old.node_scope and not setting.node_scope:
        return
    target[name] = setting


def _file_values(path: str, node: str) -> dict[str, tuple[Any, bool]]:
    """name -> (value, from the node's own section) for `node` in a parameter file: `/**`
    first, then the node's section (as rclpy applies them). An unreadable file gives nothing
    here; rcl reports it when it loads the arguments."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    values: dict[str, tuple[Any, bool]] = {}
    for section, node_scope in (("/**", False), (node, True), ("/" + node, True)):
        body = data.get(section)
        params = body.get("ros__parameters") if isinstance(body, dict) else None
        if isinstance(params, dict):
            for name, value in _flatten(params).items():
                values[name] = (value, node_scope)
    return values


def _flatten(params: dict, prefix: str = "") -> dict[str, Any]:
    """Nested keys as ROS names them: `qos_overrides: {/tf: ...}` -> `qos_overrides./tf...`."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _parse_value(raw: str) -> Any:
    """A `-p` value as rcl reads it: YAML (`5` an integer, `'5'` a string, `[a, b]` a list)."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def show(value: Any) -> str:
    """A value as a user would type it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if value is None:
        return "''"
    return str(value)


def same_value(a: Any, b: Any) -> bool:
    """Equal as parameter values: 5 and 5.0 are; PyYAML's string '1e-3' and rcl's 0.001 are."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    numbers = [_number(a), _number(b)]
    if None not in numbers and (isinstance(a, (int, float)) or isinstance(b, (int, float))):
        return numbers[0] == numbers[1]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def node_name(args: Sequence[str], default: str) -> str:
    """The name a one-node process's node gets: the last `-r __node:=NAME` (or `__name`)
    among the ROS arguments, else `default`."""
    name = default
    for flag, value in zip(args, args[1:], strict=False):
        if flag in ("-r", "--remap") and value.split(":=", 1)[0] in ("__node", "__name"):
            name = value.split(":=", 1)[1] if ":=" in value else name
    return name
