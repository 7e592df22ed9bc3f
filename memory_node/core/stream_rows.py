"""How a stream kind's payload becomes stored rows: its blobs, its embeddings, its batching.

Each `core.streams.StreamKind` names one `RowIngest` here, so ingestion has one path for every
stream (`core.ingest.Ingestor.add`) and a new kind picks how it is stored instead of adding an
`add_<kind>` method to the ingestor and the engine:
- `TEXT_ROWS` (the default): a `SensorRow` of tags and a text, the text embedded with the text
  model when not empty (odometry, every registered kind);
- `FRAME_ROWS`: `CameraFrame`s, described and JPEG-encoded (ahead of storing, on any thread:
  `prepare`), the JPEG a blob, embedded as images (or by their description), in batches: one
  embed call and one transaction per batch;
- `SCAN_ROWS`: `LidarScan`s, the points an `.npy` blob, range tags, no embedding.

A strategy stores through a `RowSink` (the ingestor): blobs, the store, the models. It never
sees the engine, and this module imports no store, model or middleware.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from memory_node.core.types import Observation, Pose, View


@dataclass
class SensorRow:
    """One row of a text-stored stream: what its decoder said (tags, a text) at a time and
    pose."""

    t: float
    pose: Pose | None
    tags: dict[str, Any] = field(default_factory=dict)
    text: str = ""


@dataclass
class CameraFrame:
    """A camera image to keep: BGR uint8, its stamp, the pose it was taken at, and what the
    camera covered (`view`, for seen_near searches; None when unknown)."""

    t: float
    pose: Pose | None
    image_bgr: np.ndarray
    tags: dict[str, Any] = field(default_factory=dict)
    view: View | None = None
    # Filled by `FRAME_ROWS.prepare` (on any thread, ahead of storing); else when stored.
    description: Any = None  # core.embedders.base.ImageDescription
    jpeg: bytes | None = None


@dataclass
class LidarScan:
    """A point cloud to keep: (n, 3) points, in the frame its `tags["frame"]` names when
    known. A tag given as None is unknown and left out of the row (see `ScanRows`)."""

    t: float
    pose: Pose | None
    points: Any  # array-like of (x, y, z)
    tags: dict[str, Any] = field(default_factory=dict)


class RowSink(Protocol):
    """What a strategy stores through (core.ingest.Ingestor)."""

    def write_blob(self, stream: str, t: float, data: bytes, ext: str) -> str: ...

    def remove_blobs(self, refs: Sequence[str | None]) -> None: ...

    def insert(self, rows: list[Observation], vectors: list[Any]) -> list[int]: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def text_model(self) -> str: ...

    def image_model(self) -> Any: ...

    def frame_describer(self, stream: str) -> tuple[Any, Any]: ...

    def sync(self) -> int: ...


class RowIngest:
    """A way of storing payloads. `batched`: the recorder hands a batch of kept messages in
    one call (one transaction) rather than one call each; `prepares`: `prepare` does work worth
    doing ahead of storing, on another thread."""

    batched = False
    prepares = False

    def prepare(self, sink: RowSink, stream: str, payload: Any) -> None:
        """Work on one payload that touches no store (any thread, several at once)."""

    def store(self, sink: RowSink, stream: str, payloads: Sequence[Any]) -> list[int]:
        raise NotImplementedError


class TextRows(RowIngest):
    """`SensorRow`s: one transaction for the batch; non-empty texts embedded in one call."""

    def store(self, sink: RowSink, stream: str, payloads: Sequence[Any]) -> list[int]:
        rows: Sequence[SensorRow] = payloads
        texts = [r.text for r in rows if r.text]
        vecs = iter(sink.embed(texts)) if texts else iter(())
        model_id = sink.text_model() if texts else None
        obs = [Observation(stream=stream, t=r.t, pose=r.pose, tags=dict(r.tags), text=r.text,
                           model_id=model_id if r.text else None) for r in rows]
        ids = sink.insert(obs, [next(vecs) if r.text else None for r in rows])
        if texts:
            sink.sync()
        return ids


class ScanRows(RowIngest):
    """`LidarScan`s: each an `.npy` blob with its point count and ranges from the cloud's
    origin (a tag the scan gives replaces them; None leaves it out: ranges of a world-frame
    cloud whose robot position is not known are not stored from the wrong origin)."""

    def store(self, sink: RowSink, stream: str, payloads: Sequence[Any]) -> list[int]:
        return [self._store_one(sink, stream, scan) for scan in payloads]

    @staticmethod
    def _store_one(sink: RowSink, stream: str, scan: LidarScan) -> int:
        pts = np.asarray(scan.points, np.float32).reshape(-1, 3)
        buf = io.BytesIO()
        np.save(buf, pts)
        ranges = np.linalg.norm(pts[:, :2], axis=1) if len(pts) else np.zeros(1)
        info = {"points": int(len(pts)), "max_range": round(float(ranges.max()), 3),
                "mean_range": round(float(ranges.mean()), 3), **scan.tags}
        info = {k: v for k, v in info.items() if v is not None}
        ref = sink.write_blob(stream, scan.t, buf.getvalue(), "npy")
        try:
            [oid] = sink.insert([Observation(stream=stream, t=scan.t, pose=scan.pose, tags=info,
                                             ref=ref)], [None])
        except BaseException:
            sink.remove_blobs([ref])
            raise
        return oid


class FrameRows(RowIngest):
    """`CameraFrame`s, a batch at a time (see the module docstring). With a captioner on the
    stream, rows it admits are stored marked `caption: pending` and it is woken after the
    batch is stored: the model's caption replaces the heuristic text later."""

    batched = True
    prepares = True
    jpeg_quality = 80

    def prepare(self, sink: RowSink, stream: str, payload: Any) -> None:
        import cv2

        frame: CameraFrame = payload
        if frame.description is None:
            frame.description = sink.frame_describer(stream)[0].describe(frame.image_bgr)
        if frame.jpeg is None:
            ok, buf = cv2.imencode(".jpg", frame.image_bgr,
                                   [cv2.IMWRITE_JPEG_QUALITY, self.jpeg_quality])
            if not ok:
                raise ValueError("JPEG encoding of a camera frame failed")
            frame.jpeg = buf.tobytes()

    def store(self, sink: RowSink, stream: str, payloads: Sequence[Any]) -> list[int]:
        frames: Sequence[CameraFrame] = payloads
        if not frames:
            return []
        captioner = sink.frame_describer(stream)[1]
        for f in frames:
            self.prepare(sink, stream, f)
        refs: list[str | None] = []
        try:
            for f in frames:
                assert f.jpeg is not None  # prepared above
                refs.append(sink.write_blob(stream, f.t, f.jpeg, "jpg"))
            ids, admitted = self._insert(sink, stream, frames, refs, captioner)
        except BaseException:
            sink.remove_blobs(refs)  # nothing of the batch stored: its JPEGs go too
            raise
        sink.sync()
        if admitted and captioner is not None:
            captioner.notify()
        return ids

    @staticmethod
    def _insert(sink: RowSink, stream: str, frames: Sequence[CameraFrame],
                refs: list[str | None], captioner: Any) -> tuple[list[int], int]:
        image_embedder = sink.image_model()
        if image_embedder is not None:
            vecs = np.asarray(image_embedder.embed_images([f.image_bgr for f in frames]),
                              np.float32)
            model_id = image_embedder.model_id
        else:
            vecs = sink.embed([f.description.text for f in frames])
            model_id = sink.text_model()
        rows, admitted = [], 0
        for f, ref in zip(frames, refs, strict=True):
            tags = {**f.description.tags, **f.tags}
            if captioner is not None and captioner.admit(f.t, f.pose, tags):
                tags["caption"] = "pending"  # persisted with the row: the captioner's queue
                admitted += 1
            rows.append(Observation(stream=stream, t=f.t, pose=f.pose, tags=tags,
                                    text=f.description.text, ref=ref, model_id=model_id,
                                    view=f.view))
        return sink.insert(rows, list(vecs)), admitted


TEXT_ROWS = TextRows()
SCAN_ROWS = ScanRows()
FRAME_ROWS = FrameRows()
