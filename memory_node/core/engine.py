"""`MemoryEngine`: the one object that owns a memory directory and answers the JSON contract.

The ROS query server and the in-process agent client both wrap it, so DESIGN.md's JSON is
implemented here once. Sensor ingestion (the recorder) goes through the typed methods
`add_camera_frames`, `add_lidar_scan` and `add_observation`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_node.core.config import NOTE_STREAMS, MemoryConfig
from memory_node.core.errors import BadRequest, InternalError, MemoryError_, Unavailable
from memory_node.core.index_manager import IndexManager
from memory_node.core.notes import NoteEntry, NotesLog, new_key
from memory_node.core.query import SaveRequest, SearchRequest, parse_save, parse_search
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import NO_POSE_DICT, Observation, Pose
from memory_node.core.vectors import top_k

log = logging.getLogger("memory_node.engine")


def _one_blas_thread() -> None:
    """Exact scoring is one matrix-vector product per query: split over threads it mostly
    waits for the other core (24 ms vs 0.08 ms measured on a busy 2-core machine)."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")
    except ImportError:  # optional: only speed depends on it
        log.debug("threadpoolctl not installed: BLAS keeps its default thread count")


_one_blas_thread()

Clock = Callable[[], float]
PoseProvider = Callable[[], "Pose | None"]


@dataclass
class CameraFrame:
    """A camera image to keep: BGR uint8, its stamp and the pose it was taken at."""

    t: float
    pose: Pose | None
    image_bgr: np.ndarray
    tags: dict[str, Any] = field(default_factory=dict)


class _StreamNames:
    """The stream names a search may use; a miss refreshes the engine's cache once (another
    process may have written a new stream), so validation stays off the database."""

    def __init__(self, engine: MemoryEngine):
        self.engine = engine

    def __contains__(self, name: object) -> bool:
        if name in self.engine.known_streams():
            return True
        self.engine._streams_cache = None  # noqa: SLF001
        return name in self.engine.known_streams()

    def __iter__(self):
        return iter(self.engine.known_streams())


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


