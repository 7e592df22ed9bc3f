"""What the parts of a `GraphIndex` share (`GraphState`): its settings, the exact indexes it
covers, the live graph with its node ids, and the rows kept beside it (pending, held out,
removed), with the bookkeeping that keeps them consistent as rows come and go.

One object under one lock, so the build, the calibration, the persistence and the search
see the same graph and rows; each of them lives in a module of its own.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from memory_node.core.config import MIN_GRAPH_DIMS
from memory_node.core.vectors import calibrate as cal
from memory_node.core.vectors.coarse import COARSE_MIN_ROWS, CoarseIndex, rows_of
from memory_node.core.vectors.exact import ExactIndex
from memory_node.core.vectors.hnsw_graph import GRAPH_HALVES, HNSW_STORAGES, Graph
from memory_node.core.vectors.partial_graph import PartialGraph
from memory_node.core.vectors.projection import PROJECTION_REACH

# Whether an inverted file is kept beside the graph: "auto" (the faster of the two once
# calibrated), "prefer" (the file whenever it holds the recall target), "off".
IVF_MODES = ("auto", "prefer", "off")
# A graph whose removed rows exceed this share of its nodes is rebuilt (in the background).
DEAD_REBUILD_SHARE = 0.2


class GraphState:
    """Settings, parts and the live graph of one `GraphIndex`. `lock` guards the state;
    `glock` the faiss graph object (a search against rows being added to it)."""

    def __init__(self, dim: int, *, m: int, ef_construction: int, ef_search: int,
                 min_rows: int, storage: str, rerank: int, recall_target: float, ivf: str,
                 halves: int, dims: int, coarse_min_rows: int = COARSE_MIN_ROWS,
                 projection_reach: int = PROJECTION_REACH):
        if storage not in HNSW_STORAGES:
            raise ValueError(f"unknown HNSW storage {storage!r}; known: {HNSW_STORAGES}")
        if ivf not in IVF_MODES:
            raise ValueError(f"unknown inverted-file mode {ivf!r}; known: {IVF_MODES}")
        if halves not in GRAPH_HALVES:
            raise ValueError(f"halves must be one of {GRAPH_HALVES}, not {halves!r}")
        self.dim = int(dim)
        if dims < 0 or 0 < dims < MIN_GRAPH_DIMS:
            raise ValueError(f"graph dims must be 0 (the vectors' own) or >= {MIN_GRAPH_DIMS}")
        # Components the graph walks: the vectors' own when not fewer.
        self.graph_dims = int(dims) if 0 < dims < self.dim else self.dim
        # Two walks at once need two cores: on one they would take turns (twice one's time).
        self.halves = halves if (os.cpu_count() or 1) >= 2 else 1
        self.m, self.ef_construction, self.ef_search = m, ef_construction, ef_search
        self.storage, self.rerank = storage, rerank
        self.min_rows = min_rows
        self.recall_target = float(recall_target)
        self.ivf_mode = ivf
        self.coarse_min_rows = coarse_min_rows  # see `coarse.COARSE_MIN_ROWS`
        self.projection_reach = projection_reach  # see `projection.PROJECTION_REACH`
        self.calibration: cal.Calibration | None = None
        self.recent = cal.RecentQueries(cal.RECENT_QUERIES)  # distinct real queries
        self.serial = 0  # graphs adopted (a calibration holds for the graph it measured)
        self.parts: dict[str, ExactIndex] = {}
        self.names: list[str] = []  # part code -> part name
        self.graph: Graph | None = None
        self.node_ids = np.empty(0, np.int64)  # graph position -> observation id
        self.node_codes = np.empty(0, np.int16)  # graph position -> part code (-1: removed)
        self.pending = np.empty(0, np.int64)  # ids in a part, not yet in the graph
        self.pending_codes = np.empty(0, np.int16)
        # Rows held out of the graph (scanned exactly beside it, like pending rows): the
        # queries a calibration measures it with, as it would a query that is not a node.
        self.held = np.empty(0, np.int64)
        self.held_codes = np.empty(0, np.int16)
        # (ids, codes, vectors) of the held rows, copied together: one small product a search
        self.held_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # (graph serial, live rows, queries, real ones) when last measured or tried
        self.calib_tried: tuple[int, int, int, int] | None = None
        self.partial: PartialGraph | None = None  # the first build so far, while it runs
        # An inverted file over the graph's nodes (same positions), kept beside it while a
        # calibration may still find it the cheaper of the two.
        self.ivf: CoarseIndex | None = None
        self.ivf_declined = -1  # the graph serial whose full calibration kept the walk
        self.dead = 0  # graph nodes whose id was removed since (tombstones)
        self.rebuild_asked = False
        self.builds = 0  # graphs built over every part (not counting rows added later)
        self.scheduled = False
        self.chunk = 16  # pending rows added per background step, sized to its time slice
        self.lock = threading.RLock()  # state above
        self.glock = threading.Lock()  # the faiss graph object (search vs add)

    def __len__(self) -> int:
        return sum(len(p) for p in list(self.parts.values()))

    def ordered_parts(self) -> list[ExactIndex]:
        """The parts by code."""
        return [self.parts[name] for name in self.names]

    def want(self, k: int) -> int:
        """Candidates re-scored exactly for a top-k (a few more than k, so ties at the
        boundary break by id; at least `rerank`)."""
        return max(k + 8, self.rerank)

    def current_calibration(self) -> cal.Calibration | None:
        """The calibration serving unrestricted searches now (None: not measured yet)."""
        c = self.calibration
        return c if c is not None and c.serial == self.serial else None

    def held_matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The held rows' ids, part codes and vectors in one array (call under the lock)."""
        rows = self.held_rows
        if rows is None:
            rows = self.held_rows = rows_of(self.ordered_parts(), self.held, self.held_codes,
                                            self.dim)
        return rows

    # ---- rows ---------------------------------------------------------------------------------
    def attach(self, name: str, part: ExactIndex) -> None:
        with self.lock:
            if name in self.parts:
                raise ValueError(f"part {name!r} is already attached")
            if part.dim != self.dim:
                raise ValueError(f"part dimension {part.dim} != graph dimension {self.dim}")
            self.parts[name] = part
            self.names.append(name)
            if self.graph is not None and len(part):
                self._pend(part.ids(), len(self.names) - 1)

    def add_rows(self, name: str, ids: np.ndarray, vectors: np.ndarray | None,
                 meta: np.ndarray | None, slots: np.ndarray | None) -> None:
        with self.lock:
            self.parts[name].add(ids, vectors, meta, slots)
            if self.graph is not None:
                self._pend(np.asarray(ids, np.int64).reshape(-1), self.names.index(name))

    def _pend(self, ids: np.ndarray, code: int) -> None:
        self.pending = np.concatenate([self.pending, ids])
        self.pending_codes = np.concatenate([self.pending_codes,
                                             np.full(len(ids), code, np.int16)])

    def remove_rows(self, ids: np.ndarray) -> int:
        with self.lock:
            removed = sum(p.remove(ids) for p in self.parts.values())
            if removed and self.graph is not None:
                self.dead += int(np.isin(ids, self.node_ids).sum())
                keep = ~np.isin(self.pending, ids)
                self.pending, self.pending_codes = self.pending[keep], self.pending_codes[keep]
                keep = ~np.isin(self.held, ids)
                self.held, self.held_codes = self.held[keep], self.held_codes[keep]
                self.held_rows = None
        return removed

    def needs_build(self) -> bool:
        return (self.graph is None or self.rebuild_asked
                or self.dead > DEAD_REBUILD_SHARE * max(1, len(self.node_ids)))

    # ---- the live graph -----------------------------------------------------------------------
    def adopt(self, graph: Graph, graph_ids: np.ndarray, codes: np.ndarray | None = None,
              held: np.ndarray | None = None, ivf: CoarseIndex | None = None) -> None:
        """Make `graph` (whose node i holds id graph_ids[i], of part codes[i]; looked up in the
        parts when not given) the live one: rows added since are pending, rows removed since
        are tombstones. `ivf`: an inverted file over the same nodes (else none until one is
        made in the background)."""
        graph_ids = np.asarray(graph_ids, np.int64)
        with self.lock:
            new_codes = np.full(len(graph_ids), -1, np.int16)
            pend, pend_codes = [], []
            for c, name in enumerate(self.names):
                cur = self.parts[name].ids()
                if codes is None:
                    mine = np.isin(graph_ids, cur)
                else:
                    mine = codes == c
                    mine[mine] = np.isin(graph_ids[mine], cur)
                new_codes[mine] = c
                p = np.setdiff1d(cur, graph_ids[mine])
                pend.append(p)
                pend_codes.append(np.full(len(p), c, np.int16))
            with self.glock:
                self.graph, self.node_ids, self.node_codes = graph, graph_ids, new_codes
                self.ivf = ivf
            self.serial += 1
            pending = np.concatenate(pend) if pend else np.empty(0, np.int64)
            pending_codes = (np.concatenate(pend_codes) if pend_codes
                             else np.empty(0, np.int16))
            # Rows held out before, or asked for, stay out of the graph: they measure it as
            # unseen queries (more are held out as rows are added: see `extend`).
            want = np.concatenate([self.held, held if held is not None
                                   else np.empty(0, np.int64)])
            hold = np.isin(pending, want) if self.recall_target > 0 else np.zeros(
                len(pending), bool)
            self.held, self.held_codes = pending[hold], pending_codes[hold]
            self.held_rows = None
            self.pending, self.pending_codes = pending[~hold], pending_codes[~hold]
            self.dead = int((new_codes < 0).sum())

    def extend(self, slice_s: float | None) -> bool:
        """Add pending rows to the graph: one chunk sized to hold the graph about `slice_s`
        (queries wait that long at most), or all of them (None). Returns whether rows remain
        pending."""
        while True:
            with self.lock:
                if self.graph is None or not len(self.pending):
                    return False
                n = self.chunk if slice_s is not None else 4096
                take, take_codes = self.pending[:n], self.pending_codes[:n]
                short = cal.SAMPLE_QUERIES - len(self.held) if self.recall_target > 0 else 0
                if short > 0 and len(take) >= 8:  # one row in 8 held out until there are enough
                    out = np.zeros(len(take), bool)
                    out[7::8][:short] = True
                    self.held_rows = None
                    self.held = np.concatenate([self.held, take[out]])
                    self.held_codes = np.concatenate([self.held_codes, take_codes[out]])
                    take, take_codes = take[~out], take_codes[~out]
                ids_l, codes_l, vecs_l = [], [], []
                for c in np.unique(take_codes).tolist():
                    part = self.parts[self.names[c]]
                    pos = part.positions(take[take_codes == c])
                    ids_l.append(part.ids_at(pos))
                    codes_l.append(np.full(len(pos), c, np.int16))
                    vecs_l.append(part.vectors_at(pos))
                vecs = np.ascontiguousarray(np.concatenate(vecs_l))
                t0 = time.perf_counter()
                with self.glock:
                    self.graph.add(vecs)
                    if self.ivf is not None:  # the same node positions
                        at = len(self.node_ids)
                        self.ivf.add(np.arange(at, at + len(vecs), dtype=np.int64), vecs)
                    self.node_ids = np.concatenate([self.node_ids, *ids_l])
                    self.node_codes = np.concatenate([self.node_codes, *codes_l])
                self.pending, self.pending_codes = self.pending[n:], self.pending_codes[n:]
                if slice_s is not None:
                    per_row = (time.perf_counter() - t0) / max(1, len(take))
                    self.chunk = int(min(4096, max(1, slice_s / max(per_row, 1e-7))))
                    return len(self.pending) > 0
