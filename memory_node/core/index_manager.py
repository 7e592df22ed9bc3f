"""The in-memory vector indexes, one per (embedding model, stream), kept in step with memory.db.

The indexes are a cache: `index/` holds their last persisted state (vectors, ids and HNSW
graphs) with a manifest naming the database and the change-feed position it reflects. At
start-up a valid cache is loaded and caught up from the feed; a missing, stale or corrupt one
is rebuilt from memory.db. Never an outage.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time

import numpy as np

from memory_node.core.config import MemoryConfig
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.vectors import make_index
from memory_node.core.vectors.faiss_index import HNSWIndex

log = logging.getLogger("memory_node.index")

Key = tuple[str, str]  # (model_id, stream)
MANIFEST_VERSION = 2


def _meta(t: float | None, x: float | None, y: float | None) -> tuple[float, float, float]:
    """(t, x, y) for in-memory pre-filtering; NaN where the row has no pose."""
    return (float(t), np.nan if x is None else float(x), np.nan if y is None else float(y))


def _file_base(key: Key) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key[0]}__{key[1]}")


class IndexManager:
    def __init__(self, config: MemoryConfig, store: SqliteObservationStore):
        self.config = config
        self.store = store
        self._indexes: dict[Key, HNSWIndex] = {}
        self._seq = 0
        self._data_version: int | None = None
        self._lock = threading.RLock()
        self._last_persist = time.monotonic()

    # ---- lookup -------------------------------------------------------------------------
    def _new(self, dim: int) -> HNSWIndex:
        c = self.config
        return make_index("hnsw", dim, m=c.hnsw_m, ef_construction=c.hnsw_ef_construction,
                          ef_search=c.hnsw_ef_search, min_rows=c.hnsw_min_rows,
                          gather_max=c.exact_gather_max, storage=c.hnsw_storage,
                          rerank=c.hnsw_rerank)

    def keys_for(self, streams: tuple[str, ...] | None) -> list[Key]:
        with self._lock:
            return [k for k, idx in self._indexes.items()
                    if len(idx) and (streams is None or k[1] in streams)]

    def get(self, key: Key) -> HNSWIndex | None:
        return self._indexes.get(key)

    def ids_of(self, key: Key) -> np.ndarray:
        idx = self._indexes.get(key)
        return np.empty(0, np.int64) if idx is None else idx.ids()

    def contains(self, model_id: str | None, stream: str, obs_id: int | None) -> bool:
        if model_id is None or obs_id is None:
            return False
        idx = self._indexes.get((model_id, stream))
        return idx is not None and len(idx.exact_twin.positions(np.array([obs_id]))) > 0

    def vector(self, model_id: str | None, stream: str, obs_id: int | None) -> np.ndarray | None:
        if not self.contains(model_id, stream, obs_id):
            return None
        return self._indexes[(model_id, stream)].exact_twin.get(np.array([obs_id]))[0]

    def total(self) -> int:
        return sum(len(i) for i in self._indexes.values())

    def stats(self) -> list[dict]:
        return [{"model_id": k[0], "stream": k[1], "vectors": len(i), "hnsw": not i.exact}
                for k, i in self._indexes.items()]

    # ---- keeping up with memory.db ------------------------------------------------------------
    def sync(self) -> int:
        """Apply the change feed since the last call. Cheap when nothing changed."""
        with self._lock:
            dv = self.store.data_version()
            if dv == self._data_version:
                return 0
            self._data_version = dv
            applied = 0
            adds: dict[Key, tuple[list[int], list[np.ndarray], list[tuple]]] = {}
            for ch in self.store.vector_changes(self._seq):
                self._seq = ch.seq
                if ch.op == "add":
                    key = (ch.model_id, ch.stream)
                    ids, vecs, metas = adds.setdefault(key, ([], [], []))
                    ids.append(ch.obs_id)
                    vecs.append(ch.vector)
                    metas.append(_meta(ch.t, ch.x, ch.y))
                else:
                    self._flush(adds)
                    adds = {}
                    for idx in self._indexes.values():
                        idx.remove(np.array([ch.obs_id], np.int64))
                applied += 1
            self._flush(adds)
            return applied

    def _flush(self, adds: dict[Key, tuple[list[int], list[np.ndarray], list[tuple]]]) -> None:
        for key, (ids, vecs, metas) in adds.items():
            arr = np.asarray(ids, np.int64)
            idx = self._indexes.get(key)
            if idx is None:
                idx = self._indexes[key] = self._new(len(vecs[0]))
            else:
                # A row re-embedded later (set_vector) must not appear twice.
                present = idx.exact_twin.positions(arr)
                if len(present):
                    idx.remove(arr)
            idx.add(arr, np.stack(vecs), np.asarray(metas, np.float64))

    # ---- start-up -------------------------------------------------------------------------
    def load_or_rebuild(self) -> None:
        t0 = time.perf_counter()
        how = "loaded"
        try:
            if not self._load():
                how = "rebuilt (no index cache)"
                self._rebuild()
        except Exception as exc:  # noqa: BLE001 - a corrupt cache is rebuilt, never fatal
            how = f"rebuilt (index cache unusable: {exc})"
            self._indexes, self._seq = {}, 0
            self._rebuild()
        self._data_version = None
        caught_up = self.sync()
        for idx in self._indexes.values():
            if len(idx) >= self.config.hnsw_min_rows and idx.exact:
                idx.build()
        log.info("vector index %s in %.2f s: %d vectors in %d indexes (+%d from the change "
                 "feed)", how, time.perf_counter() - t0, self.total(), len(self._indexes),
                 caught_up)

    def _rebuild(self) -> None:
        self._indexes = {}
        self._seq = self.store.max_vector_seq()
        batch: dict[Key, tuple[list[int], list[bytes], list[tuple]]] = {}
        for oid, stream, model_id, t, x, y, blob in self.store.all_vectors():
            ids, blobs, metas = batch.setdefault((model_id, stream), ([], [], []))
            ids.append(oid)
            blobs.append(blob)
            metas.append(_meta(t, x, y))
        for key, (ids, blobs, metas) in batch.items():
            vecs = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(ids), -1)
            idx = self._indexes[key] = self._new(vecs.shape[1])
            idx.add(np.asarray(ids, np.int64), vecs, np.asarray(metas, np.float64))
        # Rows added while we read are in the feed after `_seq`... but so are rows we did read;
        # `_flush` de-duplicates re-adds, so replaying them is harmless.

    def _load(self) -> bool:
        d = self.config.index_dir
        manifest_path = d / "manifest.json"
        if not manifest_path.exists():
            return False
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("version") != MANIFEST_VERSION:
            raise ValueError("manifest version differs")
        if manifest.get("db_uuid") != self.store.get_meta("db_uuid"):
            raise ValueError("it belongs to another memory.db")
        seq = int(manifest["seq"])
        if seq > self.store.max_vector_seq():
            raise ValueError("it is newer than memory.db")
        indexes: dict[Key, HNSWIndex] = {}
        for entry in manifest["keys"]:
            key = (entry["model_id"], entry["stream"])
            base = d / entry["file"]
            ids = np.load(base.with_suffix(".ids.npy"))
            vecs = np.load(base.with_suffix(".vecs.npy"), mmap_mode=None)
            meta = np.load(base.with_suffix(".meta.npy"))
            if (len(ids) != entry["n"] or vecs.shape != (entry["n"], entry["dim"])
                    or meta.shape != (entry["n"], 3)):
                raise ValueError(f"{entry['file']} does not match the manifest")
            idx = self._new(entry["dim"])
            idx.add(ids, vecs, meta)
            if entry.get("hnsw") and not idx.load_graph(base.with_suffix(".hnsw")):
                log.warning("cached HNSW graph of %s/%s not usable (built with other settings, "
                            "or damaged): rebuilding it over %d vectors, which can take "
                            "minutes on a large store", key[0], key[1], len(idx))
            indexes[key] = idx
        self._indexes, self._seq = indexes, seq
        return True

    # ---- persistence ------------------------------------------------------------------------
    def persist(self) -> None:
        """Write the cache atomically: a new directory, then a rename over the old one."""
        with self._lock:
            d = self.config.index_dir
            tmp = d.with_name(d.name + ".new")
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            keys = []
            for key, idx in self._indexes.items():
                base = tmp / _file_base(key)
                np.save(base.with_suffix(".ids.npy"), idx.ids())
                np.save(base.with_suffix(".vecs.npy"), idx.exact_twin.vectors())
                np.save(base.with_suffix(".meta.npy"), idx.exact_twin.meta())
                has_graph = idx.save_graph(base.with_suffix(".hnsw"))
                keys.append({"model_id": key[0], "stream": key[1], "file": _file_base(key),
                             "n": len(idx), "dim": idx.dim, "hnsw": has_graph})
            manifest = {"version": MANIFEST_VERSION, "db_uuid": self.store.get_meta("db_uuid"),
                        "seq": self._seq, "keys": keys, "written": time.time()}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
            old = d.with_name(d.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            if d.exists():
                d.rename(old)
            tmp.rename(d)
            if old.exists():
                shutil.rmtree(old)
            self._last_persist = time.monotonic()

    def maybe_persist(self) -> bool:
        if time.monotonic() - self._last_persist < self.config.index_persist_interval_s:
            return False
        self.persist()
        return True

