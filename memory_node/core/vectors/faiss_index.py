"""The HNSW graph (FAISS) that answers unfiltered semantic searches fast: `GraphIndex`.

Filtered searches are always exact: HNSW with an id selector can miss allowed ids, so they are
scored from the exact indexes (one per stream) that a graph covers. One graph covers every
stream of an embedding model, so a search over every stream walks one graph; it proposes
candidates that are re-scored with the exact indexes' float vectors, which lets the graph
store 8-bit codes: a quarter of the memory, and each hop reads a quarter of the bytes.

`GraphIndex` composes parts that each do one job over one shared `GraphState`:
`GraphBuilder` (graph_build.py: builds, and the copies searches use during a first build),
`GraphCalibration` (graph_calibration.py: what serves, the inverted file beside the graph),
`GraphPersistence` (graph_persist.py: the graph on disk) and `GraphSearch` (graph_search.py);
below them `CoarseIndex` (coarse.py), the projection check (projection.py) and the faiss
graph objects (hnsw_graph.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import faiss
import numpy as np

from memory_node.core.vectors import calibrate as cal
from memory_node.core.vectors.coarse import COARSE_MIN_ROWS, CoarseIndex
from memory_node.core.vectors.exact import ExactIndex
from memory_node.core.vectors.graph_build import GraphBuilder
from memory_node.core.vectors.graph_calibration import GraphCalibration, pick_source
from memory_node.core.vectors.graph_persist import (
    GraphPersistence,
    MissingVectors,
    read_graph,
    write_graph,
)
from memory_node.core.vectors.graph_search import GraphSearch
from memory_node.core.vectors.graph_state import GraphState
from memory_node.core.vectors.hnsw_graph import Graph, Half, walked_dims
from memory_node.core.vectors.projection import PROJECTION_REACH

__all__ = ["GraphIndex", "Graph", "Half", "MissingVectors", "read_graph", "write_graph"]

# The most time a background step holds the graph while adding rows to it (queries wait that
# long at most); rows are added in chunks sized to it.
EXTEND_SLICE_S = 0.01
# The coarse index under its name before the split (tests patch it here).
_Coarse = CoarseIndex

T = TypeVar("T")


class _Shared(Generic[T]):
    """A `GraphIndex` attribute kept in its `GraphState` (read and set through the index)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: GraphIndex | None, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]  # the descriptor, on the class
        return cast(T, getattr(obj.state, self.name))

    def __set__(self, obj: GraphIndex, value: T) -> None:
        setattr(obj.state, self.name, value)


