"""What searches use while a first graph is built: a copy of the graph as far as the build
got (`PartialGraph`), with the coarse index of every row when the build made one, so a
search walks or probes most rows and scans only the rest exactly, instead of scanning them
all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memory_node.core.vectors.coarse import CoarseIndex
from memory_node.core.vectors.exact import ExactIndex, top_k
from memory_node.core.vectors.hnsw_graph import Graph, hnsw_params


@dataclass
class PartialGraph:
    """A copy of a first graph as far as its build got, and what it covers: per part code,
    (its rows [0, n) are nodes or held out, the part's layout then)."""

    graph: Graph
    ids: np.ndarray  # node -> id
    codes: np.ndarray  # node -> part code
    cover: dict[int, tuple[int, int]]
    held: np.ndarray  # rows held out of the graph (scored exactly)
    held_codes: np.ndarray
    held_vecs: np.ndarray  # their vectors, row for row
    coarse: CoarseIndex | None = None  # every row the build began with, but the held ones

    def search(self, q: np.ndarray, k: int, want: int, ef_for: Callable[[int], int],
               selected: list[tuple[int, ExactIndex]]) -> tuple[np.ndarray, np.ndarray] | None:
        """Top-k over the `selected` (part code, part) pairs: the copy's best `want`
        candidates and, with a coarse index, its best among the rows the copy lacks (among
        every row when it holds the recall target alone: walking a copy still being built
        costs more than probing the coarse index, bench/results/NOTES.md, finding 19),
        re-scored exactly; held-out rows and every row neither covers scored exactly (a
        matrix-vector product over each part's uncovered tail). None when a part's rows
        moved since the copy (a removal): the caller scans exactly."""
        cand_l: list[np.ndarray] = []
        codes_l: list[np.ndarray] = []
        alone = self.coarse is not None and self.coarse.alone
        if len(self.ids) and not alone:
            _, pos = self.graph.search(q.reshape(1, -1), want,
                                       params=hnsw_params(max(ef_for(len(self.ids)), want)))
            pos = pos[0][pos[0] >= 0]
            cand_l.append(self.ids[pos])
            codes_l.append(self.codes[pos])
        if self.coarse is not None:  # every row, or those not in the copy yet
            found, found_codes = self.coarse.search(q, want, 0 if alone else len(self.ids))
            cand_l.append(found)
            codes_l.append(found_codes)
        cand = np.concatenate(cand_l) if cand_l else np.empty(0, np.int64)
        cand_codes = np.concatenate(codes_l) if codes_l else np.empty(0, np.int16)
        mine = np.isin(self.held_codes, [c for c, _p in selected])
        ids_l, scores_l = [self.held[mine]], [self.held_vecs[mine] @ q]
        for c, part in selected:
            covered, layout = self.cover.get(c, (0, part.layout))
            if part.layout != layout:
                return None
            sel = np.unique(cand[cand_codes == c])
            for i, s in ([part.score_ids(sel, q)] if len(sel) else []) + (
                    [part.search_range(q, k, covered, len(part))] if len(part) > covered
                    else []):
                ids_l.append(i)
                scores_l.append(s)
        return top_k(np.concatenate(ids_l), np.concatenate(scores_l), k)
