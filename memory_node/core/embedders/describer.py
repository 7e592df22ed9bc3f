"""Image describers: tags plus a short text that the text model embeds.

`OpenCVDescriber` is a heuristic describer that needs no weights, so it works offline: it
measures brightness, names dominant colours from a fixed palette, and counts people (OpenCV's
HOG people detector) and frontal faces (a Haar cascade bundled with opencv-python). It does not
recognise objects; its text says only what those measurements support.

`VLMDescriber` keeps the same tags and takes its text from a vision-language model behind an
OpenAI-compatible endpoint (the VLM_* / OPENAI_* settings).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from memory_node.core.embedders.base import ImageDescription, ModelUnavailable

if TYPE_CHECKING:  # pragma: no cover - typing only
    from memory_node.core.llm import ChatClient
from memory_node.core.pixels import as_bgr_uint8

DESCRIBER_ID = "opencv-heuristic-v1"
PALETTE = (
    "red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink",
    "brown", "white", "grey", "black",
)  # fmt: skip
FACE_CASCADE = "haarcascade_frontalface_default.xml"
_NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def find_face_cascade() -> str | None:
    """The frontal-face Haar cascade: pip wheels carry it in cv2.data, distro packages under
    /usr/share (ROS machines often use the distro's python3-opencv)."""
    import cv2

    dirs = []
    data = getattr(cv2, "data", None)
    if data is not None and getattr(data, "haarcascades", None):
        dirs.append(data.haarcascades)
    dirs += [
        "/usr/share/opencv4/haarcascades",
        "/usr/share/opencv/haarcascades",
        "/usr/local/share/opencv4/haarcascades",
    ]
    for d in dirs:
        path = os.path.join(d, FACE_CASCADE)
        if os.path.isfile(path):
            return path
    return None


def color_names(hsv: np.ndarray) -> np.ndarray:
    """Palette index per pixel of an OpenCV HSV image (H 0..179, S and V 0..255).

    Achromatic first (black by value, white/grey by low saturation), then brown and pink as
    dark-orange and pale-red, then hue bands.
    """
    h = hsv[..., 0].astype(np.int16)
    s = hsv[..., 1].astype(np.int16)
    v = hsv[..., 2].astype(np.int16)
    idx = np.full(h.shape, PALETTE.index("red"), dtype=np.int8)
    bands = (  # (upper hue bound exclusive, name); hue 170..179 wraps back to red
        (8, "red"), (21, "orange"), (34, "yellow"), (78, "green"), (98, "cyan"),
        (130, "blue"), (150, "purple"), (170, "pink"),
    )  # fmt: skip
    lower = 0
    for upper, name in bands:
        idx[(h >= lower) & (h < upper)] = PALETTE.index(name)
        lower = upper
    idx[(h >= 5) & (h < 25) & (v < 150)] = PALETTE.index("brown")
    idx[((h < 8) | (h >= 160)) & (s < 130) & (v >= 170)] = PALETTE.index("pink")
    grey = s < 45
    idx[grey] = PALETTE.index("grey")
    idx[grey & (v >= 200)] = PALETTE.index("white")
    idx[v < 50] = PALETTE.index("black")
    return idx


def brightness_word(b: float) -> str:
    if b < 0.2:
        return "dark"
    if b < 0.4:
        return "dim"
    if b < 0.65:
        return "moderately bright"
    return "bright"


def describe_tags(tags: dict[str, Any], mixed_colors: bool = False) -> str:
    """The deterministic text for a tag set, e.g. "bright scene; mostly red, white; one person".

    `mixed_colors` says no colour reached the share threshold, so the one named is only the
    commonest and the text must not claim "mostly".
    """
    parts = [f"{brightness_word(float(tags.get('brightness', 0.0)))} scene"]
    colors = list(tags.get("colors") or [])
    if mixed_colors and colors:
        parts.append(f"mixed colours, some {colors[0]}")
    elif colors:
        parts.append("mostly " + ", ".join(colors))
    people = int(tags.get("people", 0))
    if not people and tags.get("person"):
        parts.append("a person")
    elif people:
        parts.append(f"{_count(people)} {'person' if people == 1 else 'people'}")
    faces = int(tags.get("faces", 0))
    if faces:
        parts.append(f"{_count(faces)} {'face' if faces == 1 else 'faces'} visible")
    return "; ".join(parts)


def _count(n: int) -> str:
    return _NUMBERS[n] if 0 <= n < len(_NUMBERS) else str(n)


class OpenCVDescriber:
    """Heuristic, weight-free describer (`describer_id = "opencv-heuristic-v1"`).

    Tags: brightness (mean luma 0..1, 3 dp), colors (palette names covering >= `min_share` of
    pixels, most first, at most 3; the single commonest when none does), person, people (HOG
    detections, at least the number of faces: a visible face is a person even when the body is
    out of frame), faces. Detection runs on a copy no wider than `max_detect_width` for speed;
    detectors are created on first use, one set per calling thread (OpenCV's cascade is not
    documented as thread-safe), so several threads describe frames at once.

    `detect_people` / `detect_faces`: True requires the detector (ModelUnavailable if this
    OpenCV lacks it: OpenCV 5 dropped HOG and the bundled cascades from the main wheels), False
    turns it off, None uses it when present. A detector that does not run leaves its tags out
    (`people`, `faces`; `person` when neither runs) rather than claiming nobody is there.
    """

    describer_id = DESCRIBER_ID

    def __init__(
        self,
        *,
        min_share: float = 0.15,
        detect_people: bool | None = None,
        detect_faces: bool | None = None,
        face_cascade_path: str | None = None,
        max_detect_width: int = 320,
        hog_scale: float = 1.05,
        hog_min_weight: float = 0.5,
        face_scale: float = 1.2,
        face_min_size: int = 28,
        cv_threads: int | None = 1,
    ) -> None:
        if not 0.0 < min_share <= 1.0:
            raise ValueError(f"min_share must be in (0, 1], got {min_share}")
        if max_detect_width < 64:
            raise ValueError(f"max_detect_width must be >= 64, got {max_detect_width}")
        if hog_scale <= 1.0 or face_scale <= 1.0:
            raise ValueError(f"hog_scale and face_scale must be > 1, got {hog_scale}, {face_scale}")
        self.min_share = min_share
        self.detect_people = detect_people
        self.detect_faces = detect_faces
        self.face_cascade_path = face_cascade_path
        self.max_detect_width = max_detect_width
        self.hog_scale = hog_scale
        self.hog_min_weight = hog_min_weight
        self.face_scale = face_scale
        self.face_min_size = face_min_size
        self.cv_threads = cv_threads
        self._checked = False
        self._check_lock = threading.Lock()
        self._local = threading.local()  # this thread's (hog, cascade)

    def load(self) -> None:
        """Create the detectors now (a lifecycle `configure` wants failures early)."""
        self._detectors()

    @property
    def detectors(self) -> dict[str, bool]:
        """Which detectors run: {"people": ..., "faces": ...} (loads them)."""
        hog, cascade = self._detectors()
        return {"people": hog is not None, "faces": cascade is not None}

    def _detectors(self) -> tuple[Any, Any]:
        """This thread's HOG people detector and face cascade (None where not run)."""
        made = getattr(self._local, "detectors", None)
        if made is None:
            with self._check_lock:  # the first creation says why a required one is missing
                made = self._make_detectors()
                self._checked = True
            self._local.detectors = made
        return made

    def _make_detectors(self) -> tuple[Any, Any]:
        import cv2

        if self.cv_threads is not None and not self._checked:
            # Process-wide; a small number keeps the describer from starving the robot's stack.
            cv2.setNumThreads(self.cv_threads)
        hog: Any = None
        if self.detect_people is not False:
            if hasattr(cv2, "HOGDescriptor") and hasattr(
                cv2, "HOGDescriptor_getDefaultPeopleDetector"
            ):
                hog = cv2.HOGDescriptor()
                # The older spelling, kept by OpenCV but missing from its type stubs.
                hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())  # type: ignore[attr-defined]
            elif self.detect_people:
                raise ModelUnavailable(
                    f"OpenCV {cv2.__version__} has no HOG people detector; install "
                    "opencv-python-headless<5 or set detect_people to false"
                )
        cascade: Any = None
        if self.detect_faces is not False:
            path = self.face_cascade_path or find_face_cascade()
            if path and hasattr(cv2, "CascadeClassifier"):
                try:
                    cascade = cv2.CascadeClassifier(path)
                except Exception:  # cv2 raises cv2.error or SystemError on a bad file
                    cascade = None
                if cascade is None or cascade.empty():
                    if self.face_cascade_path:
                        raise ModelUnavailable(f"cannot load OpenCV face cascade {path}")
                    cascade = None
            if cascade is None and self.detect_faces:
                raise ModelUnavailable(
                    f"no usable Haar face cascade ({path or FACE_CASCADE + ' not found'}) in "
                    f"OpenCV {cv2.__version__}; install opencv-python-headless<5, or set "
                    "face_cascade_path, or set detect_faces to false"
                )
        return hog, cascade

    def describe(self, image_bgr: np.ndarray) -> ImageDescription:
        tags, mixed = self._measure(image_bgr)
        return ImageDescription(tags=tags, text=describe_tags(tags, mixed))

    def tags(self, image_bgr: np.ndarray) -> dict[str, Any]:
        """The tags alone (what `describe` reports), for describers that bring their own text."""
        return self._measure(image_bgr)[0]

    def _measure(self, image_bgr: np.ndarray) -> tuple[dict[str, Any], bool]:
        import cv2

        img = as_bgr_uint8(image_bgr)
        h, w = img.shape[:2]
        gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
        brightness = round(float(gray.mean()) / 255.0, 3)
        colors, mixed = self._colors(img)
        hog, cascade = self._detectors()
        if w > self.max_detect_width:
            scale = self.max_detect_width / w
            size = (self.max_detect_width, max(1, round(h * scale)))
            det = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
            det_gray = cv2.resize(gray, size, interpolation=cv2.INTER_AREA)
        else:
            det, det_gray = img, gray
        people = self._people(hog, det) if hog is not None else None
        faces = self._faces_count(cascade, det_gray) if cascade is not None else None
        tags: dict[str, Any] = {"brightness": brightness, "colors": colors}
        if people is not None or faces is not None:
            count = max(people or 0, faces or 0)
            tags["person"] = count > 0
            if people is not None:
                tags["people"] = count
            if faces is not None:
                tags["faces"] = faces
        return tags, mixed

    def _colors(self, img: np.ndarray) -> tuple[list[str], bool]:
        import cv2

        h, w = img.shape[:2]
        scale = min(1.0, 64.0 / max(h, w))
        if scale < 1.0:
            small_size = (max(1, round(w * scale)), max(1, round(h * scale)))
            img = cv2.resize(img, small_size, interpolation=cv2.INTER_AREA)
        idx = color_names(cv2.cvtColor(img, cv2.COLOR_BGR2HSV))
        counts = np.bincount(idx.ravel(), minlength=len(PALETTE))
        shares = counts / max(1, idx.size)
        # Most first; ties broken by palette order so the answer is deterministic.
        order = sorted(range(len(PALETTE)), key=lambda i: (-counts[i], i))
        picked = [PALETTE[i] for i in order if shares[i] >= self.min_share][:3]
        if picked:
            return picked, False
        return [PALETTE[order[0]]], True

    def _people(self, hog: Any, img: np.ndarray) -> int:
        import cv2

        h, w = img.shape[:2]
        if h < 64 or w < 32:  # too little to hold a person at any scale worth reporting
            return 0
        if h < 128 or w < 64:  # the HOG window is 64x128: upscale so a full-frame person fits
            f = max(128 / h, 64 / w)
            img = cv2.resize(img, (round(w * f), round(h * f)), interpolation=cv2.INTER_LINEAR)
        rects, weights = hog.detectMultiScale(
            img, winStride=(8, 8), padding=(8, 8), scale=self.hog_scale
        )
        if len(rects) == 0:
            return 0
        return int(np.count_nonzero(np.asarray(weights).ravel() >= self.hog_min_weight))

    def _faces_count(self, cascade: Any, gray: np.ndarray) -> int:
        m = self.face_min_size
        if min(gray.shape[:2]) < m:
            return 0
        found = cascade.detectMultiScale(
            gray, scaleFactor=self.face_scale, minNeighbors=5, minSize=(m, m)
        )
        return len(found)


