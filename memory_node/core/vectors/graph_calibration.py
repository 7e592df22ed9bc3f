"""When and how a `GraphIndex` measures itself (`GraphCalibration`): the cheapest efSearch
and rerank depth that hold the recall target, the inverted file kept beside the graph while
it may serve cheaper, and the projection given up when no depth holds the target over it.
The measuring itself is `calibrate.calibrate`; this decides what to measure and adopts it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from memory_node.core.vectors import calibrate as cal
from memory_node.core.vectors.coarse import CoarseIndex, rows_of
from memory_node.core.vectors.graph_state import GraphState
from memory_node.core.vectors.hnsw_graph import hnsw_params, walked_dims

log = logging.getLogger(__name__)

# Chooses the source that serves from the walk's and the inverted file's measurements.
Pick = Callable[[cal.Calibration, cal.Calibration], cal.Calibration]


class _Replaced(Exception):
    """The graph being calibrated was replaced (rebuilt) meanwhile."""


def pick_source(walk: cal.Calibration, ivf: cal.Calibration, mode: str) -> cal.Calibration:
    """The one to serve: whichever holds the target (both: the faster per query, as
    measured in the same calibration; `mode` "prefer": the inverted file); neither: the one
    with the higher recall."""
    if walk.met != ivf.met:
        return walk if walk.met else ivf
    if not walk.met:
        return ivf if ivf.recall_at_5 > walk.recall_at_5 else walk
    if mode == "prefer":
        return ivf
    return ivf if (ivf.search_us or 0.0) < (walk.search_us or 0.0) else walk


class GraphCalibration:
    """Calibrates the live graph of `state` (and its inverted file)."""

    def __init__(self, state: GraphState):
        self.state = state

    def due(self) -> bool:
        """A built graph not measured yet, grown by `calibrate.GROWTH` since, with enough
        queries now where it had too few, or with real queries past a new checkpoint."""
        st = self.state
        if st.recall_target <= 0 or st.graph is None:
            return False
        tried = st.calib_tried
        live = len(st.node_ids) - st.dead
        have = len(st.held) + len(st.recent)  # queries to measure with
        return (tried is None or tried[0] != st.serial or live > tried[1] * (1 + cal.GROWTH)
                or tried[2] < cal.MIN_QUERIES <= have
                # real queries came since: again as they pass each checkpoint
                or any(tried[3] < c <= len(st.recent) for c in cal.REAL_CHECKPOINTS))

    def ivf_due(self) -> bool:
        """A graph large enough for an inverted file beside it that has none (nor kept its
        walk against one on its full measurement)."""
        st = self.state
        return (st.ivf_mode != "off" and st.recall_target > 0 and st.graph is not None
                and st.ivf is None and st.ivf_declined != st.serial
                and len(st.node_ids) - st.dead >= st.coarse_min_rows)

    def calibrate(self, cancelled: Callable[[], bool], pick: Pick,
                  rebuild: Callable[[], None]) -> cal.Calibration | None:
        """Measure the graph and adopt the cheapest efSearch and rerank depth that hold the
        recall target; with an inverted file beside it, measure that too and let `pick`
        choose. A walk over projections that holds the target at no depth asks `rebuild`
        for one over whole vectors. Holds the graph lock for a few queries at a time."""
        st = self.state
        with st.lock:
            graph, serial = st.graph, st.serial
            if graph is None:
                return None
            with st.glock:
                graph_ids, codes, ivf = st.node_ids, st.node_codes, st.ivf
            parts = st.ordered_parts()
            recent = list(st.recent)
            held, held_codes = st.held, st.held_codes
            st.calib_tried = (serial, int((codes >= 0).sum()), len(held) + len(recent),
                              len(recent))
        snap_parts = []
        for p in parts:
            with p._lock:  # ids and rows as one view
                snap_parts.append((p.ids(), p.vectors()))
        own = rows_of(parts, held, held_codes, st.dim)[2]
        real = np.asarray(recent, np.float32).reshape(-1, st.dim)
        if len(own) + len(real) < cal.MIN_QUERIES:
            return None  # too few to measure: tried again once the graph grows

        def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
            with st.glock:  # a few queries at a time: searches wait a few ms at most
                if st.graph is not graph:
                    raise _Replaced
                _, pos = graph.search(q, k, params=hnsw_params(ef))
            return pos

        def probe(q: np.ndarray, k: int, nprobe: int) -> np.ndarray:
            with st.glock:
                if st.graph is not graph or st.ivf is not ivf:
                    raise _Replaced
                assert ivf is not None
                return ivf.positions(q, k, nprobe)

        snap = cal.Snapshot(search, graph_ids, codes, snap_parts)
        finders = [p.find for p in parts]
        try:
            result = cal.calibrate(snap, own, real, st.recall_target, cancelled, finders,
                                   serial)
            by_ivf = None if ivf is None or result is None else cal.calibrate(
                cal.Snapshot(probe, graph_ids, codes, snap_parts), own, real,
                st.recall_target, cancelled, finders, serial,
                grid=cal.ivf_grid(ivf.index.nlist), walk=False, reranks=cal.IVF_RERANKS,
                # it cannot serve slower than a walk that holds the target ("auto")
                max_us=result.search_us if result.met and st.ivf_mode == "auto" else None)
        except (_Replaced, IndexError):  # rebuilt (measured next), or rows removed meanwhile
            return None  # (measured again once it grows)
        if result is None or (ivf is not None and by_ivf is None):  # cancelled: again later
            with st.lock:
                st.calib_tried = None
            return None
        walked = walked_dims(graph)
        if not result.met and walked < st.dim:
            self._decline_projection(walked, result, rebuild)
        if by_ivf is not None and pick(result, by_ivf) is by_ivf:
            result = replace(by_ivf, ef_search=result.ef_search)
        with st.lock:
            if st.serial == serial:
                st.calibration = result
                if (ivf is not None and result.nprobe is None
                        and len(real) >= cal.RECENT_QUERIES):
                    with st.glock:  # the walk won on every real query kept: free the file
                        st.ivf, st.ivf_declined = None, serial
        return result

    def _decline_projection(self, walked: int, measured: cal.Calibration,
                            rebuild: Callable[[], None]) -> None:
        """A walk over projections that holds the target at no depth tried (data spread
        over more axes than it keeps): the graph is rebuilt over whole vectors, in the
        background (this one serves, with what it measured, until then)."""
        st = self.state
        log.warning("graph over %d-component projections of %d-d vectors reached recall@5 "
                    "%.3f at best (target %.2f): rebuilding it over whole vectors",
                    walked, st.dim, measured.recall_at_5, st.recall_target)
        with st.lock:
            st.graph_dims = st.dim
        rebuild()

    def build_ivf(self, cancelled: Callable[[], bool]) -> None:
        """Make the inverted file of a graph read or rebuilt (a first build keeps its coarse
        index): its live nodes' vectors at their positions, then the nodes added
        meanwhile; the next calibration weighs it against the walk."""
        st = self.state
        with st.lock:
            serial = st.serial
            with st.glock:
                graph_ids, codes = st.node_ids, st.node_codes
            parts = st.ordered_parts()
        ivf = CoarseIndex.over_nodes(st.dim, graph_ids, codes, parts, cancelled)
        if ivf is None:
            return
        with st.lock:
            if st.serial != serial or st.ivf is not None:
                return  # replaced meanwhile: made again for the new graph
            with st.glock:
                at, now = len(graph_ids), len(st.node_ids)
                if now > at:
                    ivf.fill(st.node_ids[at:], st.node_codes[at:], parts, at)
                st.ivf = ivf
            st.calib_tried = None  # measure it
