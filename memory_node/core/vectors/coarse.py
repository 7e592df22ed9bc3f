"""The inverted-file coarse index of a graph's rows (`CoarseIndex`): 8-bit codes in lists
around k-means centres, numbered as the graph's nodes.

A first build makes one before the graph, so searches meanwhile probe it for the rows the
graph lacks instead of scanning them all exactly; once the graph is built it stays beside
it as its inverted file, which the calibration weighs against the walk (some data a graph
walks badly).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import faiss
import numpy as np

from memory_node.core.vectors.exact import ExactIndex, SlotRows
from memory_node.core.vectors.hnsw_graph import SQ_TYPE

# A first build of at least this many rows first indexes them coarsely (a few seconds where
# the graph takes minutes), and a graph of at least this many live rows keeps an inverted
# file beside it.
COARSE_MIN_ROWS = 20000
# Held-out rows a coarse index is measured with (their exact top 5 found as it is filled).
COARSE_QUERIES = 128
CHUNK = 8192  # rows read at a time while filling a coarse index
# Filling costs rows x lists products: the cap keeps it linear at a million rows.
COARSE_MAX_LISTS = 1024


@dataclass
class CoarseIndex:
    """An inverted file of 8-bit codes over the rows a first build began with (held rows
    left out), numbered in the order the build adds them to the graph: position i is graph
    node i once the build gets there, so the rows a copy of the graph lacks are positions
    from its node count on. A search probes `nprobe` of its lists, the fewest whose best
    `want` hold the exact top 5 of the held-out rows as often as the recall target asks
    (`recall_at_5`, measured when built; every list when none does: a scan of 8-bit codes,
    still a quarter of the bytes of an exact one)."""

    index: faiss.IndexIVFScalarQuantizer
    ids: np.ndarray  # position -> id
    codes: np.ndarray  # position -> part code
    nprobe: int
    recall_at_5: float | None  # of the held rows with `nprobe` (None: none held)
    alone: bool = False  # it holds the recall target: searches probe it for every row

    @classmethod
    def build(cls, dim: int, snap: list[tuple[int, np.ndarray, np.ndarray | SlotRows]],
              held: np.ndarray, want: int, recall_target: float,
              cancelled: Callable[[], bool]) -> CoarseIndex | None:
        """Train on a sample of every part, add every row but the held ones (measuring their
        exact top 5 on the way), pick `nprobe`; None if cancelled meanwhile."""
        keeps = [~np.isin(ids, held) if len(held) else np.ones(len(ids), bool)
                 for _c, ids, _v in snap]
        n = int(sum(int(k.sum()) for k in keeps))
        index, share = new_ivf(dim, n)
        index.train(np.ascontiguousarray(np.concatenate(
            [v[: max(1, int(np.ceil(len(v) * share)))] for _c, _i, v in snap if len(v)])))
        nlist = index.nlist
        queries = [np.asarray(v[start:start + CHUNK], np.float32)[~k[start:start + CHUNK]]
                   for (_c, _i, v), k in zip(snap, keeps, strict=True)
                   for start in range(0, len(v), CHUNK) if not k[start:start + CHUNK].all()]
        q = (np.concatenate(queries)[:COARSE_QUERIES] if queries
             else np.empty((0, dim), np.float32))
        best = np.full((len(q), 5), -np.inf, np.float32)  # their exact top 5 so far
        best_at = np.full((len(q), 5), -1, np.int64)
        ids_l, codes_l, at = [], [], 0
        for (c, ids, vecs), keep in zip(snap, keeps, strict=True):
            for start in range(0, len(vecs), CHUNK):
                if cancelled():
                    return None
                chunk = np.ascontiguousarray(
                    np.asarray(vecs[start:start + CHUNK], np.float32)[keep[start:start + CHUNK]])
                index.add_with_ids(chunk, np.arange(at, at + len(chunk), dtype=np.int64))
                if len(q) and len(chunk):
                    scores = np.concatenate([best, q @ chunk.T], axis=1)
                    where = np.concatenate([best_at, np.broadcast_to(
                        np.arange(at, at + len(chunk)), (len(q), len(chunk)))], axis=1)
                    top = np.argpartition(-scores, 4, axis=1)[:, :5]
                    best = np.take_along_axis(scores, top, 1)
                    best_at = np.take_along_axis(where, top, 1)
                at += len(chunk)
            ids_l.append(ids[keep])
            codes_l.append(np.full(int(keep.sum()), c, np.int16))
        nprobe, recall = nlist, None
        if len(q):
            for probe in sorted({max(1, nlist // d) for d in (32, 16, 8, 4, 2, 1)}):
                _, got = index.search(q, want, params=ivf_params(probe))
                recall = float(np.mean([len(set(g.tolist()) & set(b.tolist())) / 5
                                        for g, b in zip(got, best_at, strict=True)]))
                if recall >= recall_target:
                    nprobe = probe
                    break  # else every list: as good as the 8-bit codes' ranking gets
        return cls(index, np.concatenate(ids_l), np.concatenate(codes_l), nprobe, recall,
                   recall is not None and recall >= recall_target)

    @classmethod
    def over_nodes(cls, dim: int, graph_ids: np.ndarray, codes: np.ndarray,
                   parts: list[ExactIndex], cancelled: Callable[[], bool]
                   ) -> CoarseIndex | None:
        """An inverted file over a graph's live nodes, at their node positions (tombstones
        left out); None if cancelled meanwhile."""
        live = np.nonzero(codes >= 0)[0]
        index, share = new_ivf(dim, len(live))
        sample = live[np.linspace(0, len(live) - 1, max(1, int(len(live) * share))).astype(
            np.int64)]
        vecs = rows_of(parts, graph_ids[sample], codes[sample], dim)[2]
        index.train(vecs)
        out = cls(index, graph_ids, codes, index.nlist, None)
        for start in range(0, len(graph_ids), CHUNK):
            if cancelled():
                return None
            out.fill(graph_ids[start:start + CHUNK], codes[start:start + CHUNK], parts, start)
        return out

    def fill(self, ids: np.ndarray, codes: np.ndarray, parts: list[ExactIndex],
             at: int) -> None:
        """Add the rows `ids` (of parts `codes`) at positions from `at` on, those their
        parts still hold."""
        keep, vecs = gather_rows(parts, ids, codes, self.index.d)
        if keep.any():
            self.add(np.nonzero(keep)[0].astype(np.int64) + at, vecs[keep])

    def add(self, positions: np.ndarray, vecs: np.ndarray) -> None:
        """Rows at these positions (nodes the graph gained)."""
        self.index.add_with_ids(np.ascontiguousarray(vecs, np.float32), positions)

    def positions(self, q: np.ndarray, want: int, nprobe: int) -> np.ndarray:
        """The best `want` positions of each query (rows of `q`), -1 padded, probing
        `nprobe` lists."""
        _, pos = self.index.search(q, want, params=ivf_params(nprobe))
        return pos

    def search(self, q: np.ndarray, want: int, start: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, part codes) of the best `want` rows at positions from `start` on."""
        if start >= len(self.ids):
            return np.empty(0, np.int64), np.empty(0, np.int16)
        if start:  # (a selector is a test per row scanned)
            params = faiss.SearchParametersIVF()
            params.nprobe = self.nprobe
            params.sel = faiss.IDSelectorRange(start, len(self.ids))
            _, pos = self.index.search(q.reshape(1, -1), want, params=params)
        else:
            pos = self.positions(q.reshape(1, -1), want, self.nprobe)
        pos = pos[0][pos[0] >= 0]
        return self.ids[pos], self.codes[pos]


