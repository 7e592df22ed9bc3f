"""The fleet's search backend: `SearchBackend` over the PostgreSQL + pgvector fleet store.

The planner (core/planner.py) is the robot's own; only finding rows differs. Every filter is a
SQL condition (`FleetStore.where` compiles the `RowFilter`), so filtered answers are the exact
top k of the rows that pass (`ORDER BY emb <#> q`). An unfiltered semantic search (at most a
stream restriction) uses the model's HNSW index when one exists, with pgvector's iterative
scan. Rows are `FleetHit`s: a result's `id` is the fleet's own row id, and it names its robot
and map; equal scores break by the robot's own row order.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import numpy as np

from memory_node.core.contract import result_fields
from memory_node.core.planner import Nearest, QueryVectors
from memory_node.core.store.pose_index import PoseExcerpt
from memory_node.core.types import RowFilter
from memory_node.fleet.store import FleetHit, FleetStore

MODELS_TTL_S = 5.0  # how long the list of embedding models in the fleet is reused


class FleetBackend:
    """`SearchBackend` over a `FleetStore` (read-only)."""

    def __init__(self, store: FleetStore):
        self.store = store
        self._models: list[str] | None = None
        self._models_at = 0.0

    def catch_up(self) -> None:
        """Nothing to catch up with: PostgreSQL is always current."""

    def stream_names(self) -> set[str]:
        return self.store.stream_names()

    def models(self, streams: Collection[str] | None) -> list[str]:
        """Embedding models with vectors in the fleet (refreshed every few seconds); a model
        without rows in the requested streams simply finds none."""
        if self._models is None or time.monotonic() - self._models_at > MODELS_TTL_S:
            rows = self.store.run(lambda c: c.execute(
                "SELECT model_id FROM memory_models ORDER BY model_id").fetchall())
            self._models, self._models_at = [r[0] for r in rows], time.monotonic()
        return self._models

    def ordered(self, where: RowFilter, order_by: str, limit: int) -> list[FleetHit]:
        return self.store.ordered(where, order_by, limit)

    def ordered_with_scores(self, where: RowFilter, order_by: str, qvecs: QueryVectors,
                            min_score: float | None, limit: int
                            ) -> list[tuple[FleetHit, float | None]]:
        hits = self.store.ordered_with_scores(where, order_by, qvecs, min_score, limit)
        return [(h, h.score) for h in hits]

    def nearest(self, where: RowFilter, qvecs: QueryVectors, k: int,
                min_score: float | None, notes: list[str]) -> Nearest[FleetHit]:
        filtered = where.has_filters or where.include_archived
        hnsw = {} if filtered else self.store.hnsw_models()
        scored: list[tuple[FleetHit, float]] = []
        for model_id, qvec in qvecs.items():
            for h in self.store.nearest(where, model_id, qvec, k, min_score=min_score,
                                        use_hnsw=model_id in hnsw):
                scored.append((h, h.score or 0.0))

        def unscored(n: int) -> list[FleetHit]:
            return self.store.ordered(where, "-time", n, exclude_models=list(qvecs))

        return Nearest(scored, unscored)

    def pose_tracks(self, robots: Collection[str] | None, map_id: str | None,
                    t_min: float | None, t_max: float | None) -> dict[str | None, np.ndarray]:
        """Each robot's own pose history on `map_id` (a robot's track never joins another's):
        the named robots, or every robot with a pose there in the window."""
        if map_id is None:
            return {}
        who = list(robots) if robots else self.store.pose_robots(map_id, None, t_min, t_max)
        return {r: self.store.pose_track(r, map_id, t_min, t_max) for r in who}

    def pose_excerpts(self, robots: Collection[str] | None, map_id: str | None,
                      centre: tuple[float, float], radius: float, t_min: float | None,
                      t_max: float | None, gap_s: float
                      ) -> dict[str | None, np.ndarray | PoseExcerpt]:
        """Each robot's whole track (the fleet keeps no pose-history index)."""
        return dict(self.pose_tracks(robots, map_id, t_min, t_max))

    def tie_key(self, row: FleetHit) -> tuple[int, str, str]:
        return (row.local_id, row.robot, row.store_id)

    def result(self, row: FleetHit, score: float | None) -> dict[str, Any]:
        fields = result_fields(row.obs, score)
        fields["robot"] = row.robot
        if row.archived:
            fields["archived"] = True
        fields["map"] = row.map_id
        return fields
