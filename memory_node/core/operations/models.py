"""The engine's models: embedders loaded at open, the describer and captioner built on first
use, and query vectors cached per model (agents repeat their questions)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memory_node.core.config import MemoryConfig
from memory_node.core.store.sqlite_store import SqliteObservationStore

log = logging.getLogger(__name__)

QUERY_CACHE_SIZE = 512  # query embeddings kept, least recently used dropped first


class Models:
    """The text and image embedders, the describer and the captioner of one engine.

    `store` and `sync` are the engine's (read when the captioner starts, after open);
    `embed_texts` is the engine's own method, so a wrapper set on the engine (a benchmark's
    prototype) applies to the captioner too."""

    def __init__(self, config: Callable[[], MemoryConfig], *, text_embedder: Any = None,
                 image_embedder: Any = None, describer: Any = None,
                 captioner_options: dict[str, Any] | None = None,
                 store: Callable[[], SqliteObservationStore],
                 embed_texts: Callable[[Sequence[str]], np.ndarray],
                 sync: Callable[[], int]):
        self._config = config
        self.text_embedder = text_embedder
        self.image_embedder = image_embedder
        self.described = describer  # None until first use (unless given)
        self.captioner_job: Any = None
        self._captioner_options = dict(captioner_options or {})  # a clock, a policy (tests)
        self._store = store
        self._embed_texts = embed_texts
        self._sync = sync
        self.qcache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.qcache_lock = threading.Lock()
        self._captioner_lock = threading.Lock()
        self._lazy_lock = threading.RLock()  # the describer, built on first use

    def load(self) -> None:
        """The configured embedders, loaded now: a broken model must fail configure, not the
        first query (the local and the fleet engine alike)."""
        cfg = self._config()
        if self.text_embedder is None:
            from memory_node.core.embedders import get_text_embedder

            self.text_embedder = get_text_embedder(cfg.text_embedder,
                                                   onnx_threads=cfg.onnx_threads)
        self.text_embedder.embed_texts(["warm-up"])
        if cfg.image_embedder == "clip" and self.image_embedder is None:
            from memory_node.core.embedders import get_image_embedder

            if cfg.clip_image_model or cfg.clip_text_model:
                options: dict[str, Any] = {
                    "image_model_path": cfg.clip_image_model or None,
                    "text_model_path": cfg.clip_text_model or None,
                    "tokenizer_path": cfg.clip_tokenizer or None}
            else:  # no paths: the model `memory-models fetch clip` put in the models dir
                from memory_node.core.model_store import clip_options

                options = clip_options()
            self.image_embedder = get_image_embedder(
                "clip", onnx_threads=cfg.onnx_threads, **options)
            self.image_embedder.load()

    @property
    def text_model_id(self) -> str:
        return self.text_embedder.model_id

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.text_embedder.embed_texts(list(texts)), np.float32)

    @property
    def describer(self) -> Any:
        if self.described is None:
            from memory_node.core.embedders import get_describer

            with self._lazy_lock:  # importers describe on several threads
                if self.described is None:
                    self.described = get_describer(self._config().describer)
        return self.described

    def captions(self) -> bool:
        """Whether camera rows are captioned (the describer is a vision-language model)."""
        return self._config().describer == "vlm" or hasattr(self.described, "caption")

    def captioner(self) -> Any:
        """The background captioner when the describer is a vision-language model (built on
        first use; None otherwise)."""
        if self.captioner_job is not None:
            return self.captioner_job
        if not self.captions():
            return None
        with self._captioner_lock:
            if self.captioner_job is None:
                from memory_node.core.captioner import Captioner

                describer = self.describer
                self.captioner_job = Captioner(
                    self._store(), self._config().root, caption=describer.caption,
                    embed_texts=self._embed_texts, text_model_id=lambda: self.text_model_id,
                    sync=self._sync, max_per_min=self._config().caption_max_per_min,
                    **self._captioner_options)
                self.captioner_job.prime()
            return self.captioner_job

    def resume_captions(self) -> None:
        """Rows left pending by an earlier process are captioned by this one (when it holds
        the store's caption lock and the endpoint is configured)."""
        if not self.captions():
            return
        if not self._store().tagged("camera", "caption", "pending", 0, limit=1):
            return
        try:
            captioner = self.captioner()
        except Exception as exc:  # noqa: BLE001 - e.g. no key in this process
            log.warning("camera rows wait for captions but no captioner can start here: %s",
                        exc)
            return
        if captioner is not None:
            captioner.start()

    def stop_captioner(self) -> None:
        if self.captioner_job is not None:
            self.captioner_job.stop()
            self.captioner_job = None

    def camera_model_id(self) -> str:
        """The model camera rows are embedded with now: CLIP's, else the text model's."""
        if self.image_embedder is not None:
            return self.image_embedder.model_id
        return self.text_model_id

    def query_vector(self, model_id: str, text: str) -> np.ndarray | None:
        """The query embedding for one model, cached (agents repeat their questions)."""
        key = (model_id, text)
        with self.qcache_lock:
            vec = self.qcache.get(key)
            if vec is not None:
                self.qcache.move_to_end(key)
                return vec
        if model_id == self.text_model_id:
            vec = self._embed_texts([text])[0]
        elif self.image_embedder is not None and model_id == self.image_embedder.model_id:
            vec = np.asarray(self.image_embedder.embed_texts([text]), np.float32)[0]
        else:
            return None  # vectors of a model that is not loaded now cannot be queried
        self.remember_query(model_id, text, vec)
        return vec

    def remember_query(self, model_id: str, text: str, vec: np.ndarray) -> None:
        """A query vector known already (a saved note's: an agent searching for what it
        wrote needs no second embedding)."""
        with self.qcache_lock:
            self.qcache[(model_id, text)] = vec
            if len(self.qcache) > QUERY_CACHE_SIZE:
                self.qcache.popitem(last=False)
