"""The query planner: filters first, then ranking, exact for every filtered query.

One planner for every store. It decides what a search is (docs/design.md, "Query semantics"):
- no semantic part: the backend orders the rows that pass the filter (time, or a numeric tag);
- semantic, ordered by time or a tag: the same, each row reporting its similarity;
- semantic, ordered by score: the backend's nearest rows by vector among those that pass, the
  k best kept here (ties broken by the backend's row order, newest first), and with room left
  (and no min_score) rows without a vector fill in, newest first.
How a backend finds rows (SQL, an in-memory mask, a graph index, pgvector) is its own: the
robot's SQLite store with its vector indexes (`core/local_backend.py`) and the fleet's
PostgreSQL store (`fleet/backend.py`) both implement `SearchBackend`. Every backend compiles
the same `RowFilter`, whose `matches` is the reference semantics.

Visits are planned here too (`QueryPlanner.visits`): the backend gives each robot's pose
history around the circle (`pose_excerpts`), and core/visits.py finds the visits in it, so a
robot's store and the fleet's answer visits the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from memory_node.core.query import SearchPlan
from memory_node.core.store.pose_index import PoseExcerpt
from memory_node.core.types import RowFilter
from memory_node.core.visits import VisitSpan, find_visits, find_visits_in, gap_notes

Row = TypeVar("Row")
QueryVectors = dict[str, np.ndarray]  # the query's embedding per model

EMPTY_WINDOW = "the time window is empty (its start is after its end)"
NO_VECTORS = "no embedded rows in the requested stream(s): semantic_query ignored"
NO_LOADED_MODEL = "no embedded rows of a loaded model: semantic_query ignored"
NO_POSE_HISTORY = ("no pose history in this time window: no odometry or other observation "
                   "with a pose is stored for it, so visits are not known")


@dataclass
class Nearest(Generic[Row]):
    """What a backend found by vector: (row, score) pairs, at least the k best of every
    model's rows that pass the filter (and min_score), and how to find rows without a vector
    that pass it, newest first, when the scored ones run short."""

    scored: list[tuple[Row, float]]
    unscored: Callable[[int], list[Row]]


class SearchBackend(Protocol[Row]):
    """The operations the planner needs from a store: rows by filter in an order, rows by
    vector, and what each row is in an answer."""

    def catch_up(self) -> None:
        """See rows other threads or processes added since the last search."""

    def stream_names(self) -> set[str]:
        """Every stream with rows."""

    def models(self, streams: Collection[str] | None) -> list[str]:
        """Embedding models with vectors in these streams (None: all streams)."""

    def ordered(self, where: RowFilter, order_by: str, limit: int) -> list[Row]:
        """Rows passing `where`, ordered by time ("time", "-time") or a numeric tag ("tag",
        "-tag": rows without a number for it last), then newest first."""

    def ordered_with_scores(self, where: RowFilter, order_by: str, qvecs: QueryVectors,
                            min_score: float | None, limit: int
                            ) -> list[tuple[Row, float | None]]:
        """As `ordered`, each row with its similarity (None without a vector of a queried
        model); with min_score, rows below it or unscored drop out."""

    def nearest(self, where: RowFilter, qvecs: QueryVectors, k: int,
                min_score: float | None, notes: list[str]) -> Nearest[Row]:
        """The best-scoring rows passing `where` (exact when anything but the streams
        filters), with notes on how they were found."""

    def pose_tracks(self, robots: Collection[str] | None, map_id: str | None,
                    t_min: float | None, t_max: float | None) -> dict[str | None, np.ndarray]:
        """(t, x, y) pose history in time order, kept and archived rows, per robot (a robot's
        own store: one track, keyed None; a fleet: each robot with a pose on `map_id`)."""

    def pose_excerpts(self, robots: Collection[str] | None, map_id: str | None,
                      centre: tuple[float, float], radius: float, t_min: float | None,
                      t_max: float | None, gap_s: float
                      ) -> dict[str | None, np.ndarray | PoseExcerpt]:
        """As `pose_tracks`, for visits to one circle with gaps longer than `gap_s`: a
        `PoseExcerpt` where a pose-history index answers, else the whole track."""

    def tie_key(self, row: Row) -> Hashable:
        """Equal scores break by this, highest first: the robot's own row order."""

    def result(self, row: Row, score: float | None) -> dict[str, Any]:
        """One row as a search result's fields (the engine validates an answer's results in
        one call)."""


