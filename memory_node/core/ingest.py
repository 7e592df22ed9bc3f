"""Ingestion: what the recorder hands the memory (camera frames, lidar scans, odometry and
other observations) described, encoded, written as blobs, embedded and stored.

One path for every sensor stream: `Ingestor.add(stream, payloads)` stores them the way the
stream's kind says (`StreamKind.rows`, core/stream_rows.py), so a new kind adds no method here.
`add_observation` stores one row of any stream (notes, events) with an optional blob.

`Ingestor` receives the store, the memory directory, the models (as calls: the engine loads
them lazily) and the index catch-up call; it never sees the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.store.base import ObservationStore
from memory_node.core.stream_rows import CameraFrame, LidarScan, SensorRow
from memory_node.core.streams import stream_kind
from memory_node.core.types import Observation, Pose

__all__ = ["CameraFrame", "Ingestor", "LidarScan", "SensorRow"]


class Ingestor:
    def __init__(self, store: ObservationStore, root: Path, *,
                 embed_texts: Callable[[Sequence[str]], np.ndarray],
                 text_model_id: Callable[[], str],
                 image_embedder: Callable[[], Any],
                 describer: Callable[[], Any],
                 sync: Callable[[], int],
                 captioner: Callable[[], Any] | None = None):
        self.store = store
        self.root = Path(root)
        self.embed_texts = embed_texts
        self.text_model_id = text_model_id
        self.image_embedder = image_embedder
        self.describer = describer
        self.sync = sync
        self.captioner = captioner
        self._blob_seq = 0

    def _blob_ref(self, stream: str, t: float, ext: str) -> str:
        self._blob_seq += 1
        return f"blobs/{stream}/{int(t * 1000)}_{self._blob_seq:04d}.{ext}"

    def write_blob(self, stream: str, t: float, data: bytes, ext: str) -> str:
        ref = self._blob_ref(stream, t, ext)
        path = self.root / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            tmp.write_bytes(data)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk leaves no partial file behind
            raise
        return ref

    def remove_blobs(self, refs: Sequence[str | None]) -> None:
        """Blobs written for rows that were then not stored (a full disk): their space back."""
        for ref in refs:
            if ref:
                try:
                    (self.root / ref).unlink(missing_ok=True)
                except OSError:
                    pass

    def add_observation(self, stream: str, t: float, pose: Pose | None,
                        tags: dict[str, Any] | None = None, text: str = "",
                        blob: bytes | None = None, blob_ext: str = "bin",
                        embed: bool = True) -> int:
        """Store one observation; its text (if any) is embedded with the text model."""
        ref = self.write_blob(stream, t, blob, blob_ext) if blob is not None else None
        vec = self.embed_texts([text])[0] if (text and embed) else None
        obs = Observation(stream=stream, t=t, pose=pose, tags=dict(tags or {}), text=text,
                          ref=ref, model_id=self.text_model_id() if vec is not None else None)
        try:
            [oid] = self.store.insert([obs], [vec])
        except BaseException:
            self.remove_blobs([ref])
            raise
        if vec is not None:
            self.sync()
        return oid

    # ---- what a stream kind's strategy stores through (core.stream_rows.RowSink) ----------
    def insert(self, rows: list[Observation], vectors: list[Any]) -> list[int]:
        return self.store.insert(rows, vectors)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_texts(texts)

    def text_model(self) -> str:
        return self.text_model_id()

    def image_model(self) -> Any:
        return self.image_embedder()

    def frame_describer(self, stream: str) -> tuple[Any, Any]:
        """The describer a frame of `stream` is described with now, and the captioner that
        replaces its text later (None when no captioner works on the stream)."""
        describer = self.describer()
        captioner = self.captioner() if self.captioner is not None else None
        if captioner is not None and captioner.stream != stream:
            captioner = None
        if captioner is not None:
            # The model's caption comes later, from the background captioner: the row is
            # stored now with the heuristic text, never waiting for the network.
            describer = describer.heuristic
        return describer, captioner

    # ---- the one ingestion path ---------------------------------------------------------------
    def prepare(self, stream: str, payload: Any) -> None:
        """The CPU-heavy part of storing one payload of `stream` (a camera frame's description
        and JPEG), touching no store: an importer runs it on several threads ahead of `add`."""
        stream_kind(stream).rows.prepare(self, stream, payload)

    def add(self, stream: str, payloads: Sequence[Any]) -> list[int]:
        """Store payloads of a registered stream the way its kind says (core/streams.py):
        `SensorRow`s, `CameraFrame`s or `LidarScan`s for the built-in ways. Returns the ids."""
        return stream_kind(stream).rows.store(self, stream, payloads)