class VLMDescriber:
    """Heuristic tags with a caption from a vision-language model as the text.

    The caption is the model's words, not a measurement; the tags stay the heuristic ones so
    that tag filters behave the same whichever describer recorded an image.
    """

    def __init__(
        self,
        client: ChatClient | None = None,
        *,
        prompt: str = "Describe this robot camera image in one short sentence: place, objects, "
        "people and anything notable.",
        max_tokens: int = 300,
        heuristic: OpenCVDescriber | None = None,
    ) -> None:
        if client is None:
            from memory_node.core.llm import ChatClient, resolve_llm_settings

            settings = resolve_llm_settings()
            if settings is None:
                raise ModelUnavailable(
                    "VLM describer needs an API key (VLM_API_KEY or OPENAI_API_KEY)"
                )
            client = ChatClient(settings)
        self.client = client
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.heuristic = heuristic or OpenCVDescriber()
        self.describer_id = f"vlm:{client.settings.model}"

    def describe(self, image_bgr: np.ndarray) -> ImageDescription:
        img = as_bgr_uint8(image_bgr)
        tags = self.heuristic.tags(img)
        return ImageDescription(tags=tags, text=self.caption(img))

    def caption(self, image_bgr: np.ndarray) -> str:
        """The model's caption alone (the background captioner's call)."""
        text = self.client.caption_image(as_bgr_uint8(image_bgr), self.prompt,
                                         max_tokens=self.max_tokens)
        return " ".join(text.split())