class MemoryEngine:
    """Store + embedders + indexes + notes behind search/save/compact/streams.

    `clock` gives "now" for "seconds ago" filters and note stamps (the ROS node clock, so
    simulated time works); `pose_provider` gives the robot's current pose for `save` and
    `near_here` (TF in the ROS server), or None when unknown.
    """

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        clock: Clock | None = None,
        pose_provider: PoseProvider | None = None,
        text_embedder: Any = None,
        image_embedder: Any = None,
        describer: Any = None,
        llm_settings: Any = "env",
        open_now: bool = True,
    ):
        self.config = config or MemoryConfig.from_mapping({})
        self.clock: Clock = clock or time.time
        self.pose_provider: PoseProvider = pose_provider or (lambda: None)
        self._text_embedder = text_embedder
        self._image_embedder = image_embedder
        self._describer = describer
        self._llm_settings = llm_settings
        self._qcache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._qcache_lock = threading.Lock()
        self._compact_lock = threading.Lock()
        self._blob_seq = 0
        self._streams_cache: set[str] | None = None
        self.store: SqliteObservationStore | None = None
        self.indexes: IndexManager | None = None
        self.notes: NotesLog | None = None
        if open_now:
            self.open()

    # ---- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Create the directory, open the store, load models and build or load the indexes.

        Raises on failure (a missing model, an unwritable directory) so a lifecycle
        `configure` can refuse to activate with the reason.
        """
        cfg = self.config
        t0 = time.perf_counter()
        for d in (cfg.root, cfg.notes_dir, cfg.index_dir, cfg.blobs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.store = SqliteObservationStore(cfg.db_path)
        self.notes = NotesLog(cfg.notes_dir)
        if self._text_embedder is None:
            from memory_node.core.embedders import get_text_embedder

            self._text_embedder = get_text_embedder(cfg.text_embedder,
                                                    onnx_threads=cfg.onnx_threads)
        # Load the text model now: a broken model must fail configure, not the first query.
        self._text_embedder.embed_texts(["warm-up"])
        if cfg.image_embedder == "clip" and self._image_embedder is None:
            from memory_node.core.embedders import get_image_embedder

            self._image_embedder = get_image_embedder(
                "clip", image_model_path=cfg.clip_image_model,
                text_model_path=cfg.clip_text_model, tokenizer_path=cfg.clip_tokenizer,
                onnx_threads=cfg.onnx_threads)
        self.indexes = IndexManager(cfg, self.store)
        self.indexes.load_or_rebuild()
        picked = self._ingest_note_files()
        indexed = self._index_missing_vectors()
        log.info(
            "memory opened at %s: %d observations, %d vectors, %d notes picked up from "
            "Markdown, %d rows indexed late, in %.2f s", cfg.root, self.store.count(),
            self.indexes.total(), picked, indexed, time.perf_counter() - t0)

    def close(self) -> bool:
        """Write the index cache and close the store. Returns True when the cache was written;
        False when it was not (another process held it, or a write failed: logged), in which
        case the next start loads the previous cache and catches up from memory.db."""
        persisted = False
        if self.indexes is not None and self.store is not None:
            try:
                persisted = self.indexes.persist()
            except Exception as exc:  # noqa: BLE001 - the index is a cache; log and go on
                log.warning("index cache not written (%s: %s); the next start catches up "
                            "from memory.db", type(exc).__name__, exc)
        if self.indexes is not None:
            self.indexes.close()
        if self.store is not None:
            self.store.close()
        self.store = None
        return persisted

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- models -------------------------------------------------------------------------
    @property
    def text_model_id(self) -> str:
        return self._text_embedder.model_id

    @property
    def describer(self) -> Any:
        if self._describer is None:
            from memory_node.core.embedders import get_describer

            self._describer = get_describer(self.config.describer)
        return self._describer

    def _embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._text_embedder.embed_texts(list(texts)), np.float32)

    def query_vector(self, model_id: str, text: str) -> np.ndarray | None:
        """The query embedding for one model, cached (agents repeat their questions)."""
        key = (model_id, text)
        with self._qcache_lock:
            vec = self._qcache.get(key)
            if vec is not None:
                self._qcache.move_to_end(key)
                return vec
        if model_id == self.text_model_id:
            vec = self._embed_texts([text])[0]
        elif self._image_embedder is not None and model_id == self._image_embedder.model_id:
            vec = np.asarray(self._image_embedder.embed_texts([text]), np.float32)[0]
        else:
            return None  # vectors of a model that is not loaded now cannot be queried
        with self._qcache_lock:
            self._qcache[key] = vec
            if len(self._qcache) > 512:
                self._qcache.popitem(last=False)
        return vec

    # ---- JSON contract ------------------------------------------------------------------
    def _answer(self, fn: Callable[[], dict[str, Any]], what: str) -> str:
        t0 = time.perf_counter()
        try:
            if self.store is None:
                raise Unavailable("the memory store is closed")
            out = fn()
        except MemoryError_ as exc:
            if not isinstance(exc, BadRequest):
                log.warning("%s failed: %s", what, exc.message)
            return _dumps(exc.to_response())
        except Exception as exc:  # noqa: BLE001 - a request never takes the node down
            log.exception("%s failed unexpectedly", what)
            return _dumps(InternalError(f"{what} failed: {type(exc).__name__}").to_response())
        out["took_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return _dumps(out)

    def search(self, query: str) -> str:
        return self._answer(lambda: self.search_dict(query), "search")

    def save(self, note: str) -> str:
        return self._answer(lambda: self.save_dict(note), "save")

    def compact(self) -> str:
        return self._answer(self.compact_dict, "compact")

    def streams(self) -> str:
        return self._answer(self.streams_dict, "streams")

    # ---- search ---------------------------------------------------------------------------
    def known_streams(self) -> set[str]:
        """Configured streams and every stream with rows. Cached: a search only looks the
        database up again when it names a stream the cache does not know."""
        if self._streams_cache is None:
            self._streams_cache = set(self.config.streams) | self.store.stream_names()
        return self._streams_cache

    def parse_search(self, query: str) -> SearchRequest:
        cfg = self.config
        req = parse_search(query, now=self.clock(), known_streams=_StreamNames(self),
                           k_default=cfg.k_default, k_max=cfg.k_max,
                           max_bytes=cfg.max_query_bytes)
        if req.near_here:
            pose = self.pose_provider()
            if pose is None:
                raise Unavailable("near_here: the robot's current pose is unknown (no TF "
                                  "from the world frame to the base frame yet)")
            req.near = (pose.x, pose.y)
        return req

    def search_dict(self, query: str) -> dict[str, Any]:
        req = self.parse_search(query)
        pairs, notes = self.run_search(req)
        results = [obs.to_result(score) for obs, score in pairs]
        out: dict[str, Any] = {"ok": True, "results": results, "count": len(results)}
        if req.k_capped:
            notes.append(f"k capped at {self.config.k_max}")
        if notes:
            out["notes"] = notes
        return out

    def run_search(self, req: SearchRequest) -> tuple[list[tuple[Observation, float | None]],
                                                      list[str]]:
        """The planner: filters first, then ranking, exact for every filtered query."""
        self.sync()
        notes: list[str] = []
        if req.empty_window:
            return [], ["the time window is empty (its start is after its end)"]
        if not req.semantic_query:
            return [(o, None) for o in self.store.ordered(req, req.k)], notes

        keys = self.indexes.keys_for(req.streams)
        if not keys:
            notes.append("no embedded rows in the requested stream(s): semantic_query ignored,"
                         " newest first")
            req_time = SearchRequest(**{**req.__dict__, "order_by": "-time"})
            return [(o, None) for o in self.store.ordered(req_time, req.k)], notes
        qvecs = {m: self.query_vector(m, req.semantic_query) for m in {k[0] for k in keys}}

        if req.order_by != "score":
            return self._ordered_with_scores(req, qvecs), notes

        scored_ids: list[np.ndarray] = []
        scored_vals: list[np.ndarray] = []
        unscored: list[int] = []
        if req.has_filters and not req.tags:
            # Time and place filters run in memory, over each index's (t, x, y) columns:
            # the same comparisons as SQL, without a round trip.
            matched = 0
            for key in keys:
                qv = qvecs.get(key[0])
                if qv is None:
                    continue
                twin = self.indexes.get(key).exact_twin
                pos = twin.filter_positions(req.t_min, req.t_max, req.near, req.radius)
                matched += len(pos)
                if len(pos):
                    i, s = twin.search_positions(qv, req.k, pos)
                    scored_ids.append(i)
                    scored_vals.append(s)
            if matched < req.k:  # too few embedded matches: rows without vectors fill in
                have = set(np.concatenate(scored_ids).tolist()) if scored_ids else set()
                unscored = [i for i in self.store.candidates(req).ids.tolist()
                            if i not in have]
        elif req.has_filters:
            cand = self.store.candidates(req)
            groups: dict[tuple[str, str], list[int]] = {}
            for oid, stream, model_id in zip(cand.ids.tolist(), cand.streams, cand.model_ids):
                if model_id is not None and qvecs.get(model_id) is not None:
                    groups.setdefault((model_id, stream), []).append(oid)
                else:
                    unscored.append(oid)
            for key, ids in groups.items():
                idx = self.indexes.get(key)
                if idx is None:
                    unscored.extend(ids)
                    continue
                arr = np.asarray(ids, np.int64)
                i, s = idx.search(qvecs[key[0]], req.k, candidates=arr)
                scored_ids.append(i)
                scored_vals.append(s)
                if len(i) < min(req.k, len(arr)):  # rows whose vectors are not indexed yet
                    unscored.extend(np.setdiff1d(arr, self.indexes.ids_of(key)).tolist())
        else:
            for key in keys:
                qv = qvecs.get(key[0])
                if qv is None:
                    continue
                if self.indexes.building(key):
                    notes.append(f"exact search over {key[1]}: its graph index is being built"
                                 " in the background")
                i, s = self.indexes.get(key).search(qv, req.k)
                scored_ids.append(i)
                scored_vals.append(s)
        ids = np.concatenate(scored_ids) if scored_ids else np.empty(0, np.int64)
        vals = np.concatenate(scored_vals) if scored_vals else np.empty(0, np.float32)
        if req.min_score is not None:
            keep = vals >= req.min_score
            ids, vals = ids[keep], vals[keep]
        ids, vals = top_k(ids, vals, req.k)
        rows = self.store.get(ids.tolist())
        out: list[tuple[Observation, float | None]] = [
            (rows[i], float(s)) for i, s in zip(ids.tolist(), vals.tolist()) if i in rows
        ]
        missing = req.k - len(out)
        if missing > 0 and req.min_score is None:
            if not req.has_filters:
                fill = self.store.ordered(
                    SearchRequest(**{**req.__dict__, "order_by": "-time"}), req.k + len(out))
                have = {o.id for o, _ in out}
                fill = [o for o in fill if o.id not in have
                        and not self.indexes.contains(o.model_id, o.stream, o.id)]
            else:
                fill_rows = self.store.get(unscored)
                fill = sorted(fill_rows.values(), key=lambda o: (o.t, o.id), reverse=True)
            out.extend((o, None) for o in fill[:missing])
        return out, notes

    def _ordered_with_scores(self, req: SearchRequest, qvecs: dict[str, np.ndarray | None]
                             ) -> list[tuple[Observation, float | None]]:
        """Order by time or a tag, reporting (and with min_score, filtering by) similarity."""
        cand = self.store.candidates(req)
        rows = self.store.get(cand.ids.tolist())
        scored: list[tuple[Observation, float | None]] = []
        for obs in rows.values():
            score = None
            vec = self.indexes.vector(obs.model_id, obs.stream, obs.id)
            qv = qvecs.get(obs.model_id) if obs.model_id else None
            if vec is not None and qv is not None:
                score = float(vec @ qv)
            if req.min_score is not None and (score is None or score < req.min_score):
                continue
            scored.append((obs, score))
        key = req.order_by
        if key in ("time", "-time"):
            scored.sort(key=lambda p: (p[0].t, p[0].id), reverse=key == "-time")
        else:
            tag = key.lstrip("-")
            desc = key.startswith("-")

            def tag_key(p: tuple[Observation, float | None]) -> tuple:
                v = p[0].tags.get(tag)
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                return (0 if ok else 1, (-v if desc else v) if ok else 0, -p[0].t, -p[0].id)

            scored.sort(key=tag_key)
        return scored[: req.k]

    # ---- save -----------------------------------------------------------------------------
    def save_dict(self, note: str) -> dict[str, Any]:
        req = parse_save(note, max_bytes=self.config.max_note_bytes)
        return self.save_note(req)

    def save_note(self, req: SaveRequest, stream: str = "events",
                  t: float | None = None, pose: Pose | None | str = "current") -> dict[str, Any]:
        now = self.clock() if t is None else t
        if pose == "current":
            pose = self.pose_provider()
        vec: np.ndarray | None = None
        try:
            vec = self._embed_texts([req.text])[0]
        except Exception as exc:  # noqa: BLE001 - the note is kept; indexed at next start
            log.warning("embedding the note failed (%s); storing it unindexed", exc)
        if vec is not None:
            # A later search for the same words (an agent checking what it wrote) needs no
            # second embedding.
            with self._qcache_lock:
                self._qcache[(self.text_model_id, req.text)] = vec
        if vec is not None and stream == "events":
            folded = self._fold_note(req, vec, now, pose)
            if folded is not None:
                return folded
        entry = NoteEntry(key=new_key(), stream=stream, t=now, text=req.text, pose=pose,
                          tags=req.tags)
        try:
            self.notes.append(entry)  # durable first: the Markdown file is the record
        except OSError as exc:
            raise Unavailable(f"could not write the notes file: {exc.strerror}") from None
        obs = Observation(stream=stream, t=now, pose=pose, tags=dict(req.tags), text=req.text,
                          model_id=self.text_model_id if vec is not None else None,
                          note_key=entry.key)
        try:
            [oid] = self.store.insert([obs], [vec])
        except Exception:  # noqa: BLE001 - in Markdown already; the next start indexes it
            log.exception("note %s is in %s but could not be added to memory.db", entry.key,
                          entry.file)
            return {"ok": True, "id": None, "t": now,
                    "pose": pose.to_dict() if pose else dict(NO_POSE_DICT), "indexed": False}
        indexed = vec is not None
        if indexed:
            try:
                self.sync()
            except Exception:  # noqa: BLE001
                log.exception("note %d stored but the index could not be updated", oid)
                indexed = False
        return {"ok": True, "id": oid, "t": now,
                "pose": pose.to_dict() if pose else dict(NO_POSE_DICT), "indexed": indexed}

    def _fold_note(self, req: SaveRequest, vec: np.ndarray, now: float,
                   pose: Pose | None) -> dict[str, Any] | None:
        """A note that repeats a recent one (same meaning, same place) is folded into it."""
        cfg = self.config
        probe = SearchRequest(streams=("events",), t_min=now - cfg.note_fold_window_s,
                              t_max=now + 1e-6, k=1)
        if pose is not None:
            probe.near, probe.radius = (pose.x, pose.y), cfg.note_fold_radius_m
        self.sync()
        key = (self.text_model_id, "events")
        idx = self.indexes.get(key)
        if idx is None:
            return None
        cand = self.store.candidates(probe)
        if len(cand.ids) == 0:
            return None
        ids, scores = idx.search(vec, 1, candidates=cand.ids)
        if len(ids) == 0 or scores[0] < cfg.note_fold_similarity:
            return None
        prior = self.store.get([int(ids[0])])[int(ids[0])]
        if (prior.pose is None) != (pose is None):
            return None
        tags = dict(prior.tags)
        tags["repeats"] = int(tags.get("repeats", 1)) + 1
        tags["last_t"] = now
        self.store.update_tags(prior.id, tags)
        log.info("note folded into #%d (similarity %.3f): %.60s", prior.id, scores[0], req.text)
        return {"ok": True, "id": prior.id, "t": prior.t,
                "pose": prior.pose.to_dict() if prior.pose else dict(NO_POSE_DICT),
                "indexed": True, "folded": True}

    # ---- streams / compact ------------------------------------------------------------------
    def streams_dict(self) -> dict[str, Any]:
        return {"ok": True, "streams": self.store.stream_stats()}

    def compact_dict(self) -> dict[str, Any]:
        from memory_node.core.compaction import Compactor

        if not self._compact_lock.acquire(blocking=False):
            raise Unavailable("a compaction is already running")
        try:
            return Compactor(self).run()
        finally:
            self._compact_lock.release()

    # ---- ingestion (recorder) ---------------------------------------------------------------
    def sync(self) -> int:
        """Catch up with rows other threads or processes added; returns vectors applied."""
        return self.indexes.sync()

    def _blob_ref(self, stream: str, t: float, ext: str) -> str:
        self._blob_seq += 1
        return f"blobs/{stream}/{int(t * 1000)}_{self._blob_seq:04d}.{ext}"

    def write_blob(self, stream: str, t: float, data: bytes, ext: str) -> str:
        ref = self._blob_ref(stream, t, ext)
        path = self.config.root / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return ref

    def add_observation(self, stream: str, t: float, pose: Pose | None,
                        tags: dict[str, Any] | None = None, text: str = "",
                        blob: bytes | None = None, blob_ext: str = "bin",
                        embed: bool = True) -> int:
        """Store one observation; its text (if any) is embedded with the text model."""
        ref = self.write_blob(stream, t, blob, blob_ext) if blob is not None else None
        vec = self._embed_texts([text])[0] if (text and embed) else None
        obs = Observation(stream=stream, t=t, pose=pose, tags=dict(tags or {}), text=text,
                          ref=ref, model_id=self.text_model_id if vec is not None else None)
        [oid] = self.store.insert([obs], [vec])
        if vec is not None:
            self.sync()
        return oid

    def add_embedded(self, observations: Sequence[Observation], vectors: Any,
                     model_id: str) -> list[int]:
        """Store observations whose vectors were computed elsewhere (an import from another
        store, a fleet peer, a benchmark), in one transaction, and index them.

        `vectors` is an (n, dim) array, one row per observation, from the embedding model
        `model_id` (vectors of one model share an index; searches with a `semantic_query`
        rank them when that model is loaded here). Rows are L2-normalised here (scores are
        cosine similarities); a dimension other than the model's existing vectors, a
        non-finite or zero row raise ValueError and store nothing. Returns the new ids."""
        vecs = np.asarray(vectors, np.float32)
        if vecs.ndim != 2 or len(vecs) != len(observations):
            raise ValueError("vectors must be an (n, dim) array, one row per observation")
        if not isinstance(model_id, str) or not model_id:
            raise ValueError("model_id must be a non-empty string")
        if len(vecs) == 0:
            return []
        if not np.isfinite(vecs).all():
            raise ValueError("vectors must be finite")
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        if (norms == 0).any():
            raise ValueError("a zero vector has no direction to rank by")
        dim = self.indexes.dim_of(model_id)
        if dim is not None and vecs.shape[1] != dim:
            raise ValueError(f"{model_id} vectors here have {dim} dimensions, not "
                             f"{vecs.shape[1]}")
        vecs = vecs / norms
        for obs in observations:
            obs.model_id = model_id
        ids = self.store.insert(list(observations), list(vecs))
        self._streams_cache = None
        self.sync()
        return ids

    def add_camera_frames(self, frames: Sequence[CameraFrame], stream: str = "camera",
                          jpeg_quality: int = 80) -> list[int]:
        """Describe, encode and embed a batch of frames; one transaction for the batch."""
        import cv2

        if not frames:
            return []
        descs = [self.describer.describe(f.image_bgr) for f in frames]
        rows, refs = [], []
        for f, d in zip(frames, descs):
            ok, buf = cv2.imencode(".jpg", f.image_bgr, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
            if not ok:
                raise ValueError("JPEG encoding of a camera frame failed")
            refs.append(self.write_blob(stream, f.t, buf.tobytes(), "jpg"))
        if self._image_embedder is not None:
            vecs = np.asarray(self._image_embedder.embed_images([f.image_bgr for f in frames]),
                              np.float32)
            model_id = self._image_embedder.model_id
        else:
            vecs = self._embed_texts([d.text for d in descs])
            model_id = self.text_model_id
        for f, d, ref in zip(frames, descs, refs):
            tags = {**d.tags, **f.tags}
            rows.append(Observation(stream=stream, t=f.t, pose=f.pose, tags=tags, text=d.text,
                                    ref=ref, model_id=model_id))
        ids = self.store.insert(rows, list(vecs))
        self.sync()
        return ids

    def add_lidar_scan(self, t: float, pose: Pose | None, points: np.ndarray,
                       stream: str = "lidar", tags: dict[str, Any] | None = None) -> int:
        pts = np.asarray(points, np.float32).reshape(-1, 3)
        import io

        buf = io.BytesIO()
        np.save(buf, pts)
        ranges = np.linalg.norm(pts[:, :2], axis=1) if len(pts) else np.zeros(1)
        info = {"points": int(len(pts)), "max_range": round(float(ranges.max()), 3),
                "mean_range": round(float(ranges.mean()), 3), **(tags or {})}
        return self.add_observation(stream, t, pose, info, "", buf.getvalue(), "npy")

    # ---- start-up work ----------------------------------------------------------------------
    def _ingest_note_files(self) -> int:
        """Rows for Markdown entries memory.db lacks (written by hand, or a crash before the
        insert): the Markdown files are the record of notes."""
        known = self.store.note_keys()
        new = [e for e in self.notes.read_all() if e.key not in known]
        if not new:
            return 0
        try:
            vecs: list[np.ndarray | None] = list(self._embed_texts([e.text for e in new]))
        except Exception as exc:  # noqa: BLE001
            log.warning("embedding notes from Markdown failed (%s); stored unindexed", exc)
            vecs = [None] * len(new)
        rows = []
        for e in new:
            stream = e.stream if e.stream in self.known_streams() else "events"
            tags = dict(e.tags)
            if e.hand_written:
                tags["hand_written"] = True
            rows.append(Observation(stream=stream, t=e.t, pose=e.pose, tags=tags, text=e.text,
                                    model_id=self.text_model_id, note_key=e.key))
        for row, vec in zip(rows, vecs):
            if vec is None:
                row.model_id = None
        self.store.insert(rows, vecs)
        self.sync()
        return len(rows)

    def _index_missing_vectors(self) -> int:
        """Embed rows stored without a vector (indexing failed when they were saved)."""
        rows = self.store.rows_without_vectors(
            [s for s in self.known_streams() if s in NOTE_STREAMS or s == "camera"])
        if not rows:
            return 0
        vecs = self._embed_texts([r.text for r in rows])
        for r, v in zip(rows, vecs):
            self.store.set_vector(r.id, v, self.text_model_id)
        self.sync()
        return len(rows)
