"""What the user types last wins: plain `-p NAME:=VALUE` on the command line over the parameter
file's per-node sections.

rcl files a plain `-p` under `/**`, and rclpy gives a node the sections of its parameter
overrides that match its name in the order each section first appeared, later ones winning.
memory.yaml (which memory-node always loads) opens with `/**`, so its `memory_recorder:`
section silently outranks a plain `-p lidar_topic:=/utlidar/cloud` typed after it. Every ROS 2
user expects the opposite. So each plain `-p` is kept and repeated, in place, as a
node-qualified rule (`-p memory_recorder:lidar_topic:=...`) for every node of the process: it
replaces the value in the node's own section whatever the sections' order, a `--params-file`
typed after it still wins over it, and `/**` still carries it to a node under a namespace
(which neither the file's sections nor a qualified rule reach).

The same walk over the arguments tells which values come from the command line and differ
from the files, for the start line (`lidar_topic = /utlidar/cloud (command line)`), with any
secret in a value masked (`fleet_url = postgresql://go2-a:***@/fleet (command line)`).
Pure Python: no rclpy, so it is checked without a ROS graph.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import yaml

from memory_node.core.secrets import mask_secrets, mask_value

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
        """One line for the log: where the parameters come from ('' when from nowhere).
        `extra`: values set otherwise ("memory_dir = D (--memory-dir)"), which win over a
        `-p` of the same name."""
        overridden = {note.split(" = ", 1)[0] for note in extra}
        notes = [n for n in self.notes if n.split(" = ", 1)[0].split(":")[-1] not in overridden]
        notes += list(extra)
        parts = []
        if self.files:
            parts.append("parameters from " + ", ".join(self.files))
        if notes:
            parts.append(("" if parts else "parameters: ") + ", ".join(notes))
        return mask_secrets("; ".join(parts))


@dataclasses.dataclass
class _Setting:
    value: Any
    label: str = ""  # as typed, for the start line ('' = from a file)
    order: int = 0  # where it was typed


class _Overrides:
    """What rcl keeps of parameter files and `-p` rules: sections (`/**`, `memory_recorder`,
    ...) in the order each first appeared, and the last value given for each name in each.
    rclpy gives a node the sections that match its name, in that order, later ones winning:
    so a plain `-p` (in `/**`) loses to a node section that appears after `/**`."""

    def __init__(self) -> None:
        self.sections: dict[str, dict[str, _Setting]] = {}

    def set(self, section: str, name: str, setting: _Setting) -> None:
        self.sections.setdefault(section, {})[name] = setting

    def load(self, path: str) -> None:
        """A parameter file's sections. An unreadable one adds nothing here; rcl reports it
        when it loads the arguments."""
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError):
            return
        for section, body in (data.items() if isinstance(data, dict) else ()):
            params = body.get("ros__parameters") if isinstance(body, dict) else None
            if isinstance(params, dict):
                for name, value in _flatten(params).items():
                    self.set(str(section), name, _Setting(value))

    def for_node(self, node: str) -> dict[str, _Setting]:
        values: dict[str, _Setting] = {}
        for section, settings in self.sections.items():
            if _matches(section, node):
                values.update(settings)
        return values


def _matches(section: str, node: str) -> bool:
    """Whether a section applies to the node `node` (no namespace), as rclpy matches it:
    `/**`, the node's name with or without its leading slash, or a wildcard pattern."""
    fqn = "/" + node
    pattern = section if section.startswith("/") else "/" + section
    if pattern in ("/**", fqn):
        return True
    return "*" in pattern and (fnmatch.fnmatchcase(fqn, pattern)
                               or fnmatch.fnmatchcase(fqn, pattern.replace("/**/", "/")))


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
        self.given = _Overrides()  # files and rules, as the nodes get them
        self.from_files = _Overrides()  # the files alone

    def rule(self, flag: str, value: str) -> None:
        self.out.append(value)
        if flag == "--params-file":
            self.files.append(value)
            self.given.load(value)
            self.from_files.load(value)
            return
        if flag not in _PARAM_FLAGS or ":=" not in value:
            return
        target, raw = value.split(":=", 1)
        parsed = _parse_value(raw)
        setting = _Setting(parsed, f"{target} = {mask_value(target, show(parsed))}",
                           len(self.out))
        if ":" in target:  # node-qualified: `memory_recorder:lidar_topic:=...`
            node, name = target.split(":", 1)
            self.given.set(node, name, setting)
            return
        self.given.set("/**", target, setting)
        for node in self.nodes:
            self.out += [flag, f"{node}:{value}"]
            self.given.set(node, target, setting)

    def notes(self) -> list[str]:
        """Values from the command line that the files alone would not give, as typed, in the
        order typed."""
        labels: dict[str, int] = {}
        for node in self.nodes:
            in_files = self.from_files.for_node(node)
            for name, setting in self.given.for_node(node).items():
                if not setting.label or setting.label in labels:
                    continue
                if name in self.anywhere and name not in self.declared.get(node, ()):
                    continue  # `lidar_topic` given to the server too, which never reads it
                in_file = in_files.get(name)
                if in_file is None or not same_value(in_file.value, setting.value):
                    labels[setting.label] = setting.order
        return [f"{label} (command line)" for label in sorted(labels, key=labels.__getitem__)]


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
