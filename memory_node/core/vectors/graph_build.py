"""Building a `GraphIndex`'s graph over every row of its parts (`GraphBuilder`): the graph's
shape (one or two halves, whole vectors or a projection), its 8-bit codes' training, the
rows held out of it for its calibration and, during a first build, the copies handed to
searches meanwhile (`PartialGraph`), after a coarse index of every row when there are many.
"""

from __future__ import annotations

from collections.abc import Callable

import faiss
import numpy as np

from memory_node.core.vectors import calibrate as cal
from memory_node.core.vectors.coarse import CoarseIndex, rows_of
from memory_node.core.vectors.graph_state import GraphState
from memory_node.core.vectors.hnsw_graph import Graph, Half, Halves, clone, new_hnsw
from memory_node.core.vectors.partial_graph import PartialGraph
from memory_node.core.vectors.projection import PROJECTION_MIN_ROWS, fitted_projection

# A first build publishes a copy of its graph for searches after at least this many rows.
PARTIAL_MIN_ROWS = 4096
# The most rows its codes (and a projection) are fitted on.
TRAIN_ROWS = 200_000
ADD_CHUNK = 2048  # rows added at a time (a build is cancellable between chunks)

# Hands searches a copy of the graph being built (`GraphBuilder.publish_partial`'s
# arguments): the facade passes its own, so a subclass or a test can watch the build.
Publish = Callable[..., None]


