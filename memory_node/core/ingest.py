"""Ingestion: what the recorder hands the memory (camera frames, lidar scans, odometry and
other observations) described, encoded, written as blobs, embedded and stored.

`Ingestor` receives the store, the memory directory, the models (as calls: the engine loads
them lazily) and the index catch-up call; it never sees the engine.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.embedders.base import ImageDescription
from memory_node.core.store.base import ObservationStore
from memory_node.core.types import Observation, Pose, View


@dataclass
class CameraFrame:
    """A camera image to keep: BGR uint8, its stamp, the pose it was taken at, and what the
    camera covered (`view`, for seen_near searches; None when unknown)."""

    t: float
    pose: Pose | None
    image_bgr: np.ndarray
    tags: dict[str, Any] = field(default_factory=dict)
    view: View | None = None
    # Filled by `Ingestor.prepare_frame` (on any thread, ahead of storing); else when stored.
    description: ImageDescription | None = None
    jpeg: bytes | None = None


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

    def _frame_describer(self, stream: str) -> tuple[Any, Any]:
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

    def prepare_frame(self, frame: CameraFrame, stream: str = "camera",
                      jpeg_quality: int = 80) -> tuple[ImageDescription, bytes]:
        """Describe and JPEG-encode a frame (the CPU-heavy part of storing it; kept on the
        frame), touching no store: an importer runs this on several threads ahead of
        `add_camera_frames`."""
        import cv2

        if frame.description is None:
            frame.description = self._frame_describer(stream)[0].describe(frame.image_bgr)
        if frame.jpeg is None:
            ok, buf = cv2.imencode(".jpg", frame.image_bgr,
                                   [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
            if not ok:
                raise ValueError("JPEG encoding of a camera frame failed")
            frame.jpeg = buf.tobytes()
        return frame.description, frame.jpeg

    def add_camera_frames(self, frames: Sequence[CameraFrame], stream: str = "camera",
                          jpeg_quality: int = 80) -> list[int]:
        """Describe, encode and embed a batch of frames; one transaction for the batch."""
        if not frames:
            return []
        captioner = self._frame_describer(stream)[1]
        prepared = [self.prepare_frame(f, stream, jpeg_quality) for f in frames]
        descs = [d for d, _ in prepared]
        refs: list[str | None] = []
        try:
            for f, (_, jpg) in zip(frames, prepared, strict=True):
                refs.append(self.write_blob(stream, f.t, jpg, "jpg"))
            ids, admitted = self._insert_frames(frames, descs, refs, stream, captioner)
        except BaseException:
            self.remove_blobs(refs)  # nothing of the batch stored: its JPEGs go too
            raise
        self.sync()
        if admitted and captioner is not None:
            captioner.notify()
        return ids

    def _insert_frames(self, frames: Sequence[CameraFrame], descs: list[ImageDescription],
                       refs: list[str | None], stream: str, captioner: Any
                       ) -> tuple[list[int], int]:
        rows = []
        image_embedder = self.image_embedder()
        if image_embedder is not None:
            vecs = np.asarray(image_embedder.embed_images([f.image_bgr for f in frames]),
                              np.float32)
            model_id = image_embedder.model_id
        else:
            vecs = self.embed_texts([d.text for d in descs])
            model_id = self.text_model_id()
        admitted = 0
        for f, d, ref in zip(frames, descs, refs, strict=True):
            tags = {**d.tags, **f.tags}
            if captioner is not None and captioner.admit(f.t, f.pose, tags):
                tags["caption"] = "pending"  # persisted with the row: the captioner's queue
                admitted += 1
            rows.append(Observation(stream=stream, t=f.t, pose=f.pose, tags=tags, text=d.text,
                                    ref=ref, model_id=model_id, view=f.view))
        return self.store.insert(rows, list(vecs)), admitted

    def add_lidar_scan(self, t: float, pose: Pose | None, points: np.ndarray,
                       stream: str = "lidar", tags: dict[str, Any] | None = None) -> int:
        pts = np.asarray(points, np.float32).reshape(-1, 3)
        buf = io.BytesIO()
        np.save(buf, pts)
        ranges = np.linalg.norm(pts[:, :2], axis=1) if len(pts) else np.zeros(1)
        info = {"points": int(len(pts)), "max_range": round(float(ranges.max()), 3),
                "mean_range": round(float(ranges.mean()), 3), **(tags or {})}
        # A tag given as None is unknown (ranges of a world-frame cloud whose robot position
        # is not known): left out, not stored from the wrong origin.
        info = {k: v for k, v in info.items() if v is not None}
        return self.add_observation(stream, t, pose, info, "", buf.getvalue(), "npy")