def new_ivf(dim: int, n: int) -> tuple[faiss.IndexIVFScalarQuantizer, float]:
    """An untrained inverted file of 8-bit codes for `n` rows, and the share of them to train
    it on: 2 sqrt(n) lists, at most COARSE_MAX_LISTS."""
    nlist = max(8, min(int(2 * np.sqrt(n)), COARSE_MAX_LISTS, n // 40))
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, SQ_TYPE,
                                          faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = 8  # coarse lists: a few k-means rounds are plenty
    return index, min(1.0, 40 * nlist / max(1, n))


@functools.lru_cache(maxsize=256)
def ivf_params(nprobe: int) -> faiss.SearchParameters:
    """Inverted-file search parameters, one object per number of lists probed."""
    params = faiss.SearchParametersIVF()
    params.nprobe = nprobe
    return params


def gather_rows(parts: list[ExactIndex], ids: np.ndarray, codes: np.ndarray, dim: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(whether its part still holds it, its vector or zeros) for each of the rows `ids`
    (of parts `codes`; -1: none), in the order given."""
    keep = np.zeros(len(ids), bool)
    vecs = np.zeros((len(ids), dim), np.float32)
    for c in np.unique(codes[codes >= 0]).tolist():
        sel = np.nonzero(codes == c)[0]
        hit, found = parts[c].vectors_of(ids[sel])
        vecs[sel[hit]], keep[sel[hit]] = found.reshape(-1, dim), True
    return keep, vecs


def rows_of(parts: list[ExactIndex], ids: np.ndarray, codes: np.ndarray, dim: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, part codes, vectors) of the rows `ids` (of parts `codes`) that their parts still
    hold, in the order given: the held-out rows as one matrix."""
    keep, vecs = gather_rows(parts, ids, codes, dim)
    return ids[keep], codes[keep], np.ascontiguousarray(vecs[keep])