class QueryPlanner(Generic[Row]):
    """Plans a resolved search over one backend. `query_vector(model_id, text)` embeds the
    query for one model (None: that model is not loaded here)."""

    def __init__(self, backend: SearchBackend[Row],
                 query_vector: Callable[[str, str], np.ndarray | None]):
        self.backend = backend
        self.query_vector = query_vector

    def run(self, plan: SearchPlan) -> tuple[list[tuple[Row, float | None]], list[str]]:
        """The plan's rows with their scores, and notes for the answer."""
        backend = self.backend
        backend.catch_up()
        if plan.empty_window:
            return [], [EMPTY_WINDOW]
        where = plan.filter
        if not plan.semantic_query:
            return self._newest(where, plan.order_by, plan.k)
        models = backend.models(plan.streams)
        qvecs: QueryVectors = {}
        for m in models:
            vec = self.query_vector(m, plan.semantic_query)
            if vec is not None:
                qvecs[m] = vec
        if not qvecs:  # nothing to compare with: the search lists rows as without one
            note = NO_LOADED_MODEL if models else NO_VECTORS
            if plan.order_by == "score":
                return self._newest(where, "-time", plan.k, note + ", newest first")
            return self._newest(where, plan.order_by, plan.k, note)
        if plan.order_by != "score":
            return backend.ordered_with_scores(where, plan.order_by, qvecs, plan.min_score,
                                               plan.k), []
        notes: list[str] = []
        found = backend.nearest(where, qvecs, plan.k, plan.min_score, notes)
        scored = found.scored
        if plan.min_score is not None:
            scored = [p for p in scored if p[1] >= plan.min_score]
        tie = backend.tie_key
        best: list[tuple[Row, float | None]] = list(
            sorted(scored, key=lambda p: (p[1], tie(p[0])), reverse=True)[:plan.k])
        missing = plan.k - len(best)
        if missing > 0 and plan.min_score is None:
            best += [(row, None) for row in found.unscored(missing)]
        return best, notes

    def _newest(self, where: RowFilter, order_by: str, k: int, note: str | None = None
                ) -> tuple[list[tuple[Row, float | None]], list[str]]:
        rows = self.backend.ordered(where, order_by, k)
        return [(row, None) for row in rows], [note] if note else []


    # ---- visits ---------------------------------------------------------------------------
    def visits(self, plan: SearchPlan, gap_s: float, clock: Callable[[], float],
               history_gap_s: float | None = None
               ) -> tuple[list[tuple[VisitSpan, str | None]], list[str]]:
        """Visits to the plan's circle in its time window, each with its robot (None on a
        robot's own store), in time order; and notes where pose history is missing.

        `gap_s` is the configured gap threshold, `history_gap_s` a coarser one where the
        stored pose history is sparser than that (the disk budget downsampled it)."""
        assert plan.near is not None
        if plan.empty_window:
            return [], [EMPTY_WINDOW]
        # One sample either side of the window links a visit that crosses its edges.
        lo = None if plan.t_min is None else plan.t_min - gap_s
        hi = None if plan.t_max is None else plan.t_max + gap_s
        tracks = self.backend.pose_excerpts(plan.robots, plan.map_id, plan.near, plan.radius,
                                            lo, hi, gap_s)
        spans: list[tuple[VisitSpan, str | None]] = []
        notes: list[str] = []
        for robot, track in tracks.items():
            got, said = self.track_visits(plan, track, history_gap_s or gap_s, clock)
            spans += [(v, robot) for v in got]
            notes += said if len(tracks) == 1 else [f"{robot}: {n}" for n in said]
        if not tracks:
            notes.append(f"no robot has pose history on map {plan.map_id} in this time "
                         "window, so visits are not known")
        spans.sort(key=lambda p: (p[0].start, p[1] or ""))
        return spans, notes

    @staticmethod
    def track_visits(plan: SearchPlan, history: np.ndarray | PoseExcerpt, gap_s: float,
                     clock: Callable[[], float]) -> tuple[list[VisitSpan], list[str]]:
        """One robot's visits in its pose history: a whole track or the pose-history index's
        excerpt for the circle, the same visits either way; and notes on where it is
        missing."""
        assert plan.near is not None
        if isinstance(history, PoseExcerpt):
            last_t = history.last_t
        else:
            last_t = float(history[-1, 0]) if len(history) else None
        t_max = plan.t_max
        if t_max is None and plan.t_min is not None:
            t_max = max(clock(), plan.t_min if last_t is None else last_t)
        # (with a window ending now or later, the track reaches now: see find_visits)
        now = clock()
        args = (plan.near, plan.radius, gap_s, plan.t_min, t_max,
                now if t_max is None or t_max >= now else None)
        spans, gaps = (find_visits_in(history, *args) if isinstance(history, PoseExcerpt)
                       else find_visits(history, *args))
        if last_t is None:
            return spans, [NO_POSE_HISTORY]
        return spans, gap_notes(gaps, gap_s)
