"""Read tf2_msgs/TFMessage straight from its CDR bytes, skipping edges nobody needs.

A robot's /tf carries a dozen or more joint transforms per message at tens to hundreds of Hz
(robot_state_publisher), beside the two or three edges a world pose needs (map → odom →
base). rclpy builds six Python objects per transform before a callback sees it; at 2,000
transforms/s that alone can keep a busy process behind /tf, and every pose it then answers
for "now" is seconds old. Subscribing with `raw=True` and reading the bytes here costs a few
struct reads per transform, and `TfEdgeFilter` drops joint edges before any float is decoded.

Layout (OMG CDR, as every ROS 2 RMW sends it): a 4-byte encapsulation header (byte 1: 0 big,
1 little endian), then `uint32 n` and n TransformStamped: int32 sec, uint32 nanosec, string
frame_id, string child_frame_id (each uint32 length counting the NUL, then the bytes), then
7 float64 (translation xyz, rotation xyzw) aligned to 8 from the start of the payload.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass


class TfWireError(ValueError):
    """The bytes are not a TFMessage."""


@dataclass(frozen=True)
class WireTransform:
    parent: str
    child: str
    stamp: float
    translation: tuple[float, float, float]
    rotation: tuple[float, float, float, float]


_LE = (struct.Struct("<I"), struct.Struct("<iI"), struct.Struct("<7d"))
_BE = (struct.Struct(">I"), struct.Struct(">iI"), struct.Struct(">7d"))
# A TFMessage with more transforms than this is not a real one (a corrupt length field).
MAX_TRANSFORMS = 100_000


def parse_tf_message(data: bytes | bytearray | memoryview,
                     wanted: Callable[[str, str], bool] | None = None) -> list[WireTransform]:
    """The transforms of a serialized TFMessage; only those for which `wanted(parent, child)`
    is true when given (their poses are not even decoded otherwise). Raises TfWireError."""
    buf = memoryview(data)
    if len(buf) < 8:
        raise TfWireError(f"TFMessage of {len(buf)} bytes is too short")
    if buf[1] not in (0, 1):
        raise TfWireError(f"unknown CDR encapsulation {bytes(buf[:2]).hex()}")
    u32, time_s, pose_s = _LE if buf[1] == 1 else _BE
    base, end = 4, len(buf)
    try:
        (count,) = u32.unpack_from(buf, base)
        if count > MAX_TRANSFORMS:
            raise TfWireError(f"TFMessage claims {count} transforms")
        pos = 4  # offset from the payload start (alignment is relative to it)
        out: list[WireTransform] = []
        for _ in range(count):
            pos = (pos + 3) & ~3
            sec, nanosec = time_s.unpack_from(buf, base + pos)
            pos += 8
            frames = []
            for _field in range(2):
                pos = (pos + 3) & ~3
                (length,) = u32.unpack_from(buf, base + pos)
                pos += 4
                if length == 0 or base + pos + length > end:
                    raise TfWireError("frame id runs past the end of the message")
                frames.append(str(buf[base + pos:base + pos + length - 1], "utf-8"))
                pos += length
            pos = (pos + 7) & ~7
            if base + pos + 56 > end:
                raise TfWireError("transform runs past the end of the message")
            parent, child = frames
            if wanted is None or wanted(parent, child):
                v = pose_s.unpack_from(buf, base + pos)
                out.append(WireTransform(parent, child, sec + nanosec * 1e-9,
                                         (v[0], v[1], v[2]), (v[3], v[4], v[5], v[6])))
            pos += 56
    except (struct.error, UnicodeDecodeError) as exc:
        raise TfWireError(f"malformed TFMessage: {exc}") from exc
    return out


class TfEdgeFilter:
    """Which /tf edges a world pose can need: every edge except those below the base frame.

    Joint transforms (base → hip → thigh → foot) hang below the base frame; a world ← base
    lookup never walks them. An edge is dropped once its parent is known to be the base frame
    or below it; everything else is kept, so map → odom is kept even before odom → base is
    seen. Edges to frames in `keep` (a camera on a moving mount) are never dropped.
    """

    def __init__(self, base_frame: str, keep: Iterable[str] = ()) -> None:
        self.base_frame = base_frame.removeprefix("/")
        self.keep = {f.removeprefix("/") for f in keep if f}
        self._below_base: set[str] = set()
        self.dropped = 0

    def __call__(self, parent: str, child: str) -> bool:
        parent, child = parent.removeprefix("/"), child.removeprefix("/")
        if child in self.keep or child == self.base_frame:
            return True
        if parent == self.base_frame or parent in self._below_base:
            self._below_base.add(child)
            self.dropped += 1
            return False
        return True
