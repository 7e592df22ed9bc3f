"""The in-memory vector indexes, kept in step with memory.db: one exact index per (embedding
model, stream), and one HNSW graph per embedding model over the rows of all its streams (built
and extended in the background; searches are exact until it is ready).

The indexes are a cache: `index/` holds their last persisted state (vectors, ids and HNSW
graphs) with a manifest naming the database, the change-feed position it reflects, and the
size and CRC-32 of every file. At start-up a cache whose files all check out (and whose sampled
rows agree with memory.db) is loaded and caught up from the feed; a missing, stale, damaged or
foreign one is rebuilt from memory.db, with one warning naming the file and why. Never an
outage, never a silently different answer.

Start-up reads no more than it must: the vector, id and time/place arrays are checksummed and
then memory-mapped copy-on-write, not copied (the OS pages them in as searches touch them; the
files are written with spare rows after the data, so rows added later land in private pages
of the mapping and the files never change). HNSW graphs, the large part, are checksummed and
read by the background worker; until a graph is adopted its unrestricted searches are exact,
and a graph found damaged then is rebuilt in the background, with one warning.

Layout: `index/manifest.json` names a generation directory `index/g-<pid>-<time>-<random>/`
holding the files. A writer fills a new generation directory, then replaces the manifest with
one rename; `index/.lock` (flock) makes processes sharing the directory take turns.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import mmap
import os
import re
import secrets
import shutil
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

import faiss
import numpy as np

from memory_node.core.config import MemoryConfig
from memory_node.core.store.base import KeyVectors
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.store.vector_files import DIR_NAME, fsync_dir, row_crcs
from memory_node.core.vectors.exact import ExactIndex
from memory_node.core.vectors.faiss_index import GraphIndex

log = logging.getLogger("memory_node.index")

Key = tuple[str, str]  # (model_id, stream)
MANIFEST_VERSION = 5
# 2: files beside the manifest, no checksums; 2 and 3: a graph per stream (not read: one graph
# per model is built in the background instead); up to 4: vectors in the cache (the indexes
# are read from memory.db and the vector files instead; a version-4 graph is kept).
READABLE_VERSIONS = (2, 3, 4, 5)
MANIFEST = "manifest.json"
LOCK_NAME = ".lock"
PERSIST_LOCK_TIMEOUT_S = 30.0  # how long a writer waits for another process's write


def spare_rows(n: int) -> int:
    """Rows of room written (as a sparse hole: no disk blocks) after an array's data, so that
    rows added after the next start do not force a copy of the mapped arrays."""
    return max(1024, n // 8)


def _meta(t: float | None, x: float | None, y: float | None) -> tuple[float, float, float]:
    """(t, x, y) for in-memory pre-filtering; NaN where the row has no pose."""
    if t is None:
        raise TypeError("a vector row without a time")
    return (float(t), np.nan if x is None else float(x), np.nan if y is None else float(y))


class _Adds:
    """Rows of one key from a run of the change feed: ids, where their vectors are, meta."""

    def __init__(self, dim: int):
        self.dim = dim
        self.ids: list[int] = []
        self.gens: list[int] = []
        self.slots: list[int] = []
        self.metas: list[tuple[float, float, float]] = []


def _file_base(key: Key) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key[0]}__{key[1]}")


# A model's graph: its links, node ids, (since the codes are no longer saved) an empty copy
# of its storage and (since graphs calibrate themselves) the ids held out of it:
# `<model>.graph.hnsw`, `.graph_ids.npy`, `.quantizer`, `.held.npy`. Caches of earlier
# releases lack the last ones.
GRAPH_PARTS = ("hnsw", "graph_ids.npy", "quantizer", "held.npy")


def _graph_base(model_id: str) -> str:
    """The files of a model's graph are `<base>.<part>` for each of GRAPH_PARTS."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model_id}.graph")


