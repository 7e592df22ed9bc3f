"""FAISS indexes: a flat (exact) one with id selectors, and HNSW for fast unfiltered search.

Filtered searches are always exact: HNSW with an id selector can miss allowed ids, so the HNSW
index keeps an exact twin and hands every restricted search to it. The twin also re-scores the
graph's candidates, which lets the graph store its vectors as 8-bit codes: a quarter of the
memory, and each hop of the search reads a quarter of the bytes.
"""

from __future__ import annotations

import os
import threading
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
                params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(cand))
                limit = min(n, len(cand))
            # Ask for a few more than k so ties at the boundary are broken by id like the rest.
            kk = min(limit, k + 8)
            scores, ids = self._index.search(q, kk, params=params)
        ids, scores = ids[0], scores[0]
        ok = ids >= 0
        return top_k(ids[ok].astype(np.int64), scores[ok].astype(np.float32), k)


HNSW_STORAGES = ("sq8", "flat")


class HNSWIndex(VectorIndex):
    """HNSW (inner product) for unrestricted search once a stream is large; exact otherwise.

    Below `min_rows` vectors the graph is not built and every search is exact. `storage`
    "sq8" keeps 8-bit codes in the graph and re-scores its best `rerank` candidates exactly
    with the twin's float vectors; "flat" keeps float copies in the graph.
    """

    name = "hnsw"

    def __init__(self, dim: int, *, m: int = 48, ef_construction: int = 200,
                 ef_search: int = 128, min_rows: int = 20000, gather_max: int = 20000,
                 storage: str = "sq8", rerank: int = 40):
        super().__init__(dim)
        if storage not in HNSW_STORAGES:
            raise ValueError(f"unknown HNSW storage {storage!r}; known: {HNSW_STORAGES}")
        self.m, self.ef_construction, self.ef_search = m, ef_construction, ef_search
        self.storage, self.rerank = storage, rerank
        self.min_rows = min_rows
        self.exact_twin = ExactIndex(dim, gather_max=gather_max)
        self._hnsw: faiss.Index | None = None
        self._hnsw_ids = np.empty(0, np.int64)  # hnsw position -> observation id
        self._dirty = False
        self._lock = threading.RLock()

    @property
    def exact(self) -> bool:
        return self._hnsw is None

    def __len__(self) -> int:
        return len(self.exact_twin)

    def ids(self) -> np.ndarray:
        return self.exact_twin.ids()

    def _new_graph(self) -> faiss.Index:
        if self.storage == "sq8":
            index = faiss.IndexHNSWSQ(self.dim, faiss.ScalarQuantizer.QT_8bit, self.m,
                                      faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexHNSWFlat(self.dim, self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.ef_construction
        index.hnsw.efSearch = self.ef_search
        return index

    def build(self) -> None:
        """(Re)build the graph from the exact twin's vectors, on every core (queries stay on
        one thread: that is faster for a single query)."""
        with self._lock:
            graph = self._new_graph()
            vecs = np.ascontiguousarray(self.exact_twin.vectors())
            if len(vecs):
                faiss.omp_set_num_threads(os.cpu_count() or 1)
                try:
                    if not graph.is_trained:  # 8-bit codes: per-dimension ranges first
                        graph.train(vecs)
                    graph.add(vecs)
                finally:
                    faiss.omp_set_num_threads(1)
            graph.hnsw.efSearch = self.ef_for(len(vecs))
            self._hnsw, self._hnsw_ids = graph, self.exact_twin.ids()
            self._dirty = False

    def ef_for(self, n: int) -> int:
        """efSearch grows with the graph: recall@5 fell to 0.92 at 1M rows with 128, while
        100k rows of MiniLM captions already reach 1.000 with 32."""
        return self.ef_search if n <= 200_000 else max(self.ef_search, 2 * self.ef_search)

    def _matches(self, graph: faiss.Index) -> bool:
        """Whether a loaded graph was built with this index's settings."""
        kind = faiss.IndexHNSWSQ if self.storage == "sq8" else faiss.IndexHNSWFlat
        return (isinstance(graph, kind) and graph.d == self.dim
                and graph.hnsw.nb_neighbors(1) == self.m
                and graph.hnsw.efConstruction == self.ef_construction)

    def add(self, ids: np.ndarray, vectors: np.ndarray, meta: np.ndarray | None = None) -> None:
        ids, vectors = self._check(ids, vectors)
        with self._lock:
            self.exact_twin.add(ids, vectors, meta)
            if self._hnsw is not None and not self._dirty:
                self._hnsw.add(vectors)
                self._hnsw_ids = np.concatenate([self._hnsw_ids, ids])

    def remove(self, ids: np.ndarray) -> int:
        with self._lock:
            removed = self.exact_twin.remove(ids)
            if removed and self._hnsw is not None:
                self._dirty = True  # HNSW cannot delete: rebuilt on next unrestricted search
            return removed

    def search(
        self, query: np.ndarray, k: int, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if candidates is not None:
            return self.exact_twin.search(query, k, candidates)
        with self._lock:
            if len(self) < self.min_rows:
                return self.exact_twin.search(query, k)
            if self._hnsw is None or self._dirty:
                self.build()
            q = np.asarray(query, np.float32).reshape(1, -1)
            # A few more than k so ties at the boundary are broken by id like the rest; with
            # 8-bit codes, `rerank` candidates re-scored exactly.
            want = k + 8 if self.storage == "flat" else max(k + 8, self.rerank)
            scores, pos = self._hnsw.search(q, min(len(self), want))
            pos = pos[0][pos[0] >= 0]
            if self.storage == "flat":
                scores = scores[0][: len(pos)]
            else:  # graph position == twin position while the graph is clean
                scores = self.exact_twin.vectors()[pos] @ q[0]
            ids = self._hnsw_ids[pos]
        return top_k(ids, scores.astype(np.float32), k)

    # ---- persistence of the graph (the expensive part to rebuild) -------------------------
    def save_graph(self, path: Path) -> bool:
        with self._lock:
            if self._hnsw is None or self._dirty:
                return False
            tmp = path.with_suffix(path.suffix + ".tmp")
            faiss.write_index(self._hnsw, str(tmp))
            np.save(path.with_suffix(".graph_ids.npy"), self._hnsw_ids)
            tmp.replace(path)
            return True

    def load_graph(self, path: Path) -> bool:
        """Adopt a saved graph if it covers exactly a prefix of the current ids; else False."""
        try:
            graph = faiss.read_index(str(path))  # already of its concrete class
            ids = np.load(path.with_suffix(".graph_ids.npy"))
        except Exception:  # noqa: BLE001 - a corrupt cache file just means "rebuild"
            return False
        if not self._matches(graph):  # other settings (or an older release): rebuild
            return False
        with self._lock:
            cur = self.exact_twin.ids()
            if graph.ntotal != len(ids) or len(ids) > len(cur):
                return False
            if not np.array_equal(cur[: len(ids)], ids):
                return False
            graph.hnsw.efSearch = self.ef_for(len(cur))
            rest = cur[len(ids):]
            if len(rest):
                graph.add(np.ascontiguousarray(self.exact_twin.get(rest)))
            self._hnsw, self._hnsw_ids, self._dirty = graph, cur, False
            return True