class GraphIndex:
    """One HNSW graph (inner product) over the rows of several exact indexes ("parts": the
    streams of one embedding model), so that a search over every stream walks one graph instead
    of one per stream.

    The parts keep the float vectors and answer every filtered search exactly; the graph only
    proposes candidates: the best `rerank` are re-scored exactly with the parts' vectors, which
    lets it store 8-bit codes (`storage` "sq8") or float copies ("flat"). Below `min_rows`
    rows in all parts no graph is built and searches are exact.

    With a `scheduler` (the engine's background worker) no search waits for graph work: until a
    graph is ready searches are exact (`building` says so); rows added later are searched
    exactly (`pending`) until the worker adds them to the graph; removed rows stay in the graph
    as tombstones that searches skip, and the graph is rebuilt in the background once they
    exceed `graph_state.DEAD_REBUILD_SHARE`. Without a scheduler the same work runs inside the
    search.

    With a `recall_target` (> 0) the graph calibrates itself (`GraphCalibration`): the
    cheapest efSearch and rerank depth whose measured recall@5 holds the target serve
    unrestricted searches (`calibration` says what was measured); until then `ef_for` and
    `rerank` do. Above `COARSE_MIN_ROWS` live rows an inverted file over the same nodes is
    weighed against the walk (`ivf` "auto": the faster; "prefer": it whenever it holds the
    target; "off": never made). With `dims` (> 0, below the vectors' dimension) the graph
    walks the vectors' projections on their `dims` principal axes (see projection.py).
    """

    dim = _Shared[int]()
    graph_dims = _Shared[int]()  # components the graph walks (the vectors' own: no projection)
    halves = _Shared[int]()
    m = _Shared[int]()
    ef_construction = _Shared[int]()
    ef_search = _Shared[int]()
    storage = _Shared[str]()
    rerank = _Shared[int]()
    min_rows = _Shared[int]()
    recall_target = _Shared[float]()
    ivf_mode = _Shared[str]()
    calibration = _Shared["cal.Calibration | None"]()
    parts = _Shared["dict[str, ExactIndex]"]()
    builds = _Shared[int]()  # graphs built over every part (not counting rows added later)

    def __init__(self, dim: int, *, m: int = 48, ef_construction: int = 200,
                 ef_search: int = 128, min_rows: int = 20000, storage: str = "sq8",
                 rerank: int = 40, scheduler: Callable[[GraphIndex], None] | None = None,
                 recall_target: float = 0.99, ivf: str = "auto", halves: int = 2,
                 dims: int = 0):
        self.state = GraphState(dim, m=m, ef_construction=ef_construction,
                                ef_search=ef_search, min_rows=min_rows, storage=storage,
                                rerank=rerank, recall_target=recall_target, ivf=ivf,
                                halves=halves, dims=dims,
                                # read from this module when made: set here, they hold for
                                # the indexes made after
                                coarse_min_rows=COARSE_MIN_ROWS,
                                projection_reach=PROJECTION_REACH)
        self.scheduler = scheduler
        self._builder = GraphBuilder(self.state)
        self._calibration = GraphCalibration(self.state)
        self._persist = GraphPersistence(self.state)
        self._search = GraphSearch(self.state)

    # ---- parts ------------------------------------------------------------------------------
    def attach(self, name: str, part: ExactIndex) -> None:
        """Cover the rows of `part` (named `name`) by this graph from now on."""
        self.state.attach(name, part)
        self.schedule()

    def __len__(self) -> int:
        return len(self.state)

    def add_rows(self, name: str, ids: np.ndarray, vectors: np.ndarray | None,
                 meta: np.ndarray | None = None, slots: np.ndarray | None = None) -> None:
        """Add rows to part `name` (searchable at once: exactly until in the graph); `slots`
        for a part over a vector file."""
        self.state.add_rows(name, ids, vectors, meta, slots)
        self.schedule()

    def remove_rows(self, ids: np.ndarray) -> int:
        """Remove ids from every part; their graph nodes become tombstones (no rebuild here)."""
        removed = self.state.remove_rows(np.asarray(ids, np.int64).reshape(-1))
        if removed:
            self.schedule()
        return removed

    # ---- what serves now --------------------------------------------------------------------
    @property
    def exact(self) -> bool:
        return self.state.graph is None

    @property
    def building(self) -> bool:
        """True while there are enough rows for a graph but none is ready: searches that would
        use it are then exact (slower, same answers)."""
        return self.state.graph is None and len(self) >= self.min_rows

    @property
    def partial_nodes(self) -> int | None:
        """While a first graph is built: the rows a copy of it covers so far (searches walk
        that copy and scan the other rows exactly); None otherwise."""
        p = self.state.partial
        return len(p.ids) if p is not None and self.state.graph is None else None

    @property
    def _serving_coarse(self) -> CoarseIndex | None:
        """The coarse index searches use while a first graph is built (None: none)."""
        p = self.state.partial
        return p.coarse if p is not None and self.state.graph is None else None

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
        graph = self.state.graph
        return self.graph_dims if graph is None else walked_dims(graph)

    @property
    def pending(self) -> int:
        """Rows searched exactly beside the graph until the background adds them to it."""
        return len(self.state.pending)

    @property
    def nodes(self) -> int:
        """Nodes in the live graph, tombstones included."""
        return len(self.state.node_ids)

    @property
    def _hnsw(self) -> Graph | None:
        """The live faiss graph (None: none built or read yet)."""
        return self.state.graph

    @property
    def _ivf(self) -> CoarseIndex | None:
        """The inverted file kept beside the live graph (None: none)."""
        return self.state.ivf

    def ef_for(self, n: int) -> int:
        """efSearch grows with the graph (a larger graph needs a deeper walk for the same
        recall: BENCHMARKS.md, "Semantic-only vs the graph's efSearch and M"): 1x
        `ef_search` up to 50k nodes, 1.5x to 150k, 2.5x to 500k, 3x above. Serves until a
        calibration says otherwise."""
        if n <= 50_000:
            return self.ef_search
        if n <= 150_000:
            return self.ef_search * 3 // 2
        return self.ef_search * (5 if n <= 500_000 else 6) // 2

    def current_calibration(self) -> cal.Calibration | None:
        """The calibration serving unrestricted searches now (None: not measured yet)."""
        return self.state.current_calibration()

    # ---- graph work: in the background with a scheduler, else inline ----------------------
    def needs_work(self) -> bool:
        st = self.state
        with st.lock:
            if len(st) < st.min_rows:
                return False
            return (st.needs_build() or len(st.pending) > 0 or self._calibration.ivf_due()
                    or self._calibration.due())

    def request_rebuild(self) -> None:
        """Rebuild the graph in the background (the current one serves until then)."""
        with self.state.lock:
            self.state.rebuild_asked = True
        self.schedule()

    def schedule(self) -> None:
        """Ask the scheduler for graph work if there is any (no-op without one)."""
        if self.scheduler is None:
            return
        with self.state.lock:
            if self.state.scheduled or not self.needs_work():
                return
            self.state.scheduled = True
        self.scheduler(self)

    def work(self, cancelled: Callable[[], bool] = lambda: False,
             threads: int | None = None) -> bool:
        """One step of graph work: a full build, adding a slice of pending rows, making the
        inverted file or a calibration. Returns whether more work remains. Called by the
        scheduler's worker (or inline)."""
        st = self.state
        with st.lock:
            st.scheduled = False
            if len(st) < st.min_rows:
                return False
            rebuild = st.needs_build()
            pending = len(st.pending) > 0
            ivf = self._calibration.ivf_due()
            measure = self._calibration.due()
        if rebuild:
            self._build(cancelled, threads)
        elif pending:
            st.extend(EXTEND_SLICE_S)
        elif ivf:
            self._calibration.build_ivf(cancelled)
        elif measure:
            self.calibrate(cancelled)
        return self.needs_work()

    def build(self) -> None:
        """Build the graph now, on every core, and add every pending row (benchmarks, tests
        and standalone use; the engine builds in the background)."""
        self._build(lambda: False, os.cpu_count() or 1)
        while self.state.extend(None):
            pass
        if self._calibration.due():
            self.calibrate()

    def _build(self, cancelled: Callable[[], bool], threads: int | None) -> None:
        self._builder.build(cancelled, threads, self._publish_partial)

    def _publish_partial(self, *args: Any) -> None:
        """Hand searches a copy of the graph being built (`GraphBuilder.publish_partial`):
        the build calls it through the index, so a subclass or a test can watch it."""
        self._builder.publish_partial(*args)

    def calibrate(self, cancelled: Callable[[], bool] = lambda: False) -> cal.Calibration | None:
        """Measure the graph (and the inverted file beside it) and adopt what holds
        `recall_target` cheapest (`_pick` between the two)."""
        return self._calibration.calibrate(cancelled, self._pick, self.request_rebuild)

    def _pick(self, walk: cal.Calibration, ivf: cal.Calibration) -> cal.Calibration:
        """Which of the walk and the inverted file serves (`pick_source`)."""
        return pick_source(walk, ivf, self.ivf_mode)

    # ---- search -------------------------------------------------------------------------
    def exact_search(self, query: np.ndarray, k: int, names: list[str]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k over the named parts, exactly: one product per part, one ranking."""
        return self._search.exact(query, k, names)

    def search_parts(self, query: np.ndarray, k: int, parts: Collection[str] | None = None
                     ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Top-k (ids, scores) over every part, or over the named ones, and whether the answer
        is exact only because the graph is still being built.

        Named parts holding `graph_search.GRAPH_MIN_SHARE` of the rows are searched in the
        graph: its nearest `rerank` / share rows, those of the parts kept. When fewer than
        k + 8 of them are the parts' (their rows lie apart from the query: a filter inside
        the graph walk then misses many of their nearest rows: finding 19 in
        bench/results/NOTES.md), the parts are scanned exactly; when at least that many
        are, the parts' k best are among the graph's nearest rows as surely as an
        unrestricted search's. Smaller parts are scanned exactly."""
        names = self._search.names_of(parts)
        if not self._search.uses_graph(names):
            return (*self.exact_search(query, k, names), False)
        if self.scheduler is None:  # standalone: do the graph work inline
            while self.needs_work():
                self.work(threads=os.cpu_count() or 1)
        else:
            self.schedule()
        return self._search.search(query, k, names, self.ef_for)

    # ---- persistence of the graph (the expensive part to rebuild) -------------------------
    def save_graph(self, path: Path) -> bool:
        """Write the graph's files beside `path` (see `GraphPersistence.save`). False when
        no graph is built."""
        return self._persist.save(path)

    def load_graph(self, path: Path, vectors_of: MissingVectors | None = None) -> bool:
        """Adopt a saved graph built with the same settings: rows it lacks become pending,
        rows it has that are gone become tombstones. False (and no change) otherwise."""
        if not self._persist.load(path, vectors_of):
            return False
        self.schedule()
        return True

    def use_graph(self, graph: Graph, ids: np.ndarray,
                  quantizer: faiss.Index | None = None,
                  vectors_of: MissingVectors | None = None,
                  cancelled: Callable[[], bool] = lambda: False,
                  held: np.ndarray | None = None, asked: np.ndarray | None = None) -> bool:
        """Adopt a graph read elsewhere (node i holds id ids[i]) if it was built with these
        settings (see `GraphPersistence.use`); False (and no change) otherwise."""
        if not self._persist.use(graph, ids, quantizer, vectors_of, cancelled, held, asked):
            return False
        self.schedule()
        return True
