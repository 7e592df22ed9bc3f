"""The HNSW graph (FAISS) that answers unfiltered semantic searches fast: `GraphIndex`.

Filtered searches are always exact: HNSW with an id selector can miss allowed ids, so they are
scored from the exact indexes (one per stream) that a graph covers. One graph covers every
stream of an embedding model, so a search over every stream walks one graph; it proposes
candidates that are re-scored with the exact indexes' float vectors, which lets the graph
store 8-bit codes: a quarter of the memory, and each hop reads a quarter of the bytes.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import faiss
import numpy as np

from memory_node.core.config import MIN_GRAPH_DIMS
from memory_node.core.vectors import calibrate as cal
from memory_node.core.vectors.exact import ExactIndex, SlotRows, top_k

faiss.omp_set_num_threads(1)  # single queries are faster on one thread (notes/offline-models.md)
log = logging.getLogger(__name__)


HNSW_STORAGES = ("sq8", "flat")
# Whether an inverted file is kept beside the graph: "auto" (the faster of the two once
# calibrated), "prefer" (the file whenever it holds the recall target), "off".
IVF_MODES = ("auto", "prefer", "off")
# A graph whose removed rows exceed this share of its nodes is rebuilt (in the background).
DEAD_REBUILD_SHARE = 0.2
# The most time a background step holds the graph while adding rows to it (queries wait that
# long at most); rows are added in chunks sized to it.
EXTEND_SLICE_S = 0.01
# A search restricted to some parts uses the graph only when they hold at least this share of
# its rows: it fetches the graph's nearest rows, 1/share times as many as an unrestricted
# search, and keeps those of the parts. Smaller selections are scanned exactly.
GRAPH_MIN_SHARE = 0.2
# A first build publishes a copy of its graph for searches after at least this many rows.
PARTIAL_MIN_ROWS = 4096
# A first build of at least this many rows first indexes them coarsely (an inverted file of
# 8-bit codes, a few seconds at 100k): searches meanwhile probe it for the rows the copy of
# the graph lacks, instead of scanning them all exactly.
COARSE_MIN_ROWS = 20000
# Held-out rows a coarse index is measured with (their exact top 5 found as it is filled).
COARSE_QUERIES = 128
CHUNK = 8192  # rows read at a time while filling a coarse index
COARSE_MAX_LISTS = 1024
# The 8-bit codes' quantizer: one value range for every dimension. Decoding a code is one
# multiply-add per component, not a range per dimension read beside it: a walk is faster at
# the same recall after the exact re-scoring, which makes up for the coarser codes
# (bench/results/NOTES.md, finding 17).
SQ_TYPE = faiss.ScalarQuantizer.QT_8bit_uniform
# Graphs over alternate nodes walked at once, one per core (see `_Halves`): 2, or 1 (one
# graph) on a single core, where the two walks would run one after the other.
GRAPH_HALVES = (1, 2)
# A graph built over fewer rows walks whole vectors, whatever `dims` says: a projection
# fitted on so few would cost it more recall than it saves time.
PROJECTION_MIN_ROWS = 1000
# Before a graph is built over projections, rows of its training sample are asked for as
# queries: the projection is kept when their exact top 5 lie among the PROJECTION_REACH best
# by projection as often as the recall target asks (a walk cannot find what the projection
# ranks lower). On MiniLM captions, whose near-alike rows differ in few components, 96
# components fail it (the calibration of such a graph reached 0.980 at best), and on
# overlapping clusters they pass.
PROJECTION_REACH = 32
PROJECTION_QUERIES = 200


class GraphIndex:
    """One HNSW graph (inner product) over the rows of several exact indexes ("parts": the
    streams of one embedding model), so that a search over every stream walks one graph instead
    of one per stream.

    The parts keep the float vectors and answer every filtered search exactly; the graph only
    proposes candidates: the best `rerank` are re-scored exactly with the parts' vectors, which
    lets it store 8-bit codes (`storage` "sq8": a quarter of the memory, each hop reads a
    quarter of the bytes) or float copies ("flat"). Below `min_rows` rows in all parts no graph
    is built and searches are exact.

    With a `scheduler` (the engine's background worker) no search waits for graph work: until a
    graph is ready searches are exact (`building` says so); rows added later are searched
    exactly (`pending`) until the worker adds them to the graph; removed rows stay in the graph
    as tombstones that searches skip, and the graph is rebuilt in the background once they
    exceed `DEAD_REBUILD_SHARE`. Without a scheduler the same work runs inside the search.

    With a `recall_target` (> 0) the graph calibrates itself once built, again whenever
    its live rows grew by `calibrate.GROWTH`, and once real queries have come after a
    measurement made without them: the cheapest efSearch and rerank depth whose
    measured recall@5 holds the target serve unrestricted searches (`calibration` says what
    was measured); until then `ef_for` and `rerank` do. Searches restricted to some parts
    keep `ef_for` (their answers are checked against the parts' exact ranking anyway).

    Above `COARSE_MIN_ROWS` live rows an inverted file of 8-bit codes over the same nodes
    (the first build's coarse index, or one made in the background for a graph read or
    rebuilt) is calibrated beside the graph: where it holds the target with fewer
    microseconds per query (data the graph walks badly, e.g. MiniLM captions, whose
    near-alike rows crowd the graph's links: bench/results/NOTES.md, finding 19),
    unrestricted searches probe
    it instead (`ivf` "auto"; "prefer":
    whenever it holds the target; "off": never made). It is dropped once a calibration on
    the full set of real queries keeps the walk.

    With `dims` (> 0, below the vectors' dimension) the graph links and walks the vectors'
    projections on their `dims` principal axes (a PCA fitted on the rows the first build
    trains its codes with): each hop reads and scores a quarter of the components at 96 of
    384, the candidates are re-scored with the float vectors as always, and the calibration
    measures the recall that results. On overlapping clusters a walk over the projection
    holds the recall in a fraction of the full vectors' time (two halves over it gain
    nothing: the hand-off costs more than it saves; bench/results/NOTES.md, finding 18).
    """

    def __init__(self, dim: int, *, m: int = 48, ef_construction: int = 200,
                 ef_search: int = 128, min_rows: int = 20000, storage: str = "sq8",
                 rerank: int = 40, scheduler: Callable[[GraphIndex], None] | None = None,
                 recall_target: float = 0.99, ivf: str = "auto", halves: int = 2,
                 dims: int = 0):
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
        self.scheduler = scheduler
        self.recall_target = float(recall_target)
        self.ivf_mode = ivf
        self.calibration: cal.Calibration | None = None
        self._recent = cal.RecentQueries(cal.RECENT_QUERIES)  # distinct real queries
        self._serial = 0  # graphs adopted (a calibration holds for the graph it measured)
        self.parts: dict[str, ExactIndex] = {}
        self._names: list[str] = []  # part code -> part name
        self._hnsw: Graph | None = None
        self._hnsw_ids = np.empty(0, np.int64)  # graph position -> observation id
        self._hnsw_codes = np.empty(0, np.int16)  # graph position -> part code (-1: removed)
        self._pending = np.empty(0, np.int64)  # ids in a part, not yet in the graph
        self._pending_codes = np.empty(0, np.int16)
        # Rows held out of the graph (scanned exactly beside it, like pending rows): the
        # queries a calibration measures it with, as it would a query that is not a node.
        self._held = np.empty(0, np.int64)
        self._held_codes = np.empty(0, np.int16)
        # (ids, codes, vectors) of the held rows, copied together: one small product a search
        self._held_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # (graph serial, live rows, queries, real ones) when last measured or tried
        self._calib_tried: tuple[int, int, int, int] | None = None
        self._partial: _Partial | None = None  # the first build so far, while it runs
        # An inverted file over the graph's nodes (same positions), kept beside it while a
        # calibration may still find it the cheaper of the two (see `calibrate`).
        self._ivf: _Coarse | None = None
        self._ivf_declined = -1  # the graph serial whose full calibration kept the walk
        self._dead = 0  # graph nodes whose id was removed since (tombstones)
        self._rebuild_asked = False
        self.builds = 0  # graphs built over every part (not counting rows added later)
        self._scheduled = False
        self._chunk = 16  # pending rows added per background step, sized to EXTEND_SLICE_S
        self._lock = threading.RLock()  # state above
        self._glock = threading.Lock()  # the faiss graph object (search vs add)

    # ---- parts ------------------------------------------------------------------------------
    def attach(self, name: str, part: ExactIndex) -> None:
        """Cover the rows of `part` (named `name`) by this graph from now on."""
        with self._lock:
            if name in self.parts:
                raise ValueError(f"part {name!r} is already attached")
            if part.dim != self.dim:
                raise ValueError(f"part dimension {part.dim} != graph dimension {self.dim}")
            self.parts[name] = part
            self._names.append(name)
            if self._hnsw is not None and len(part):
                self._pending = np.concatenate([self._pending, part.ids()])
                self._pending_codes = np.concatenate(
                    [self._pending_codes, np.full(len(part), len(self._names) - 1, np.int16)])
        self.schedule()

    def __len__(self) -> int:
        return sum(len(p) for p in list(self.parts.values()))

    @property
    def exact(self) -> bool:
        return self._hnsw is None

    @property
    def building(self) -> bool:
        """True while there are enough rows for a graph but none is ready: searches that would
        use it are then exact (slower, same answers)."""
        return self._hnsw is None and len(self) >= self.min_rows

    @property
    def partial_nodes(self) -> int | None:
        """While a first graph is built: the rows a copy of it covers so far (searches walk
        that copy and scan the other rows exactly); None otherwise."""
        p = self._partial
        return len(p.ids) if p is not None and self._hnsw is None else None

    @property
    def _serving_coarse(self) -> _Coarse | None:
        """The coarse index searches use while a first graph is built (None: none)."""
        p = self._partial
        return p.coarse if p is not None and self._hnsw is None else None

    @property
    def partial_coarse(self) -> bool:
        """While a first graph is built: whether the rows its copy lacks are probed in a
        coarse index (approximate) rather than scanned exactly."""
        return self._serving_coarse is not None

    @property
    def partial_coarse_recall(self) -> float | None:
        """The coarse index's recall@5 as measured on the held-out rows (None: no coarse
        index serves, or no rows were held out)."""
        coarse = self._serving_coarse
        return coarse.recall_at_5 if coarse is not None else None

    @property
    def partial_coarse_alone(self) -> bool:
        """Whether the coarse index answers for every row (it holds the recall target), the
        copy of the graph being built not walked."""
        coarse = self._serving_coarse
        return coarse is not None and coarse.alone

    @property
    def walked_dims(self) -> int:
        """Components of each vector the graph links and walks (its projection's, if any)."""
        graph = self._hnsw
        return self.graph_dims if graph is None else _walked_dims(graph)

    @property
    def pending(self) -> int:
        """Rows searched exactly beside the graph until the background adds them to it."""
        return len(self._pending)

    @property
    def nodes(self) -> int:
        """Nodes in the live graph, tombstones included."""
        return len(self._hnsw_ids)

    def add_rows(self, name: str, ids: np.ndarray, vectors: np.ndarray | None,
                 meta: np.ndarray | None = None, slots: np.ndarray | None = None) -> None:
        """Add rows to part `name` (searchable at once: exactly until in the graph); `slots`
        for a part over a vector file."""
        with self._lock:
            part = self.parts[name]
            part.add(ids, vectors, meta, slots)
            if self._hnsw is not None:
                code = self._names.index(name)
                ids = np.asarray(ids, np.int64).reshape(-1)
                self._pending = np.concatenate([self._pending, ids])
                self._pending_codes = np.concatenate(
                    [self._pending_codes, np.full(len(ids), code, np.int16)])
        self.schedule()

    def remove_rows(self, ids: np.ndarray) -> int:
        """Remove ids from every part; their graph nodes become tombstones (no rebuild here)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        with self._lock:
            removed = sum(p.remove(ids) for p in self.parts.values())
            if removed and self._hnsw is not None:
                self._dead += int(np.isin(ids, self._hnsw_ids).sum())
                keep = ~np.isin(self._pending, ids)
                self._pending, self._pending_codes = self._pending[keep], self._pending_codes[keep]
                keep = ~np.isin(self._held, ids)
                self._held, self._held_codes = self._held[keep], self._held_codes[keep]
                self._held_rows = None
        if removed:
            self.schedule()
        return removed

    def _new_graph(self, rows: int, sample: np.ndarray | None = None) -> Graph:
        """A graph for `rows` rows: over projections when there are enough to fit one and,
        with a `sample` of them, when it ranks their neighbours well enough (see
        `PROJECTION_REACH`)."""
        d = self.graph_dims if rows >= PROJECTION_MIN_ROWS else self.dim
        pca: faiss.PCAMatrix | None = None
        if d < self.dim and sample is not None and len(sample) >= PROJECTION_MIN_ROWS:
            # Fitted once: the check ranks by it and the graph (each half) projects with it.
            pca = faiss.PCAMatrix(self.dim, d)
            pca.train(sample)
            reach = projection_recall(sample, d, PROJECTION_REACH, PROJECTION_QUERIES, pca)
            if reach < self.recall_target:
                log.info("graph over whole %d-d vectors: their exact top 5 lie among the %d "
                         "best by %d-component projections for %.3f of sampled rows (target "
                         "%.2f)", self.dim, PROJECTION_REACH, d, reach, self.recall_target)
                with self._lock:
                    self.graph_dims = d = self.dim
        if self.halves == 2:
            return _Halves((self._new_hnsw(d, pca), self._new_hnsw(d, pca)))
        return self._new_hnsw(d, pca)

    def _new_hnsw(self, d: int, pca: faiss.PCAMatrix | None = None) -> Half:
        index: faiss.IndexHNSW
        if self.storage == "sq8":
            # SQ_TYPE is an int in faiss's stubs; the constructor takes it as the quantizer type.
            index = faiss.IndexHNSWSQ(d, SQ_TYPE,  # type: ignore[arg-type]
                                      self.m, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexHNSWFlat(d, self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.ef_construction
        index.hnsw.efSearch = self.ef_search
        if d == self.dim:
            return index
        # The principal axes of the sample the codes are fitted on: `pca` when the caller
        # fitted it already (training the graph leaves a trained transform alone), else
        # fitted when the graph is trained.
        return faiss.IndexPreTransform(pca if pca is not None else faiss.PCAMatrix(self.dim, d),
                                       index)

    def ef_for(self, n: int) -> int:
        """efSearch grows with the graph: 1x `ef_search` up to 50k nodes, 1.5x to 150k, 2.5x
        to 500k, 3x above. Measured recall@5 against brute force on the benchmark's
        clustered synthetic vectors (the hardest set it has): 100k 0.989 at 128, 0.995 at
        192; 200k 0.979 at 128, 0.989 at 256, 0.995 at 320; 1M 0.992 at 256, 1.000 at 384.
        MiniLM captions and overlapping clusters reach 0.99 at 128 by 100k."""
        if n <= 50_000:
            return self.ef_search
        if n <= 150_000:
            return self.ef_search * 3 // 2
        return self.ef_search * (5 if n <= 500_000 else 6) // 2

    def _matches(self, graph: Graph) -> bool:
        """Whether a loaded graph was built with this index's settings (halves included)."""
        kind = faiss.IndexHNSWSQ if self.storage == "sq8" else faiss.IndexHNSWFlat
        halves = _halves_of(graph)
        return len(halves) == self.halves and all(
            isinstance(g, kind) and h.d == self.dim
            and g.d in (self.graph_dims, self.dim)  # whole vectors: a projection's fallback
            and g.hnsw.nb_neighbors(1) == self.m  # type: ignore[attr-defined]
            and g.hnsw.efConstruction == self.ef_construction
            for h, g in ((h, _hnsw_of(h)) for h in halves))

    # ---- graph work: in the background with a scheduler, else inline ----------------------
    def needs_work(self) -> bool:
        with self._lock:
            if len(self) < self.min_rows:
                return False
            return (self._needs_build() or len(self._pending) > 0 or self._ivf_due()
                    or self._calibration_due())

    def current_calibration(self) -> cal.Calibration | None:
        """The calibration serving unrestricted searches now (None: not measured yet)."""
        c = self.calibration
        return c if c is not None and c.serial == self._serial else None

    def _calibration_due(self) -> bool:
        """A built graph not measured yet, grown by `calibrate.GROWTH` since, with enough
        queries now where it had too few, or with real queries past a new checkpoint."""
        if self.recall_target <= 0 or self._hnsw is None:
            return False
        tried = self._calib_tried
        live = len(self._hnsw_ids) - self._dead
        have = len(self._held) + len(self._recent)  # queries to measure with
        return (tried is None or tried[0] != self._serial or live > tried[1] * (1 + cal.GROWTH)
                or tried[2] < cal.MIN_QUERIES <= have
                # real queries came since: again as they pass each checkpoint
                or any(tried[3] < c <= len(self._recent) for c in cal.REAL_CHECKPOINTS))

    def _ivf_due(self) -> bool:
        """A graph large enough for an inverted file beside it that has none (nor kept its
        walk against one on its full measurement)."""
        return (self.ivf_mode != "off" and self.recall_target > 0 and self._hnsw is not None
                and self._ivf is None and self._ivf_declined != self._serial
                and len(self._hnsw_ids) - self._dead >= COARSE_MIN_ROWS)

    def _needs_build(self) -> bool:
        return (self._hnsw is None or self._rebuild_asked
                or self._dead > DEAD_REBUILD_SHARE * max(1, len(self._hnsw_ids)))

    def request_rebuild(self) -> None:
        """Rebuild the graph in the background (the current one serves until then)."""
        with self._lock:
            self._rebuild_asked = True
        self.schedule()

    def schedule(self) -> None:
        """Ask the scheduler for graph work if there is any (no-op without one)."""
        if self.scheduler is None:
            return
        with self._lock:
            if self._scheduled or not self.needs_work():
                return
            self._scheduled = True
        self.scheduler(self)

    def work(self, cancelled: Callable[[], bool] = lambda: False,
             threads: int | None = None) -> bool:
        """One step of graph work: a full build, or adding a slice of pending rows. Returns
        whether more work remains. Called by the scheduler's worker (or inline)."""
        with self._lock:
            self._scheduled = False
            if len(self) < self.min_rows:
                return False
            rebuild = self._needs_build()
            pending = len(self._pending) > 0
            ivf = self._ivf_due()
            measure = self._calibration_due()
        if rebuild:
            self._build(cancelled, threads)
        elif pending:
            self._extend(EXTEND_SLICE_S)
        elif ivf:
            self._build_ivf(cancelled)
        elif measure:
            self.calibrate(cancelled)
        return self.needs_work()

    def calibrate(self, cancelled: Callable[[], bool] = lambda: False) -> cal.Calibration | None:
        """Measure the graph (see `calibrate`) and adopt the cheapest efSearch and rerank
        depth that hold `recall_target`; with an inverted file beside it, measure that too
        and let the cheaper of the two serve (`_pick`). Holds the graph lock for a few
        queries at a time."""
        with self._lock:
            graph, serial = self._hnsw, self._serial
            if graph is None:
                return None
            with self._glock:
                graph_ids, codes, ivf = self._hnsw_ids, self._hnsw_codes, self._ivf
            parts = [self.parts[name] for name in self._names]
            recent = list(self._recent)
            held, held_codes = self._held, self._held_codes
            self._calib_tried = (serial, int((codes >= 0).sum()), len(held) + len(recent),
                                 len(recent))
        snap_parts = []
        for p in parts:
            with p._lock:  # ids and rows as one view
                snap_parts.append((p.ids(), p.vectors()))
        own = _rows_of(parts, held, held_codes, self.dim)[2]
        real = np.asarray(recent, np.float32).reshape(-1, self.dim)
        if len(own) + len(real) < cal.MIN_QUERIES:
            return None  # too few to measure: tried again once the graph grows

        def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
            with self._glock:  # a few queries at a time: searches wait a few ms at most
                if self._hnsw is not graph:
                    raise _Replaced
                _, pos = graph.search(q, k, params=_hnsw_params(ef))
            return pos

        def probe(q: np.ndarray, k: int, nprobe: int) -> np.ndarray:
            with self._glock:
                if self._hnsw is not graph or self._ivf is not ivf:
                    raise _Replaced
                assert ivf is not None
                return ivf.positions(q, k, nprobe)

        snap = cal.Snapshot(search, graph_ids, codes, snap_parts)
        finders = [p.find for p in parts]
        try:
            result = cal.calibrate(snap, own, real, self.recall_target, cancelled, finders,
                                   serial)
            by_ivf = None if ivf is None or result is None else cal.calibrate(
                cal.Snapshot(probe, graph_ids, codes, snap_parts), own, real,
                self.recall_target, cancelled, finders, serial,
                grid=cal.ivf_grid(ivf.index.nlist), walk=False, reranks=cal.IVF_RERANKS,
                # it cannot serve slower than a walk that holds the target ("auto")
                max_us=result.search_us if result.met and self.ivf_mode == "auto" else None)
        except (_Replaced, IndexError):  # rebuilt (measured next), or rows removed meanwhile
            return None  # (measured again once it grows)
        if result is None or (ivf is not None and by_ivf is None):  # cancelled: again later
            with self._lock:
                self._calib_tried = None
            return None
        walked = _walked_dims(graph)
        if not result.met and walked < self.dim:
            self._decline_projection(walked, result)
        if by_ivf is not None and self._pick(result, by_ivf) is by_ivf:
            result = replace(by_ivf, ef_search=result.ef_search)
        with self._lock:
            if self._serial == serial:
                self.calibration = result
                if (ivf is not None and result.nprobe is None
                        and len(real) >= cal.RECENT_QUERIES):
                    with self._glock:  # the walk won on every real query kept: free the file
                        self._ivf, self._ivf_declined = None, serial
        return result

    def _decline_projection(self, walked: int, measured: cal.Calibration) -> None:
        """A walk over projections that holds the target at no depth tried (data spread
        over more axes than it keeps): the graph is rebuilt over whole vectors, in the
        background (this one serves, with what it measured, until then)."""
        log.warning("graph over %d-component projections of %d-d vectors reached recall@5 "
                    "%.3f at best (target %.2f): rebuilding it over whole vectors",
                    walked, self.dim, measured.recall_at_5, self.recall_target)
        with self._lock:
            self.graph_dims = self.dim
        self.request_rebuild()

    def _pick(self, walk: cal.Calibration, ivf: cal.Calibration) -> cal.Calibration:
        """The one to serve: whichever holds the target (both: the faster per query, as
        measured in the same calibration; "prefer": the inverted file); neither: the one
        with the higher recall."""
        if walk.met != ivf.met:
            return walk if walk.met else ivf
        if not walk.met:
            return ivf if ivf.recall_at_5 > walk.recall_at_5 else walk
        if self.ivf_mode == "prefer":
            return ivf
        return ivf if (ivf.search_us or 0.0) < (walk.search_us or 0.0) else walk

    def build(self) -> None:
        """Build the graph now, on every core, and add every pending row (benchmarks, tests
        and standalone use; the engine builds in the background)."""
        self._build(lambda: False, os.cpu_count() or 1)
        while self._extend(None):
            pass
        if self._calibration_due():
            self.calibrate()

    def _build(self, cancelled: Callable[[], bool], threads: int | None) -> None:
        with self._lock:
            self._rebuild_asked = False
            # Rows below each part's length are never written again (a removal makes new
            # arrays; a vector file is only appended to), so these views stay valid while the
            # build runs unlocked.
            snap = [(c, self.parts[name].ids(), self.parts[name].vectors())
                    for c, name in enumerate(self._names)]
            layouts = [self.parts[name].layout for name in self._names]
            first = self._hnsw is None  # nothing serves searches but exact scans meanwhile
        total = sum(len(ids) for _c, ids, _v in snap)
        sample = np.empty((0, self.dim), np.float32)
        if total:  # the rows the 8-bit ranges (and a projection) are fitted on
            share = min(1.0, 200_000 / total)
            sample = np.ascontiguousarray(np.concatenate(
                [v[: max(1, int(np.ceil(len(v) * share)))] for _c, _i, v in snap if len(v)]))
        graph = self._new_graph(total, sample)
        ids_out: list[np.ndarray] = []
        codes_out: list[np.ndarray] = []
        held = self._pick_held([ids for _c, ids, _v in snap], total)
        coarse: _Coarse | None = None
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
                if first and total - len(held) >= COARSE_MIN_ROWS:
                    coarse = _Coarse.build(self.dim, snap, held, self._want(5),
                                           self.recall_target, cancelled)
                    if coarse is None:
                        return  # cancelled
                    self._publish_partial(graph, [], [], 0, snap[0][1],
                                          np.ones(len(snap[0][1]), bool), 0,
                                          [i for _c, i, _v in snap], layouts, held, coarse)
                for c, ids, vecs in snap:
                    out = np.isin(ids, held) if len(held) else np.zeros(len(ids), bool)
                    for start in range(0, len(vecs), 2048):  # cancellable between chunks
                        if cancelled():
                            return
                        chunk = vecs[start:start + 2048]
                        if out[start:start + 2048].any():
                            chunk = chunk[~out[start:start + 2048]]
                        graph.add(np.ascontiguousarray(chunk))
                        added += len(chunk)
                        end = min(len(ids), start + 2048)
                        if first and next_publish <= added < total - len(held):
                            next_publish += publish_every
                            self._publish_partial(graph, ids_out, codes_out, c, ids, out, end,
                                                  [i for _c, i, _v in snap], layouts, held,
                                                  coarse)
                    ids_out.append(ids[~out])
                    codes_out.append(np.full(int((~out).sum()), c, np.int16))
            finally:
                if threads:
                    faiss.omp_set_num_threads(1)
        # The coarse index numbers the rows as the graph's nodes: it stays, as the graph's
        # inverted file, for the calibration to weigh against the walk.
        self._adopt(graph, np.concatenate(ids_out) if ids_out else np.empty(0, np.int64),
                    np.concatenate(codes_out) if codes_out else np.empty(0, np.int16), held,
                    ivf=coarse if self.ivf_mode != "off" else None)
        self._partial = None
        self.builds += 1

    def _publish_partial(self, graph: Graph, ids_out: list[np.ndarray],
                         codes_out: list[np.ndarray], c: int, ids: np.ndarray,
                         out: np.ndarray, end: int, snap_ids: list[np.ndarray],
                         layouts: list[int], held: np.ndarray,
                         coarse: _Coarse | None = None) -> None:
        """Hand searches a copy of the graph being built: parts before `c` whole, part `c`
        up to row `end` (rows `out` held out), later parts not yet. With a `coarse` index of
        every row the build began with, the copy and it cover them all."""
        node_ids = np.concatenate([*ids_out, ids[:end][~out[:end]]])
        node_codes = np.concatenate([*codes_out, np.full(int((~out[:end]).sum()), c, np.int16)])
        cover = {cc: (len(i) if cc < c or coarse is not None else end if cc == c else 0,
                      layouts[cc]) for cc, i in enumerate(snap_ids)}
        # Held-out rows the copy covers (those beyond it are in the exact scan already).
        held_codes = np.full(len(held), -1, np.int16)
        for cc, i in enumerate(snap_ids):
            held_codes[np.isin(held, i[:cover[cc][0]])] = cc
        # Their vectors in one matrix: one small product a search (gathering ~300 rows from
        # the parts on every search cost more than the coarse probe itself).
        held_rows = _rows_of([self.parts[n] for n in self._names], held[held_codes >= 0],
                             held_codes[held_codes >= 0], self.dim)
        copy = _clone(graph)  # cheap beside the build (finding 19); searched without any lock
        self._partial = _Partial(copy, node_ids, node_codes, cover, *held_rows, coarse)

    def _partial_search(self, p: _Partial, q: np.ndarray, k: int, names: list[str]
                        ) -> tuple[np.ndarray, np.ndarray] | None:
        """Top-k over `names` while a first graph is built: the copy's best candidates and,
        with a coarse index, its best among the rows the copy lacks (among every row when
        it holds the recall target alone: walking a copy still being built costs more than
        probing the coarse index, bench/results/NOTES.md, finding 19), re-scored exactly;
        held-out rows and every row neither covers scored exactly (a matrix-vector product
        over each part's uncovered tail). None when a part's rows moved since the copy (a
        removal): the caller scans exactly."""
        want = self._want(k)
        cand_l: list[np.ndarray] = []
        codes_l: list[np.ndarray] = []
        alone = p.coarse is not None and p.coarse.alone
        if len(p.ids) and not alone:
            _, pos = p.graph.search(q.reshape(1, -1), want,
                                    params=_hnsw_params(max(self.ef_for(len(p.ids)), want)))
            pos = pos[0][pos[0] >= 0]
            cand_l.append(p.ids[pos])
            codes_l.append(p.codes[pos])
        if p.coarse is not None:  # every row, or those not in the copy yet
            found, found_codes = p.coarse.search(q, want, 0 if alone else len(p.ids))
            cand_l.append(found)
            codes_l.append(found_codes)
        cand = np.concatenate(cand_l) if cand_l else np.empty(0, np.int64)
        cand_codes = np.concatenate(codes_l) if codes_l else np.empty(0, np.int16)
        codes = [self._names.index(name) for name in names]
        mine = np.isin(p.held_codes, codes)
        ids_l, scores_l = [p.held[mine]], [p.held_vecs[mine] @ q]
        for name, c in zip(names, codes, strict=True):
            part = self.parts[name]
            covered, layout = p.cover.get(c, (0, part.layout))
            if part.layout != layout:
                return None
            sel = np.unique(cand[cand_codes == c])
            for i, s in ([part.score_ids(sel, q)] if len(sel) else []) + (
                    [part.search_range(q, k, covered, len(part))] if len(part) > covered
                    else []):
                ids_l.append(i)
                scores_l.append(s)
        return top_k(np.concatenate(ids_l), np.concatenate(scores_l), k)

    def _want(self, k: int) -> int:
        """Candidates a partial search re-scores exactly for a top-k (a few more than k, so
        ties at the boundary break by id; at least `rerank`)."""
        return max(k + 8, self.rerank)

    def _pick_held(self, ids: list[np.ndarray], total: int) -> np.ndarray:
        """Ids to hold out of a graph (at most 1% of its rows): its calibration queries."""
        n = min(cal.SAMPLE_QUERIES, total // 100) if self.recall_target > 0 else 0
        if n < cal.MIN_QUERIES:
            return np.empty(0, np.int64)
        every = np.concatenate(ids)
        return np.random.default_rng(total).choice(every, n, replace=False)

    def _adopt(self, graph: Graph, graph_ids: np.ndarray,
               codes: np.ndarray | None = None, held: np.ndarray | None = None,
               ivf: _Coarse | None = None) -> None:
        """Make `graph` (whose node i holds id graph_ids[i], of part codes[i]; looked up in the
        parts when not given) the live one: rows added since are pending, rows removed since
        are tombstones. `ivf`: an inverted file over the same nodes (else none until one is
        made in the background)."""
        graph_ids = np.asarray(graph_ids, np.int64)
        with self._lock:
            new_codes = np.full(len(graph_ids), -1, np.int16)
            pend, pend_codes = [], []
            for c, name in enumerate(self._names):
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
            with self._glock:
                self._hnsw, self._hnsw_ids, self._hnsw_codes = graph, graph_ids, new_codes
                self._ivf = ivf
            self._serial += 1
            pending = np.concatenate(pend) if pend else np.empty(0, np.int64)
            pending_codes = (np.concatenate(pend_codes) if pend_codes
                             else np.empty(0, np.int16))
            # Rows held out before, or asked for, stay out of the graph: they measure it as
            # unseen queries (more are held out as rows are added: see `_extend`).
            want = np.concatenate([self._held, held if held is not None
                                   else np.empty(0, np.int64)])
            hold = np.isin(pending, want) if self.recall_target > 0 else np.zeros(
                len(pending), bool)
            self._held, self._held_codes = pending[hold], pending_codes[hold]
            self._held_rows = None
            self._pending, self._pending_codes = pending[~hold], pending_codes[~hold]
            self._dead = int((new_codes < 0).sum())

    def _extend(self, slice_s: float | None) -> bool:
        """Add pending rows to the graph: one chunk sized to hold the graph about `slice_s`
        (queries wait that long at most), or all of them (None). Returns whether rows remain
        pending."""
        while True:
            with self._lock:
                if self._hnsw is None or not len(self._pending):
                    return False
                n = self._chunk if slice_s is not None else 4096
                take, take_codes = self._pending[:n], self._pending_codes[:n]
                short = cal.SAMPLE_QUERIES - len(self._held) if self.recall_target > 0 else 0
                if short > 0 and len(take) >= 8:  # one row in 8 held out until there are enough
                    out = np.zeros(len(take), bool)
                    out[7::8][:short] = True
                    self._held_rows = None
                    self._held = np.concatenate([self._held, take[out]])
                    self._held_codes = np.concatenate([self._held_codes, take_codes[out]])
                    take, take_codes = take[~out], take_codes[~out]
                ids_l, codes_l, vecs_l = [], [], []
                for c in np.unique(take_codes).tolist():
                    part = self.parts[self._names[c]]
                    pos = part.positions(take[take_codes == c])
                    ids_l.append(part.ids_at(pos))
                    codes_l.append(np.full(len(pos), c, np.int16))
                    vecs_l.append(part.vectors_at(pos))
                vecs = np.ascontiguousarray(np.concatenate(vecs_l))
                t0 = time.perf_counter()
                with self._glock:
                    self._hnsw.add(vecs)
                    if self._ivf is not None:  # the same node positions
                        at = len(self._hnsw_ids)
                        self._ivf.add(np.arange(at, at + len(vecs), dtype=np.int64), vecs)
                    self._hnsw_ids = np.concatenate([self._hnsw_ids, *ids_l])
                    self._hnsw_codes = np.concatenate([self._hnsw_codes, *codes_l])
                self._pending, self._pending_codes = self._pending[n:], self._pending_codes[n:]
                if slice_s is not None:
                    per_row = (time.perf_counter() - t0) / max(1, len(take))
                    self._chunk = int(min(4096, max(1, slice_s / max(per_row, 1e-7))))
                    return len(self._pending) > 0

    def _build_ivf(self, cancelled: Callable[[], bool]) -> None:
        """Make the inverted file of a graph read or rebuilt (a first build keeps its coarse
        index): its live nodes' vectors at their positions, then the nodes added
        meanwhile; the next calibration weighs it against the walk."""
        with self._lock:
            serial = self._serial
            with self._glock:
                graph_ids, codes = self._hnsw_ids, self._hnsw_codes
            parts = [self.parts[name] for name in self._names]
        ivf = _Coarse.over_nodes(self.dim, graph_ids, codes, parts, cancelled)
        if ivf is None:
            return
        with self._lock:
            if self._serial != serial or self._ivf is not None:
                return  # replaced meanwhile: made again for the new graph
            with self._glock:
                at, now = len(graph_ids), len(self._hnsw_ids)
                if now > at:
                    ivf.fill(self._hnsw_ids[at:], self._hnsw_codes[at:], parts, at)
                self._ivf = ivf
            self._calib_tried = None  # measure it

    # ---- search -------------------------------------------------------------------------
    def exact_search(self, query: np.ndarray, k: int, names: list[str]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k over the named parts, exactly: one product per part, one ranking."""
        q = np.asarray(query, np.float32).reshape(-1)
        got = [self.parts[n].search(q, k) for n in names if len(self.parts[n])]
        if not got:
            return top_k(np.empty(0, np.int64), np.empty(0, np.float32), k)
        return top_k(np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]),
                     k)

    def search_parts(self, query: np.ndarray, k: int, parts: Collection[str] | None = None
                     ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Top-k (ids, scores) over every part, or over the named ones, and whether the answer
        is exact only because the graph is still being built.

        Named parts holding `GRAPH_MIN_SHARE` of the rows are searched in the graph: its
        nearest `rerank` / share rows, those of the parts kept. When fewer than k + 8 of them
        are the parts' (their rows lie apart from the query: a filter inside the graph walk
        then misses many of their nearest rows: finding 19 in bench/results/NOTES.md), the
        parts are scanned exactly; when at least that many are, the parts' k best are among
        the graph's nearest rows as surely as an unrestricted search's. Smaller parts are
        scanned exactly."""
        names = list(self.parts) if parts is None else [p for p in self.parts if p in parts]
        sel_n = sum(len(self.parts[p]) for p in names)
        total = len(self)
        restricted = len(names) < len(self.parts)
        if total < self.min_rows or (restricted and (sel_n < self.min_rows
                                                     or sel_n < GRAPH_MIN_SHARE * total)):
            return (*self.exact_search(query, k, names), False)
        if self.scheduler is None:  # standalone: do the graph work inline
            while self.needs_work():
                self.work(threads=os.cpu_count() or 1)
        else:
            self.schedule()
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            graph, dead = self._hnsw, self._dead
            pending, pending_codes = self._pending, self._pending_codes
            held = self._held_matrix() if len(self._held) else None
        if graph is None:
            partial = self._partial
            got = (self._partial_search(partial, q, k, names)
                   if partial is not None and not restricted else None)
            return (*(got if got is not None else self.exact_search(q, k, names)), True)
        codes = tuple(self._names.index(p) for p in names)
        calib = None if restricted else self.current_calibration()
        if restricted:
            keep = np.isin(pending_codes, codes)
            pending, pending_codes = pending[keep], pending_codes[keep]
        else:
            self._recent.append(q)  # the next calibration measures these too
        # A few more than k so ties at the boundary are broken by id like the rest; `rerank`
        # candidates re-scored exactly; more when tombstones take some of them.
        want = max(k + 8, self.rerank if calib is None else calib.rerank)
        fetch = want if not restricted else int(np.ceil(want * total / max(1, sel_n)))
        with self._glock:  # graph, ids and codes as one (a background slice may extend them)
            graph, graph_ids, graph_codes = self._hnsw, self._hnsw_ids, self._hnsw_codes
            assert graph is not None  # once built, the graph is only ever replaced
            g = len(graph_ids)
            want_g = min(g, int(np.ceil(fetch * g / max(1, g - dead))) + (8 if dead else 0))
            if calib is not None and calib.nprobe is not None and self._ivf is not None:
                pos = self._ivf.positions(q.reshape(1, -1), want_g, calib.nprobe)
            else:
                ef = self.ef_for(g) if calib is None else calib.ef_search
                _, pos = graph.search(q.reshape(1, -1), want_g,
                                      params=_hnsw_params(max(ef, want_g)))
        pos = pos[0][pos[0] >= 0]
        # Ids once each (dead nodes left out: a row added again is pending under the id of
        # its dead node; a row replayed into a part twice is two live nodes), then a loop
        # over the parts they are in, not a mask and a sort per part: a third of this step's
        # time with four parts. Without pending rows the candidates are seldom alike: a set
        # tells, and the sort is skipped.
        cand = np.concatenate([graph_ids[pos], pending]) if len(pending) else graph_ids[pos]
        cand_codes = (np.concatenate([graph_codes[pos], pending_codes]) if len(pending)
                      else graph_codes[pos])
        live = cand_codes >= 0
        cand, cand_codes = cand[live], cand_codes[live]
        if len(pending) or len(set(cand.tolist())) < len(cand):
            cand, first = np.unique(cand, return_index=True)
            cand_codes = cand_codes[first]
        ids_l, scores_l = [], []
        for c in set(cand_codes.tolist()):
            if c in codes:
                i, s = self.parts[self._names[c]].score_ids(cand[cand_codes == c], q)
                ids_l.append(i)
                scores_l.append(s)
        ids = np.concatenate(ids_l) if ids_l else np.empty(0, np.int64)
        scores = np.concatenate(scores_l) if scores_l else np.empty(0, np.float32)
        from_graph = len(ids) - min(len(pending), len(ids))
        n_held = 0 if held is None else len(held[0])
        if from_graph < (min(k + 8, sel_n - len(pending) - n_held) if restricted
                         else min(k, sel_n - len(pending) - n_held)):
            return (*self.exact_search(q, k, names), False)  # too few: see above
        if held is not None and n_held:
            h_ids, h_codes, h_vecs = held
            h_scores = h_vecs @ q
            # Only held rows reaching the candidates' k-th score can be in the answer (ties
            # kept): a top-k over a few rows instead of ~300.
            if len(scores) >= k:
                keep = h_scores >= np.partition(scores, len(scores) - k)[len(scores) - k]
            else:
                keep = np.ones(len(h_ids), bool)
            if restricted:
                keep &= np.isin(h_codes, codes)
            ids = np.concatenate([ids, h_ids[keep]])
            scores = np.concatenate([scores, h_scores[keep]])
        return (*top_k(ids, scores, k), False)

    def _held_matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The held rows' ids, part codes and vectors in one array (call under the lock)."""
        rows = self._held_rows
        if rows is None:
            rows = self._held_rows = _rows_of([self.parts[n] for n in self._names],
                                              self._held, self._held_codes, self.dim)
        return rows

    # ---- persistence of the graph (the expensive part to rebuild) -------------------------
    # The graph is saved as its links, its node ids and an empty copy of its storage (the
    # 8-bit quantizer's trained ranges): the codes are the float vectors quantized, which the
    # vector files hold already, so they are encoded again when the graph is read (the same
    # bytes: the same ranges, the same vectors). That keeps 384 bytes a row off the disk.
    def save_graph(self, path: Path) -> bool:
        """Write `path` (the links), `.graph_ids.npy` (node ids, tombstones included),
        `.quantizer` (the storage, empty), `.held.npy` (ids held out of the graph for its
        calibration) and `.asked.npy` (the last real queries, which it is measured on too:
        a restart keeps what users ask). False when no graph is built."""
        with self._lock:
            if self._hnsw is None:
                return False
            with self._glock:
                tmp = path.with_suffix(path.suffix + ".tmp")
                with open(tmp, "wb") as fh:
                    write_graph(self._hnsw, fh.write)
                quantizer = _empty_storage(_hnsw_of(_halves_of(self._hnsw)[0]))
                graph_ids = self._hnsw_ids.copy()
            held = self._held.copy()
            asked = np.asarray(list(self._recent), np.float32).reshape(-1, self.dim)
        faiss.write_index(quantizer, str(path.with_suffix(".quantizer")))
        np.save(path.with_suffix(".asked.npy"), asked)
        np.save(path.with_suffix(".graph_ids.npy"), graph_ids)
        np.save(path.with_suffix(".held.npy"), held)
        tmp.replace(path)
        return True

    def load_graph(self, path: Path, vectors_of: MissingVectors | None = None) -> bool:
        """Adopt a saved graph built with the same settings: rows it lacks become pending,
        rows it has that are gone become tombstones. False (and no change) otherwise."""
        try:
            quantizer = None
            if path.with_suffix(".quantizer").exists():
                with open(path, "rb") as fh:
                    graph = read_graph(fh.read, os.fstat(fh.fileno()).st_size, fh.tell)
                quantizer = faiss.read_index(str(path.with_suffix(".quantizer")))
            else:  # saved with its codes (an earlier release)
                graph = cast(Half, faiss.read_index(str(path)))  # of its concrete class
            ids = np.load(path.with_suffix(".graph_ids.npy"))
            held_path = path.with_suffix(".held.npy")
            held = np.load(held_path) if held_path.exists() else None
            asked_path = path.with_suffix(".asked.npy")
            asked = np.load(asked_path) if asked_path.exists() else None
        except Exception:  # noqa: BLE001 - a corrupt cache file just means "rebuild"
            return False
        return self.use_graph(graph, ids, quantizer, vectors_of, held=held, asked=asked)

    def use_graph(self, graph: Graph, ids: np.ndarray,
                  quantizer: faiss.Index | None = None,
                  vectors_of: MissingVectors | None = None,
                  cancelled: Callable[[], bool] = lambda: False,
                  held: np.ndarray | None = None, asked: np.ndarray | None = None) -> bool:
        """Adopt a graph read elsewhere (node i holds id ids[i]) if it was built with these
        settings; False (and no change) otherwise. A graph read without its storage gets
        `quantizer` (empty, trained) filled with its nodes' vectors: from the parts, then
        `vectors_of(ids)` for nodes removed since (their vectors, where still kept), zeros
        for the rest (tombstones: searches skip them, walks still pass through). `held`: ids
        the graph was built without, to keep out of it (its calibration queries); `asked`:
        the last real queries it had seen, measured on again."""
        if not self._matches(graph):  # other settings (or an older release): rebuild
            return False
        halves = _halves_of(graph)
        if (graph.ntotal != len(ids) or ids.dtype != np.int64 or ids.ndim != 1
                or any(h.ntotal != len(ids[s::len(halves)]) for s, h in enumerate(halves))):
            return False
        if quantizer is not None:
            if not _storage_fits(_hnsw_of(halves[0]), quantizer) or quantizer.ntotal != 0:
                return False
            # One storage per half, each with its own nodes' codes (node p is node p // 2
            # of half p % 2), encoded with the saved ranges.
            storages = [quantizer] + [faiss.clone_index(quantizer) for _ in halves[1:]]
            for s, (half, storage) in enumerate(zip(halves, storages, strict=True)):
                own = ids[s::len(halves)]
                # Room for every code at once: growing the codes chunk by chunk reallocates
                # them, and the copies left behind stay in this process (+40 MB per 100k).
                storage.codes.resize(len(own) * storage.code_size)  # type: ignore[attr-defined]
                for start in range(0, len(own), 4096):  # 6 MB of floats at a time
                    if cancelled():
                        return False
                    storage.add(_project(half, self._node_vectors(own[start:start + 4096],
                                                                  vectors_of)))
                hnsw = _hnsw_of(half)
                hnsw.storage = storage
                hnsw.own_fields = True
                storage.this.disown()  # type: ignore[attr-defined]  # the graph frees it now
            _trim_heap()
        elif any(g.storage is None or not _storage_fits(g, g.storage)
                 for g in map(_hnsw_of, halves)):
            return False  # (codes of another quantizer: an earlier release)
        if held is not None and (held.dtype != np.int64 or held.ndim != 1):
            held = None
        self._adopt(graph, ids, held=held)
        if (asked is not None and asked.dtype == np.float32 and asked.ndim == 2
                and asked.shape[1] == self.dim and np.isfinite(asked).all()):
            with self._lock:
                self._recent.extend(asked[-cal.RECENT_QUERIES:])
        self.schedule()
        return True

    def _node_vectors(self, ids: np.ndarray, vectors_of: MissingVectors | None) -> np.ndarray:
        """Float vectors of graph nodes, in node order."""
        out = np.zeros((len(ids), self.dim), np.float32)
        found = np.zeros(len(ids), bool)
        with self._lock:
            parts = list(self.parts.values())
        for part in parts:
            hit, vecs = part.vectors_of(ids)
            new = hit & ~found
            if new.any():
                out[new] = vecs[new[hit]]
                found |= new
        if vectors_of is not None and not found.all():
            missing = ids[~found]
            kept = vectors_of(np.unique(missing).tolist())
            for j in np.nonzero(~found)[0]:
                vec = kept.get(int(ids[j]))
                if vec is not None and vec.shape == (self.dim,):
                    out[j] = vec
        return out


MissingVectors = Callable[[list[int]], dict[int, np.ndarray]]


@dataclass
class _Partial:
    """A copy of a first graph as far as its build got, and what it covers: per part code,
    (its rows [0, n) are nodes or held out, the part's layout then)."""

    graph: Graph
    ids: np.ndarray  # node -> id
    codes: np.ndarray  # node -> part code
    cover: dict[int, tuple[int, int]]
    held: np.ndarray  # rows held out of the graph (scored exactly)
    held_codes: np.ndarray
    held_vecs: np.ndarray  # their vectors, row for row
    coarse: _Coarse | None = None  # every row the build began with, but the held ones


@dataclass
class _Coarse:
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
              cancelled: Callable[[], bool]) -> _Coarse | None:
        """Train on a sample of every part, add every row but the held ones (measuring their
        exact top 5 on the way), pick `nprobe`; None if cancelled meanwhile."""
        keeps = [~np.isin(ids, held) if len(held) else np.ones(len(ids), bool)
                 for _c, ids, _v in snap]
        n = int(sum(int(k.sum()) for k in keeps))
        index, share = _new_ivf(dim, n)
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
                _, got = index.search(q, want, params=_ivf_params(probe))
                recall = float(np.mean([len(set(g.tolist()) & set(b.tolist())) / 5
                                        for g, b in zip(got, best_at, strict=True)]))
                if recall >= recall_target:
                    nprobe = probe
                    break  # else every list: as good as the 8-bit codes' ranking gets
        return cls(index, np.concatenate(ids_l), np.concatenate(codes_l), nprobe, recall,
                   recall is not None and recall >= recall_target)

    @classmethod
    def over_nodes(cls, dim: int, graph_ids: np.ndarray, codes: np.ndarray,
                   parts: list[ExactIndex], cancelled: Callable[[], bool]) -> _Coarse | None:
        """An inverted file over a graph's live nodes, at their node positions (tombstones
        left out); None if cancelled meanwhile."""
        live = np.nonzero(codes >= 0)[0]
        index, share = _new_ivf(dim, len(live))
        sample = live[np.linspace(0, len(live) - 1, max(1, int(len(live) * share))).astype(
            np.int64)]
        vecs = _rows_of(parts, graph_ids[sample], codes[sample], dim)[2]
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
        keep, vecs = _gather_rows(parts, ids, codes, self.index.d)
        if keep.any():
            self.add(np.nonzero(keep)[0].astype(np.int64) + at, vecs[keep])

    def add(self, positions: np.ndarray, vecs: np.ndarray) -> None:
        """Rows at these positions (nodes the graph gained)."""
        self.index.add_with_ids(np.ascontiguousarray(vecs, np.float32), positions)

    def positions(self, q: np.ndarray, want: int, nprobe: int) -> np.ndarray:
        """The best `want` positions of each query (rows of `q`), -1 padded, probing
        `nprobe` lists."""
        _, pos = self.index.search(q, want, params=_ivf_params(nprobe))
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


def _new_ivf(dim: int, n: int) -> tuple[faiss.IndexIVFScalarQuantizer, float]:
    """An untrained inverted file of 8-bit codes for `n` rows, and the share of them to train
    it on: 2 sqrt(n) lists (632 at 100k), at most COARSE_MAX_LISTS (filling costs n x lists
    products: ~6 s at 100k; ~1 min at 1M with the cap)."""
    nlist = max(8, min(int(2 * np.sqrt(n)), COARSE_MAX_LISTS, n // 40))
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, SQ_TYPE,
                                          faiss.METRIC_INNER_PRODUCT)
    index.cp.niter = 8  # coarse lists: a few k-means rounds are plenty
    return index, min(1.0, 40 * nlist / max(1, n))


@functools.lru_cache(maxsize=256)
def _ivf_params(nprobe: int) -> faiss.SearchParameters:
    """Inverted-file search parameters, one object per number of lists probed."""
    params = faiss.SearchParametersIVF()
    params.nprobe = nprobe
    return params


def _gather_rows(parts: list[ExactIndex], ids: np.ndarray, codes: np.ndarray, dim: int
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


def _rows_of(parts: list[ExactIndex], ids: np.ndarray, codes: np.ndarray, dim: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, part codes, vectors) of the rows `ids` (of parts `codes`) that their parts still
    hold, in the order given: the held-out rows as one matrix."""
    keep, vecs = _gather_rows(parts, ids, codes, dim)
    return ids[keep], codes[keep], np.ascontiguousarray(vecs[keep])


class _Halves:
    """Two HNSW graphs over alternate nodes (node p is node p // 2 of half p % 2), walked at
    once on two cores; each half's best candidates are merged by their 8-bit scores, so it
    answers like one graph (`search`, `add`, `train`, `ntotal`) and the rest of
    `GraphIndex` (node positions, tombstones, the inverted file, calibration) is unchanged.

    On overlapping clusters one graph needed a deeper search for the recall target than the
    two halves walked at once: two walks from two entry points miss less than one walk half
    as deep again, on data whose near rows crowd each other's links. Handing a half to the
    other thread has a cost of its own (bench/results/NOTES.md, finding 17)."""

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
Graph = Half | _Halves  # one graph, or two halves answering as one


def _halves_of(graph: Graph) -> tuple[Half, ...]:
    return graph.halves if isinstance(graph, _Halves) else (graph,)


def _hnsw_of(half: Half) -> faiss.IndexHNSW:
    """The HNSW graph itself (behind its projection, if any)."""
    if isinstance(half, faiss.IndexPreTransform):
        return cast(faiss.IndexHNSW, faiss.downcast_index(half.index))
    return half


def _walked_dims(graph: Graph) -> int:
    """Components of each vector a graph links and walks (its projection's, if any)."""
    return int(_hnsw_of(_halves_of(graph)[0]).d)


def _projection(half: Half) -> faiss.VectorTransform | None:
    if isinstance(half, faiss.IndexPreTransform):
        return faiss.downcast_VectorTransform(half.chain.at(0))  # type: ignore[attr-defined]
    return None


def _project(half: Half, x: np.ndarray) -> np.ndarray:
    """Vectors as the graph walks them: projected, when it walks projections."""
    pca = _projection(half)
    return x if pca is None else np.ascontiguousarray(pca.apply(x))


def _clone(graph: Graph) -> Graph:
    halves = tuple(cast(Half, faiss.clone_index(h)) for h in _halves_of(graph))
    return _Halves(halves) if isinstance(graph, _Halves) else halves[0]


# What precedes a half's links in a graph file when it walks projections: its projection
# (faiss would write an IndexPreTransform's graph with its codes, so the two go apart).
_PROJECTION_TAG = b"MNpj"


def write_graph(graph: Graph, write: Callable[[bytes], object]) -> None:
    """A graph's links (not its codes: see `save_graph`), its halves one after the other,
    each after its projection, if any."""
    writer = faiss.PyCallbackIOWriter(write)  # type: ignore[attr-defined]
    for h in _halves_of(graph):
        pca = _projection(h)
        if pca is not None:
            write(_PROJECTION_TAG)
            faiss.write_VectorTransform(pca, writer)
        faiss.write_index(_hnsw_of(h), writer, faiss.IO_FLAG_SKIP_STORAGE)


def read_graph(read: Callable[[int], bytes], size: int, tell: Callable[[], int]) -> Graph:
    """A graph written by `write_graph` (without its codes) from a file of `size` bytes: one
    graph, or halves when a second follows the first."""
    ahead = bytearray()  # read to look for a projection, not yet handed to faiss

    def next_bytes(n: int) -> bytes:
        out = bytes(ahead[:n])
        del ahead[:n]
        return out + read(n - len(out)) if len(out) < n else out

    reader = faiss.PyCallbackIOReader(next_bytes)  # type: ignore[attr-defined]

    def half() -> Half:
        ahead.extend(read(len(_PROJECTION_TAG)))
        if bytes(ahead) != _PROJECTION_TAG:
            return cast(faiss.IndexHNSW, faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE))
        ahead.clear()
        pca = faiss.read_VectorTransform(reader)
        return faiss.IndexPreTransform(pca, faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE))

    halves = [half()]
    while tell() - len(ahead) < size and len(halves) < max(GRAPH_HALVES):
        halves.append(half())
    return _Halves(tuple(halves)) if len(halves) > 1 else halves[0]


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


def projection_recall(sample: np.ndarray, dims: int, reach: int, queries: int,
                      pca: faiss.PCAMatrix | None = None) -> float:
    """How often a row's exact top 5 (itself left out) lie among its `reach` best by the
    sample's projection on `dims` principal axes (`pca`, fitted on `sample`, or fitted here):
    for `queries` rows of `sample`, as recall@5 (what a graph over the projection can find at
    best, re-scoring `reach` candidates)."""
    at = np.random.default_rng(len(sample)).choice(len(sample), min(queries, len(sample)),
                                                    replace=False)
    if pca is None:
        pca = faiss.PCAMatrix(sample.shape[1], dims)
        pca.train(sample)
    proj = pca.apply(sample)
    want = _best_rows(sample, at, 5)
    got = _best_rows(proj, at, reach)
    found = sum(len(np.intersect1d(w, g)) for w, g in zip(want, got, strict=True))
    return found / (5 * len(at))


def _best_rows(rows: np.ndarray, at: np.ndarray, n: int, chunk: int = 50_000) -> np.ndarray:
    """Per query row `at[j]`, the positions of its `n` best rows by inner product, itself
    left out (a chunk of rows at a time: 40 MB of scores for 200 queries)."""
    q = rows[at]
    best_s = np.empty((len(at), 0), np.float32)
    best_i = np.empty((len(at), 0), np.int64)
    for start in range(0, len(rows), chunk):
        s = q @ rows[start:start + chunk].T
        mine = (at >= start) & (at < start + s.shape[1])
        s[np.nonzero(mine)[0], at[mine] - start] = -np.inf  # not itself
        all_s = np.concatenate([best_s, s], axis=1)
        all_i = np.concatenate([best_i, np.broadcast_to(
            np.arange(start, start + s.shape[1]), s.shape)], axis=1)
        keep = np.argpartition(-all_s, min(n, all_s.shape[1] - 1), axis=1)[:, :n]
        best_s = np.take_along_axis(all_s, keep, 1)
        best_i = np.take_along_axis(all_i, keep, 1)
    return best_i


class _Replaced(Exception):
    """The graph being calibrated was replaced (rebuilt) meanwhile."""


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps the chunks a re-encode freed as this
    process's memory otherwise: bench/results/NOTES.md, finding 19). A no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _empty_storage(graph: faiss.Index) -> faiss.Index:
    """An empty storage index like the graph's: the quantizer's trained ranges, no codes."""
    storage = faiss.downcast_index(graph.storage)  # type: ignore[attr-defined]
    if isinstance(storage, faiss.IndexScalarQuantizer):
        empty = faiss.IndexScalarQuantizer(storage.d, storage.sq.qtype, storage.metric_type)
        empty.sq.trained = storage.sq.trained
        empty.is_trained = True
        return empty
    return faiss.IndexFlat(storage.d, storage.metric_type)


def _storage_fits(graph: faiss.Index, storage: faiss.Index) -> bool:
    """Whether a storage read beside a graph is the kind the graph was built with (8-bit
    codes: of `SQ_TYPE`; earlier releases' per-dimension ranges mean a rebuild)."""
    kind = faiss.IndexScalarQuantizer if isinstance(graph, faiss.IndexHNSWSQ) else faiss.IndexFlat
    storage = faiss.downcast_index(storage)
    return (isinstance(storage, kind) and storage.d == graph.d and storage.is_trained
            and (not isinstance(storage, faiss.IndexScalarQuantizer)
                 or storage.sq.qtype == SQ_TYPE))


@functools.lru_cache(maxsize=256)
def _hnsw_params(ef: int) -> faiss.SearchParameters:
    """HNSW search parameters (faiss's stubs know neither the class nor its keywords), one
    object per efSearch: making one is a noticeable part of a query (finding 19), and a
    search only reads it."""
    params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
    params.efSearch = ef
    return params
