"""Image and CompressedImage conversion, with real sensor_msgs message objects.

Raw encodings are checked both through the builder (round trips) and against bytes laid out
here by hand, so builder and decoder cannot share a mistake unnoticed.
"""

from __future__ import annotations

import array
from collections.abc import Callable

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image

from memory_node.wire.geometry import stamp_to_seconds
from memory_node.wire.image_codec import (
    bgr_to_compressed_msg,
    bgr_to_image_msg,
    compressed_to_bgr,
    encode_jpeg,
    image_to_bgr,
    image_to_gray,
)

H, W = 6, 9


def sample_bgr(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(H, W, 3), dtype=np.uint8)


def gray_bgr(bgr: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY), cv2.COLOR_GRAY2BGR)


def smooth_bgr() -> np.ndarray:
    """A gradient: JPEG keeps it close, unlike noise."""
    y, x = np.mgrid[0:48, 0:64]
    return np.dstack([x * 4, y * 5, (x + y) * 2]).astype(np.uint8)


COLOR = ["rgb8", "bgr8", "rgba8", "bgra8", "8UC3"]
MONO = ["mono8", "8UC1", "mono16", "16UC1"]


@pytest.mark.parametrize("encoding", COLOR + MONO)
@pytest.mark.parametrize("row_padding", [0, 5])
def test_round_trip_every_encoding(encoding: str, row_padding: int) -> None:
    bgr = sample_bgr()
    msg = bgr_to_image_msg(bgr, encoding, "cam", 3.5, row_padding=row_padding)
    assert isinstance(msg, Image)
    assert (msg.height, msg.width, msg.encoding) == (H, W, encoding)
    assert len(msg.data) == msg.step * H
    out = image_to_bgr(msg)
    assert out.dtype == np.uint8 and out.shape == (H, W, 3)
    want = bgr if encoding in COLOR else gray_bgr(bgr)
    assert np.array_equal(out, want)
    # the keyframe gate's grey, taken without the BGR copy where it can: the same pixels
    assert np.array_equal(image_to_gray(msg), cv2.cvtColor(want, cv2.COLOR_BGR2GRAY))
    assert msg.header.frame_id == "cam" and stamp_to_seconds(msg.header.stamp) == 3.5


@pytest.mark.parametrize("big_endian", [False, True])
def test_mono16_byte_order(big_endian: bool) -> None:
    msg = bgr_to_image_msg(sample_bgr(1), "mono16", big_endian=big_endian)
    assert msg.is_bigendian == int(big_endian)
    assert np.array_equal(image_to_bgr(msg), gray_bgr(sample_bgr(1)))


def raw_image(encoding: str, pixels: np.ndarray, step: int, big_endian: bool = False) -> Image:
    """An Image whose bytes are laid out here, row by row, padding 0x77."""
    height = pixels.shape[0]
    rows = np.ascontiguousarray(pixels).reshape(height, -1).view(np.uint8)
    pad = np.full((height, step - rows.shape[1]), 0x77, np.uint8)
    msg = Image()
    msg.height, msg.width = height, pixels.shape[1]
    msg.encoding = encoding
    msg.is_bigendian = int(big_endian)
    msg.step = step
    msg.data = array.array("B", np.hstack([rows, pad]).tobytes())
    return msg


def test_hand_laid_out_images() -> None:
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[0, 0] = (255, 0, 0)  # red, in rgb order
    rgb[1, 2] = (0, 0, 255)  # blue
    out = image_to_bgr(raw_image("rgb8", rgb, step=3 * 3 + 7))
    assert tuple(out[0, 0]) == (0, 0, 255) and tuple(out[1, 2]) == (255, 0, 0)

    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[1, 1] = (10, 20, 30, 40)
    out = image_to_bgr(raw_image("rgba8", rgba, step=8))
    assert tuple(out[1, 1]) == (30, 20, 10)

    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[0, 1] = (10, 20, 30, 40)
    assert tuple(image_to_bgr(raw_image("bgra8", bgra, step=12))[0, 1]) == (10, 20, 30)

    mono = np.array([[0, 128], [255, 7]], np.uint8)
    out = image_to_bgr(raw_image("mono8", mono, step=4))
    assert np.array_equal(out[:, :, 0], mono) and np.array_equal(out[:, :, 2], mono)

    deep = np.array([[0, 65535], [257, 32896]], np.uint16)
    for order, big in (("<", False), (">", True)):
        out = image_to_bgr(raw_image("mono16", deep.astype(f"{order}u2"), step=6, big_endian=big))
        assert np.array_equal(out[:, :, 1], [[0, 255], [1, 128]])


