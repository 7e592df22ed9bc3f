"""The index registry: the in-memory vector indexes, kept in step with memory.db through the
store's change feed (`VectorFeed`). One exact index per (embedding model, stream), and one
HNSW graph per embedding model over the rows of all its streams (built and extended in the
background by `GraphWorker`; searches are exact until it is ready).

`IndexManager` is the facade the engine and the planner use: lookup and search, catching up
with the feed, start-up (load the cache or rebuild from memory.db) and persisting. The cache
files themselves (manifest, lock, checksums, load, verify, write) are
`core/vectors/index_cache.py`; the background thread is `core/vectors/graph_worker.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from memory_node.core.config import MemoryConfig
from memory_node.core.store.base import KeyVectors, VectorFeed
from memory_node.core.store.vector_files import DIR_NAME, row_crcs
from memory_node.core.vectors.exact import ExactIndex
from memory_node.core.vectors.faiss_index import GraphIndex
from memory_node.core.vectors.graph_worker import GraphWorker
from memory_node.core.vectors.index_cache import (
    CacheDamaged,
    CacheLock,
    GraphSource,
    IndexCache,
    Key,
    row_meta,
)

__all__ = ["PERSIST_LOCK_TIMEOUT_S", "CacheDamaged", "CacheLock", "GraphSource", "GraphWorker",
           "IndexManager", "Key"]

log = logging.getLogger(__name__)

PERSIST_LOCK_TIMEOUT_S = 30.0  # how long a writer waits for another process's write


class _Adds:
    """Rows of one key from a run of the change feed: ids, where their vectors are, meta."""

    def __init__(self, dim: int):
        self.dim = dim
        self.ids: list[int] = []
        self.gens: list[int] = []
        self.slots: list[int] = []
        self.metas: list[tuple[float, float, float]] = []


class IndexManager:
    """Which index serves each (model, stream) and which graph each model: the engine's and
    the planner's one door to the vector indexes, their cache and their background work."""

    def __init__(self, config: MemoryConfig, store: VectorFeed):
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
        self._cache = IndexCache(config.index_dir, store, self._new)

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
                recall_target=c.hnsw_recall_target, ivf=c.hnsw_ivf, halves=c.hnsw_halves,
                dims=c.hnsw_dims)
        return graph

    def _attach(self, indexes: dict[Key, ExactIndex]) -> dict[str, GraphIndex]:
        """Make `indexes` the exact indexes, each covered by its model's graph; the graphs."""
        self._indexes, self._graphs = {}, {}
        for key, idx in indexes.items():
            self._indexes[key] = idx
            self._graph_of(key[0], idx.dim).attach(key[1], idx)
        return self._graphs

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
            if state == "ready":
                entry["graph_dims"] = graph.walked_dims
            c = graph.current_calibration()
            if state == "ready" and c is not None:
                entry.update(searched_by=c.searched_by, nprobe=c.nprobe,
                             ef_search=c.ef_search, rerank=c.rerank, recall_at_5=c.recall_at_5,
                             recall_at_10=c.recall_at_10, recall_target=c.target,
                             target_met=c.met, calibrated_rows=c.rows,
                             calibration_queries=c.queries)
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
                    add.metas.append(row_meta(ch.t, ch.x, ch.y))
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
        """Make the cache's indexes and graphs the registry's (False: there is no cache)."""
        loaded = self._cache.load(self._key_from_db, self._attach, self._archived_vectors)
        if loaded is None:
            return False
        self._drop_graph_sources()
        self._seq, self._graph_sources = loaded
        if self._graph_sources:  # ahead of any graph build the feed or a search may schedule
            self._graphs_read.clear()
            self._worker.submit(self._load_graphs)
        return True

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

    def _verify_sample(self) -> CacheDamaged | None:
        """The loaded cache checked against a sample of memory.db's rows (`IndexCache`)."""
        with self._lock:
            return self._cache.verify_sample(self._indexes, self._seq, self.contains)

    # ---- persistence ------------------------------------------------------------------------
    def persist(self, lock_timeout_s: float | None = None) -> bool:
        """Write the cache (`IndexCache.write`: the previous cache or the new one survives a
        crash, never a mix). True when written, False when another process held the cache's
        lock for `lock_timeout_s`; OSError when it cannot be written."""
        if lock_timeout_s is None:
            lock_timeout_s = PERSIST_LOCK_TIMEOUT_S
        with self._lock:
            seq = self._seq
            snap = [(key, idx, *idx.snapshot(), idx.source) for key, idx
                    in self._indexes.items()]
            graphs = [(m, g, self._graph_sources.get(m)) for m, g in self._graphs.items()]
        if not self._cache.write(seq, snap, graphs, lock_timeout_s):
            return False
        self._last_persist = time.monotonic()
        return True

    def maybe_persist(self) -> bool:
        if time.monotonic() - self._last_persist < self.config.index_persist_interval_s:
            return False
        return self.persist()
