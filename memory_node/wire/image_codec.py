"""sensor_msgs Image / CompressedImage to numpy BGR and back, without cv_bridge.

The recorder stores JPEG keyframes and computes image tags on BGR arrays; cv_bridge is not
on pip, so this module reads the raw encodings a camera driver publishes (honouring row
padding in `step` and the byte order of 16-bit data) and decodes compressed frames with
OpenCV. Messages are duck-typed; builders import sensor_msgs only when called.
"""

from __future__ import annotations

import array
from typing import Any

import cv2
import numpy as np

from memory_node.wire.geometry import seconds_to_stamp

__all__ = [
    "ENCODINGS",
    "bgr_to_compressed_msg",
    "bgr_to_image_msg",
    "compressed_to_bgr",
    "encode_jpeg",
    "image_to_bgr",
]

# encoding -> (channels, bytes per channel); aliases resolve to these.
ENCODINGS: dict[str, tuple[int, int]] = {
    "bgr8": (3, 1),
    "rgb8": (3, 1),
    "bgra8": (4, 1),
    "rgba8": (4, 1),
    "mono8": (1, 1),
    "mono16": (1, 2),
    # What USB and machine-vision cameras publish raw: YUV 4:2:2 (2 bytes per pixel) and
    # 8-bit Bayer mosaics (one byte per pixel, demosaiced here).
    "yuv422": (2, 1),  # UYVY
    "yuv422_yuy2": (2, 1),  # YUYV
    "bayer_rggb8": (1, 1),
    "bayer_bggr8": (1, 1),
    "bayer_gbrg8": (1, 1),
    "bayer_grbg8": (1, 1),
}
_ALIASES = {"8uc3": "bgr8", "8uc1": "mono8", "16uc1": "mono16", "8uc4": "bgra8",
            "uyvy": "yuv422", "yuyv": "yuv422_yuy2"}
_FROM_2CH = {"yuv422": cv2.COLOR_YUV2BGR_UYVY, "yuv422_yuy2": cv2.COLOR_YUV2BGR_YUY2}
# OpenCV encodes BGR to YUV 4:2:2 from 4.7 on; apt's python3-opencv (4.5 on Ubuntu 22.04, 4.6
# on Debian 12) has only the decoder, so there bgr_to_yuv422 below does it (None: not in cv2).
_TO_2CH = {"yuv422": getattr(cv2, "COLOR_BGR2YUV_UYVY", None),
           "yuv422_yuy2": getattr(cv2, "COLOR_BGR2YUV_YUY2", None)}
# BT.601 limited range, as OpenCV's YUV 4:2:2 conversions: rows Y, U, V; columns B, G, R.
_BGR_TO_YUV = np.array([[0.097906, 0.504129, 0.256788], [0.439216, -0.290993, -0.148223],
                        [-0.071427, -0.367788, 0.439216]])
# OpenCV names a Bayer pattern by the second row's first two pixels; ROS by the first row's.
_FROM_BAYER = {"bayer_rggb8": cv2.COLOR_BayerBG2BGR, "bayer_bggr8": cv2.COLOR_BayerRG2BGR,
               "bayer_gbrg8": cv2.COLOR_BayerGR2BGR, "bayer_grbg8": cv2.COLOR_BayerGB2BGR}
# Where each Bayer pattern puts B, G, R in its 2x2 cell (row, col) -> BGR channel.
_BAYER_CELL = {"bayer_rggb8": ((2, 1), (1, 0)), "bayer_bggr8": ((0, 1), (1, 2)),
               "bayer_gbrg8": ((1, 0), (2, 1)), "bayer_grbg8": ((1, 2), (0, 1))}


