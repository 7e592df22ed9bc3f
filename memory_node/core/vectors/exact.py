"""Exact index over a contiguous numpy matrix: the reference every other index is checked
against, and the scorer of filtered candidate sets."""

from __future__ import annotations

import threading

import numpy as np

from memory_node.core.vectors.base import VectorIndex, top_k


class ExactIndex(VectorIndex):
    """Brute-force inner product. Small candidate sets are gathered and scored; large ones are
    scored by one matrix-vector product over everything, then masked (cheaper than a gather)."""

    name = "exact"

    def __init__(self, dim: int, gather_max: int = 20000):
        super().__init__(dim)
        self.gather_max = gather_max
        self._ids = np.empty(0, np.int64)
        self._vecs = np.empty((0, dim), np.float32)
        self._n = 0
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._n

    def ids(self) -> np.ndarray:
        return self._ids[: self._n].copy()

    def vectors(self) -> np.ndarray:
        return self._vecs[: self._n]

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        ids, vectors = self._check(ids, vectors)
        if len(ids) == 0:
            return
        with self._lock:
            need = self._n + len(ids)
            if need > len(self._ids):
                cap = max(need, 2 * len(self._ids), 1024)
                new_ids = np.empty(cap, np.int64)
                new_vecs = np.empty((cap, self.dim), np.float32)
                new_ids[: self._n] = self._ids[: self._n]
                new_vecs[: self._n] = self._vecs[: self._n]
                self._ids, self._vecs = new_ids, new_vecs
            self._ids[self._n : need] = ids
            self._vecs[self._n : need] = vectors
            self._n = need
            self._sorted = None

    def remove(self, ids: np.ndarray) -> int:
        ids = np.asarray(ids, np.int64).reshape(-1)
        with self._lock:
            keep = ~np.isin(self._ids[: self._n], ids)
            removed = int(self._n - keep.sum())
            if removed:
                self._ids = self._ids[: self._n][keep].copy()
                self._vecs = self._vecs[: self._n][keep].copy()
                self._n = len(self._ids)
                self._sorted = None
            return removed

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of the given ids (ids not in the index are dropped)."""
        with self._lock:
            if self._sorted is None:
                order = np.argsort(self._ids[: self._n], kind="stable")
                self._sorted = (self._ids[: self._n][order], order)
            sorted_ids, order = self._sorted
        if len(sorted_ids) == 0:
            return np.empty(0, np.int64)
        idx = np.searchsorted(sorted_ids, ids)
        idx[idx >= len(sorted_ids)] = 0
        hit = sorted_ids[idx] == ids
        return order[idx[hit]]

    def get(self, ids: np.ndarray) -> np.ndarray:
        return self._vecs[self.positions(np.asarray(ids, np.int64))]

    def search(
        self, query: np.ndarray, k: int, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            n = self._n
            ids_all, vecs = self._ids[:n], self._vecs[:n]
            if candidates is None:
                return top_k(ids_all, vecs @ q, k)
            pos = self.positions(np.asarray(candidates, np.int64))
            if len(pos) <= self.gather_max:
                return top_k(ids_all[pos], vecs[pos] @ q, k)
            return top_k(ids_all[pos], (vecs @ q)[pos], k)
