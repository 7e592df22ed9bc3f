"""Front-video payloads as a Go2 on unitree_ros2 may send them: H.264 Annex-B access units (one
per message, an IDR every `gop` frames, SPS/PPS repeated before each IDR so a late subscriber
can start there) encoded with PyAV's libx264, or JPEG images."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

CODECS = ("h264", "jpeg")
GOP = 30  # frames between IDRs: one second at the ~30 Hz users report


class H264Encoder:
    """BGR frames in, one Annex-B access unit out per frame (no B-frames, no delay)."""

    def __init__(self, width: int, height: int, rate: float, gop: int = GOP) -> None:
        import av

        self.width, self.height = width, height
        codec: Any = av.CodecContext.create("libx264", "w")
        codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
        codec.framerate = Fraction(round(rate))
        codec.time_base = Fraction(1, round(rate))
        codec.gop_size = gop
        codec.options = {"preset": "ultrafast", "tune": "zerolatency",
                         "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:"
                                        "repeat-headers=1:threads=1"}
        self.codec = codec
        self._n = 0

    def encode(self, bgr: np.ndarray) -> bytes:
        import av

        h, w = bgr.shape[:2]
        if (w, h) != (self.width, self.height):
            import cv2

            bgr = cv2.resize(bgr, (self.width, self.height), interpolation=cv2.INTER_AREA)
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(bgr), format="bgr24")
        frame = frame.reformat(format="yuv420p")
        frame.pts = self._n
        self._n += 1
        return b"".join(bytes(p) for p in self.codec.encode(frame))


def jpeg_payload(bgr: np.ndarray, size: tuple[int, int] | None = None,
                 quality: int = 85) -> bytes:
    """A JPEG of the frame (scaled to `size`, (width, height), when given)."""
    import cv2

    if size is not None and (bgr.shape[1], bgr.shape[0]) != size:
        bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return buf.tobytes()


class FrontVideoWriter:
    """The three resolution fields of each message: the rendered frame at full size in
    video720p, halved in video360p, quartered in video180p (each its own stream)."""

    def __init__(self, width: int, height: int, rate: float, codec: str = "h264",
                 gop: int = GOP) -> None:
        if codec not in CODECS:
            raise ValueError(f"front video codec must be one of {', '.join(CODECS)}, "
                             f"not {codec!r}")
        self.codec = codec
        # even sizes: yuv420p halves both
        self.sizes = {"720p": (width, height), "360p": (width // 2 // 2 * 2, height // 2 // 2 * 2),
                      "180p": (width // 4 // 2 * 2, height // 4 // 2 * 2)}
        self.encoders = ({r: H264Encoder(w, h, rate, gop) for r, (w, h) in self.sizes.items()}
                         if codec == "h264" else {})

    def payloads(self, bgr: np.ndarray) -> dict[str, bytes]:
        if self.codec == "jpeg":
            return {r: jpeg_payload(bgr, size) for r, size in self.sizes.items()}
        return {r: enc.encode(bgr) for r, enc in self.encoders.items()}
