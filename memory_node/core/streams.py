"""Sensor stream kinds described as data: one registry the recorder, memory-import, the
settings, ingestion and the disk budget read.

Each `StreamKind` says once what a stream is: its ROS message type names (strings, so the core
imports no middleware), the recorder parameter naming its topic and that topic's default, the
QoS profile it is subscribed with, whether the keyframe gate applies, the tags it produces, how
a kept message becomes a stored row (`to_row`) and how that row is stored (`rows`, one of
core/stream_rows.py's ways: embedded text, batched camera frames, point-cloud blobs). Camera
and lidar turn a message into their payload in the recorder policy (frame views, scan
voxels and ranges: core/keyframe_payloads.py); every other kind's `to_row` gives the tags and
text of its row, stored with the pose the policy resolved. Ingestion (`Ingestor.add`),
compaction and the disk budget treat every registered kind as a sensor stream.

Adding a sensor stream: write its decoder (a function of the deserialized message) and
`register_stream(StreamKind(...))`; the recorder policy then counts, gates, poses and stores
it, live and offline (see test/ros/test_stream_registry.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memory_node.core.front_video import FRONT_VIDEO
from memory_node.core.stream_rows import FRAME_ROWS, SCAN_ROWS, TEXT_ROWS, RowIngest

# A kept message → (tags, text) of its stored row. The text is embedded when not empty.
RowDecoder = Callable[[Any], tuple[dict[str, Any], str]]


@dataclass(frozen=True)
class StreamKind:
    """One sensor stream kind (see the module docstring)."""

    name: str  # the stored rows' stream name
    message_types: tuple[str, ...]  # ROS type names, e.g. "sensor_msgs/msg/Range"
    topic_param: str  # the recorder parameter naming its topic
    topic_default: str
    qos: str = "sensor"  # "sensor" (best effort) or "reliable"
    gated: bool = True  # the keyframe gate (distance, yaw, interval) thins it
    tags: tuple[str, ...] = ()  # the tag names its rows carry
    to_row: RowDecoder | None = None  # None: a built-in kind the recorder policy decodes itself
    rows: RowIngest = TEXT_ROWS  # how its payloads are stored (core/stream_rows.py)
    builtin: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "_-" for c in self.name):
            raise ValueError(f"stream name {self.name!r} must be letters, digits, '_' or '-'")
        if not self.message_types:
            raise ValueError(f"stream {self.name!r} needs at least one message type")
        if self.qos not in ("sensor", "reliable"):
            raise ValueError(f"stream {self.name!r}: qos must be 'sensor' or 'reliable'")
        if not self.builtin and self.to_row is None:
            raise ValueError(f"stream {self.name!r} needs a to_row decoder")


BUILTIN_STREAMS: tuple[StreamKind, ...] = (
    # The camera has three sources; `camera_feed` picks the one the settings name.
    StreamKind("camera", ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage",
                          FRONT_VIDEO.msg_type), "camera_topic", "/camera/image_raw",
               rows=FRAME_ROWS, builtin=True),
    StreamKind("lidar", ("sensor_msgs/msg/PointCloud2",), "lidar_topic", "/lidar/points",
               tags=("frame", "max_range", "mean_range"), rows=SCAN_ROWS, builtin=True),
    # Odometry's speed tag is measured on arrival (RecorderPolicy.receive_odom); its row is
    # otherwise the generic one, with no text.
    StreamKind("odom", ("nav_msgs/msg/Odometry",), "odom_topic", "/odom", qos="reliable",
               tags=("speed",), to_row=lambda _msg: ({}, ""), builtin=True),
)

@dataclass(frozen=True)
class CameraFeed:
    """The camera stream's source the settings pick: its topic, message type and the
    recorder's job kind ("raw" Image, "compressed" CompressedImage, or the front video's)."""

    topic: str
    message_type: str
    kind: str


def camera_feed(settings: Mapping[str, Any]) -> CameraFeed:
    """The Go2's front video when `front_video_topic` is set, else the compressed topic with
    `use_compressed`, else the Image topic: the one choice the node and memory-import make."""
    if settings.get(FRONT_VIDEO.topic_param):
        return CameraFeed(settings[FRONT_VIDEO.topic_param], FRONT_VIDEO.msg_type,
                          FRONT_VIDEO.kind)
    if settings["use_compressed"]:
        return CameraFeed(settings["compressed_topic"], "sensor_msgs/msg/CompressedImage",
                          "compressed")
    return CameraFeed(settings["camera_topic"], "sensor_msgs/msg/Image", "raw")


_REGISTRY: dict[str, StreamKind] = {k.name: k for k in BUILTIN_STREAMS}


def register_stream(kind: StreamKind) -> StreamKind:
    """Add a stream kind; a name already registered (a built-in above all) is refused."""
    if kind.name in _REGISTRY:
        raise ValueError(f"stream {kind.name!r} is already registered")
    if kind.builtin:
        raise ValueError("only core/streams.py defines built-in streams")
    _REGISTRY[kind.name] = kind
    return kind


def unregister_stream(name: str) -> None:
    """Remove a registered (not built-in) stream kind; an unknown name is a no-op."""
    kind = _REGISTRY.get(name)
    if kind is not None and kind.builtin:
        raise ValueError(f"stream {name!r} is built in")
    _REGISTRY.pop(name, None)


def stream_kind(name: str) -> StreamKind:
    """The registered kind `name` (KeyError names the registered ones)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown stream {name!r} (one of {', '.join(_REGISTRY)})") from None


def stream_kinds() -> tuple[StreamKind, ...]:
    """Every registered kind, built-ins first, in registration order."""
    return tuple(_REGISTRY.values())


def stream_topic_params() -> dict[str, tuple[Any, str]]:
    """The topic parameters of the registered (not built-in) kinds, as
    core.recorder_settings describes parameters: name -> (default, description). The
    recorder node declares them and memory-import reads them from the parameter file."""
    return {k.topic_param: (k.topic_default, f"{' or '.join(k.message_types)}: the {k.name} "
                            "stream ('' = off)")
            for k in _REGISTRY.values() if not k.builtin}


def sensor_stream_names() -> tuple[str, ...]:
    """The names of every registered sensor stream: the rows compaction thins and the disk
    budget may remove (notes, summaries and places are never among them)."""
    return tuple(_REGISTRY)