def test_raw_camera_encodings_hand_laid_out() -> None:
    """YUV 4:2:2 in both byte orders and a Bayer mosaic, laid out byte by byte as a USB or
    machine-vision camera driver publishes them: a red patch comes out red."""
    red_uyvy = np.tile(np.array([90, 81, 240, 81], np.uint8), (2, 2)).reshape(2, 8)
    red_yuyv = np.tile(np.array([81, 90, 81, 240], np.uint8), (2, 2)).reshape(2, 8)
    for encoding, data in (("yuv422", red_uyvy), ("yuv422_yuy2", red_yuyv)):
        b, g, r = image_to_bgr(raw_image(encoding, data.reshape(2, 4, 2), step=8))[1, 3]
        assert r > 240 and g < 10 and b < 10, encoding
    mosaic = np.tile(np.array([[200, 10], [10, 0]], np.uint8), (3, 3))  # R G / G B
    out = image_to_bgr(raw_image("bayer_rggb8", mosaic, step=6))
    assert tuple(out[2, 2]) == (0, 10, 200)
    odd = raw_image("yuv422", np.zeros((2, 3, 2), np.uint8), step=6)
    with pytest.raises(ValueError, match="even width"):
        image_to_bgr(odd)


@pytest.mark.parametrize("encoding", ["yuv422", "yuv422_yuy2", "UYVY", "bayer_rggb8",
                                      "bayer_bggr8", "bayer_gbrg8", "bayer_grbg8"])
def test_raw_camera_encodings_round_trip(encoding: str) -> None:
    """Chroma is shared by two pixels (YUV) or interpolated (Bayer): a flat colour comes back
    exactly, a smooth gradient within two levels away from the border."""
    flat = np.zeros((24, 32, 3), np.uint8)  # YUV 4:2:2 needs an even width
    flat[:] = (30, 140, 220)
    assert np.array_equal(image_to_bgr(bgr_to_image_msg(flat, encoding)), flat)
    y, x = np.mgrid[0:24, 0:32]
    smooth = np.dstack([x * 2 + 40, y * 3 + 30, x + y + 50]).astype(np.uint8)
    out = image_to_bgr(bgr_to_image_msg(smooth, encoding, row_padding=4))
    diff = np.abs(out.astype(int) - smooth.astype(int))[2:-2, 2:-2]
    assert diff.max() <= 2


def test_data_as_bytes_and_ndarray() -> None:
    msg = bgr_to_image_msg(sample_bgr(2), "bgr8")
    for data in (bytes(msg.data), np.frombuffer(bytes(msg.data), np.uint8)):
        msg.data = array.array("B", bytes(data))
        assert np.array_equal(image_to_bgr(msg), sample_bgr(2))


def test_output_does_not_alias_the_message() -> None:
    msg = bgr_to_image_msg(sample_bgr(3), "bgr8")
    out = image_to_bgr(msg)
    out[:] = 0
    assert np.array_equal(image_to_bgr(msg), sample_bgr(3))


def test_empty_image() -> None:
    assert image_to_bgr(Image(encoding="rgb8")).shape == (0, 0, 3)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: setattr(m, "encoding", "nv21"), r"unsupported image encoding 'nv21'"),
        (lambda m: setattr(m, "encoding", "32FC1"), r"unsupported image encoding"),
        (lambda m: setattr(m, "encoding", ""), r"unsupported image encoding ''"),
        (lambda m: setattr(m, "step", 20), r"step 20 is shorter than a row \(9 px x 3 bytes"),
        (lambda m: setattr(m, "data", m.data[:-1]), r"needs 162 bytes of data, got 161"),
        (lambda m: setattr(m, "height", 7), r"'rgb8' 9x7 \(step 27\) needs 189 bytes"),
    ],
)
def test_bad_images_raise_value_error(mutate: Callable[[Image], None], message: str) -> None:
    msg = bgr_to_image_msg(sample_bgr(), "rgb8")
    mutate(msg)
    with pytest.raises(ValueError, match=message):
        image_to_bgr(msg)
    with pytest.raises(ValueError, match=message):
        image_to_gray(msg)


# -- compressed --------------------------------------------------------------------------
def test_jpeg_round_trip() -> None:
    bgr = smooth_bgr()
    msg = bgr_to_compressed_msg(bgr, "jpeg", "cam", 9.25, quality=95)
    assert isinstance(msg, CompressedImage)
    assert msg.format == "bgr8; jpeg compressed bgr8"
    assert stamp_to_seconds(msg.header.stamp) == 9.25
    out = compressed_to_bgr(msg)
    assert out.shape == bgr.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - bgr).mean() < 3.0


