"""A caption stand-in for the sample recording: a local OpenAI-compatible chat endpoint that
captions a keyframe of the sample from its ground truth.

It finds which recorded frame an image is (the nearest of the keyframes it was given, by a
small grey thumbnail), and answers what a perfect captioner would say of that moment: the
named objects in the camera's view then (`memory_node.sim.objects`). `memory-eval --captions
standin` uses it to measure the caption pipeline (admission, budget, re-embedding, search)
with a model whose answers are known to be right; `--captions vlm` asks a real model instead.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memory_node.sim.chat_endpoint import Answer, ChatEndpoint, assistant, completion, error

THUMB = (32, 24)


def thumbnail(image_bgr: np.ndarray) -> np.ndarray:
    import cv2

    grey = cv2.cvtColor(image_bgr, cv2.COLOR_BGR2GRAY)
    small = cv2.resize(grey, THUMB, interpolation=cv2.INTER_AREA).astype(np.float32)
    return (small - small.mean()).ravel() / (small.std() + 1e-3)


class CaptionOracle(ChatEndpoint):
    """`with CaptionOracle(frames, caption_at) as oracle:` — `frames` are (t, image) of the
    keyframes that may be asked about; `caption_at(t)` is the true caption at stamp t."""

    def __init__(self, frames: Sequence[tuple[float, np.ndarray]],
                 caption_at: Callable[[float], str]):
        if not frames:
            raise ValueError("the caption oracle needs the keyframes it may be asked about")
        self.times = np.array([t for t, _ in frames], np.float64)
        self.thumbs = np.stack([thumbnail(img) for _, img in frames])
        self.caption_at = caption_at
        self.requests = 0
        super().__init__()

    def answer(self, body: dict[str, Any], request: Any = None) -> Answer:
        self.requests += 1
        try:
            return 200, completion(assistant(self.caption(body)))
        except ValueError as exc:
            return 400, error(str(exc))

    def frame_time(self, image_bgr: np.ndarray) -> float:
        d = np.linalg.norm(self.thumbs - thumbnail(image_bgr)[None, :], axis=1)
        return float(self.times[int(np.argmin(d))])

    def caption(self, body: dict[str, Any]) -> str:
        """The true caption of the frame whose image the request carries."""
        import cv2

        try:
            parts = body["messages"][-1]["content"]
            url = next(p["image_url"]["url"] for p in parts if p.get("type") == "image_url")
            data = base64.b64decode(url.split(",", 1)[1])
        except (KeyError, IndexError, StopIteration, TypeError, ValueError):
            raise ValueError("expected a user message with an image_url data URL") from None
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError("the image is not a JPEG or PNG")
        return self.caption_at(self.frame_time(img))