def bgr_to_yuv422(bgr: np.ndarray, uyvy: bool) -> np.ndarray:
    """BGR to packed YUV 4:2:2 (UYVY or YUYV), as OpenCV >= 4.7 does: each pixel pair shares the
    mean of its chroma. For OpenCV builds without that conversion (apt's)."""
    if bgr.shape[1] % 2:
        raise ValueError(f"YUV 4:2:2 needs an even width, not {bgr.shape[1]}")
    yuv = bgr.astype(np.float64) @ _BGR_TO_YUV.T
    out = np.empty((*bgr.shape[:2], 2), np.float64)
    luma, chroma = (1, 0) if uyvy else (0, 1)
    out[..., luma] = yuv[..., 0] + 16.0
    out[:, 0::2, chroma] = (yuv[:, 0::2, 1] + yuv[:, 1::2, 1]) / 2 + 128.0
    out[:, 1::2, chroma] = (yuv[:, 0::2, 2] + yuv[:, 1::2, 2]) / 2 + 128.0
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)


def _canonical(encoding: str) -> str:
    enc = str(encoding).strip()
    lowered = enc.lower()
    if lowered in _ALIASES:
        return _ALIASES[lowered]
    if lowered in ENCODINGS:
        return lowered
    raise ValueError(
        f"unsupported image encoding '{enc}' (supported: {', '.join(ENCODINGS)}, "
        f"8UC1, 8UC3, 8UC4, 16UC1, uyvy, yuyv)"
    )


