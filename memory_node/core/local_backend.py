"""The robot's own search backend: the SQLite store and the vector indexes over it.

`QueryPlanner` (core/planner.py) decides what a search is; this finds the rows:
- filters without a semantic part, and rows without vectors: SQL (`SqliteObservationStore`);
- semantic with time or place filters: in memory, over each index's (t, x, y) columns, scored
  exactly;
- semantic with tag filters (or views, or the archive): SQL candidates, scored exactly;
- semantic without filters: each model's graph over all its streams (the requested streams as
  a filter on its nodes, or an exact scan when they are small).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from memory_node.core.contract import result_fields
from memory_node.core.index_manager import IndexManager
from memory_node.core.planner import Nearest, QueryVectors
from memory_node.core.store import pose_index
from memory_node.core.store.pose_index import PoseExcerpt
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, RowFilter
from memory_node.core.vectors import top_k
from memory_node.core.vectors.faiss_index import GraphIndex

Key = tuple[str, str]  # (model_id, stream): one vector index


class Hits:
    """What one path found: scored (id, score) arrays per index, and the ids of candidate rows
    without a usable vector (they fill in, newest first, when the scored ones run short)."""

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []
        self.scores: list[np.ndarray] = []
        self.unscored: list[int] = []

    def add(self, ids: np.ndarray, scores: np.ndarray) -> None:
        self.ids.append(ids)
        self.scores.append(scores)


class LocalBackend:
    """`SearchBackend` over a robot's own memory: rows are `Observation`s, ids its own."""

    def __init__(self, store: SqliteObservationStore, indexes: IndexManager):
        self.store = store
        self.indexes = indexes

    # ---- SearchBackend --------------------------------------------------------------------
    def catch_up(self) -> None:
        self.indexes.sync()

    def stream_names(self) -> set[str]:
        return self.store.stream_names()

    def models(self, streams: Collection[str] | None) -> list[str]:
        names = None if streams is None else tuple(streams)
        return sorted({m for m, _ in self.indexes.keys_for(names)})

    def ordered(self, where: RowFilter, order_by: str, limit: int) -> list[Observation]:
        return self.store.ordered(where, order_by, limit)

    def pose_tracks(self, robots: Collection[str] | None, map_id: str | None,
                    t_min: float | None, t_max: float | None) -> dict[str | None, np.ndarray]:
        """The robot's one pose history (robots and map are a fleet's)."""
        return {None: self.store.pose_track(t_min, t_max)}

    def pose_excerpts(self, robots: Collection[str] | None, map_id: str | None,
                      centre: tuple[float, float], radius: float, t_min: float | None,
                      t_max: float | None, gap_s: float
                      ) -> dict[str | None, np.ndarray | PoseExcerpt]:
        """The pose-history index's excerpt for the circle; the whole track when the index
        cannot answer (a circle over too many cells, a gap threshold finer than it keeps)."""
        got = (self.store.pose_excerpt(centre, radius, t_min, t_max)
               if gap_s >= pose_index.GAP_MIN_S else None)
        if got is None:
            return {None: self.store.pose_track(t_min, t_max)}
        return {None: got}

    def tie_key(self, row: Observation) -> int:
        return row.id or 0  # stored rows always have an id

    def result(self, row: Observation, score: float | None) -> dict[str, Any]:
        return result_fields(row, score)

    def nearest(self, where: RowFilter, qvecs: QueryVectors, k: int,
                min_score: float | None, notes: list[str]) -> Nearest[Observation]:
        keys = [key for key in self.indexes.keys_for(where.streams) if key[0] in qvecs]
        # Views (seen_near) and the archive are SQL's: they take the candidate path.
        in_sql = bool(where.tags) or where.seen_near or where.include_archived
        if where.has_filters and not in_sql:
            hits = self._filtered_in_memory(where, keys, qvecs, k)
        elif where.has_filters or in_sql:
            hits = self._filtered_in_store(where, qvecs, k)
        else:
            hits = self._unfiltered(where, keys, qvecs, k, notes)
        ids = np.concatenate(hits.ids) if hits.ids else np.empty(0, np.int64)
        vals = np.concatenate(hits.scores) if hits.scores else np.empty(0, np.float32)
        if min_score is not None:
            keep = vals >= min_score
            ids, vals = ids[keep], vals[keep]
        ids, vals = top_k(ids, vals, k)
        rows = self._get(where, ids.tolist())
        scored = [(rows[i], float(s)) for i, s in zip(ids.tolist(), vals.tolist(), strict=True)
                  if i in rows]

        def unscored(n: int) -> list[Observation]:
            if not where.has_filters:  # rows not in an index, newest first
                have = {o.id for o, _ in scored}
                fill = [o for o in self.store.ordered(where, "-time", k + len(scored))
                        if o.id not in have
                        and not self.indexes.contains(o.model_id, o.stream, o.id)]
            else:
                fill = sorted(self._get(where, hits.unscored).values(),
                              key=lambda o: (o.t, o.id), reverse=True)
            return fill[:n]

        return Nearest(scored, unscored)

    def ordered_with_scores(self, where: RowFilter, order_by: str, qvecs: QueryVectors,
                            min_score: float | None, limit: int
                            ) -> list[tuple[Observation, float | None]]:
        """Order by time or a tag (the store's one ordering, in SQL), reporting (and with
        min_score, filtering by) similarity."""
        rows = self.store.ordered(where, order_by, limit if min_score is None else -1)
        archived = (self.store.archived_vectors([o.id for o in rows if o.archived and o.id])
                    if where.include_archived else {})
        scored: list[tuple[Observation, float | None]] = []
        for obs in rows:
            score = None
            if obs.archived:
                pair = archived.get(obs.id or 0)
                vec = pair[1] if pair is not None else None
            else:
                vec = self.indexes.vector(obs.model_id, obs.stream, obs.id)
            qv = qvecs.get(obs.model_id) if obs.model_id else None
            if vec is not None and qv is not None:
                score = float(vec @ qv)
            if min_score is not None and (score is None or score < min_score):
                continue
            scored.append((obs, score))
            if len(scored) == limit:
                break
        return scored

    # ---- the three semantic paths -----------------------------------------------------------
    def _filtered_in_memory(self, where: RowFilter, keys: list[Key], qvecs: QueryVectors,
                            k: int) -> Hits:
        """Time and place filters run in memory, over each index's (t, x, y) columns: the same
        comparisons as SQL, without a round trip."""
        hits = Hits()
        matched = 0
        for key in keys:
            idx = self.indexes.get(key)
            if idx is None:
                continue
            pos = idx.filter_positions(where.t_min, where.t_max, where.near, where.radius)
            matched += len(pos)
            if len(pos):
                hits.add(*idx.search_positions(qvecs[key[0]], k, pos))
        if matched < k:  # too few embedded matches: rows without vectors fill in
            have = set(np.concatenate(hits.ids).tolist()) if hits.ids else set()
            hits.unscored = [i for i in self.store.candidates(where).ids.tolist()
                             if i not in have]
        return hits

    def _filtered_in_store(self, where: RowFilter, qvecs: QueryVectors, k: int) -> Hits:
        """Tag filters (with any others) run in SQL; the candidates are scored exactly."""
        hits = Hits()
        cand = self.store.candidates(where)
        # Archived rows (include_archived) kept their vectors apart from the index: scored
        # here, exactly.
        archived = (self.store.archived_vectors(cand.ids.tolist())
                    if where.include_archived else {})
        got_ids, got_vals = [], []
        for oid, (model_id, vec) in archived.items():
            qv = qvecs.get(model_id) if model_id else None
            if qv is not None and len(vec) == len(qv):
                got_ids.append(oid)
                got_vals.append(float(vec @ qv))
        if got_ids:
            hits.add(np.asarray(got_ids, np.int64), np.asarray(got_vals, np.float32))
        got = set(got_ids)
        groups: dict[Key, list[int]] = {}
        for oid, stream, model_id in zip(cand.ids.tolist(), cand.streams, cand.model_ids,
                                        strict=True):
            if oid in archived:
                if oid not in got:
                    hits.unscored.append(oid)
                continue
            if model_id is not None and model_id in qvecs:
                groups.setdefault((model_id, stream), []).append(oid)
            else:
                hits.unscored.append(oid)
        for key, ids in groups.items():
            idx = self.indexes.get(key)
            if idx is None:
                hits.unscored.extend(ids)
                continue
            arr = np.asarray(ids, np.int64)
            i, s = idx.search(qvecs[key[0]], k, candidates=arr)
            hits.add(i, s)
            if len(i) < min(k, len(arr)):  # rows whose vectors are not indexed yet
                hits.unscored.extend(np.setdiff1d(arr, self.indexes.ids_of(key)).tolist())
        return hits

    def _unfiltered(self, where: RowFilter, keys: list[Key], qvecs: QueryVectors, k: int,
                    notes: list[str]) -> Hits:
        """No filter but streams: one search per model, over one graph of all its streams (HNSW
        above its size threshold)."""
        hits = Hits()
        streams: dict[str, list[str]] = {}
        for model_id, stream in keys:
            streams.setdefault(model_id, []).append(stream)
        for model_id, names in streams.items():
            ids, scores, building = self.indexes.search(
                model_id, qvecs[model_id], k,
                None if where.streams is None else tuple(names))
            if building:
                graph = self.indexes.graph(model_id)
                part = graph.partial_nodes if graph is not None else None
                if graph is not None and part is not None and where.streams is None:
                    notes.append(f"the graph index of {', '.join(sorted(names))} is being "
                                 f"built in the background: {part} of {len(graph)} rows are "
                                 "in it so far; " + partial_words(graph))
                else:
                    doing = ("read from the index cache" if self.indexes.reading(model_id)
                             else "built in the background")
                    notes.append(f"exact search over {', '.join(sorted(names))}: the graph "
                                 f"index of their vectors is being {doing}")
            hits.add(ids, scores)
        return hits

    def _get(self, where: RowFilter, ids: list[int]) -> dict[int, Observation]:
        return self.store.get(ids, include_archived=where.include_archived)


def partial_words(graph: GraphIndex) -> str:
    """How a search during a first build found its rows, in a note's words."""
    if not graph.partial_coarse:
        return "the others were scanned exactly"
    recall = graph.partial_coarse_recall
    measured = "" if recall is None else f", recall@5 {recall:.3f} on held-out rows"
    where = "every row was" if graph.partial_coarse_alone else "the others were"
    return f"{where} probed in a coarse index (approximate{measured})"