class IndexManager:
    def __init__(self, config: MemoryConfig, store: SqliteObservationStore):
        self.config = config
        self.store = store
        self._indexes: dict[Key, ExactIndex] = {}
        self._graphs: dict[str, GraphIndex] = {}  # model id -> its graph over every stream
        self._seq = 0
        self._data_version: int | None = None
        self._lock = threading.RLock()
        self._last_persist = time.monotonic()
        self._worker = GraphWorker()
        self._graph_sources: dict[str, GraphSource] = {}  # model id -> cached graph to read
        self._graphs_read = threading.Event()  # set: no cached graph is left to read
        self._graphs_read.set()
        self._starting = False  # graphs made while loading wait for the end to be scheduled
        # key -> (file generation, rows, CRC-32 of those rows): what the last persist recorded
        self._crc: dict[Key, tuple[int, int, int]] = {}

    def building(self, model_id: str) -> bool:
        """Whether `model_id`'s graph is still being built (searches it would serve are exact)."""
        graph = self._graphs.get(model_id)
        return graph is not None and graph.building

    def reading(self, model_id: str) -> bool:
        """Whether `model_id`'s cached graph is still to be read by the background (searches
        it would serve are exact until then; no build is needed)."""
        return model_id in self._graph_sources

    def graph(self, model_id: str) -> GraphIndex | None:
        return self._graphs.get(model_id)

    def graphs(self) -> dict[str, GraphIndex]:
        return dict(self._graphs)

    def wait_for_graphs(self, timeout_s: float | None = None) -> bool:
        """Block until the background worker has nothing left to do (benchmarks, tests)."""
        for graph in list(self._graphs.values()):
            graph.schedule()
        return self._worker.wait_idle(timeout_s)

    def wait_for_cached_graphs(self, timeout_s: float | None = None) -> bool:
        """Block until the background has read (or given up on) every cached graph; builds
        and rows still to add are not waited for (benchmarks, tests)."""
        return self._graphs_read.wait(timeout_s)

    def close(self) -> None:
        """Stop graph work (a build in progress stops at its next chunk)."""
        self._worker.stop()
        self._drop_graph_sources()

    # ---- lookup -------------------------------------------------------------------------
    def _new(self, dim: int) -> ExactIndex:
        return ExactIndex(dim, gather_max=self.config.exact_gather_max)

    def _graph_of(self, model_id: str, dim: int) -> GraphIndex:
        graph = self._graphs.get(model_id)
        if graph is None:
            c = self.config
            graph = self._graphs[model_id] = GraphIndex(
                dim, m=c.hnsw_m, ef_construction=c.hnsw_ef_construction,
                ef_search=c.hnsw_ef_search, min_rows=c.hnsw_min_rows, storage=c.hnsw_storage,
                rerank=c.hnsw_rerank, scheduler=None if self._starting else self._worker.schedule,
                recall_target=c.hnsw_recall_target)
        return graph

    def _attach(self, indexes: dict[Key, ExactIndex]) -> None:
        """Make `indexes` the exact indexes, each covered by its model's graph."""
        self._indexes, self._graphs = {}, {}
        for key, idx in indexes.items():
            self._indexes[key] = idx
            self._graph_of(key[0], idx.dim).attach(key[1], idx)

    def search(self, model_id: str, query: np.ndarray, k: int,
               streams: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
        """Top-k of `model_id`'s rows in every stream (or in `streams`), and whether the answer
        is exact only because the model's graph is still being built."""
        graph = self._graphs.get(model_id)
        if graph is None:
            return np.empty(0, np.int64), np.empty(0, np.float32), False
        return graph.search_parts(query, k, streams)

    def keys_for(self, streams: tuple[str, ...] | None) -> list[Key]:
        with self._lock:
            return [k for k, idx in self._indexes.items()
                    if len(idx) and (streams is None or k[1] in streams)]

    def dim_of(self, model_id: str) -> int | None:
        """The dimension of `model_id`'s vectors here, or None when it has none yet."""
        for (m, _), idx in list(self._indexes.items()):
            if m == model_id:
                return idx.dim
        return None

    def get(self, key: Key) -> ExactIndex | None:
        return self._indexes.get(key)

    def ids_of(self, key: Key) -> np.ndarray:
        idx = self._indexes.get(key)
        return np.empty(0, np.int64) if idx is None else idx.ids()

    def contains(self, model_id: str | None, stream: str, obs_id: int | None) -> bool:
        if model_id is None or obs_id is None:
            return False
        idx = self._indexes.get((model_id, stream))
        return idx is not None and len(idx.positions(np.array([obs_id]))) > 0

    def vector(self, model_id: str | None, stream: str, obs_id: int | None) -> np.ndarray | None:
        if model_id is None or not self.contains(model_id, stream, obs_id):
            return None
        return self._indexes[(model_id, stream)].get(np.array([obs_id]))[0]

    def total(self) -> int:
        return sum(len(i) for i in self._indexes.values())

    def stats(self) -> list[dict]:
        return [{"model_id": k[0], "stream": k[1], "vectors": len(i),
                 "hnsw": k[0] in self._graphs and not self._graphs[k[0]].exact}
                for k, i in self._indexes.items()]

    def graph_info(self) -> list[dict]:
        """Per model: its graph's state and, once calibrated, the efSearch and rerank depth
        in use with the recall measured (`streams`' "indexes")."""
        out = []
        for model_id, graph in list(self._graphs.items()):
            n = len(graph)
            state = ("reading" if model_id in self._graph_sources
                     else "ready" if not graph.exact
                     else "building" if graph.building else "exact")
            entry: dict = {"model_id": model_id, "vectors": n, "graph": state}
            c = graph.current_calibration()
            if state == "ready" and c is not None:
                entry.update(ef_search=c.ef_search, rerank=c.rerank, recall_at_5=c.recall_at_5,
                             recall_at_10=c.recall_at_10, recall_target=c.target,
                             calibrated_rows=c.rows, calibration_queries=c.queries)
            out.append(entry)
        return out

    # ---- keeping up with memory.db ------------------------------------------------------------
    def sync(self) -> int:
        """Apply the change feed since the last call. Cheap when nothing changed."""
        with self._lock:
            dv = self.store.data_version()
            if dv == self._data_version:
                return 0
            self._data_version = dv
            applied = 0
            adds: dict[Key, _Adds] = {}
            removes: list[int] = []
            for ch in self.store.vector_changes(self._seq):
                self._seq = ch.seq
                if ch.op == "add":
                    if removes:  # keep the feed's order between runs of adds and removals
                        self._remove(removes)
                        removes = []
                    # An add always carries its model, stream and place (the feed's contract).
                    assert ch.model_id is not None and ch.stream is not None
                    assert ch.vector is not None and ch.gen is not None and ch.slot is not None
                    key = (ch.model_id, ch.stream)
                    add = adds.setdefault(key, _Adds(len(ch.vector)))
                    add.ids.append(ch.obs_id)
                    add.gens.append(ch.gen)
                    add.slots.append(ch.slot)
                    add.metas.append(_meta(ch.t, ch.x, ch.y))
                else:
                    self._flush(adds)
                    adds = {}
                    removes.append(ch.obs_id)  # one removal per run: compaction removes many
                applied += 1
            self._remove(removes)
            self._flush(adds)
            # A file compaction rewrote (a new generation) moves its index's slots.
            for key, (gen, _dim, _rows) in self.store.vector_file_states().items():
                idx = self._indexes.get(key)
                if idx is not None and idx.source != gen:
                    self._move(key)
            return applied

    def _remove(self, ids: list[int]) -> None:
        if ids:
            arr = np.asarray(ids, np.int64)
            for graph in self._graphs.values():
                graph.remove_rows(arr)

    def _flush(self, adds: dict[Key, _Adds]) -> None:
        for key, add in adds.items():
            arr = np.asarray(add.ids, np.int64)
            slots = np.asarray(add.slots, np.int64)
            metas = np.asarray(add.metas, np.float64)
            idx = self._indexes.get(key)
            gen = add.gens[-1]
            if any(g != gen for g in add.gens) or (idx is not None and idx.source != gen):
                # The file was rewritten since: take the rows' slots in the current one.
                kv = self.store.key_vectors(*key)
                if idx is not None and not self._move(key, kv):
                    continue
                at = {int(i): j for j, i in enumerate(kv.ids.tolist())}
                keep = [j for j, i in enumerate(add.ids) if i in at]
                arr, metas = arr[keep], metas[keep]
                slots = np.asarray([kv.slots[at[int(i)]] for i in arr], np.int64)
                gen = kv.gen
            if not len(arr):
                continue
            idx = self._file_index(key, gen, add.dim, int(slots.max()) + 1)
            if idx is None:
                continue
            graph = self._graphs[key[0]]
            if len(idx.positions(arr)):  # a row re-embedded later (set_vector): not twice
                graph.remove_rows(arr)
            graph.add_rows(key[1], arr, None, metas, slots)

    def _file_index(self, key: Key, gen: int, dim: int, rows: int) -> ExactIndex | None:
        """`key`'s index over generation `gen` of its vector file, mapped far enough to hold
        `rows` rows (created when new, its map renewed when the file grew)."""
        try:
            vmap = self.store.files.map(key[0], key[1], gen, dim, rows)
        except (OSError, ValueError) as exc:
            log.error("vector file of %s in %s unreadable (%s): its new rows stay unindexed "
                      "until the next start checks it", key[0], key[1], exc)
            return None
        idx = self._indexes.get(key)
        if idx is None:
            idx = self._indexes[key] = self._new(dim)
            idx.use_file(vmap.array, gen)
            self._graph_of(key[0], dim).attach(key[1], idx)
        elif len(vmap.array) > len(idx.storage()):
            idx.grow_file(vmap.array, gen)
        return idx

    def _move(self, key: Key, kv: KeyVectors | None = None) -> bool:
        """Point `key`'s index at its file's current generation (compaction rewrote it);
        `kv`: memory.db's rows of the key, when already read."""
        kv = self.store.key_vectors(*key) if kv is None else kv
        idx = self._indexes[key]
        try:
            vmap = self.store.files.map(key[0], key[1], kv.gen, kv.dim,
                                        int(kv.slots.max()) + 1 if len(kv.slots) else 0)
        except (OSError, ValueError) as exc:
            log.error("vector file of %s in %s unreadable after compaction (%s)", key[0],
                      key[1], exc)
            return False
        gone = idx.move_to_file(vmap.array, kv.gen, kv.ids, kv.slots)
        if len(gone):
            self._remove(gone.tolist())
        return True

    # ---- building an index from memory.db ------------------------------------------------------
    def _key_from_db(self, key: Key) -> ExactIndex | None:
        """`key`'s index from memory.db's slots and its vector file, every row's checksum
        checked: a damaged row loses its vector (logged; the engine embeds its text again
        when it starts), never a wrong score. None when the key has no vector left."""
        kv = self.store.key_vectors(*key)
        if not len(kv.ids):
            return None
        path = self.store.files.path(key[0], key[1], kv.gen)
        try:
            storage = self.store.files.map(key[0], key[1], kv.gen, kv.dim, 0).array
        except OSError:
            storage = np.empty((0, kv.dim), np.float32)
        short = kv.slots >= len(storage)
        bad = short.copy()
        inside = np.nonzero(~short)[0]
        for start in range(0, len(inside), 65536):
            chunk = inside[start:start + 65536]
            crcs = np.asarray(row_crcs(storage[kv.slots[chunk]]), np.int64)
            bad[chunk[crcs != kv.crcs[chunk]]] = True
        if bad.any():
            why = ("missing or shorter than memory.db says" if short.any()
                   else "rows whose bytes differ from their checksum in memory.db")
            self.store.drop_vectors(kv.ids[bad].tolist(), f"{DIR_NAME}/{path.name}: {why}")
            keep = ~bad
            kv.ids, kv.slots, kv.meta = kv.ids[keep], kv.slots[keep], kv.meta[keep]
            if not len(kv.ids):
                return None
        idx = self._new(kv.dim)
        idx.use_file(storage, kv.gen, kv.ids, kv.slots, kv.meta, len(kv.ids))
        return idx

    # ---- start-up -------------------------------------------------------------------------
    def load_or_rebuild(self) -> None:
        """Load the cache if every file in it checks out, else rebuild from memory.db with one
        warning naming the file and why. Never an outage, never a silently wrong answer."""
        t0 = time.perf_counter()
        how = "loaded"
        self._starting = True
        try:
            with CacheLock(self.config.index_dir, shared=True):
                loaded = self._load()
            if not loaded:
                how = "rebuilt (no index cache)"
        except Exception as exc:  # noqa: BLE001 - a damaged cache is rebuilt, never fatal
            damaged: CacheDamaged | None
            damaged = exc if isinstance(exc, CacheDamaged) else CacheDamaged(
                "index/", f"{type(exc).__name__}: {exc}")
            self._warn_damaged(damaged)
            how, loaded = f"rebuilt ({damaged.file}: {damaged.why})", False
        if not loaded:
            self._rebuild()
        self._data_version = None
        caught_up = self.sync()
        if loaded:
            # The files are those the manifest names; this checks that they also say what
            # memory.db says (a cache copied from another store, a manifest edited by hand).
            damaged = self._verify_sample()
            if damaged is not None:
                self._warn_damaged(damaged)
                how = f"rebuilt ({damaged.file}: {damaged.why})"
                self._rebuild()
                self._data_version = None
                caught_up = self.sync()
        self._starting = False
        for graph in self._graphs.values():  # missing or behind: built in the background
            graph.scheduler = self._worker.schedule
            graph.schedule()
        log.info("vector index %s in %.2f s: %d vectors in %d indexes, %d graphs (+%d from the "
                 "change feed)", how, time.perf_counter() - t0, self.total(), len(self._indexes),
                 len(self._graphs), caught_up)

    @staticmethod
    def _warn_damaged(exc: CacheDamaged) -> None:
        log.warning("index cache file %s unusable (%s): rebuilding the vector index from "
                    "memory.db", exc.file, exc.why)

    def _rebuild(self) -> None:
        """Every index from memory.db and the vector files (mapped, not copied)."""
        self._drop_graph_sources()
        self._indexes, self._graphs = {}, {}
        self._seq = self.store.max_vector_seq()
        indexes = {}
        for key in self.store.vector_file_states():
            idx = self._key_from_db(key)
            if idx is not None:
                indexes[key] = idx
        self._attach(indexes)
        # Rows added while we read are in the feed after `_seq`... but so are rows we did read;
        # `_flush` de-duplicates re-adds, so replaying them is harmless.

    def _load(self) -> bool:
        d = self.config.index_dir
        manifest_path = d / MANIFEST
        if not manifest_path.exists():
            return False
        manifest = _read_manifest(manifest_path)
        if manifest.get("db_uuid") != self.store.get_meta("db_uuid"):
            raise CacheDamaged(MANIFEST, "it belongs to another memory.db")
        seq = int(manifest["seq"])
        if seq > self.store.max_vector_seq():
            raise CacheDamaged(MANIFEST, "it is newer than memory.db")
        gen = d / manifest.get("dir", ".")
        indexes: dict[Key, ExactIndex] = {}
        states = self.store.vector_file_states()
        if manifest.get("version", 0) < 5:
            log.info("index cache of an earlier release (vectors in the cache): indexes read "
                     "from memory.db and %s/, cached graphs kept", DIR_NAME)
            loaded = {key: self._key_from_db(key) for key in states}
        else:
            loaded = {(e["model_id"], e["stream"]): self._load_entry(gen, e, states)
                      for e in manifest["keys"]}
        indexes = {key: idx for key, idx in loaded.items() if idx is not None}
        self._attach(indexes)
        sources: dict[str, GraphSource] = {}
        try:
            for entry in manifest.get("graphs", []):
                graph = self._graphs.get(entry["model_id"])
                if graph is None:
                    raise CacheDamaged(MANIFEST, f"a graph of {entry['model_id']}, which has "
                                                 "no vectors in it")
                base, files = entry["file"], entry.get("files") or {}
                # Opened now, under the cache lock (a writer may replace the files once it is
                # released), and read by the background worker.
                # A graph saved without its codes has a quantizer file beside it.
                parts = GRAPH_PARTS[:2] + tuple(p for p in GRAPH_PARTS[2:] if p in files)
                sources[entry["model_id"]] = GraphSource(
                    graph, {part: gen / f"{base}.{part}" for part in parts},
                    {part: files.get(part) for part in parts}, self._archived_vectors)
        except BaseException:
            for src in sources.values():
                src.close()
            raise
        if manifest.get("version", 0) < 4 and any(e.get("hnsw") for e in manifest["keys"]):
            log.info("index cache of an earlier release (a graph per stream): one graph per "
                     "model is built in the background")
        self._drop_graph_sources()
        self._seq, self._graph_sources = seq, sources
        if sources:  # ahead of any graph build the feed or a search may schedule
            self._graphs_read.clear()
            self._worker.submit(self._load_graphs)
        return True

    def _load_entry(self, gen: Path, entry: dict, states: dict[Key, tuple[int, int, int]]
                    ) -> ExactIndex | None:
        """One key's cached index: ids, slots and (t, x, y) checked against the manifest and
        memory-mapped, over its vector file, whose rows the manifest covers are checksummed.
        A file compaction has rewritten since, or one that fails its checksum, is read from
        memory.db instead (which finds and unindexes damaged rows)."""
        key: Key = (entry["model_id"], entry["stream"])
        files, base = entry.get("files") or {}, entry["file"]
        for part in ("ids.npy", "slots.npy", "meta.npy"):
            _check_file(gen, f"{base}.{part}", files.get(part))
        ids, n_ids = _np_map(gen, f"{base}.ids.npy")
        slots, n_slots = _np_map(gen, f"{base}.slots.npy")
        meta, n_meta = _np_map(gen, f"{base}.meta.npy")
        n, dim = int(entry["n"]), int(entry["dim"])
        if (n_ids, n_slots, n_meta) != (n, n, n) or ids.shape[1:] != () \
                or slots.shape[1:] != () or meta.shape[1:] != (3,):
            raise CacheDamaged(f"{base}.*.npy", "shapes do not match the manifest")
        if ids.dtype != np.int64 or slots.dtype != np.int64 or meta.dtype != np.float64:
            raise CacheDamaged(f"{base}.*.npy", "types do not match the manifest")
        if n and not _unique_positive(ids[:n]):
            raise CacheDamaged(f"{base}.ids.npy", "its ids are not unique positive ids")
        vec = entry.get("vectors") or {}
        state = states.get(key)
        if state is None or state[0] != vec.get("gen") or state[1] != dim:
            return self._key_from_db(key)  # compaction wrote a new generation since
        rows = int(vec.get("rows", -1))
        if not 0 <= rows <= state[2] or (n and (slots[:n].min() < 0
                                                or slots[:n].max() >= rows)):
            raise CacheDamaged(f"{base}.slots.npy", "slots outside the vector file")
        path = self.store.files.path(key[0], key[1], state[0])
        try:
            crc = _crc_prefix(path, rows * 4 * dim)
            vmap = self.store.files.map(key[0], key[1], state[0], dim, rows)
        except (OSError, ValueError):
            crc = None
        if crc is None or f"{crc:08x}" != vec.get("crc32"):
            return self._key_from_db(key)  # checks every row: damaged ones are unindexed
        self._crc[key] = (state[0], rows, crc)
        idx = self._new(dim)
        idx.use_file(vmap.array, state[0], ids, slots, meta, n)
        return idx

    def _archived_vectors(self, ids: list[int]) -> dict[int, np.ndarray]:
        """Vectors of rows archived since a graph was saved (its nodes keep their place)."""
        return {oid: vec for oid, (_m, vec) in self.store.archived_vectors(ids).items()}

    def _drop_graph_sources(self) -> None:
        with self._lock:
            sources, self._graph_sources = list(self._graph_sources.values()), {}
        for src in sources:
            src.close()
        self._graphs_read.set()

    def _load_graphs(self, cancelled: Callable[[], bool]) -> None:
        """Background: checksum, read and adopt each cached graph; one that does not check
        out is rebuilt (searches stay exact meanwhile), with one warning for all of them."""
        unusable: list[tuple[str, int]] = []
        try:
            while not cancelled():
                with self._lock:
                    if not self._graph_sources:
                        return
                    model_id, src = next(iter(self._graph_sources.items()))
                why = src.load(cancelled)
                if cancelled():
                    return  # stopped (engine closing): the source stays for persist to carry
                with self._lock:
                    current = self._graph_sources.get(model_id) is src
                    if current:
                        del self._graph_sources[model_id]
                    streams = ", ".join(k[1] for k in self._indexes if k[0] == model_id)
                src.close()
                if why and current:  # not one dropped meanwhile (the cache was rebuilt)
                    unusable.append((f"{model_id} over {streams} ({why})", len(src.idx)))
                    src.idx.schedule()
        finally:
            if unusable:  # one warning, however many graphs
                log.warning("cached HNSW graph of %s not usable: rebuilding it over %d "
                            "vectors in the background (searches of it are exact until "
                            "then), which can take minutes on a large store",
                            "; ".join(u[0] for u in unusable), sum(u[1] for u in unusable))
            self._graphs_read.set()  # read, given up on, or stopped: nothing more to wait for

    def _verify_sample(self, per_key: int = 32) -> CacheDamaged | None:
        """Compare a sample of cached rows with memory.db, both ways: each sampled cached
        row must be that row of memory.db (same key, slot, time and place, and its bytes in
        the vector file must have the checksum memory.db keeps), and sampled rows of the
        feed that still have a vector must be cached. Cheap (a few hundred key reads)."""
        rng = np.random.default_rng()
        with self._lock:
            for key, idx in self._indexes.items():
                ids, slots, meta = idx.ids(), idx.slots(), idx.meta()
                if not len(ids) or slots is None:
                    continue
                pos = np.unique(np.concatenate([[0, len(ids) - 1],
                                                rng.integers(0, len(ids), per_key)]))
                rows = self.store.vector_places(ids[pos].tolist())
                storage, base = idx.storage(), _file_base(key)
                for oid, slot, m in zip(ids[pos].tolist(), slots[pos].tolist(), meta[pos],
                                        strict=True):
                    row = rows.get(oid)
                    if row is None or (row[1], row[0]) != key:
                        return CacheDamaged(base + ".ids.npy",
                                            f"row {oid} is not a {key[1]} vector in memory.db")
                    _stream, _model, t, x, y, gen, db_slot, crc = row
                    if gen != idx.source:
                        continue  # compaction rewrote the file since: sync moves the index
                    if db_slot != slot:
                        return CacheDamaged(base + ".slots.npy",
                                            f"the slot of row {oid} differs from memory.db's")
                    if zlib.crc32(storage[slot]) != crc:
                        name = self.store.files.path(key[0], key[1], gen).name
                        return CacheDamaged(f"../{DIR_NAME}/{name}",
                                            f"row {oid} differs from its checksum in memory.db")
                    if not np.array_equal(np.asarray(_meta(t, x, y)), m, equal_nan=True):
                        return CacheDamaged(base + ".meta.npy",
                                            f"time or place of row {oid} differs from memory.db's")
            if self._seq:
                seqs = np.unique(rng.integers(1, self._seq + 1, 64)).tolist()
                added = self.store.added_ids_at(seqs)
                for oid, (stream, model_id, *_rest) in self.store.vector_places(added).items():
                    if not self.contains(model_id, stream, oid):
                        return CacheDamaged(MANIFEST, f"row {oid} of memory.db is not cached")
        return None

    # ---- persistence ------------------------------------------------------------------------
    def persist(self, lock_timeout_s: float | None = None) -> bool:
        """Write the cache so that a crash or a kill at any moment leaves the previous cache
        or the new one, never a mix: the files go into a directory of their own (a name no
        other process uses), then the manifest naming it replaces the old one in one rename.
        Processes sharing the directory take turns (a file lock). Returns True when the cache
        was written, False when another process held the lock for `lock_timeout_s`; raises
        OSError when it cannot be written (the previous cache then stays as it was)."""
        d = self.config.index_dir
        d.mkdir(parents=True, exist_ok=True)
        if lock_timeout_s is None:
            lock_timeout_s = PERSIST_LOCK_TIMEOUT_S
        with self._lock:
            seq = self._seq
            snap = [(key, idx, *idx.snapshot(), idx.source) for key, idx
                    in self._indexes.items()]
            graphs = [(m, g, self._graph_sources.get(m)) for m, g in self._graphs.items()]
        lock = CacheLock(d, shared=False, timeout_s=lock_timeout_s)
        if not lock.acquire():
            log.warning("index cache not written: another process kept %s locked for %.0f s",
                        d, lock_timeout_s)
            return False
        try:
            gen_name = f"g-{os.getpid()}-{time.time_ns():x}-{secrets.token_hex(3)}"
            gen = d / gen_name
            gen.mkdir()
            keys, graph_entries = [], []
            for key, idx, ids, slots, meta, _layout, source in snap:
                assert slots is not None  # the engine's indexes are over vector files
                base = _file_base(key)
                files = {}
                for part, arr in (("ids.npy", ids), ("slots.npy", slots), ("meta.npy", meta)):
                    files[part] = _write_npy(gen / f"{base}.{part}", arr)
                rows = int(slots.max()) + 1 if len(slots) else 0
                keys.append({"model_id": key[0], "stream": key[1], "file": base,
                             "n": len(ids), "dim": idx.dim, "files": files,
                             "vectors": self._vectors_entry(key, source, idx.dim, rows)})
            for model_id, graph, src in graphs:
                base = _graph_base(model_id)
                graph_files = _save_graph(graph, gen, base)
                if graph_files is None and src is not None:
                    # Still being read: the cached files go on as they are (or, read meanwhile,
                    # the graph is written).
                    graph_files = src.carry(gen, base) or _save_graph(graph, gen, base)
                if graph_files is not None:
                    graph_entries.append({"model_id": model_id, "file": base, "dim": graph.dim,
                                          "files": graph_files})
            fsync_dir(gen)
            body = {"version": MANIFEST_VERSION, "db_uuid": self.store.get_meta("db_uuid"),
                    "seq": seq, "dir": gen_name, "keys": keys, "graphs": graph_entries,
                    "written": time.time()}
            body["checksum"] = _body_sum(body)
            tmp = d / f"{MANIFEST}.{gen_name}.tmp"
            with open(tmp, "w") as fh:
                fh.write(json.dumps(body, indent=1))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, d / MANIFEST)
            fsync_dir(d)
            self._remove_unreferenced(d, gen_name)
            for key, idx, ids, _s, _m, layout, _src in snap:
                self._rebase(idx, gen, _file_base(key), len(ids), layout)
        finally:
            lock.release()
        self._last_persist = time.monotonic()
        return True

    def _vectors_entry(self, key: Key, gen: object, dim: int, rows: int) -> dict | None:
        """The manifest's record of the vector file rows [0, rows) the cache relies on: its
        generation and their CRC-32 (carried on from the last persist: only new rows are
        read). None when the file is gone (compaction replaced it: the next start reads the
        key from memory.db)."""
        if not isinstance(gen, int):
            return None
        prev = self._crc.get(key)
        start, crc = (prev[1], prev[2]) if prev and prev[0] == gen and prev[1] <= rows \
            else (0, 0)
        try:
            crc = _crc_prefix(self.store.files.path(key[0], key[1], gen), rows * 4 * dim,
                              start * 4 * dim, crc)
        except (OSError, ValueError):  # gone, or cut short: the next start checks its rows
            return None
        self._crc[key] = (gen, rows, crc)
        return {"gen": gen, "rows": rows, "crc32": f"{crc:08x}"}

    @staticmethod
    def _rebase(idx: ExactIndex, gen: Path, base: str, n: int, layout: int) -> None:
        """Map the arrays just written in place of the index's ids, slots and (t, x, y): rows
        added since the start move from private memory to pages the OS can drop, and the
        files of the generation mapped before (deleted now) free their disk space."""
        try:
            ids, slots, meta = (_np_map(gen, f"{base}.{part}")[0]
                                for part in ("ids.npy", "slots.npy", "meta.npy"))
        except CacheDamaged as exc:  # just written by us under the lock: not expected
            log.warning("index cache file %s not mapped after writing it (%s)", exc.file,
                        exc.why)
            return
        idx.rebase_rows(ids, slots, meta, n, layout)

    @staticmethod
    def _remove_unreferenced(d: Path, keep: str) -> None:
        """Under the lock nobody else writes: what the manifest does not name is left over
        from an earlier cache, an interrupted write, or the layout before version 3."""
        for p in d.iterdir():
            if p.name in (MANIFEST, LOCK_NAME, keep):
                continue
            if p.is_dir() and p.name.startswith("g-"):
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_file() and (p.name.startswith(MANIFEST + ".") or p.suffix in (
                    ".npy", ".hnsw", ".tmp")):
                p.unlink(missing_ok=True)
        for stale in (d.with_name(d.name + ".new"), d.with_name(d.name + ".old")):
            if stale.is_dir():  # what releases before version 3 left behind
                shutil.rmtree(stale, ignore_errors=True)

    def maybe_persist(self) -> bool:
        if time.monotonic() - self._last_persist < self.config.index_persist_interval_s:
            return False
        return self.persist()


