"""The query planner: filters first, then ranking, exact for every filtered query.

Three paths, chosen by what a plan holds (docs/design.md, "Query semantics"):
- no semantic part: the store orders the filtered rows (time, or a numeric tag);
- semantic with filters: candidates are filtered (time/place in memory over each index's
  (t, x, y) columns, tags in SQL) and scored exactly; rows without vectors fill in;
- semantic without filters: each model's graph answers over all its streams (the requested
  streams as a filter on its nodes, or an exact scan when they are small).
It receives the store, the indexes, the query embedder and the catch-up call; it never sees
the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from memory_node.core.index_manager import IndexManager
from memory_node.core.query import SearchPlan
from memory_node.core.store.base import ObservationStore
from memory_node.core.types import Observation
from memory_node.core.vectors import top_k

Scored = list[tuple[Observation, float | None]]
Key = tuple[str, str]  # (model_id, stream): one vector index
QueryVectors = dict[str, np.ndarray | None]  # the query's embedding per model


@dataclass
class Hits:
    """What one path found: scored (id, score) arrays per index, and the ids of candidate rows
    without a usable vector (they fill in, newest first, when the scored ones run short)."""

    ids: list[np.ndarray] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)
    unscored: list[int] = field(default_factory=list)

    def add(self, ids: np.ndarray, scores: np.ndarray) -> None:
        self.ids.append(ids)
        self.scores.append(scores)


class QueryPlanner:
    def __init__(self, store: ObservationStore, indexes: IndexManager,
                 query_vector: Callable[[str, str], np.ndarray | None],
                 sync: Callable[[], int]):
        self.store = store
        self.indexes = indexes
        self.query_vector = query_vector
        self.sync = sync

    def run(self, req: SearchPlan) -> tuple[Scored, list[str]]:
        """The planner: filters first, then ranking, exact for every filtered query."""
        self.sync()
        notes: list[str] = []
        if req.empty_window:
            return [], ["the time window is empty (its start is after its end)"]
        if not req.semantic_query:
            return [(o, None) for o in self.store.ordered(req.filter, req.order_by, req.k)], notes

        keys = self.indexes.keys_for(req.streams)
        if not keys:
            notes.append("no embedded rows in the requested stream(s): semantic_query ignored,"
                         " newest first")
            return [(o, None) for o in self.store.ordered(req.filter, "-time", req.k)], notes
        qvecs = {m: self.query_vector(m, req.semantic_query) for m in {k[0] for k in keys}}

        if req.order_by != "score":
            return self._ordered_with_scores(req, qvecs), notes
        # Views (seen_near) and the archive are SQL's: they take the candidate path.
        in_sql = bool(req.tags) or req.filter.seen_near or req.include_archived
        if req.has_filters and not in_sql:
            hits = self._filtered_in_memory(req, keys, qvecs)
        elif req.has_filters or in_sql:
            hits = self._filtered_in_store(req, qvecs)
        else:
            hits = self._unfiltered(req, keys, qvecs, notes)
        return self._ranked(req, hits), notes

    def _filtered_in_memory(self, req: SearchPlan, keys: list[Key], qvecs: QueryVectors) -> Hits:
        """Time and place filters run in memory, over each index's (t, x, y) columns: the same
        comparisons as SQL, without a round trip."""
        hits = Hits()
        matched = 0
        for key in keys:
            qv = qvecs.get(key[0])
            idx = self.indexes.get(key)
            if qv is None or idx is None:
                continue
            pos = idx.filter_positions(req.t_min, req.t_max, req.near, req.radius)
            matched += len(pos)
            if len(pos):
                hits.add(*idx.search_positions(qv, req.k, pos))
        if matched < req.k:  # too few embedded matches: rows without vectors fill in
            have = set(np.concatenate(hits.ids).tolist()) if hits.ids else set()
            hits.unscored = [i for i in self.store.candidates(req.filter).ids.tolist()
                             if i not in have]
        return hits

    def _filtered_in_store(self, req: SearchPlan, qvecs: QueryVectors) -> Hits:
        """Tag filters (with any others) run in SQL; the candidates are scored exactly."""
        hits = Hits()
        cand = self.store.candidates(req.filter)
        # Archived rows (include_archived) kept their vectors apart from the index: scored
        # here, exactly.
        archived = (self.store.archived_vectors(cand.ids.tolist())
                    if req.include_archived else {})
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
            if model_id is not None and qvecs.get(model_id) is not None:
                groups.setdefault((model_id, stream), []).append(oid)
            else:
                hits.unscored.append(oid)
        for key, ids in groups.items():
            idx = self.indexes.get(key)
            qv = qvecs[key[0]]
            if idx is None or qv is None:
                hits.unscored.extend(ids)
                continue
            arr = np.asarray(ids, np.int64)
            i, s = idx.search(qv, req.k, candidates=arr)
            hits.add(i, s)
            if len(i) < min(req.k, len(arr)):  # rows whose vectors are not indexed yet
                hits.unscored.extend(np.setdiff1d(arr, self.indexes.ids_of(key)).tolist())
        return hits

    def _unfiltered(self, req: SearchPlan, keys: list[Key], qvecs: QueryVectors,
                    notes: list[str]) -> Hits:
        """No filter but streams: one search per model, over one graph of all its streams (HNSW
        above its size threshold)."""
        hits = Hits()
        streams: dict[str, list[str]] = {}
        for model_id, stream in keys:
            streams.setdefault(model_id, []).append(stream)
        for model_id, names in streams.items():
            qv = qvecs.get(model_id)
            if qv is None:
                continue
            ids, scores, building = self.indexes.search(
                model_id, qv, req.k, None if req.streams is None else tuple(names))
            if building:
                graph = self.indexes.graph(model_id)
                part = graph.partial_nodes if graph is not None else None
                if graph is not None and part is not None and req.streams is None:
                    notes.append(f"the graph index of {', '.join(sorted(names))} is being "
                                 f"built in the background: {part} of {len(graph)} rows are "
                                 "in it so far; the others were scanned exactly")
                else:
                    doing = ("read from the index cache" if self.indexes.reading(model_id)
                             else "built in the background")
                    notes.append(f"exact search over {', '.join(sorted(names))}: the graph "
                                 f"index of their vectors is being {doing}")
            hits.add(ids, scores)
        return hits

    def _ranked(self, req: SearchPlan, hits: Hits) -> Scored:
        """The k best hits by score; with room left (and no min_score), rows without vectors
        fill in, newest first."""
        ids = np.concatenate(hits.ids) if hits.ids else np.empty(0, np.int64)
        vals = np.concatenate(hits.scores) if hits.scores else np.empty(0, np.float32)
        if req.min_score is not None:
            keep = vals >= req.min_score
            ids, vals = ids[keep], vals[keep]
        ids, vals = top_k(ids, vals, req.k)
        rows = self._get(req, ids.tolist())
        out: Scored = [
            (rows[i], float(s))
            for i, s in zip(ids.tolist(), vals.tolist(), strict=True) if i in rows
        ]
        missing = req.k - len(out)
        if missing > 0 and req.min_score is None:
            if not req.has_filters:
                fill = self.store.ordered(req.filter, "-time", req.k + len(out))
                have = {o.id for o, _ in out}
                fill = [o for o in fill if o.id not in have
                        and not self.indexes.contains(o.model_id, o.stream, o.id)]
            else:
                fill_rows = self._get(req, hits.unscored)
                fill = sorted(fill_rows.values(), key=lambda o: (o.t, o.id), reverse=True)
            out.extend((o, None) for o in fill[:missing])
        return out

    def _get(self, req: SearchPlan, ids: list[int]) -> dict[int, Observation]:
        if req.include_archived:
            return self.store.get(ids, include_archived=True)  # type: ignore[call-arg]
        return self.store.get(ids)

    def _ordered_with_scores(self, req: SearchPlan, qvecs: QueryVectors) -> Scored:
        """Order by time or a tag, reporting (and with min_score, filtering by) similarity."""
        cand = self.store.candidates(req.filter)
        rows = self._get(req, cand.ids.tolist())
        archived = (self.store.archived_vectors([i for i, o in rows.items() if o.archived])
                    if req.include_archived else {})
        scored: list[tuple[Observation, float | None]] = []
        for oid, obs in rows.items():
            score = None
            if obs.archived:
                pair = archived.get(oid)
                vec = pair[1] if pair is not None else None
            else:
                vec = self.indexes.vector(obs.model_id, obs.stream, oid)
            qv = qvecs.get(obs.model_id) if obs.model_id else None
            if vec is not None and qv is not None:
                score = float(vec @ qv)
            if req.min_score is not None and (score is None or score < req.min_score):
                continue
            scored.append((obs, score))
        key = req.order_by
        if key in ("time", "-time"):
            scored.sort(key=lambda p: (p[0].t, p[0].id), reverse=key == "-time")
        else:
            tag = key.lstrip("-")
            desc = key.startswith("-")

            def tag_key(p: tuple[Observation, float | None]) -> tuple:
                obs = p[0]
                v = obs.tags.get(tag)
                last = (-obs.t, -(obs.id or 0))  # stored rows always have an id
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return (0, -v if desc else v, *last)
                return (1, 0, *last)

            scored.sort(key=tag_key)
        return scored[: req.k]
