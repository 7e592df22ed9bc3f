"""The vector index interface: add, remove, and top-k by inner product, optionally restricted
to a candidate id set (the rows that passed every filter)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best by (score desc, id desc): the one ordering every implementation shares."""
    if len(ids) == 0 or k <= 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    if len(ids) > k:
        # Partition on score, keeping every id tied with the k-th score so ties break by id.
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        keep = np.nonzero(scores >= kth)[0]
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((-ids, -scores))[:k]
    return ids[order], scores[order]


class VectorIndex(ABC):
    """Vectors are L2-normalised float32; scores are inner products (cosine similarity)."""

    name = "base"

    def __init__(self, dim: int):
        self.dim = int(dim)

    @abstractmethod
    def add(self, ids: np.ndarray, vectors: np.ndarray, meta: np.ndarray | None = None) -> None:
        """Add vectors; `meta` is an optional (n, 3) float64 array of (t, x, y) per row that
        indexes able to pre-filter in memory keep (NaN: unknown)."""

    @abstractmethod
    def remove(self, ids: np.ndarray) -> int: ...

    @abstractmethod
    def search(
        self, query: np.ndarray, k: int, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (ids, scores). With `candidates`, only those ids are ranked, exactly."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def ids(self) -> np.ndarray: ...

    @property
    def exact(self) -> bool:
        """Whether an unrestricted search is exact (brute force) rather than approximate."""
        return True

    def _check(self, ids: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), -1)
        if vectors.shape[1] != self.dim:
            raise ValueError(f"vector dimension {vectors.shape[1]} != index dimension {self.dim}")
        return ids, vectors
