"""The heuristic OpenCV describer on synthetic images (real cv2, no weights)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from memory_node.core.embedders import ImageDescriber, ModelUnavailable, get_describer
from memory_node.core.embedders.describer import (
    DESCRIBER_ID,
    PALETTE,
    OpenCVDescriber,
    color_names,
    describe_tags,
)
from memory_node.core.pixels import as_bgr_uint8

TAG_KEYS = {"brightness", "colors", "person", "people", "faces"}


@pytest.fixture(scope="module")
def describer() -> OpenCVDescriber:
    return OpenCVDescriber(detect_people=True, detect_faces=True)  # both must exist here


def solid(bgr: tuple[int, int, int], h: int = 240, w: int = 320) -> np.ndarray:
    img = np.empty((h, w, 3), dtype=np.uint8)
    img[:] = bgr
    return img


def test_white_image_is_bright_and_white(describer: OpenCVDescriber) -> None:
    d = describer.describe(solid((255, 255, 255)))
    assert isinstance(describer, ImageDescriber)
    assert describer.describer_id == DESCRIBER_ID == "opencv-heuristic-v1"
    assert set(d.tags) == TAG_KEYS
    assert d.tags["brightness"] == 1.0
    assert d.tags["colors"] == ["white"]
    assert d.tags["person"] is False and d.tags["people"] == 0 and d.tags["faces"] == 0
    assert d.text == "bright scene; mostly white"


def test_dark_image_is_dark(describer: OpenCVDescriber) -> None:
    d = describer.describe(solid((12, 10, 8)))
    assert d.tags["brightness"] < 0.1
    assert d.tags["colors"] == ["black"]
    assert d.text == "dark scene; mostly black"


def test_grey_image_is_grey(describer: OpenCVDescriber) -> None:
    d = describer.describe(solid((128, 128, 128)))
    assert d.tags["brightness"] == pytest.approx(128 / 255, abs=1e-3)
    assert d.tags["colors"] == ["grey"]
    assert d.text == "moderately bright scene; mostly grey"


def test_half_red_half_blue_names_both(describer: OpenCVDescriber) -> None:
    img = solid((0, 0, 255))
    img[:, 160:] = (255, 0, 0)
    d = describer.describe(img)
    assert sorted(d.tags["colors"]) == ["blue", "red"]
    assert "red" in d.text and "blue" in d.text


def test_colours_ordered_by_share(describer: OpenCVDescriber) -> None:
    img = solid((0, 200, 0))  # green 60%
    img[:, 192:] = (0, 255, 255)  # yellow 40%
    assert describer.describe(img).tags["colors"] == ["green", "yellow"]


@pytest.mark.parametrize(
    ("bgr", "name"),
    [
        ((0, 0, 255), "red"),
        ((0, 140, 255), "orange"),
        ((0, 230, 255), "yellow"),
        ((0, 200, 0), "green"),
        ((230, 230, 0), "cyan"),
        ((255, 0, 0), "blue"),
        ((200, 0, 120), "purple"),
        ((180, 105, 255), "pink"),
        ((203, 192, 255), "pink"),
        ((19, 69, 139), "brown"),
        ((250, 250, 250), "white"),
        ((128, 128, 128), "grey"),
        ((20, 20, 20), "black"),
    ],
)
def test_palette(bgr: tuple[int, int, int], name: str) -> None:
    hsv = cv2.cvtColor(solid(bgr, 1, 1), cv2.COLOR_BGR2HSV)
    assert PALETTE[int(color_names(hsv)[0, 0])] == name


def test_many_colours_are_reported_as_mixed(describer: OpenCVDescriber) -> None:
    img = solid((0, 0, 0))
    stripes = [(0, 0, 255), (0, 140, 255), (0, 230, 255), (0, 200, 0), (230, 230, 0),
               (255, 0, 0), (200, 0, 120), (128, 128, 128)]  # fmt: skip
    for i, bgr in enumerate(stripes):
        img[:, i * 40 : (i + 1) * 40] = bgr
    d = describer.describe(img)
    assert len(d.tags["colors"]) == 1  # the commonest, not claimed as "mostly"
    assert "mixed colours, some" in d.text and "mostly" not in d.text


def test_no_person_on_flat_or_noisy_images(describer: OpenCVDescriber) -> None:
    rng = np.random.default_rng(0)
    images = [solid((90, 90, 90)), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)]
    for img in images:
        tags = describer.describe(img).tags
        assert tags["person"] is False
        assert isinstance(tags["people"], int) and tags["people"] == 0
        assert isinstance(tags["faces"], int) and tags["faces"] == 0


def test_sizes_small_and_large(describer: OpenCVDescriber) -> None:
    for h, w in [(1, 1), (20, 30), (100, 60), (480, 640), (720, 1280)]:
        d = describer.describe(solid((40, 180, 40), h, w))
        assert set(d.tags) == TAG_KEYS
        assert d.tags["colors"] == ["green"]


def test_deterministic(describer: OpenCVDescriber) -> None:
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    assert describer.describe(img) == describer.describe(img.copy())


def test_input_coercion_and_errors(describer: OpenCVDescriber) -> None:
    grey = np.full((60, 80), 200, dtype=np.uint8)
    d = describer.describe(grey)
    assert d.tags["colors"] == ["white"] and d.tags["brightness"] == pytest.approx(200 / 255, 1e-3)
    assert describer.describe(np.full((60, 80, 1), 200, dtype=np.uint8)) == d
    as_float = describer.describe(np.full((60, 80, 3), 200 / 255, dtype=np.float32))
    assert as_float.tags["colors"] == ["white"]
    bgra = np.dstack([solid((0, 0, 255), 60, 80), np.full((60, 80), 255, np.uint8)])
    assert describer.describe(bgra).tags["colors"] == ["red"]
    with pytest.raises(ValueError, match="empty"):
        describer.describe(np.zeros((0, 10, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="shape"):
        describer.describe(np.zeros((4, 4, 4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="shape"):
        describer.describe(np.zeros((4, 4, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match="numpy array"):
        describer.describe([[1, 2], [3, 4]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        as_bgr_uint8(np.zeros((4, 4), dtype=np.complex64))


def test_text_phrases() -> None:
    tags = {"brightness": 0.3, "colors": ["blue", "white"], "person": True, "people": 2, "faces": 1}
    assert describe_tags(tags) == "dim scene; mostly blue, white; two people; one face visible"
    one = {"brightness": 0.9, "colors": ["red"], "person": True, "people": 1, "faces": 0}
    assert describe_tags(one) == "bright scene; mostly red; one person"
    many = {"brightness": 0.5, "colors": [], "person": True, "people": 12, "faces": 0}
    assert describe_tags(many) == "moderately bright scene; 12 people"


def test_detectors_can_be_turned_off() -> None:
    d = OpenCVDescriber(detect_people=False, detect_faces=False).describe(solid((0, 0, 255)))
    assert set(d.tags) == {"brightness", "colors"}  # no claim about people either way
    only_faces = OpenCVDescriber(detect_people=False).describe(solid((0, 0, 255)))
    assert set(only_faces.tags) == {"brightness", "colors", "person", "faces"}


def test_bad_cascade_path_is_clear(tmp_path: Path) -> None:
    bad = tmp_path / "cascade.xml"
    bad.write_text("<opencv_storage></opencv_storage>")
    with pytest.raises(ModelUnavailable, match="cascade"):
        OpenCVDescriber(face_cascade_path=str(bad)).describe(solid((1, 1, 1)))


def test_registry_default_is_opencv() -> None:
    d = get_describer()
    assert isinstance(d, OpenCVDescriber)
    with pytest.raises(ValueError, match="known: opencv, vlm"):
        get_describer("yolo")
