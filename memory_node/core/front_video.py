"""The Go2's front camera as Unitree's own stack publishes it: one camera source, described here
and decoded here, with no ROS import.

unitree_ros2 publishes no sensor_msgs/Image. Its front camera is `unitree_go/msg/
Go2FrontVideoData` (`uint64 time_frame`, `uint8[] video720p`, `uint8[] video360p`,
`uint8[] video180p`), on `/frontvideostream` by users' reports. What is known and what is not:
- the message has no header: no frame_id and no ROS stamp, so frames are stamped on receipt
  (the recorder's zero-stamp path). `time_frame`'s unit and epoch are documented nowhere, so it
  is never used as a time;
- nothing official documents the payload, and public code reads it either as H.264 (Annex-B)
  or as JPEG. So each payload is sniffed: `FF D8 FF` is JPEG, `00 00 00 01` / `00 00 01` an
  H.264 Annex-B access unit; anything else is counted as failed.

H.264 is decoded in memory with PyAV (FFmpeg's decoder). A subscriber that joins mid-stream
cannot decode until the next IDR access unit: those messages are skipped and counted
(`skipped_until_keyframe`). Every access unit from then on goes through the decoder (it needs
each one for its reference frames), but a decoded picture stays in the decoder's YUV planes
until someone asks for pixels: the view gate reads the luma plane for its thumbnail, and only
frames the keyframe gate admits are converted to BGR (`VideoPicture.to_bgr`).

`FRONT_VIDEO` describes the source as data (message type and definition, parameters, the
stream it feeds, the job kind) so that a stream registry can take it in as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MSG_TYPE = "unitree_go/msg/Go2FrontVideoData"
# unitree_ros2 cyclonedds_ws/src/unitree/unitree_go/msg/Go2FrontVideoData.msg
MSG_DEFINITION = "uint64 time_frame\nuint8[] video720p\nuint8[] video360p\nuint8[] video180p\n"
RESOLUTIONS = ("720p", "360p", "180p")
KIND = "video"  # the recorder's job kind for a decoded front-video picture


@dataclass(frozen=True)
class CameraSource:
    """A camera source other than sensor_msgs/Image: what a stream registry needs to know."""

    name: str
    stream: str  # the stream it feeds
    msg_type: str
    msg_definition: str
    topic_param: str  # "" = off
    default_topic: str  # what the stack publishes (the profile's value)
    params: dict[str, tuple[Any, str]]  # the source's own parameters: default, description
    choices: dict[str, tuple[str, ...]]
    kind: str  # the job kind its decoded pictures travel as


FRONT_VIDEO = CameraSource(
    name="go2_front_video",
    stream="camera",
    msg_type=MSG_TYPE,
    msg_definition=MSG_DEFINITION,
    topic_param="front_video_topic",
    default_topic="/frontvideostream",
    params={
        "front_video_topic": ("", "unitree_go/msg/Go2FrontVideoData (the Go2's front camera on "
                              "unitree_ros2); set, it is the camera's source ('' = off)"),
        "front_video_resolution": ("720p", "front video field read: 720p, 360p or 180p"),
    },
    choices={"front_video_resolution": RESOLUTIONS},
    kind=KIND,
)


def register_rosbags_type(typestore: Any) -> Any:
    """Add Go2FrontVideoData to a rosbags typestore (bags written and read without the
    unitree_go package); returns the typestore."""
    if MSG_TYPE not in typestore.types:
        from rosbags.typesys import get_types_from_msg

        typestore.register(get_types_from_msg(MSG_DEFINITION, MSG_TYPE))
    return typestore


def sniff(payload: bytes) -> str | None:
    """"jpeg", "h264" (Annex-B) or None, from the payload's first bytes."""
    head = bytes(payload[:4])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head == b"\x00\x00\x00\x01" or head[:3] == b"\x00\x00\x01":
        return "h264"
    return None


def nal_types(access_unit: bytes) -> list[int]:
    """The NAL unit types of an Annex-B access unit, in order."""
    out = []
    data = bytes(access_unit)
    i = data.find(b"\x00\x00\x01")
    while i >= 0 and i + 3 < len(data):
        out.append(data[i + 3] & 0x1F)
        i = data.find(b"\x00\x00\x01", i + 3)
    return out


IDR = 5


class _Zero:
    sec = 0
    nanosec = 0


@dataclass(frozen=True)
class _Header:
    """A header-shaped stand-in: no stamp (the recorder stamps on receipt), no frame_id (the
    camera_frame parameter or camera_mount_* place the camera)."""

    stamp: _Zero = field(default_factory=_Zero)
    frame_id: str = ""