def test_png_round_trip_is_lossless() -> None:
    bgr = sample_bgr(4)
    msg = bgr_to_compressed_msg(bgr, "png")
    assert msg.format == "bgr8; png compressed bgr8"
    assert np.array_equal(compressed_to_bgr(msg), bgr)


@pytest.mark.parametrize(
    "fmt", ["jpeg", "png", "rgb8; png compressed bgr8", "bgr8; png compressed bgr8", ""]
)
def test_format_strings(fmt: str) -> None:
    bgr = sample_bgr(5)
    msg = bgr_to_compressed_msg(bgr, "png")
    msg.format = fmt
    assert np.array_equal(compressed_to_bgr(msg), bgr)


def test_compressed_rgb_payload_is_swapped_back() -> None:
    bgr = sample_bgr(6)
    ok, png = cv2.imencode(".png", bgr[:, :, ::-1])  # pixels stored in rgb order
    assert ok
    msg = CompressedImage(format="rgb8; png compressed rgb8", data=array.array("B", png.tobytes()))
    assert np.array_equal(compressed_to_bgr(msg), bgr)


def test_gray_alpha_and_depth_pngs() -> None:
    gray = sample_bgr(7)[:, :, 0]
    ok, png = cv2.imencode(".png", gray)
    msg = CompressedImage(
        format="mono8; png compressed mono8", data=array.array("B", png.tobytes())
    )
    assert ok and np.array_equal(compressed_to_bgr(msg), cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR))

    bgra = np.dstack([sample_bgr(8), np.full((H, W), 9, np.uint8)])
    ok, png = cv2.imencode(".png", bgra)
    msg = CompressedImage(format="png", data=array.array("B", png.tobytes()))
    assert ok and np.array_equal(compressed_to_bgr(msg), sample_bgr(8))

    depth = gray.astype(np.uint16) * 257
    ok, png = cv2.imencode(".png", depth)
    header = bytes(12)  # compressedDepth: a config header precedes the PNG
    data = array.array("B", header + png.tobytes())
    msg = CompressedImage(format="16UC1; compressedDepth png", data=data)
    assert ok and np.array_equal(compressed_to_bgr(msg), cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR))


def corrupt(data: bytes) -> CompressedImage:
    return CompressedImage(format="rgb8; jpeg compressed bgr8", data=array.array("B", data))


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not a jpeg at all",
        b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4,  # a JPEG start, then garbage
        bytes(np.random.default_rng(9).integers(0, 256, 4096, dtype=np.uint8)),
    ],
)
def test_corrupt_bytes_raise_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError, match=r"could not be decoded|has no data"):
        compressed_to_bgr(corrupt(payload))


def test_truncated_jpeg_header_raises() -> None:
    jpeg = encode_jpeg(smooth_bgr())
    with pytest.raises(ValueError, match="could not be decoded"):
        compressed_to_bgr(corrupt(jpeg[:100]))


def test_unsupported_codec() -> None:
    msg = bgr_to_compressed_msg(sample_bgr(), "jpeg")
    msg.format = "h264"
    with pytest.raises(ValueError, match="unsupported compressed image format 'h264'"):
        compressed_to_bgr(msg)
    with pytest.raises(ValueError, match="unsupported compressed format 'webp'"):
        bgr_to_compressed_msg(sample_bgr(), "webp")


def test_encode_jpeg() -> None:
    bgr = smooth_bgr()
    low, high = encode_jpeg(bgr, quality=20), encode_jpeg(bgr, quality=95)
    assert low[:2] == b"\xff\xd8" and high[-2:] == b"\xff\xd9"
    assert len(low) < len(high)
    decoded = cv2.imdecode(np.frombuffer(high, np.uint8), cv2.IMREAD_COLOR)
    assert np.abs(decoded.astype(int) - bgr).mean() < 3.0
    assert encode_jpeg(bgr[:, :, 0])[:2] == b"\xff\xd8"
    with pytest.raises(ValueError, match="quality"):
        encode_jpeg(bgr, quality=101)
    with pytest.raises(ValueError, match="shape"):
        encode_jpeg(bgr.astype(np.float32))
    with pytest.raises(ValueError, match="BGR"):
        bgr_to_image_msg(bgr[:, :, :2])
