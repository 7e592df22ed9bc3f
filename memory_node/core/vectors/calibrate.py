"""Self-calibration of a graph search: the smallest search depth that keeps a recall target.

A fixed efSearch is tuned for the hardest data it was tried on and overpays on easier data
(MiniLM captions reach the target at a far shallower search than clustered synthetic
vectors). So a graph measures itself: a sample of its rows held out of it (a row that is a
node is found through its own links, which flatters the graph, by far on overlapping
clusters) and the last real queries are answered
exactly (brute force over the graph's live rows) and through the graph at each (efSearch,
rerank) of a grid; the cheapest pair whose recall@5 holds the target by one standard error of
the sample (so that it holds on new queries too, not just on these: the error of its
queries' own recalls where misses come a whole query at a time) is kept. Held-out rows and
real queries are held to the target each on its own once there are `MIN_REAL` real ones:
a user's queries are worded unlike the rows (on MiniLM captions query texts get a clearly
lower recall than held-out rows at the same depth), so neither may carry the other. The
figures: bench/results/NOTES.md, finding 19. Recall counts a
returned row as right when its exact score reaches the k-th exact score (rows tied with it
are equally right), after the exact re-scoring every search does.

Pure numpy + faiss: `GraphIndex` runs it in the background worker and calls back to take its
graph lock for a few queries at a time, so no search waits long.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

# efSearch values tried, ascending; the search itself raises efSearch to the candidates it
# fetches. RERANK_GRID: candidates re-scored exactly with the float vectors.
EF_GRID = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
RERANK_GRID = (16, 24, 32, 48, 64, 96)
IVF_RERANKS = (16, 32)  # an inverted file's 8-bit ranking is the graph's: a shorter grid
SAMPLE_QUERIES = 300  # rows held out of the graph as queries (1500 neighbours at k=5)
MIN_QUERIES = 50  # fewer queries than this measure too coarsely: no calibration
RECENT_QUERIES = 256  # real queries kept for the next calibration
MIN_REAL = 32  # real queries held to the target on their own (fewer: pooled with held rows)
# Measured again each time the real queries kept pass one of these counts: a graph's misses
# come a whole query at a time (none of its neighbours found), a few percent of the queries on
# MiniLM captions, so a few dozen queries can show none of them.
REAL_CHECKPOINTS = (MIN_REAL, 64, 128, RECENT_QUERIES)
# When no setting holds the target, the cheapest one whose recall is within one standard
# error (at least this much) of the best measured serves: the deepest search costs several
# times a shallower one for what the sample cannot tell apart (on MiniLM query texts the
# depth a sample ranked best did worse on other queries than a shallower one: finding 19).
UNMET_SLACK = 0.002
GROWTH = 0.25  # re-calibrate once the graph holds this share more live rows
BATCH = 8  # queries per graph search while holding the graph lock (a few ms)
K5, K10 = 5, 10


class RecentQueries:
    """The last `maxlen` distinct real queries, oldest first. A question asked again is kept
    once: an agent that repeats one question (a patrol's "anything new at the door?") would
    otherwise fill the sample with copies of it, and the real queries' group would measure
    that one question (seen once, and the recall promised did not hold on other questions:
    bench/results/NOTES.md, finding 15)."""

    def __init__(self, maxlen: int = RECENT_QUERIES):
        # Keyed by the vector's bytes (the same text embeds to the same vector, byte for
        # byte), in the order first asked: a dict keeps it.
        self._queries: dict[bytes, np.ndarray] = {}
        self.maxlen = maxlen
        self._lock = threading.Lock()  # searches on several threads append at once

    def append(self, query: np.ndarray) -> None:
        key = query.tobytes()
        with self._lock:
            if key in self._queries:
                return
            if len(self._queries) >= self.maxlen:
                del self._queries[next(iter(self._queries))]  # the oldest
            self._queries[key] = query

    def extend(self, queries: Iterable[np.ndarray]) -> None:
        for q in queries:
            self.append(q)

    def __len__(self) -> int:
        return len(self._queries)

    def __iter__(self) -> Iterator[np.ndarray]:
        with self._lock:  # a copy: appends may come while the caller reads
            return iter(list(self._queries.values()))


@dataclass(frozen=True)
class Calibration:
    """What a graph promises: its search depth and the recall measured with it."""

    ef_search: int
    rerank: int
    recall_at_5: float
    recall_at_10: float
    target: float
    met: bool  # False: no pair of the grid held the target (see UNMET_SLACK)
    rows: int  # live graph rows when measured
    queries: int  # queries measured (held-out rows + real ones)
    real_queries: int
    seconds: float
    serial: int = 0  # which graph (GraphIndex's build counter) it was measured on
    # Set when the inverted file over the graph's rows serves instead of the graph walk: the
    # lists it probes (`ef_search` is then the graph's own, for when it serves again).
    nprobe: int | None = None
    search_us: float | None = None  # the kept setting's candidate search, per query

    @property
    def searched_by(self) -> str:
        """What an unrestricted search walks: "graph" or "inverted file"."""
        return "graph" if self.nprobe is None else "inverted file"

    def info(self) -> dict:
        """The figures a user sees (`streams`' "indexes")."""
        out = asdict(self)
        out.pop("serial")
        return out


@dataclass
class Snapshot:
    """The graph as it was when calibration began: node ids and part codes up to its length
    (nodes added later are ignored), and each part's rows."""

    search: Callable[[np.ndarray, int, int], np.ndarray]  # (queries, k, ef) -> node positions
    graph_ids: np.ndarray
    graph_codes: np.ndarray  # -1: tombstone
    parts: Sequence[tuple[np.ndarray, object]]  # per code: (ids, vectors or SlotRows)


def _rows(vectors: object, pos: np.ndarray) -> np.ndarray:
    return np.asarray(vectors[pos], np.float32)  # type: ignore[index]


def exact_truth(snap: Snapshot, queries: np.ndarray, k: int, cancelled: Callable[[], bool],
                chunk: int = 16384) -> np.ndarray | None:
    """The k best exact scores of each query over the graph's live rows, best first; -inf
    where fewer rows. None when cancelled."""
    nq = len(queries)
    best = np.full((nq, k), -np.inf, np.float32)
    live_sets = {c: np.sort(snap.graph_ids[snap.graph_codes == c])
                 for c in range(len(snap.parts))}
    qt = np.ascontiguousarray(queries.T)
    for c, (ids, vectors) in enumerate(snap.parts):
        live = live_sets[c]
        for start in range(0, len(ids), chunk):
            if cancelled():
                return None
            cid = ids[start:start + chunk]
            at = np.searchsorted(live, cid)
            at[at >= len(live)] = 0
            ok = live[at] == cid if len(live) else np.zeros(len(cid), bool)
            if not ok.any():
                continue
            scores = (_rows(vectors, np.arange(start, start + len(cid))[ok]) @ qt).T
            merged = np.concatenate([best, scores], axis=1)
            if merged.shape[1] > k:
                merged = -np.partition(-merged, k - 1, axis=1)[:, :k]
            best = merged
    return np.sort(best, axis=1)[:, ::-1]


def _candidate_scores(snap: Snapshot, queries: np.ndarray, pos: np.ndarray, fetch: int,
                      finders: list) -> np.ndarray:
    """Exact scores of each query's first `fetch` live candidates (tombstones and nodes
    added after the snapshot left out), -inf padded: what the search re-scores."""
    g = len(snap.graph_ids)
    nq = len(queries)
    out = np.full((nq, fetch), -np.inf, np.float32)
    ok = (pos >= 0) & (pos < g)
    safe = np.where(ok, pos, 0)
    codes = np.where(ok, snap.graph_codes[safe], -1)
    ids = snap.graph_ids[safe]
    ok &= codes >= 0
    # The first `fetch` survivors of each row, in the graph's order.
    rank = np.cumsum(ok, axis=1) - 1
    ok &= rank < fetch
    for c in np.unique(codes[ok]).tolist():
        sel = ok & (codes == c)
        qi, col = np.nonzero(sel)
        ppos = finders[c](ids[sel])
        found = ppos >= 0
        vecs = _rows(snap.parts[c][1], ppos[found])
        out[qi[found], rank[sel][found]] = np.einsum("ij,ij->i", vecs, queries[qi[found]])
    return out


def _recall(cand: np.ndarray, kth: np.ndarray, k: int) -> float:
    """Share of each query's k best exact rows that the candidates hold (a candidate tied
    with the k-th exact score counts: equally right)."""
    per = _per_query(cand, kth, k)
    return float(per.mean()) if len(per) else 1.0


def _per_query(cand: np.ndarray, kth: np.ndarray, k: int) -> np.ndarray:
    """Each query's recall (queries with fewer than k rows to find left out)."""
    have = np.isfinite(kth)
    hits = np.minimum((cand[have] >= (kth[have, None] - 1e-6)).sum(axis=1), k)
    return hits / k


def _margin(per: np.ndarray, target: float, k: int) -> float:
    """One standard error of a recall measured on these queries: of a binomial over their
    neighbours, or of the queries' own recalls where misses come a whole query at a time
    (larger then), whichever is larger."""
    n = max(1, len(per))
    binomial = math.sqrt(target * (1 - target) / (n * k))
    return max(binomial, float(per.std()) / math.sqrt(n))


def ivf_grid(nlist: int) -> tuple[int, ...]:
    """Lists an inverted file of `nlist` lists is tried at, ascending, up to a quarter of
    them (probing more reads more than a quarter of the rows' codes: no index then)."""
    most = max(1, nlist // 4)
    return tuple(sorted({p for p in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
                         if p < most} | {most}))


def calibrate(snap: Snapshot, held: np.ndarray, real: np.ndarray, target: float,
              cancelled: Callable[[], bool], finders: list, serial: int = 0,
              grid: Sequence[int] = EF_GRID, walk: bool = True,
              max_us: float | None = None, reranks: Sequence[int] = RERANK_GRID
              ) -> Calibration | None:
    """Measure recall@5 and @10 over the grid and keep the cheapest (depth, rerank) that
    holds `target` at k=5 (cost: the candidates the search keeps, then rerank). The depth is
    a graph's efSearch (`walk`: a walk keeps at least the candidates it returns, so a depth
    below them is the same search) or an inverted file's lists probed (`nprobe` of the
    result). `held`: vectors of rows held out of the graph, `real`: recent real queries.
    `finders[c](ids)` -> positions in part c (-1 where gone). With `max_us`, a rerank depth
    stops deepening once a search takes longer than that a query (what another index holds
    the target in: deeper only costs more). None when cancelled."""
    t0 = time.perf_counter()
    queries = np.ascontiguousarray(np.concatenate([held, real]).astype(np.float32))
    if not len(queries):
        return None
    truth = exact_truth(snap, queries, K10, cancelled)
    if truth is None:
        return None
    kth5, kth10 = truth[:, K5 - 1], truth[:, K10 - 1]
    groups = ([slice(0, len(held)), slice(len(held), len(queries))]
              if len(real) >= MIN_REAL and len(held) else [slice(0, len(queries))])
    best: tuple[tuple[int, int], int, int, float, float, float] | None = None
    tried: list[tuple[tuple[int, int], int, int, float, float, float, float]] = []
    for rerank in reranks:
        fetch = max(K5 + 8, rerank)  # what a k=5 search re-scores (GraphIndex.search_parts)
        last_eff = -1
        for ef in grid:
            eff = max(ef, fetch + 1) if walk else ef
            if eff == last_eff:
                continue  # the same search as the previous step
            last_eff = eff
            cost = (eff, rerank)
            if best is not None and cost >= best[0]:
                break  # no cheaper than what holds already
            pos = np.empty((len(queries), fetch + 1), np.int64)
            spent = 0.0
            for start in range(0, len(queries), BATCH):
                if cancelled():
                    return None
                t1 = time.perf_counter()
                pos[start:start + BATCH] = snap.search(queries[start:start + BATCH],
                                                       fetch + 1, eff)
                spent += time.perf_counter() - t1
            us = round(spent / len(queries) * 1e6, 1)
            cand = _candidate_scores(snap, queries, pos, fetch, finders)
            # What the graph promises: the recall of its worst group, each group held to the
            # target by one standard error (so that it holds on new queries too).
            per5 = [_per_query(cand[g], kth5[g], K5) for g in groups]
            by5 = [float(p.mean()) if len(p) else 1.0 for p in per5]
            r5 = min(by5)
            r10 = min(_recall(cand[g], kth10[g], K10) for g in groups)
            error = max(_margin(p, target, K5) for p in per5)
            tried.append((cost, ef, rerank, r5, r10, error, us))
            if all(r >= min(1.0, target + _margin(p, target, K5))
                   for r, p in zip(by5, per5, strict=True)):
                best = (cost, ef, rerank, r5, r10, us)
                break
            if max_us is not None and us > max_us:
                break
    seconds = round(time.perf_counter() - t0, 3)
    n_live = int((snap.graph_codes >= 0).sum())
    met = best is not None
    if best is None:
        top = max(tried, key=lambda t: (t[3], [-c for c in t[0]]))
        near = top[3] - max(UNMET_SLACK, top[5])
        _c, ef, rerank, r5, r10, _e, us = min(t for t in tried if t[3] >= near)
    else:
        _c, ef, rerank, r5, r10, us = best
    return Calibration(ef if walk else 0, rerank, round(r5, 4), round(r10, 4), target, met,
                       n_live, len(queries), len(real), seconds, serial,
                       nprobe=None if walk else ef, search_us=us)
