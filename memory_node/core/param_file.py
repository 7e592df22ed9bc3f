"""memory-node's parameter file read without a ROS graph, for offline tools (memory-import),
and where a named file is found (`resolve_config`).

The file is the one memory-node takes (ROS 2 parameter-file format, `/**` for every node, then
a section per node); each node's values are merged the way rclpy merges them (wildcard first,
then the node's own section) and converted with the same tables, defaults and strict types as
the nodes' declarations (core/parameters.py), so a value the node refuses is refused here with
the same line, and one it accepts means the same here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from memory_node.core import parameters as params
from memory_node.core.config import MemoryConfig
from memory_node.core.recorder_settings import recorder_settings
from memory_node.core.streams import stream_topic_params

# The nodes of memory-node and the tables each one declares (ros/main.py): the TF listener
# reads the pose parameters, the recorder its own and the pose ones, the server the engine's.
RECORDER_NODE, SERVER_NODE, LISTENER_NODE = "memory_recorder", "memory_server", "memory_tf_listener"


def read_sections(path: Path) -> dict[str, dict[str, Any]]:
    """{node name or '/**': {parameter: value}} of a parameter file; ParameterError when it is
    not one."""
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise params.ParameterError(f"cannot read parameter file {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise params.ParameterError(f"parameter file {path} is not a mapping of node sections")
    out: dict[str, dict[str, Any]] = {}
    for node, body in doc.items():
        values = body.get("ros__parameters") if isinstance(body, dict) else None
        if not isinstance(values, dict):
            raise params.ParameterError(f"parameter file {path}: section {node!r} has no "
                                        "ros__parameters mapping")
        out[str(node)] = _flatten(values)
    return out


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ROS names them (`qos_overrides./tf.depth`)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def node_values(sections: dict[str, dict[str, Any]], node: str) -> dict[str, Any]:
    """What a node named `node` (root namespace) is given: `/**` then its own section."""
    merged: dict[str, Any] = {}
    for key in ("/**", "**", f"/**/{node}", node, f"/{node}"):
        merged.update(sections.get(key, {}))
    return merged


def convert_table(given: dict[str, Any], table: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Each parameter of `table`: the given value (converted strictly) or its default."""
    return {name: params.convert(name, given.get(name, default), default)
            for name, (default, _) in table.items()}


def unknown_keys(sections: dict[str, dict[str, Any]]) -> list[str]:
    """Keys no node of the package knows, each with the nearest known name when there is one
    (the nodes warn about these at start-up)."""
    return params.unknown_names({k for values in sections.values() for k in values})


def resolve_config(name: str | Path = "memory.yaml") -> Path | None:
    """A path as given if it exists; else a file of that name in the package's config
    directory (installed share/memory_node/config, or the source tree's config/)."""
    given = Path(name)
    if given.exists():
        return given
    if given.parent != Path("."):
        return None
    candidates = [Path(__file__).resolve().parents[2] / "config" / given.name]
    try:  # a pure-Python index lookup where the package is installed through ament
        from ament_index_python.packages import get_package_share_directory

        candidates.insert(0, Path(get_package_share_directory("memory_node")) / "config"
                          / given.name)
    except Exception:  # noqa: BLE001 - not installed through ament: use the source tree
        pass
    return next((p for p in candidates if p.exists()), None)


def load(path: Path | None, overrides: dict[str, Any] | None = None
         ) -> tuple[dict[str, Any], MemoryConfig, list[str]]:
    """(recorder and pose settings, engine configuration, unknown keys) as memory-node would
    configure its recorder, TF listener and server from the file at `path` (None: defaults).
    `overrides` apply to every node, as memory-node's --memory-dir does. Raises
    ParameterError, or ConfigError for an engine configuration the server would refuse."""
    sections = read_sections(path) if path is not None else {}
    extra = dict(overrides or {})
    recorder = convert_table(node_values(sections, RECORDER_NODE) | extra,
                             params.RECORDER_PARAMS | stream_topic_params())
    # In memory-node the pose parameters are read by the TF listener the recorder shares.
    recorder |= convert_table(node_values(sections, LISTENER_NODE) | extra, params.POSE_PARAMS)
    # As the policy sees them: robot_prefix applied to the topics and the robot's frames.
    recorder = recorder_settings(recorder)
    engine = convert_table(node_values(sections, SERVER_NODE) | extra,
                           params.engine_param_table())
    config = MemoryConfig.from_mapping(
        {k: v for k, v in engine.items() if params.ENGINE_UNSET.get(k, object()) != v})
    return recorder, config, unknown_keys(sections)