class VideoPicture:
    """One decoded front-video picture, in the decoder's format until pixels are asked for."""

    header = _Header()

    def __init__(self, codec: str, time_frame: int, *, frame: Any = None,
                 jpeg: bytes | None = None,
                 on_convert: Callable[[], None] | None = None) -> None:
        self.codec = codec
        self.time_frame = time_frame
        self._frame = frame  # av.VideoFrame (H.264)
        self._jpeg = jpeg
        self._on_convert = on_convert

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) when known without decoding."""
        if self._frame is not None:
            return int(self._frame.width), int(self._frame.height)
        return None

    def to_bgr(self) -> np.ndarray:
        """The picture as an HxWx3 BGR array: the one conversion to pixels (counted). Raises
        ValueError for a JPEG that does not decode."""
        if self._on_convert is not None:
            self._on_convert()
        if self._frame is not None:
            return np.ascontiguousarray(self._frame.to_ndarray(format="bgr24"))
        import cv2

        img = cv2.imdecode(np.frombuffer(self._jpeg or b"", np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError("front video: JPEG payload does not decode")
        return np.asarray(img)

    def gray(self) -> np.ndarray | None:
        """A grey image for the view-change gate, without a colour conversion: the luma plane
        of a decoded H.264 picture, a reduced JPEG decode; None when it does not decode."""
        if self._frame is not None:
            plane = self._frame.planes[0]
            h, w = int(self._frame.height), int(self._frame.width)
            rows = np.frombuffer(memoryview(plane), np.uint8).reshape(-1, plane.line_size)
            return np.ascontiguousarray(rows[:h, :w])
        import cv2

        grey = cv2.imdecode(np.frombuffer(self._jpeg or b"", np.uint8),
                            cv2.IMREAD_REDUCED_GRAYSCALE_4)
        return None if grey is None else np.asarray(grey)


@dataclass
class FrontVideoCounters:
    """What the decoder did with the payloads it was given."""

    received: int = 0
    decoded: int = 0  # pictures out of the decoder (H.264) or JPEG payloads taken
    skipped_until_keyframe: int = 0  # H.264 access units before the first IDR
    failed: int = 0  # unknown payloads, empty fields, decoder errors
    converted: int = 0  # pictures converted to BGR pixels (admitted keyframes)


class FrontVideoError(ValueError):
    """A payload that could not be used (counted as failed)."""


class FrontVideoDecoder:
    """Decodes one front-video stream (one resolution field), message by message, in order.

    `decode(msg)` returns a VideoPicture, or None for an access unit skipped until the first
    keyframe or one that gave no picture yet; raises FrontVideoError for a payload that cannot
    be used. Not thread-safe for decoding (one subscription feeds it); a picture converts on
    any thread.
    """

    def __init__(self, resolution: str = "720p") -> None:
        if resolution not in RESOLUTIONS:
            raise ValueError(f"front_video_resolution = {resolution!r} is not one of "
                             f"{', '.join(RESOLUTIONS)}")
        self.field = f"video{resolution}"
        self.counters = FrontVideoCounters()
        self._lock = threading.Lock()
        self._codec: Any = None
        self._synced = False  # an IDR went in since the start or the last error

    def _converted(self) -> None:
        with self._lock:
            self.counters.converted += 1

    def decode(self, msg: Any) -> VideoPicture | None:
        c = self.counters
        c.received += 1
        payload = bytes(getattr(msg, self.field))
        kind = sniff(payload)
        if kind is None:
            c.failed += 1
            what = "empty" if not payload else f"starts {payload[:4].hex(' ')}"
            raise FrontVideoError(f"front video: {self.field} payload is neither JPEG nor "
                                  f"H.264 Annex-B ({what})")
        time_frame = int(getattr(msg, "time_frame", 0))
        if kind == "jpeg":
            c.decoded += 1
            return VideoPicture("jpeg", time_frame, jpeg=payload, on_convert=self._converted)
        return self._decode_h264(payload, time_frame)

    def _decode_h264(self, payload: bytes, time_frame: int) -> VideoPicture | None:
        import av

        c = self.counters
        if not self._synced:
            if IDR not in nal_types(payload):
                c.skipped_until_keyframe += 1
                return None
            self._codec = av.CodecContext.create("h264", "r")
            self._synced = True
        try:
            frames = self._codec.decode(av.Packet(payload))
        except av.error.FFmpegError as exc:
            # References are lost: wait for the next IDR rather than decode garbage.
            self._synced = False
            c.failed += 1
            raise FrontVideoError(f"front video: H.264 access unit does not decode: "
                                  f"{exc}") from None
        if not frames:
            return None
        c.decoded += 1
        return VideoPicture("h264", time_frame, frame=frames[-1], on_convert=self._converted)


class FrontVideoReceiver:
    """The front video as the recorder's camera: decodes each message in arrival order and
    counts what never becomes a camera job in the policy's camera counters (received, and
    skipped or failed), so the recorder's bookkeeping (drain, stats) holds.

    `count(stream, counter, n)`: RecorderPolicy.count. `warn(text)`: said once per kind of
    problem.
    """

    def __init__(self, resolution: str, count: Callable[..., None],
                 warn: Callable[[str], None] | None = None) -> None:
        self.decoder = FrontVideoDecoder(resolution)
        self._count = count
        self._warn = warn
        self._said: set[str] = set()

    def picture(self, msg: Any) -> VideoPicture | None:
        """The message's picture for the camera stream, or None (counted)."""
        try:
            picture = self.decoder.decode(msg)
        except FrontVideoError as exc:
            self._count("camera", "received")
            self._count("camera", "failed")
            self._say("failed", f"{exc} (said once; counted as failed)")
            return None
        if picture is None:
            self._count("camera", "received")
            self._count("camera", "skipped")
            if self.decoder.counters.skipped_until_keyframe == 1:
                self._say("joined", "front video joined mid-stream: access units are skipped "
                          "until the next keyframe (IDR)")
            return None
        if picture.codec not in self._said:
            self._say(picture.codec, f"front video payloads are {picture.codec.upper()} "
                      f"({self.decoder.field})")
        return picture

    def _say(self, key: str, text: str) -> None:
        if key in self._said or self._warn is None:
            return
        self._said.add(key)
        self._warn(text)

    def stats(self) -> dict[str, int]:
        """What the streams answer's camera entry adds: the access units skipped until the
        first keyframe, once the stream was joined mid-GOP (nothing before)."""
        skipped = self.decoder.counters.skipped_until_keyframe
        return {"skipped_until_keyframe": skipped} if skipped else {}