# ---- background graph work ----------------------------------------------------------------------
class GraphWorker:
    """One background thread at the lowest CPU priority doing every index's graph work (full
    builds in cancellable chunks, then pending rows in short slices), so no query waits.
    Other work (reading cached graphs) is submitted as tasks, run before any index's work."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or os.cpu_count() or 1
        _WORKERS.add(self)
        self._queue: list[GraphIndex | Callable[[Callable[[], bool]], None]] = []
        self._cv = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def schedule(self, idx: GraphIndex) -> None:
        with self._cv:
            if self._stopped:
                return
            if not any(i is idx for i in self._queue):
                self._queue.append(idx)
            self._start()

    def submit(self, task: Callable[[Callable[[], bool]], None]) -> None:
        """Run `task(cancelled)` in the background ahead of queued index work (a graph read
        from the cache must not lose its turn to a build of the same graph from scratch)."""
        with self._cv:
            if self._stopped:
                return
            at = next((i for i, q in enumerate(self._queue) if isinstance(q, GraphIndex)),
                      len(self._queue))
            self._queue.insert(at, task)
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memory-graph-worker",
                                            daemon=True)
            self._thread.start()
        self._cv.notify_all()

    def _run(self) -> None:
        try:  # Linux: nice is per thread; the build's OpenMP threads inherit it
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        while True:
            with self._cv:
                while not self._queue and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                idx = self._queue.pop(0)
                self._busy = True
            more = False
            try:
                if isinstance(idx, GraphIndex):
                    more = idx.work(cancelled=lambda: self._stopped, threads=self.threads)
                else:
                    idx(lambda: self._stopped)
            except Exception:  # noqa: BLE001 - searches stay exact; logged once per failure
                log.exception("background graph work failed; searches of it stay exact")
            with self._cv:
                self._busy = False
                if more and not self._stopped and not any(i is idx for i in self._queue):
                    self._queue.append(idx)
                self._cv.notify_all()
            time.sleep(0.0005)  # let a query waiting for the graph take it between slices

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._stopped = True
            self._queue.clear()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)


_WORKERS: weakref.WeakSet[GraphWorker] = weakref.WeakSet()


@atexit.register
def _stop_workers() -> None:
    """A daemon thread still inside faiss when the interpreter exits aborts the process
    ("terminate called without an active exception"): stop each worker at its next chunk."""
    for worker in list(_WORKERS):
        worker.stop(timeout_s=60.0)


# ---- cache files ------------------------------------------------------------------------------
class GraphSource:
    """A cached graph's files, opened at start-up and read in the background: checksummed,
    read and handed to its index (which encodes its nodes' vectors again when the graph was
    saved without them). Until then a persist carries the files over unchanged (with the
    checksums the manifest had), so a restart does not lose a graph it never read."""

    def __init__(self, idx: GraphIndex, paths: dict[str, Path],
                 sums: dict[str, dict | None] | None,
                 vectors_of: Callable[[list[int]], dict[int, np.ndarray]] | None = None):
        self.idx, self.sums, self.vectors_of = idx, sums, vectors_of
        self.paths = dict(paths)
        self.files: dict[str, IO[bytes]] = {}
        self.error: str | None = None
        self._lock = threading.Lock()
        for part, path in self.paths.items():
            try:
                self.files[part] = open(path, "rb")  # noqa: SIM115 - closed by close()
            except FileNotFoundError:
                self.error = f"{path.name}: missing"
                break
            except OSError as exc:
                self.error = f"{path.name}: {exc}"
                break

    def load(self, cancelled: Callable[[], bool]) -> str | None:
        """Checksum, read and adopt the graph; why it could not be (None when it was)."""
        if self.error is not None:
            return self.error
        with self._lock:
            if len(self.files) != len(self.paths):
                return "closed before it was read"
            if self.sums is not None:
                for part, fh in self.files.items():
                    want = self.sums.get(part)
                    try:
                        _check_open_file(fh, self.paths[part].name, want)
                    except CacheDamaged as exc:
                        return f"{exc.file}: {exc.why}"
                    if cancelled():
                        return None
            try:
                fh = self.files["hnsw"]
                fh.seek(0)

                def read(size: int, fh: IO[bytes] = fh) -> bytes:
                    if cancelled():  # stop a long read when the engine closes
                        raise InterruptedError("graph work stopped")
                    return fh.read(size)

                # Not in faiss's generated stubs: a reader over a Python callable.
                reader = faiss.PyCallbackIOReader(read)  # type: ignore[attr-defined]
                quantizer = None
                if "quantizer" in self.files:  # saved without its codes
                    graph = faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE)
                    fh = self.files["quantizer"]
                    fh.seek(0)
                    quantizer = faiss.read_index(faiss.PyCallbackIOReader(  # type: ignore[attr-defined]
                        lambda size, fh=fh: fh.read(size)))
                else:
                    graph = faiss.read_index(reader)
                fh = self.files["graph_ids.npy"]
                fh.seek(0)
                ids = np.load(fh, allow_pickle=False)
                held = None
                if "held.npy" in self.files:
                    fh = self.files["held.npy"]
                    fh.seek(0)
                    held = np.load(fh, allow_pickle=False)
            except Exception as exc:  # noqa: BLE001 - unreadable means "rebuild"
                return f"{self.paths['hnsw'].name}: not readable ({type(exc).__name__})"
        if cancelled():
            return None
        if not self.idx.use_graph(graph, ids, quantizer, self.vectors_of, cancelled, held):
            return None if cancelled() else "built with other settings, or damaged"
        return None

    def carry(self, gen: Path, base: str) -> dict[str, dict] | None:
        """Put the files into generation `gen` as `base`.*: a hard link when the original is
        still in place, else a copy of the open file. Their manifest entries, or None (not
        carried: a version-2 cache has no checksums to carry, or the files are gone)."""
        if self.sums is None or self.error is not None:
            return None
        with self._lock:
            if len(self.files) != len(self.paths):
                return None
            out: dict[str, dict] = {}
            for part, fh in self.files.items():
                want = self.sums.get(part)
                if want is None:
                    return None
                dst = gen / f"{base}.{part}"
                try:
                    st, own = os.stat(self.paths[part]), os.fstat(fh.fileno())
                    same = (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
                except OSError:
                    same = False
                try:
                    if same:
                        os.link(self.paths[part], dst)
                    else:  # replaced or deleted by another process: copy what we opened
                        shutil.copyfile(f"/proc/self/fd/{fh.fileno()}", dst)
                        _file_sum(dst, fsync=True)
                except OSError:
                    return None
                out[part] = dict(want)
            return out

    def close(self) -> None:
        with self._lock:
            for fh in self.files.values():
                fh.close()
            self.files = {}


class CacheDamaged(Exception):
    """A cache file that cannot be trusted: `file` (relative to index/) and why."""

    def __init__(self, file: str, why: str):
        super().__init__(f"{file}: {why}")
        self.file, self.why = file, why


class CacheLock:
    """An advisory lock on index/ shared by every process using the directory: exclusive to
    write, shared to read. The kernel drops it when its holder dies (even by SIGKILL)."""

    def __init__(self, d: Path, shared: bool, timeout_s: float = 30.0):
        self.path = d / LOCK_NAME
        self.shared, self.timeout_s = shared, timeout_s
        self._fd: int | None = None

    def acquire(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            if self.shared:  # a read-only store: nobody can be writing the cache either
                return True
            raise
        mode = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, mode)
                self._fd = fd
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.02)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __enter__(self) -> CacheLock:
        if not self.acquire():
            raise CacheDamaged(LOCK_NAME, f"another process kept it locked {self.timeout_s:.0f} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _body_sum(body: dict) -> str:
    rest = {k: v for k, v in body.items() if k != "checksum"}
    return f"{zlib.crc32(json.dumps(rest, sort_keys=True).encode()):08x}"


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CacheDamaged(MANIFEST, f"not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise CacheDamaged(MANIFEST, "not a JSON object")
    version = manifest.get("version")
    if version not in READABLE_VERSIONS:
        raise CacheDamaged(MANIFEST, f"version {version!r} is not one this release reads")
    if version >= 3 and manifest.get("checksum") != _body_sum(manifest):
        raise CacheDamaged(MANIFEST, "its checksum does not match its content")
    return manifest


def _crc(fh: IO[bytes], size: int | None = None, start: int = 0, crc: int = 0
         ) -> tuple[int, int]:
    """(bytes read up to, CRC-32) of an open file: bytes [start, size) (to the end when
    `size` is None) continuing `crc`, that of bytes [0, start). Read through one reused
    buffer: the page cache, not this process, holds what was read (about 2.4 GB/s here: 0.6 s
    for 1M rows' vectors). pread: the file position is left alone. ValueError when the
    file ends before `size`."""
    done, fd = start, fh.fileno()
    buf = bytearray(1 << 23)
    view = memoryview(buf)
    while size is None or done < size:
        want = len(buf) if size is None else min(len(buf), size - done)
        got = os.preadv(fd, [view[:want]], done)
        if got <= 0:
            if size is not None:
                raise ValueError(f"{fh.name} is shorter than {size} bytes")
            break
        crc = zlib.crc32(view[:got], crc)
        done += got
    return done, crc


def _crc_prefix(path: Path, size: int, start: int = 0, crc: int = 0) -> int:
    """CRC-32 of bytes [0, size) of a file, continuing `crc` (that of bytes [0, start))."""
    with open(path, "rb") as fh:
        return _crc(fh, size, start, crc)[1]


def _save_graph(graph: GraphIndex, gen: Path, base: str) -> dict[str, dict] | None:
    """Write a graph's files into `gen` as `base`.*; their manifest entries, or None when
    the graph has not been built."""
    if not graph.save_graph(gen / f"{base}.hnsw"):
        return None
    return {part: _file_sum(gen / f"{base}.{part}", fsync=True) for part in GRAPH_PARTS}


def _file_sum(path: Path, fsync: bool = False) -> dict:
    """Size and CRC-32 of a file (spare rows included: a hole reads as zeros, fast)."""
    with open(path, "rb") as fh:
        size, crc = _crc(fh)
        if fsync:
            os.fsync(fh.fileno())
    return {"size": size, "crc32": f"{crc:08x}"}


def _check_file(gen: Path, name: str, want: dict | None) -> None:
    path = gen / name
    if not path.is_file():
        if want is None:
            raise CacheDamaged(name, "the manifest lists no checksum for it")
        raise CacheDamaged(name, "missing")
    with open(path, "rb") as fh:
        _check_open_file(fh, name, want)


def _check_open_file(fh: IO[bytes], name: str, want: dict | None) -> None:
    if want is None:
        raise CacheDamaged(name, "the manifest lists no checksum for it")
    size = os.fstat(fh.fileno()).st_size
    if size != want.get("size"):
        raise CacheDamaged(name, f"{size} bytes where the manifest says {want.get('size')}")
    if f"{_crc(fh)[1]:08x}" != want.get("crc32"):
        raise CacheDamaged(name, "its checksum differs from the manifest's (damaged or "
                                 "replaced)")


def _unique_positive(ids: np.ndarray) -> bool:
    """Whether every id is positive and none repeats. Ids are nearly always stored in
    increasing order: one comparison pass then (np.unique takes 0.6 s per 350k ids here)."""
    if ids.min() <= 0:
        return False
    if (np.diff(ids) > 0).all():
        return True
    s = np.sort(ids)
    return bool((s[1:] != s[:-1]).all())


def _np_map(gen: Path, name: str) -> tuple[np.ndarray, int]:
    """A copy-on-write memory map of an .npy file: (an array over every row the file has room
    for, the number of rows its header holds). Writes to the array stay in this process."""
    try:
        with open(gen / name, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"npy version {version}")
            if fortran or dtype.hasobject or not shape:
                raise ValueError("not a C-ordered array of numbers")
            offset, size = fh.tell(), os.fstat(fh.fileno()).st_size
            row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            if row <= 0 or size < offset + shape[0] * row:
                raise ValueError("shorter than its header says")
            cap = (size - offset) // row
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise CacheDamaged(name, "missing") from None
    except Exception as exc:  # noqa: BLE001 - truncated or not an .npy file
        raise CacheDamaged(name, f"not a readable array ({type(exc).__name__})") from None
    count = cap * (row // dtype.itemsize)
    arr = np.frombuffer(mm, dtype, count=count, offset=offset).reshape((cap, *shape[1:]))
    return arr, int(shape[0])


def _write_npy(path: Path, arr: np.ndarray) -> dict:
    """Write `arr` as .npy followed by `spare_rows` of room (a hole: no disk blocks until
    written, and nothing ever writes it: rows added after a start go to private pages)."""
    arr = np.ascontiguousarray(arr)
    with open(path, "wb") as fh:
        np.save(fh, arr, allow_pickle=False)
        if arr.ndim:
            row = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
            fh.truncate(fh.tell() + spare_rows(len(arr)) * row)
        fh.flush()
        os.fsync(fh.fileno())
    return _file_sum(path)
