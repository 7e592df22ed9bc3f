"""The faiss objects a `GraphIndex` walks: one HNSW graph (over whole vectors or their
projection), or two halves over alternate nodes answering as one, and the helpers that
look through either (`halves_of`, `hnsw_of`, `project`, `clone`).

Kept apart from the index's bookkeeping so the build, the persistence and the calibration
see one graph type, whatever its shape.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import faiss
import numpy as np

faiss.omp_set_num_threads(1)  # single queries are faster on one thread (notes/offline-models.md)

HNSW_STORAGES = ("sq8", "flat")
# The 8-bit codes' quantizer: one value range for every dimension. Decoding a code is one
# multiply-add per component, not a range per dimension read beside it: a walk is faster at
# the same recall after the exact re-scoring, which makes up for the coarser codes
# (bench/results/NOTES.md, finding 17).
SQ_TYPE = faiss.ScalarQuantizer.QT_8bit_uniform
# Graphs over alternate nodes walked at once, one per core (see `Halves`): 2, or 1 (one
# graph) on a single core, where the two walks would run one after the other.
GRAPH_HALVES = (1, 2)


class Halves:
    """Two HNSW graphs over alternate nodes (node p is node p // 2 of half p % 2), walked at
    once on two cores; each half's best candidates are merged by their 8-bit scores, so it
    answers like one graph (`search`, `add`, `train`, `ntotal`) and the rest of
    `GraphIndex` (node positions, tombstones, the inverted file, calibration) is unchanged.

    Two walks from two entry points miss less than one walk half as deep again, on data
    whose near rows crowd each other's links; handing a half to the other thread has a cost
    of its own (bench/results/NOTES.md, finding 17)."""

    def __init__(self, halves: tuple[Half, ...]):
        self.halves = halves

    @property
    def ntotal(self) -> int:
        return sum(h.ntotal for h in self.halves)

    @property
    def d(self) -> int:
        return self.halves[0].d

    @property
    def is_trained(self) -> bool:
        return all(h.is_trained for h in self.halves)

    def train(self, x: np.ndarray) -> None:
        for h in self.halves:  # the same sample: the same ranges (one quantizer is saved)
            h.train(x)

    def add(self, x: np.ndarray) -> None:
        """Rows at the next positions, each to the half its position falls in."""
        n = len(self.halves)
        at = self.ntotal
        for s, h in enumerate(self.halves):
            mine = np.ascontiguousarray(x[(s - at) % n::n])
            if len(mine):
                h.add(mine)

    def search(self, q: np.ndarray, k: int, params: faiss.SearchParameters | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """The k best (scores, positions) of each query, as one graph would answer."""
        n = len(self.halves)
        later = [_walker().submit(h.search, q, k, params=params) for h in self.halves[1:]]
        got = [self.halves[0].search(q, k, params=params)] + [f.result() for f in later]
        scores = np.concatenate([d for d, _ in got], axis=1)
        pos = np.concatenate([np.where(p >= 0, p * n + s, -1) for s, (_, p) in enumerate(got)],
                             axis=1)
        best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, best, 1), np.take_along_axis(pos, best, 1)


# One HNSW graph, or one walking projected vectors (`GraphIndex`'s `dims`).
Half = faiss.IndexHNSW | faiss.IndexPreTransform
Graph = Half | Halves  # one graph, or two halves answering as one


def new_hnsw(dim: int, d: int, storage: str, m: int, ef_construction: int, ef_search: int,
             pca: faiss.PCAMatrix | None = None) -> Half:
    """An empty graph over `d` of the `dim` components (`d` < `dim`: behind a projection,
    `pca` when the caller fitted it already, else fitted when the graph is trained)."""
    index: faiss.IndexHNSW
    if storage == "sq8":
        # SQ_TYPE is an int in faiss's stubs; the constructor takes it as the quantizer type.
        index = faiss.IndexHNSWSQ(d, SQ_TYPE,  # type: ignore[arg-type]
                                  m, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexHNSWFlat(d, m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_construction
    index.hnsw.efSearch = ef_search
    if d == dim:
        return index
    # Training the graph leaves an already trained transform alone.
    return faiss.IndexPreTransform(pca if pca is not None else faiss.PCAMatrix(dim, d), index)


def halves_of(graph: Graph) -> tuple[Half, ...]:
    return graph.halves if isinstance(graph, Halves) else (graph,)


def hnsw_of(half: Half) -> faiss.IndexHNSW:
    """The HNSW graph itself (behind its projection, if any)."""
    if isinstance(half, faiss.IndexPreTransform):
        return cast(faiss.IndexHNSW, faiss.downcast_index(half.index))
    return half


def walked_dims(graph: Graph) -> int:
    """Components of each vector a graph links and walks (its projection's, if any)."""
    return int(hnsw_of(halves_of(graph)[0]).d)


def projection_of(half: Half) -> faiss.VectorTransform | None:
    if isinstance(half, faiss.IndexPreTransform):
        return faiss.downcast_VectorTransform(half.chain.at(0))  # type: ignore[attr-defined]
    return None


def project(half: Half, x: np.ndarray) -> np.ndarray:
    """Vectors as the graph walks them: projected, when it walks projections."""
    pca = projection_of(half)
    return x if pca is None else np.ascontiguousarray(pca.apply(x))


def clone(graph: Graph) -> Graph:
    halves = tuple(cast(Half, faiss.clone_index(h)) for h in halves_of(graph))
    return Halves(halves) if isinstance(graph, Halves) else halves[0]


@functools.lru_cache(maxsize=256)
def hnsw_params(ef: int) -> faiss.SearchParameters:
    """HNSW search parameters (faiss's stubs know neither the class nor its keywords), one
    object per efSearch: making one is a noticeable part of a query (finding 19), and a
    search only reads it."""
    params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
    params.efSearch = ef
    return params


_WALKERS: ThreadPoolExecutor | None = None
_WALKERS_LOCK = threading.Lock()


def _forget_walkers() -> None:
    """A forked child has none of its parent's threads: it starts its own walker (handing
    work to the parent's would wait forever)."""
    global _WALKERS, _WALKERS_LOCK
    _WALKERS, _WALKERS_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_walkers)


def _walker() -> ThreadPoolExecutor:
    """The thread that walks a second half while the searching thread walks the first (one
    per process: graph searches hold their graph's lock, so a second rarely waits)."""
    global _WALKERS
    with _WALKERS_LOCK:
        if _WALKERS is None:
            _WALKERS = ThreadPoolExecutor(max(GRAPH_HALVES) - 1, "graph-half",
                                          initializer=faiss.omp_set_num_threads,
                                          initargs=(1,))
        return _WALKERS
