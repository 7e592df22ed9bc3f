"""CLIP-style image and text encoders loaded from ONNX files named in the configuration.

No CLIP weights are available offline, so nothing here downloads: a user exports the image
and text towers once on a connected machine (e.g. from open_clip or Hugging Face) and points
`image_model_path`, `text_model_path` and `tokenizer_path` at the files. Both towers share one
`model_id`, so text queries and image vectors land in the same index.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memory_node.core.embedders.base import (
    LazySession,
    ModelUnavailable,
    l2_normalize,
    require_file,
    resolve_onnx_threads,
)
from memory_node.core.pixels import as_bgr_uint8

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_ONNX_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_ONNX_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class ClipEmbedder:
    """Text and image embedder over two ONNX towers; either tower may be left out.

    Input and output names default to each session's first input/output. The text session may
    also declare an `attention_mask` input, which is then fed. `image_size` defaults to the
    image model's static input size when it declares one, else 224.
    """

    def __init__(
        self,
        image_model_path: str | Path | None = None,
        text_model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        *,
        image_size: int | None = None,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
        context_length: int = 77,
        pad_id: int | None = None,
        image_input: str | None = None,
        image_output: str | None = None,
        text_input: str | None = None,
        text_output: str | None = None,
        model_id: str | None = None,
        dim: int | None = None,
        batch_size: int = 16,
        onnx_threads: int | None = None,
        providers: Sequence[str] | None = None,
    ) -> None:
        if image_model_path is None and text_model_path is None:
            raise ModelUnavailable(
                "CLIP embedder needs image_model_path and/or text_model_path (ONNX files)"
            )
        if text_model_path is not None and tokenizer_path is None:
            raise ModelUnavailable("CLIP text_model_path needs a tokenizer_path (tokenizers JSON)")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError("mean and std must be three numbers each, std > 0")
        if image_size is not None and image_size < 8:
            raise ValueError(f"image_size must be >= 8, got {image_size}")
        if context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {context_length}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        threads = resolve_onnx_threads(onnx_threads)
        self.image_model_path = (
            require_file(image_model_path, "CLIP image model") if image_model_path else None
        )
        self.text_model_path = (
            require_file(text_model_path, "CLIP text model") if text_model_path else None
        )
        self.tokenizer_path = (
            require_file(tokenizer_path, "CLIP tokenizer")
            if text_model_path and tokenizer_path is not None else None  # checked above
        )
        named = self.image_model_path or self.text_model_path
        assert named is not None
        self.model_id = model_id or f"clip:{named.stem}"
        self._dim = dim
        self._image_size = image_size
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.context_length = context_length
        self.pad_id = pad_id
        self.batch_size = batch_size
        self._names = {
            "image_input": image_input,
            "image_output": image_output,
            "text_input": text_input,
            "text_output": text_output,
        }
        self._image = (
            LazySession(self.image_model_path, threads, providers)
            if self.image_model_path
            else None
        )
        self._text = (
            LazySession(self.text_model_path, threads, providers) if self.text_model_path else None
        )
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()
        self._io: dict[str, Any] = {}

    # -- discovery -------------------------------------------------------------------------

    def _image_io(self) -> tuple[str, str, Any, int]:
        if self._image is None:
            raise ModelUnavailable("this CLIP embedder has no image model (image_model_path)")
        with self._lock:
            if "image" not in self._io:
                session = self._image.get()
                inp = _pick(session.get_inputs(), self._names["image_input"], self._image.path)
                out = _pick(session.get_outputs(), self._names["image_output"], self._image.path)
                dtype = _ONNX_FLOAT_TYPES.get(inp.type)
                if dtype is None:
                    raise ModelUnavailable(
                        f"CLIP image model {self._image.path}: input {inp.name!r} has type "
                        f"{inp.type}, expected a float tensor [N,3,H,W]"
                    )
                size = self._image_size or _static_square(inp.shape) or 224
                self._io["image"] = (inp.name, out.name, dtype, size)
            return self._io["image"]

    def _text_io(self) -> tuple[str, str, Any, str | None]:
        if self._text is None:
            raise ModelUnavailable("this CLIP embedder has no text model (text_model_path)")
        with self._lock:
            if "text" not in self._io:
                session = self._text.get()
                inputs = session.get_inputs()
                inp = _pick(inputs, self._names["text_input"], self._text.path)
                out = _pick(session.get_outputs(), self._names["text_output"], self._text.path)
                dtype = _ONNX_INT_TYPES.get(inp.type)
                if dtype is None:
                    raise ModelUnavailable(
                        f"CLIP text model {self._text.path}: input {inp.name!r} has type "
                        f"{inp.type}, expected int64 or int32 token ids [N,L]"
                    )
                mask = next(
                    (i.name for i in inputs if i.name != inp.name and "mask" in i.name.lower()),
                    None,
                )
                self._tokenizer = self._load_tokenizer()
                self._io["text"] = (inp.name, out.name, dtype, mask)
            return self._io["text"]

    def _load_tokenizer(self) -> Tokenizer:
        from tokenizers import Tokenizer

        assert self.tokenizer_path is not None
        try:
            tok = Tokenizer.from_file(str(self.tokenizer_path))
        except Exception as exc:
            raise ModelUnavailable(f"cannot load tokenizer {self.tokenizer_path}: {exc}") from exc
        pad_id = self.pad_id
        if pad_id is None:
            # Keep the tokenizer's own pad id (CLIP exports differ: 0 or <|endoftext|>).
            pad_id = int((tok.padding or {}).get("pad_id", 0))
        tok.enable_truncation(max_length=self.context_length)
        tok.enable_padding(pad_id=pad_id, length=self.context_length)
        return tok

    @property
    def dim(self) -> int:
        """Embedding width: given in config, else read from a model (loads it on first use)."""
        if self._dim is None:
            if self._image is not None:
                probe = np.zeros((8, 8, 3), dtype=np.uint8)
                self._dim = int(self.embed_images([probe]).shape[1])
            else:
                self._dim = int(self.embed_texts([""]).shape[1])
        return self._dim

    def load(self) -> None:
        """Load both towers now, so a lifecycle `configure` fails early and clearly."""
        if self._image is not None:
            self._image_io()
        if self._text is not None:
            self._text_io()

    # -- embedding -------------------------------------------------------------------------

    def preprocess(self, image_bgr: np.ndarray, size: int) -> np.ndarray:
        """BGR -> RGB, shorter side to `size`, centre crop, normalise; returns 3xSxS float32."""
        import cv2

        img = as_bgr_uint8(image_bgr)
        h, w = img.shape[:2]
        scale = size / min(h, w)
        nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
        interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
        img = cv2.resize(img, (nw, nh), interpolation=interp)
        top, left = (nh - size) // 2, (nw - size) // 2
        img = img[top : top + size, left : left + size, ::-1]
        x = (img.astype(np.float32) / 255.0 - self.mean) / self.std
        return np.ascontiguousarray(x.transpose(2, 0, 1))

    def embed_images(self, images_bgr: Sequence[np.ndarray]) -> np.ndarray:
        in_name, out_name, dtype, size = self._image_io()
        assert self._image is not None
        if len(images_bgr) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = []
        for start in range(0, len(images_bgr), self.batch_size):
            chunk = images_bgr[start : start + self.batch_size]
            batch = np.stack([self.preprocess(im, size) for im in chunk]).astype(dtype)
            (out,) = self._image.run([out_name], {in_name: batch})
            rows.append(_as_rows(out, len(chunk), self._image.path, out_name))
        return self._check_dim(l2_normalize(np.concatenate(rows)))

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed_texts takes a sequence of strings, not one string")
        in_name, out_name, dtype, mask_name = self._text_io()
        assert self._text is not None and self._tokenizer is not None
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            if not all(isinstance(t, str) for t in chunk):
                raise TypeError("embed_texts takes strings only")
            enc = self._tokenizer.encode_batch(chunk)
            feeds = {in_name: np.array([e.ids for e in enc], dtype=dtype)}
            if mask_name is not None:
                feeds[mask_name] = np.array([e.attention_mask for e in enc], dtype=dtype)
            (out,) = self._text.run([out_name], feeds)
            rows.append(_as_rows(out, len(chunk), self._text.path, out_name))
        return self._check_dim(l2_normalize(np.concatenate(rows)))

    def _check_dim(self, rows: np.ndarray) -> np.ndarray:
        if self._dim is None:
            self._dim = int(rows.shape[1])
        elif rows.shape[1] != self._dim:
            raise ModelUnavailable(
                f"CLIP model {self.model_id} produced {rows.shape[1]}-d vectors, "
                f"expected {self._dim} (image and text towers must share one space)"
            )
        return rows


def _pick(nodes: Sequence[Any], name: str | None, path: Path) -> Any:
    if name is None:
        return nodes[0]
    for node in nodes:
        if node.name == name:
            return node
    known = ", ".join(n.name for n in nodes)
    raise ModelUnavailable(f"{path}: no input/output named {name!r} (has: {known})")


def _static_square(shape: Sequence[Any]) -> int | None:
    if len(shape) == 4 and isinstance(shape[2], int) and shape[2] == shape[3] and shape[2] > 0:
        return int(shape[2])
    return None


def _as_rows(out: Any, n: int, path: Path, name: str) -> np.ndarray:
    arr = np.asarray(out, dtype=np.float32)
    if arr.ndim == 2 and arr.shape[0] == n:
        return arr
    raise ModelUnavailable(
        f"{path}: output {name!r} has shape {arr.shape}, expected ({n}, dim); "
        "name the pooled embedding output (image_output / text_output)"
    )
