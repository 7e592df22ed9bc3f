"""Searching a `GraphIndex` (`GraphSearch`): the parts exactly, or the graph's (or its
inverted file's, or a partial build's) candidates re-scored exactly with the parts' float
vectors, with the rows kept beside the graph (pending, held out) scored exactly."""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from memory_node.core.vectors.exact import top_k
from memory_node.core.vectors.graph_state import GraphState
from memory_node.core.vectors.hnsw_graph import hnsw_params

# A search restricted to some parts uses the graph only when they hold at least this share of
# its rows: it fetches the graph's nearest rows, 1/share times as many as an unrestricted
# search, and keeps those of the parts. Smaller selections are scanned exactly.
GRAPH_MIN_SHARE = 0.2


class GraphSearch:
    """Answers top-k queries over the parts of `state`."""

    def __init__(self, state: GraphState):
        self.state = state

    def names_of(self, parts: Collection[str] | None) -> list[str]:
        """The attached part names among `parts` (every one: None), in attach order."""
        st = self.state
        return list(st.parts) if parts is None else [p for p in st.parts if p in parts]

    def uses_graph(self, names: list[str]) -> bool:
        """Whether a search over `names` goes through the graph (or is exact: too few rows
        in all, or a restriction to too small a share of them)."""
        st = self.state
        sel_n = sum(len(st.parts[p]) for p in names)
        total = len(st)
        restricted = len(names) < len(st.parts)
        return not (total < st.min_rows or (restricted and (
            sel_n < st.min_rows or sel_n < GRAPH_MIN_SHARE * total)))

    def exact(self, query: np.ndarray, k: int, names: list[str]
              ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k over the named parts, exactly: one product per part, one ranking."""
        st = self.state
        q = np.asarray(query, np.float32).reshape(-1)
        got = [st.parts[n].search(q, k) for n in names if len(st.parts[n])]
        if not got:
            return top_k(np.empty(0, np.int64), np.empty(0, np.float32), k)
        return top_k(np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]),
                     k)

    def search(self, query: np.ndarray, k: int, names: list[str],
               ef_for: Callable[[int], int]) -> tuple[np.ndarray, np.ndarray, bool]:
        """Top-k over `names` through the graph (see `GraphIndex.search_parts`), and whether
        the answer is exact only because the graph is still being built. `ef_for`: the
        efSearch for a graph of n nodes, where no calibration says."""
        st = self.state
        sel_n = sum(len(st.parts[p]) for p in names)
        total = len(st)
        restricted = len(names) < len(st.parts)
        q = np.asarray(query, np.float32).reshape(-1)
        with st.lock:
            graph, dead = st.graph, st.dead
            pending, pending_codes = st.pending, st.pending_codes
            held = st.held_matrix() if len(st.held) else None
        if graph is None:
            partial = st.partial
            got = (partial.search(q, k, st.want(k), ef_for,
                                  [(st.names.index(n), st.parts[n]) for n in names])
                   if partial is not None and not restricted else None)
            return (*(got if got is not None else self.exact(q, k, names)), True)
        codes = tuple(st.names.index(p) for p in names)
        calib = None if restricted else st.current_calibration()
        if restricted:
            keep = np.isin(pending_codes, codes)
            pending, pending_codes = pending[keep], pending_codes[keep]
        else:
            st.recent.append(q)  # the next calibration measures these too
        # A few more than k so ties at the boundary are broken by id like the rest; `rerank`
        # candidates re-scored exactly; more when tombstones take some of them.
        want = max(k + 8, st.rerank if calib is None else calib.rerank)
        fetch = want if not restricted else int(np.ceil(want * total / max(1, sel_n)))
        with st.glock:  # graph, ids and codes as one (a background slice may extend them)
            graph, graph_ids, graph_codes = st.graph, st.node_ids, st.node_codes
            assert graph is not None  # once built, the graph is only ever replaced
            g = len(graph_ids)
            want_g = min(g, int(np.ceil(fetch * g / max(1, g - dead))) + (8 if dead else 0))
            if calib is not None and calib.nprobe is not None and st.ivf is not None:
                pos = st.ivf.positions(q.reshape(1, -1), want_g, calib.nprobe)
            else:
                ef = ef_for(g) if calib is None else calib.ef_search
                _, pos = graph.search(q.reshape(1, -1), want_g,
                                      params=hnsw_params(max(ef, want_g)))
        pos = pos[0][pos[0] >= 0]
        ids, scores, from_graph = self._rescored(q, graph_ids[pos], graph_codes[pos], pending,
                                                 pending_codes, codes)
        n_held = 0 if held is None else len(held[0])
        if from_graph < (min(k + 8, sel_n - len(pending) - n_held) if restricted
                         else min(k, sel_n - len(pending) - n_held)):
            # Too few of the graph's nearest rows are the parts' (their rows lie apart from
            # the query: a filter inside the walk would miss many of their nearest rows).
            return (*self.exact(q, k, names), False)
        if held is not None and n_held:
            h_ids, h_codes, h_vecs = held
            h_scores = h_vecs @ q
            # Only held rows reaching the candidates' k-th score can be in the answer (ties
            # kept): a top-k over a few rows instead of all of them.
            if len(scores) >= k:
                keep = h_scores >= np.partition(scores, len(scores) - k)[len(scores) - k]
            else:
                keep = np.ones(len(h_ids), bool)
            if restricted:
                keep &= np.isin(h_codes, codes)
            ids = np.concatenate([ids, h_ids[keep]])
            scores = np.concatenate([scores, h_scores[keep]])
        return (*top_k(ids, scores, k), False)

    def _rescored(self, q: np.ndarray, found: np.ndarray, found_codes: np.ndarray,
                  pending: np.ndarray, pending_codes: np.ndarray, codes: tuple[int, ...]
                  ) -> tuple[np.ndarray, np.ndarray, int]:
        """(ids, exact scores) of the graph's candidates and the pending rows that are in
        the parts `codes`, and how many came from the graph."""
        st = self.state
        # Ids once each (dead nodes left out: a row added again is pending under the id of
        # its dead node; a row replayed into a part twice is two live nodes), then a loop
        # over the parts they are in, not a mask and a sort per part. Without pending rows
        # the candidates are seldom alike: a set tells, and the sort is skipped.
        cand = np.concatenate([found, pending]) if len(pending) else found
        cand_codes = (np.concatenate([found_codes, pending_codes]) if len(pending)
                      else found_codes)
        live = cand_codes >= 0
        cand, cand_codes = cand[live], cand_codes[live]
        if len(pending) or len(set(cand.tolist())) < len(cand):
            cand, first = np.unique(cand, return_index=True)
            cand_codes = cand_codes[first]
        ids_l, scores_l = [], []
        for c in set(cand_codes.tolist()):
            if c in codes:
                i, s = st.parts[st.names[c]].score_ids(cand[cand_codes == c], q)
                ids_l.append(i)
                scores_l.append(s)
        ids = np.concatenate(ids_l) if ids_l else np.empty(0, np.int64)
        scores = np.concatenate(scores_l) if scores_l else np.empty(0, np.float32)
        return ids, scores, len(ids) - min(len(pending), len(ids))
