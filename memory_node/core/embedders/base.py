"""Interfaces every embedder and describer meets, plus the helpers they share.

Kept free of onnxruntime and cv2 imports so that importing the package costs nothing; the heavy
parts load on first use inside each implementation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from memory_node.core.errors import Unavailable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import onnxruntime

ONNX_THREADS_ENV = "MEMSEARCH_ONNX_THREADS"


class ModelUnavailable(Unavailable, RuntimeError):
    """A model or tokenizer file is missing or cannot be loaded.

    It is an `Unavailable` so the engine reports it with code `unavailable`, and a
    `RuntimeError` for callers that do not know the project's error types.
    """


@runtime_checkable
class TextEmbedder(Protocol):
    """Maps texts to L2-normalised float32 rows; `model_id` is stored with each vector."""

    model_id: str
    dim: int

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class ImageEmbedder(Protocol):
    """Maps uint8 BGR images (HxWx3) to L2-normalised float32 rows."""

    model_id: str
    dim: int

    def embed_images(self, images_bgr: Sequence[np.ndarray]) -> np.ndarray: ...


@dataclass
class ImageDescription:
    """Tags and a short text for one image; the text is what the text model embeds."""

    tags: dict[str, Any] = field(default_factory=dict)
    text: str = ""


@runtime_checkable
class ImageDescriber(Protocol):
    def describe(self, image_bgr: np.ndarray) -> ImageDescription: ...


def resolve_onnx_threads(
    value: int | str | None = None, env: Mapping[str, str] | None = None
) -> int:
    """Intra-op threads for an ONNX session: the option, else $MEMSEARCH_ONNX_THREADS, else 1.

    One thread is the default because the recorder and the server share a small CPU with the
    robot's own stack; a single query is not faster with more threads at these model sizes.
    """
    source = "onnx_threads"
    if value is None:
        env = os.environ if env is None else env
        value = env.get(ONNX_THREADS_ENV) or None
        source = ONNX_THREADS_ENV
    if value is None:
        return 1
    try:
        threads = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a positive integer, got {value!r}") from None
    if threads < 1:
        raise ValueError(f"{source} must be a positive integer, got {value!r}")
    return threads


def require_file(path: str | os.PathLike[str], what: str) -> Path:
    """Return `path` as a Path, or raise ModelUnavailable naming it when it is not a file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelUnavailable(f"{what} not found: {p}")
    return p


def make_onnx_session(
    path: Path, threads: int, providers: Sequence[str] | None = None
) -> onnxruntime.InferenceSession:
    """Create an onnxruntime session with bounded threads; errors name the file."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a hard dependency
        raise ModelUnavailable(f"onnxruntime is not installed (needed for {path})") from exc
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: optimiser notices are not the operator's concern
    try:
        return ort.InferenceSession(
            str(path), sess_options=opts, providers=list(providers or ["CPUExecutionProvider"])
        )
    except Exception as exc:  # onnxruntime raises several private exception types
        raise ModelUnavailable(f"cannot load ONNX model {path}: {exc}") from exc


def l2_normalize(rows: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation to float32; an all-zero row stays zero instead of NaN."""
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class LazySession:
    """An ONNX session created on first use, shared by threads, with runs serialised.

    Serialising keeps CPU use bounded to the configured threads however many callers there are.
    """

    def __init__(self, path: Path, threads: int, providers: Sequence[str] | None = None) -> None:
        self.path = path
        self.threads = threads
        self.providers = list(providers) if providers else None
        self._session: onnxruntime.InferenceSession | None = None
        self._lock = threading.Lock()

    def get(self) -> onnxruntime.InferenceSession:
        with self._lock:
            if self._session is None:
                self._session = make_onnx_session(self.path, self.threads, self.providers)
            return self._session

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def run(self, outputs: list[str] | None, feeds: dict[str, np.ndarray]) -> list[Any]:
        session = self.get()
        with self._lock:
            return session.run(outputs, feeds)
