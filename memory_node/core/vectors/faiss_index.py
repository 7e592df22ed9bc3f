"""FAISS indexes: a flat (exact) one with id selectors, and HNSW for fast unfiltered search.

Filtered searches are always exact: HNSW with an id selector can miss allowed ids, so the HNSW
index keeps an exact twin and hands every restricted search to it. The twin also re-scores the
graph's candidates, which lets the graph store its vectors as 8-bit codes: a quarter of the
memory, and each hop of the search reads a quarter of the bytes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

from memory_node.core.vectors.base import VectorIndex, top_k
from memory_node.core.vectors.exact import ExactIndex

faiss.omp_set_num_threads(1)  # single queries are faster on one thread (notes/offline-models.md)


class FaissFlatIndex(VectorIndex):
    """IndexIDMap2(IndexFlatIP): exact, with `IDSelectorBatch` for candidate restriction."""

    name = "faiss-flat"

    def __init__(self, dim: int):
        super().__init__(dim)
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def ids(self) -> np.ndarray:
        return faiss.vector_to_array(self._index.id_map).astype(np.int64)

    def add(self, ids: np.ndarray, vectors: np.ndarray, meta: np.ndarray | None = None) -> None:
        ids, vectors = self._check(ids, vectors)
        if len(ids):
            with self._lock:
                self._index.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> int:
        ids = np.asarray(ids, np.int64).reshape(-1)
        with self._lock:
            return int(self._index.remove_ids(faiss.IDSelectorBatch(ids)))

    def search(
        self, query: np.ndarray, k: int, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(query, np.float32).reshape(1, -1)
        with self._lock:
            n = len(self)
            if n == 0:
                return top_k(np.empty(0, np.int64), np.empty(0, np.float32), k)
            params = None
            limit = n
            if candidates is not None:
                cand = np.asarray(candidates, np.int64)
                if len(cand) == 0:
                    return top_k(cand, np.empty(0, np.float32), k)
                # faiss's generated stubs miss the keyword arguments of SearchParameters.
                params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(cand))  # type: ignore[call-arg]
                limit = min(n, len(cand))
            # Ask for a few more than k so ties at the boundary are broken by id like the rest.
            kk = min(limit, k + 8)
            scores, ids = self._index.search(q, kk, params=params)
        ids, scores = ids[0], scores[0]
        ok = ids >= 0
        return top_k(ids[ok].astype(np.int64), scores[ok].astype(np.float32), k)


HNSW_STORAGES = ("sq8", "flat")
# A graph whose removed rows exceed this share of its nodes is rebuilt (in the background).
DEAD_REBUILD_SHARE = 0.2
# The most time a background step holds the graph while adding rows to it (queries wait that
# long at most); rows are added in chunks sized to it.
EXTEND_SLICE_S = 0.01


class HNSWIndex(VectorIndex):
    """HNSW (inner product) for unrestricted search once a stream is large; exact otherwise.

    Below `min_rows` vectors the graph is not built and every search is exact. `storage`
    "sq8" keeps 8-bit codes in the graph; "flat" keeps float copies. Either way the graph only
    proposes candidates: the best `rerank` are re-scored exactly with the twin's vectors.

    With a `scheduler` (what the engine's `IndexManager` passes: a background worker), a query
    never waits for graph work: until a graph is ready, unrestricted searches are exact
    (`building` says so); rows added later are searched exactly (`pending`) until the worker
    has added them to the graph; removed rows stay in the graph as tombstones that searches
    skip, and the graph is rebuilt in the background once they exceed `DEAD_REBUILD_SHARE`.
    Without a scheduler (a standalone index) the same work runs inside the search.
    """

    name = "hnsw"

    def __init__(self, dim: int, *, m: int = 48, ef_construction: int = 200,
                 ef_search: int = 128, min_rows: int = 20000, gather_max: int = 20000,
                 storage: str = "sq8", rerank: int = 40,
                 scheduler: Callable[[HNSWIndex], None] | None = None):
        super().__init__(dim)
        if storage not in HNSW_STORAGES:
            raise ValueError(f"unknown HNSW storage {storage!r}; known: {HNSW_STORAGES}")
        self.m, self.ef_construction, self.ef_search = m, ef_construction, ef_search
        self.storage, self.rerank = storage, rerank
        self.min_rows = min_rows
        self.exact_twin = ExactIndex(dim, gather_max=gather_max)
        self.scheduler = scheduler
        self._hnsw: faiss.Index | None = None
        self._hnsw_ids = np.empty(0, np.int64)  # graph position -> observation id
        self._pending = np.empty(0, np.int64)  # ids in the twin, not yet in the graph
        self._dead = 0  # graph nodes whose id was removed since (tombstones)
        self._rebuild_asked = False
        self.builds = 0  # graphs built over the whole index (not counting rows added later)
        self._scheduled = False
        self._chunk = 16  # pending rows added per background step, sized to EXTEND_SLICE_S
        self._lock = threading.RLock()  # state above
        self._glock = threading.Lock()  # the faiss graph object (search vs add)

    @property
    def exact(self) -> bool:
        return self._hnsw is None

    @property
    def building(self) -> bool:
        """True while the index is large enough for a graph but has none ready: unrestricted
        searches are then exact (slower, same answers)."""
        return self._hnsw is None and len(self) >= self.min_rows

    def __len__(self) -> int:
        return len(self.exact_twin)

    def ids(self) -> np.ndarray:
        return self.exact_twin.ids()

    def _new_graph(self) -> faiss.Index:
        index: faiss.IndexHNSW
        if self.storage == "sq8":
            # QT_8bit is an int in faiss's stubs; the constructor takes it as the quantizer type.
            index = faiss.IndexHNSWSQ(self.dim, faiss.ScalarQuantizer.QT_8bit,  # type: ignore[arg-type]
                                      self.m, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexHNSWFlat(self.dim, self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.ef_construction
        index.hnsw.efSearch = self.ef_search
        return index

    def ef_for(self, n: int) -> int:
        """efSearch grows with the graph: recall@5 fell to 0.92 at 1M rows with 128, while
        100k rows of MiniLM captions already reach 1.000 with 32."""
        return self.ef_search if n <= 200_000 else max(self.ef_search, 2 * self.ef_search)

    def _matches(self, graph: faiss.Index) -> bool:
        """Whether a loaded graph was built with this index's settings."""
        kind = faiss.IndexHNSWSQ if self.storage == "sq8" else faiss.IndexHNSWFlat
        return (isinstance(graph, kind) and graph.d == self.dim
                and graph.hnsw.nb_neighbors(1) == self.m  # type: ignore[attr-defined]
                and graph.hnsw.efConstruction == self.ef_construction)

    # ---- graph work: in the background with a scheduler, else inline ----------------------
    def needs_work(self) -> bool:
        with self._lock:
            if len(self) < self.min_rows:
                return False
            return self._needs_build() or len(self._pending) > 0

    def _needs_build(self) -> bool:
        return (self._hnsw is None or self._rebuild_asked
                or self._dead > DEAD_REBUILD_SHARE * max(1, len(self._hnsw_ids)))

    def request_rebuild(self) -> None:
        """Rebuild the graph in the background (the current one serves until then)."""
        with self._lock:
            self._rebuild_asked = True
        self.schedule()

    def schedule(self) -> None:
        """Ask the scheduler for graph work if there is any (no-op without one)."""
        if self.scheduler is None:
            return
        with self._lock:
            if self._scheduled or not self.needs_work():
                return
            self._scheduled = True
        self.scheduler(self)

    def work(self, cancelled: Callable[[], bool] = lambda: False,
             threads: int | None = None) -> bool:
        """One step of graph work: a full build, or adding a slice of pending rows. Returns
        whether more work remains. Called by the scheduler's worker (or inline)."""
        with self._lock:
            self._scheduled = False
            if len(self) < self.min_rows:
                return False
            rebuild = self._needs_build()
        if rebuild:
            self._build(cancelled, threads)
        else:
            self._extend(EXTEND_SLICE_S)
        return self.needs_work()

    def build(self) -> None:
        """Build the graph now, on every core, and add every pending row (benchmarks, tests
        and standalone use; the engine builds in the background)."""
        self._build(lambda: False, os.cpu_count() or 1)
        while self._extend(None):
            pass

    def _build(self, cancelled: Callable[[], bool], threads: int | None) -> None:
        with self._lock:
            self._rebuild_asked = False
            ids = self.exact_twin.ids()
            vecs = self.exact_twin.vectors()  # rows below n are never written again
        graph = self._new_graph()
        if len(vecs):
            if threads:
                faiss.omp_set_num_threads(threads)  # this thread only (an OpenMP setting)
            try:
                if not graph.is_trained:  # 8-bit codes: per-dimension ranges first
                    graph.train(np.ascontiguousarray(vecs[: 200_000]))
                for start in range(0, len(vecs), 2048):  # cancellable between chunks
                    if cancelled():
                        return
                    graph.add(np.ascontiguousarray(vecs[start:start + 2048]))
            finally:
                if threads:
                    faiss.omp_set_num_threads(1)
        self._adopt(graph, ids)
        self.builds += 1

    @property
    def pending(self) -> int:
        """Rows searched exactly beside the graph until the background adds them to it."""
        return len(self._pending)

    def _adopt(self, graph: faiss.Index, graph_ids: np.ndarray) -> None:
        """Make `graph` (whose node i holds id graph_ids[i]) the live one: rows added since
        are pending, rows removed since are tombstones."""
        with self._lock:
            cur = self.exact_twin.ids()
            live = np.isin(graph_ids, cur)
            pending = np.setdiff1d(cur, graph_ids[live])
            graph.hnsw.efSearch = self.ef_for(len(cur))  # type: ignore[attr-defined]  # an HNSW one
            with self._glock:
                self._hnsw, self._hnsw_ids = graph, np.asarray(graph_ids, np.int64)
            self._pending = pending
            self._dead = int((~live).sum())

    def _extend(self, slice_s: float | None) -> bool:
        """Add pending rows to the graph: one chunk sized to hold the graph about `slice_s`
        (queries wait that long at most), or all of them (None). Returns whether rows remain
        pending."""
        while True:
            with self._lock:
                if self._hnsw is None or not len(self._pending):
                    return False
                take = self._pending[: self._chunk if slice_s is not None else 4096]
                pos = self.exact_twin.positions(take)
                ids = self.exact_twin.ids_at(pos)
                vecs = np.ascontiguousarray(self.exact_twin.vectors()[pos])
                t0 = time.perf_counter()
                with self._glock:
                    self._hnsw.add(vecs)
                    self._hnsw_ids = np.concatenate([self._hnsw_ids, ids])
                self._pending = self._pending[len(take):]
                if slice_s is not None:
                    per_row = (time.perf_counter() - t0) / max(1, len(take))
                    self._chunk = int(min(4096, max(1, slice_s / max(per_row, 1e-7))))
                    return len(self._pending) > 0

    # ---- the index interface ------------------------------------------------------------------
    def add(self, ids: np.ndarray, vectors: np.ndarray, meta: np.ndarray | None = None) -> None:
        ids, vectors = self._check(ids, vectors)
        with self._lock:
            self.exact_twin.add(ids, vectors, meta)
            if self._hnsw is not None:
                self._pending = np.concatenate([self._pending, ids])
        self.schedule()

    def remove(self, ids: np.ndarray) -> int:
        ids = np.asarray(ids, np.int64).reshape(-1)
        with self._lock:
            removed = self.exact_twin.remove(ids)
            if removed and self._hnsw is not None:
                # Tombstones: searches drop ids the twin no longer has (no rebuild here).
                self._dead += int(np.isin(ids, self._hnsw_ids).sum())
                self._pending = self._pending[~np.isin(self._pending, ids)]
        if removed:
            self.schedule()
        return removed

    def search(
        self, query: np.ndarray, k: int, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if candidates is not None:
            return self.exact_twin.search(query, k, candidates)
        n = len(self)
        if n < self.min_rows:
            return self.exact_twin.search(query, k)
        if self.scheduler is None:  # standalone: do the graph work inline
            while self.needs_work():
                self.work(threads=os.cpu_count() or 1)
        else:
            self.schedule()
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            graph, dead, pending = self._hnsw, self._dead, self._pending
        if graph is None:
            return self.exact_twin.search(q, k)
        # A few more than k so ties at the boundary are broken by id like the rest; `rerank`
        # candidates re-scored exactly; more when tombstones take some of them.
        want = max(k + 8, self.rerank)
        with self._glock:  # graph and its ids as one (a background slice may extend both)
            graph, graph_ids = self._hnsw, self._hnsw_ids
            assert graph is not None  # once built, the graph is only ever replaced
            g = len(graph_ids)
            want_g = min(g, int(np.ceil(want * g / max(1, g - dead))) + (8 if dead else 0))
            _, pos = graph.search(q.reshape(1, -1), want_g)
        pos = pos[0][pos[0] >= 0]
        cand = graph_ids[pos]
        if len(pending):
            cand = np.concatenate([cand, pending])
        ids, scores = self.exact_twin.score_ids(np.unique(cand), q)
        if len(ids) - min(len(pending), len(ids)) < min(k, n - len(pending)):
            return self.exact_twin.search(q, k)  # tombstones took too many: exact instead
        return top_k(ids, scores, k)

    # ---- persistence of the graph (the expensive part to rebuild) -------------------------
    def save_graph(self, path: Path) -> bool:
        """Write the graph and its node ids (tombstones included; the loader drops them)."""
        with self._lock:
            if self._hnsw is None:
                return False
            with self._glock:
                tmp = path.with_suffix(path.suffix + ".tmp")
                faiss.write_index(self._hnsw, str(tmp))
                graph_ids = self._hnsw_ids.copy()
        np.save(path.with_suffix(".graph_ids.npy"), graph_ids)
        tmp.replace(path)
        return True

    def load_graph(self, path: Path) -> bool:
        """Adopt a saved graph built with the same settings: rows it lacks become pending,
        rows it has that are gone become tombstones. False (and no change) otherwise."""
        try:
            graph = faiss.read_index(str(path))  # already of its concrete class
            ids = np.load(path.with_suffix(".graph_ids.npy"))
        except Exception:  # noqa: BLE001 - a corrupt cache file just means "rebuild"
            return False
        return self.use_graph(graph, ids)

    def use_graph(self, graph: faiss.Index, ids: np.ndarray) -> bool:
        """Adopt a graph read elsewhere (node i holds id ids[i]) if it was built with these
        settings; False (and no change) otherwise."""
        if not self._matches(graph):  # other settings (or an older release): rebuild
            return False
        if graph.ntotal != len(ids) or ids.dtype != np.int64:
            return False
        self._adopt(graph, ids)
        self.schedule()
        return True