class GraphBuilder:
    """Builds graphs over the rows of `state`'s parts and makes them the live one."""

    def __init__(self, state: GraphState):
        self.state = state

    def new_graph(self, rows: int, sample: np.ndarray | None = None) -> Graph:
        """A graph for `rows` rows: over projections when there are enough to fit one and,
        with a `sample` of them, when it ranks their neighbours well enough (see
        `projection.PROJECTION_REACH`; the setting falls back to whole vectors if not)."""
        st = self.state
        d = st.graph_dims if rows >= PROJECTION_MIN_ROWS else st.dim
        pca: faiss.PCAMatrix | None = None
        if d < st.dim and sample is not None and len(sample) >= PROJECTION_MIN_ROWS:
            pca = fitted_projection(sample, d, st.recall_target, st.projection_reach)
            if pca is None:
                with st.lock:
                    st.graph_dims = d = st.dim

        def half() -> Half:
            return new_hnsw(st.dim, d, st.storage, st.m, st.ef_construction, st.ef_search,
                            pca)

        return Halves((half(), half())) if st.halves == 2 else half()

    def build(self, cancelled: Callable[[], bool], threads: int | None,
              publish: Publish) -> None:
        """Build a graph over every row of the parts (on `threads` cores) and adopt it; a
        first build hands searches copies of it meanwhile through `publish`."""
        st = self.state
        with st.lock:
            st.rebuild_asked = False
            # Rows below each part's length are never written again (a removal makes new
            # arrays; a vector file is only appended to), so these views stay valid while the
            # build runs unlocked.
            snap = [(c, st.parts[name].ids(), st.parts[name].vectors())
                    for c, name in enumerate(st.names)]
            layouts = [st.parts[name].layout for name in st.names]
            first = st.graph is None  # nothing serves searches but exact scans meanwhile
        total = sum(len(ids) for _c, ids, _v in snap)
        sample = np.empty((0, st.dim), np.float32)
        if total:  # the rows the 8-bit ranges (and a projection) are fitted on
            share = min(1.0, TRAIN_ROWS / total)
            sample = np.ascontiguousarray(np.concatenate(
                [v[: max(1, int(np.ceil(len(v) * share)))] for _c, _i, v in snap if len(v)]))
        graph = self.new_graph(total, sample)
        ids_out: list[np.ndarray] = []
        codes_out: list[np.ndarray] = []
        held = self.pick_held([ids for _c, ids, _v in snap], total)
        snap_ids = [i for _c, i, _v in snap]
        coarse: CoarseIndex | None = None
        # A first build hands searches a copy of the graph as far as it got, every eighth
        # of the rows: they walk it and scan only the rows it lacks exactly.
        publish_every = max(PARTIAL_MIN_ROWS, total // 8)
        added, next_publish = 0, publish_every
        if total:
            if threads:
                faiss.omp_set_num_threads(threads)  # this thread only (an OpenMP setting)
            try:
                if not graph.is_trained:  # 8-bit codes: one value range, every part
                    graph.train(sample)
                if first and total - len(held) >= st.coarse_min_rows:
                    coarse = CoarseIndex.build(st.dim, snap, held, st.want(5),
                                               st.recall_target, cancelled)
                    if coarse is None:
                        return  # cancelled
                    publish(graph, [], [], 0, snap[0][1], np.ones(len(snap[0][1]), bool), 0,
                            snap_ids, layouts, held, coarse)
                for c, ids, vecs in snap:
                    out = np.isin(ids, held) if len(held) else np.zeros(len(ids), bool)
                    for start in range(0, len(vecs), ADD_CHUNK):
                        if cancelled():
                            return
                        chunk = vecs[start:start + ADD_CHUNK]
                        if out[start:start + ADD_CHUNK].any():
                            chunk = chunk[~out[start:start + ADD_CHUNK]]
                        graph.add(np.ascontiguousarray(chunk))
                        added += len(chunk)
                        end = min(len(ids), start + ADD_CHUNK)
                        if first and next_publish <= added < total - len(held):
                            next_publish += publish_every
                            publish(graph, ids_out, codes_out, c, ids, out, end, snap_ids,
                                    layouts, held, coarse)
                    ids_out.append(ids[~out])
                    codes_out.append(np.full(int((~out).sum()), c, np.int16))
            finally:
                if threads:
                    faiss.omp_set_num_threads(1)
        # The coarse index numbers the rows as the graph's nodes: it stays, as the graph's
        # inverted file, for the calibration to weigh against the walk.
        st.adopt(graph, np.concatenate(ids_out) if ids_out else np.empty(0, np.int64),
                 np.concatenate(codes_out) if codes_out else np.empty(0, np.int16), held,
                 ivf=coarse if st.ivf_mode != "off" else None)
        st.partial = None
        st.builds += 1

    def publish_partial(self, graph: Graph, ids_out: list[np.ndarray],
                        codes_out: list[np.ndarray], c: int, ids: np.ndarray,
                        out: np.ndarray, end: int, snap_ids: list[np.ndarray],
                        layouts: list[int], held: np.ndarray,
                        coarse: CoarseIndex | None = None) -> None:
        """Hand searches a copy of the graph being built: parts before `c` whole, part `c`
        up to row `end` (rows `out` held out), later parts not yet. With a `coarse` index of
        every row the build began with, the copy and it cover them all."""
        st = self.state
        node_ids = np.concatenate([*ids_out, ids[:end][~out[:end]]])
        node_codes = np.concatenate([*codes_out, np.full(int((~out[:end]).sum()), c, np.int16)])
        cover = {cc: (len(i) if cc < c or coarse is not None else end if cc == c else 0,
                      layouts[cc]) for cc, i in enumerate(snap_ids)}
        # Held-out rows the copy covers (those beyond it are in the exact scan already).
        held_codes = np.full(len(held), -1, np.int16)
        for cc, i in enumerate(snap_ids):
            held_codes[np.isin(held, i[:cover[cc][0]])] = cc
        # Their vectors in one matrix: one small product a search (gathering them from the
        # parts on every search cost more than the coarse probe itself).
        held_rows = rows_of(st.ordered_parts(), held[held_codes >= 0],
                            held_codes[held_codes >= 0], st.dim)
        copy = clone(graph)  # cheap beside the build (finding 19); searched without any lock
        st.partial = PartialGraph(copy, node_ids, node_codes, cover, *held_rows, coarse)

    def pick_held(self, ids: list[np.ndarray], total: int) -> np.ndarray:
        """Ids to hold out of a graph (at most 1% of its rows): its calibration queries."""
        n = (min(cal.SAMPLE_QUERIES, total // 100) if self.state.recall_target > 0 else 0)
        if n < cal.MIN_QUERIES:
            return np.empty(0, np.int64)
        every = np.concatenate(ids)
        return np.random.default_rng(total).choice(every, n, replace=False)