def _bytes_of(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if isinstance(data, (bytes, bytearray, memoryview, array.array)):
        return np.frombuffer(data, dtype=np.uint8)
    return np.asarray(data, dtype=np.uint8)


def _mono16_to_8(values: np.ndarray) -> np.ndarray:
    # Full 16-bit range onto 0..255 (65535 -> 255), rounded: what a viewer shows.
    return ((values.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def image_to_bgr(msg: Any) -> np.ndarray:
    """(H, W, 3) uint8 BGR copy of a sensor_msgs/Image.

    mono images come back as gray in all three channels, alpha is dropped, mono16 is scaled
    from the full 16-bit range. Raises ValueError for an unsupported encoding or data that
    does not match height, width and step."""
    encoding = _canonical(msg.encoding)
    channels, depth = ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row_bytes = width * channels * depth
    if height == 0 or width == 0:
        return np.zeros((height, width, 3), dtype=np.uint8)
    if step < row_bytes:
        raise ValueError(
            f"image '{msg.encoding}' {width}x{height}: step {step} is shorter than a row "
            f"({width} px x {channels * depth} bytes = {row_bytes})"
        )
    data = _bytes_of(msg.data)
    needed = (height - 1) * step + row_bytes
    if data.size < needed:
        raise ValueError(
            f"image '{msg.encoding}' {width}x{height} (step {step}) needs {needed} bytes of "
            f"data, got {data.size}"
        )
    rows = np.lib.stride_tricks.as_strided(data, shape=(height, row_bytes), strides=(step, 1))
    if depth == 2:
        order = ">" if bool(msg.is_bigendian) else "<"
        pixels = _mono16_to_8(rows.copy().view(f"{order}u2").reshape(height, width))
        return cv2.cvtColor(pixels, cv2.COLOR_GRAY2BGR)
    pixels = rows.reshape(height, width, channels)
    if encoding in _FROM_2CH:
        if width % 2:
            raise ValueError(f"image '{msg.encoding}' {width}x{height}: YUV 4:2:2 needs an "
                             "even width")
        return cv2.cvtColor(np.ascontiguousarray(pixels), _FROM_2CH[encoding])
    if encoding in _FROM_BAYER:
        return cv2.cvtColor(np.ascontiguousarray(pixels[:, :, 0]), _FROM_BAYER[encoding])
    if encoding == "bgr8":
        return pixels.copy()
    if encoding == "rgb8":
        return np.ascontiguousarray(pixels[:, :, ::-1])
    if encoding == "bgra8":
        return np.ascontiguousarray(pixels[:, :, :3])
    if encoding == "rgba8":
        return np.ascontiguousarray(pixels[:, :, 2::-1])
    return cv2.cvtColor(np.ascontiguousarray(pixels[:, :, 0]), cv2.COLOR_GRAY2BGR)


_TO_GRAY = {"bgr8": cv2.COLOR_BGR2GRAY, "rgb8": cv2.COLOR_RGB2GRAY,
            "bgra8": cv2.COLOR_BGRA2GRAY, "rgba8": cv2.COLOR_RGBA2GRAY}


def image_to_gray(msg: Any) -> np.ndarray:
    """(H, W) uint8 grey of a sensor_msgs/Image: what cvtColor(image_to_bgr(msg), BGR2GRAY)
    gives, without the BGR copy for the common 8-bit colour encodings (the keyframe gate
    looks at every raw frame)."""
    encoding = _canonical(msg.encoding)
    code = _TO_GRAY.get(encoding)
    if code is not None:
        height, width, step = int(msg.height), int(msg.width), int(msg.step)
        channels = ENCODINGS[encoding][0]
        data = _bytes_of(msg.data)
        if height and width and step == width * channels and data.size >= height * step:
            return cv2.cvtColor(data[:height * step].reshape(height, width, channels), code)
    return cv2.cvtColor(image_to_bgr(msg), cv2.COLOR_BGR2GRAY)  # checks and says what is wrong


def compressed_to_bgr(msg: Any) -> np.ndarray:
    """(H, W, 3) uint8 BGR of a sensor_msgs/CompressedImage in JPEG or PNG.

    `format` may be a bare "jpeg"/"png" or image_transport's "rgb8; jpeg compressed bgr8";
    when it says the compressed pixels are rgb ("... compressed rgb8"), channels are swapped
    back. compressedDepth PNGs (a 12-byte header, then 16-bit PNG) are read as mono16.
    Raises ValueError for another codec or bytes that do not decode."""
    fmt = str(getattr(msg, "format", "") or "").strip()
    lowered = fmt.lower()
    data = _bytes_of(msg.data)
    codec_words = ("jpeg", "jpg", "png")
    if lowered and not any(word in lowered for word in codec_words):
        raise ValueError(f"unsupported compressed image format '{fmt}' (JPEG and PNG only)")
    if "compresseddepth" in lowered:
        start = data.tobytes().find(b"\x89PNG")
        data = data[start:] if start >= 0 else data
    if data.size == 0:
        raise ValueError(f"compressed image ('{fmt}') has no data")
    decoded = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    if decoded is None or decoded.size == 0:
        raise ValueError(f"compressed image ('{fmt}', {data.size} bytes) could not be decoded")
    if decoded.dtype == np.uint16:
        decoded = _mono16_to_8(decoded)
    elif decoded.dtype != np.uint8:
        raise ValueError(f"compressed image ('{fmt}') decoded to unsupported {decoded.dtype}")
    if decoded.ndim == 2 or decoded.shape[2] == 1:
        return cv2.cvtColor(decoded.reshape(decoded.shape[:2]), cv2.COLOR_GRAY2BGR)
    bgr = np.ascontiguousarray(decoded[:, :, :3])
    payload = lowered.split("compressed", 1)[1] if "compressed" in lowered else ""
    if payload.strip().startswith("rgb"):
        bgr = np.ascontiguousarray(bgr[:, :, ::-1])
    return bgr


def _check_bgr(bgr: np.ndarray) -> np.ndarray:
    arr = np.asarray(bgr)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 BGR array, got {arr.shape} {arr.dtype}")
    return np.ascontiguousarray(arr)


def _stamp(stamp: Any) -> Any:
    return stamp if hasattr(stamp, "sec") else seconds_to_stamp(float(stamp))


def bgr_to_image_msg(
    bgr: np.ndarray,
    encoding: str = "rgb8",
    frame_id: str = "",
    stamp: Any = 0.0,
    *,
    row_padding: int = 0,
    big_endian: bool = False,
) -> Any:
    """sensor_msgs/Image in `encoding` from a BGR array (mono encodings take its gray;
    mono16 spreads gray over the 16-bit range, 255 -> 65535). `row_padding` bytes end each
    row, as some drivers do. For tests and the sample bag."""
    from sensor_msgs.msg import Image

    arr = _check_bgr(bgr)
    canonical = _canonical(encoding)
    height, width = arr.shape[:2]
    if canonical == "bgr8":
        pixels = arr
    elif canonical == "rgb8":
        pixels = arr[:, :, ::-1]
    elif canonical == "bgra8":
        pixels = np.dstack([arr, np.full((height, width), 255, np.uint8)])
    elif canonical == "rgba8":
        pixels = np.dstack([arr[:, :, ::-1], np.full((height, width), 255, np.uint8)])
    elif canonical in _TO_2CH:
        code = _TO_2CH[canonical]
        uyvy = canonical == "yuv422"
        pixels = cv2.cvtColor(arr, code) if code is not None else bgr_to_yuv422(arr, uyvy)
    elif canonical in _BAYER_CELL:
        pixels = np.empty((height, width), np.uint8)
        for r in range(2):
            for c in range(2):
                ch = _BAYER_CELL[canonical][r][c]
                pixels[r::2, c::2] = arr[r::2, c::2, ch]
    else:
        gray = cv2.cvtColor(arr, cv2.COLOR_BGR2GRAY)
        if canonical == "mono8":
            pixels = gray
        else:
            order = ">" if big_endian else "<"
            pixels = (gray.astype(np.uint16) * 257).astype(f"{order}u2")
    row = np.ascontiguousarray(pixels).reshape(height, -1).view(np.uint8)
    if row_padding:
        row = np.hstack([row, np.zeros((height, int(row_padding)), np.uint8)])
    msg = Image()
    msg.header.frame_id = frame_id
    msg.header.stamp = _stamp(stamp)
    msg.height, msg.width = int(height), int(width)
    msg.encoding = encoding
    msg.is_bigendian = int(bool(big_endian) and canonical == "mono16")
    msg.step = int(row.shape[1]) if height else 0
    msg.data = array.array("B", row.tobytes())
    return msg


def encode_jpeg(bgr: np.ndarray, quality: int = 85) -> bytes:
    """JPEG bytes of a BGR (or gray) uint8 image; how keyframes are stored."""
    arr = np.asarray(bgr)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or arr.size == 0:
        raise ValueError(f"cannot JPEG-encode an array of shape {arr.shape} {arr.dtype}")
    if not 0 <= int(quality) <= 100:
        raise ValueError(f"JPEG quality must be 0..100, got {quality}")
    ok, buf = cv2.imencode(".jpg", arr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError(f"JPEG encoding failed for an array of shape {arr.shape}")
    return buf.tobytes()


def bgr_to_compressed_msg(
    bgr: np.ndarray,
    fmt: str = "jpeg",
    frame_id: str = "",
    stamp: Any = 0.0,
    quality: int = 85,
) -> Any:
    """sensor_msgs/CompressedImage (JPEG or PNG) with image_transport's format string,
    e.g. "bgr8; jpeg compressed bgr8". For tests and the sample bag."""
    from sensor_msgs.msg import CompressedImage

    arr = _check_bgr(bgr)
    kind = fmt.lower()
    if kind in ("jpeg", "jpg"):
        payload, kind = encode_jpeg(arr, quality), "jpeg"
    elif kind == "png":
        ok, buf = cv2.imencode(".png", arr)
        if not ok:
            raise ValueError(f"PNG encoding failed for an array of shape {arr.shape}")
        payload = buf.tobytes()
    else:
        raise ValueError(f"unsupported compressed format '{fmt}' (jpeg or png)")
    msg = CompressedImage()
    msg.header.frame_id = frame_id
    msg.header.stamp = _stamp(stamp)
    msg.format = f"bgr8; {kind} compressed bgr8"
    msg.data = array.array("B", payload)
    return msg
