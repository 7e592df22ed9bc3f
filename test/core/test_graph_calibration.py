"""A graph calibrates its search depth to a recall target, measured the way a user's queries
would see it, re-checks it as it grows, and says what it promises in `streams`."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from engine_support import FakeClock, PoseBox, make_engine

from memory_node.core.types import Observation, Pose
from memory_node.core.vectors import ExactIndex, top_k
from memory_node.core.vectors.faiss_index import GraphIndex

DIM = 32


class OneStreamGraph(GraphIndex):
    """A graph over one stream of its own, searched the way an unfiltered query is."""

    def __init__(self, dim: int, **settings) -> None:
        super().__init__(dim, **settings)
        self.attach("camera", ExactIndex(dim))

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        self.add_rows("camera", ids, vectors, None)

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids, scores, _building = self.search_parts(query, k)
        return ids, scores


def clustered(n: int, seed: int, spread: float, clusters: int = 60) -> np.ndarray:
    """Unit vectors around `clusters` centres; a larger `spread` makes clusters overlap (a
    harder set for a graph: more hops to find the true neighbours)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    v = centres[rng.integers(0, clusters, n)] + spread * rng.standard_normal((n, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def on_few_axes(n: int, seed: int, axes: int = 8) -> np.ndarray:
    """Clustered unit vectors spread along `axes` of the DIM axes, with a little noise on
    every other (as embeddings are: a graph over their principal axes walks them well)."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((DIM, axes)))[0].T  # orthonormal rows
    low = clustered(n, seed, 0.4)[:, :axes]
    v = low @ basis + 0.02 * rng.standard_normal((n, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def recall_at_5(idx: OneStreamGraph, ids: np.ndarray, vecs: np.ndarray, queries: np.ndarray
                ) -> float:
    hits = 0
    for q in queries:
        got = idx.search(q, 5)[0]
        want = top_k(ids, vecs @ q, 5)[0]
        hits += len(set(got.tolist()) & set(want.tolist()))
    return hits / (5 * len(queries))


def built(vecs: np.ndarray, **kw) -> OneStreamGraph:
    idx = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000, **kw)
    idx.add(np.arange(1, len(vecs) + 1, dtype=np.int64), vecs)
    idx.build()
    return idx


def test_calibrated_depth_holds_the_target_on_queries_the_graph_never_saw():
    for spread, seed in ((0.15, 1), (0.9, 2)):
        data = clustered(8000, seed, spread)
        vecs, unseen = data[:7000], data[7000:7200]  # the same distribution, not stored
        idx = built(vecs)
        c = idx.calibration
        assert c is not None and c.met and c.recall_at_5 >= 0.99
        assert c.queries >= 50 and c.rows == idx.nodes  # rows held out are not nodes
        # What it promises holds for new queries (within the sample's noise).
        ids = np.arange(1, len(vecs) + 1, dtype=np.int64)
        assert recall_at_5(idx, ids, vecs, unseen) >= 0.97


def test_easy_data_gets_a_shallower_search_than_hard_data():
    easy = built(clustered(7000, 3, 0.1)).calibration
    hard = built(clustered(7000, 3, 1.2, clusters=400)).calibration
    assert easy is not None and hard is not None
    assert easy.ef_search < hard.ef_search


def test_a_grown_graph_is_measured_again_and_held_rows_are_found():
    vecs = clustered(9000, 4, 0.5)
    idx = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000, scheduler=lambda g: None)
    idx.add(np.arange(1, 6001, dtype=np.int64), vecs[:6000])
    while idx.work():  # what the engine's background worker does
        pass
    first = idx.calibration
    assert first is not None and first.rows < 6000
    idx.add(np.arange(6001, 9001, dtype=np.int64), vecs[6000:])  # +50%
    while idx.work():
        pass
    again = idx.calibration
    assert again is not None and again is not first and again.rows > first.rows * 1.25
    # Every row, held out of the graph or not, is found by its own vector.
    for i in range(0, 9000, 97):
        assert idx.search(vecs[i], 1)[0].tolist() == [i + 1]


def test_real_queries_join_the_next_measurement():
    vecs = clustered(7000, 5, 0.5)
    idx = built(vecs)
    first = idx.calibration
    assert first is not None and first.real_queries == 0
    for q in clustered(30, 6, 0.5):
        idx.search(q, 5)
    again = idx.calibrate()
    assert again is not None and again.real_queries == 30
    assert again.queries == first.queries + 30


def test_a_question_asked_again_is_measured_once():
    """An agent that repeats one question: its copies do not fill the real queries' sample
    (256 copies of one caption query let the held-out rows alone set the depth, and recall@5
    on other questions fell to 0.963)."""
    vecs = clustered(7000, 5, 0.5)
    idx = built(vecs)
    asked = clustered(30, 6, 0.5)
    for _ in range(20):  # the same question, again and again
        idx.search(asked[0], 5)
    for q in asked:  # then 30 questions, the first one among them once more
        idx.search(q.copy(), 5)
    again = idx.calibrate()
    assert again is not None and again.real_queries == 30


def test_recent_queries_keep_the_last_distinct_ones():
    from memory_node.core.vectors.calibrate import RecentQueries

    qs = [np.full(4, i, np.float32) for i in range(6)]
    recent = RecentQueries(maxlen=3)
    recent.extend([qs[0], qs[1], qs[0], qs[2], qs[2]])
    assert [int(q[0]) for q in recent] == [0, 1, 2]
    recent.extend([qs[3], qs[0]])  # 0 left with the oldest, so it is new again
    assert [int(q[0]) for q in recent] == [2, 3, 0] and len(recent) == 3


def test_no_target_no_calibration():
    idx = built(clustered(7000, 7, 0.5), recall_target=0)
    assert idx.calibration is None and not idx.needs_work()


def _engine_over_even_spread(tmp_path, caplog):
    """An engine whose 6000 vectors spread evenly over all 32 axes, its graph asked to walk
    8 of them; its graph, and the ids and vectors stored."""
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(), hnsw_min_rows=1000,
                      hnsw_m=8, hnsw_ef_construction=40, hnsw_dims=8)
    vecs = clustered(6000, 8, 0.6)
    rows = [Observation(stream="imported", t=1000.0 + i, pose=Pose(0, 0)) for i in range(6000)]
    with caplog.at_level("INFO", logger="memory_node.core"):
        ids = eng.add_embedded(rows, vecs, "test-clusters-32")
        assert eng.indexes.wait_for_graphs(120)
    entry = json.loads(eng.streams())["indexes"][0]
    assert entry["graph"] == "ready" and entry["graph_dims"] == 32  # whole vectors
    assert entry["target_met"] is True and entry["recall_at_5"] >= 0.99
    graph = eng.indexes.graph("test-clusters-32")
    hits = 0
    for q in clustered(40, 9, 0.6):
        got, _s, _b = graph.search_parts(q, 5)
        want = np.asarray(ids)[np.argsort(-(vecs @ q))[:5]]
        hits += len(set(got.tolist()) & set(want.tolist()))
    assert hits / (5 * 40) >= 0.95
    return graph


def test_a_projection_that_ranks_neighbours_badly_is_not_built(tmp_path, caplog):
    """Vectors spread evenly over all 32 axes: sampled rows' exact neighbours are not among
    the best by 8 components, so the graph is built over whole vectors at once (and says
    why), never over the projection first."""
    graph = _engine_over_even_spread(tmp_path, caplog)
    assert graph.builds == 1
    assert any("graph over whole 32-d vectors" in r.getMessage() for r in caplog.records)


def test_a_projection_that_misses_the_target_when_walked_is_rebuilt_whole(tmp_path, caplog,
                                                                          monkeypatch):
    """The check before the build let through (told to look at every row's rank): the
    calibration finds the walk over 8 components short of the target at every depth, so the
    graph is rebuilt over whole vectors (with a warning), calibrated again, and holds it."""
    from memory_node.core.vectors import faiss_index

    monkeypatch.setattr(faiss_index, "PROJECTION_REACH", 5990)
    graph = _engine_over_even_spread(tmp_path, caplog)
    assert graph.builds == 2  # projected, then whole
    assert any("8-component projections" in r.getMessage() and "whole vectors" in
               r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


def test_streams_says_what_the_graph_promises(tmp_path, monkeypatch):
    """Its depth, the recall measured, the components it walks (projections on 16 of the
    32 axes here), and which index serves: the walk, or the inverted file beside it (kept
    above COARSE_MIN_ROWS, lowered here) with the lists it probes."""
    from memory_node.core.vectors import faiss_index

    monkeypatch.setattr(faiss_index, "COARSE_MIN_ROWS", 5000)
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(), hnsw_min_rows=1000,
                      hnsw_m=8, hnsw_ef_construction=40, hnsw_dims=16)
    vecs = on_few_axes(6000, 8)
    rows = [Observation(stream="imported", t=1000.0 + i, pose=Pose(0, 0)) for i in range(6000)]
    eng.add_embedded(rows, vecs, "test-clusters-32")
    assert eng.indexes.wait_for_graphs(120)
    info = json.loads(eng.streams())["indexes"]
    assert len(info) == 1
    entry = info[0]
    assert entry["model_id"] == "test-clusters-32" and entry["vectors"] == 6000
    assert entry["graph"] == "ready" and entry["graph_dims"] == 16
    assert entry["recall_at_5"] >= entry["recall_target"] == 0.99
    assert entry["target_met"] is True
    assert entry["ef_search"] >= 16 and entry["rerank"] >= 16
    assert entry["calibration_queries"] >= 50 and entry["calibrated_rows"] <= 6000
    c = eng.indexes.graph("test-clusters-32").current_calibration()
    assert entry["searched_by"] == c.searched_by in ("graph", "inverted file")
    assert entry.get("nprobe") == c.nprobe
    assert (entry.get("nprobe") is not None) == (entry["searched_by"] == "inverted file")
    eng.close()


def test_streams_of_a_store_without_a_graph_says_exact(tmp_path):
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox())
    eng.save("the red door")
    info = json.loads(eng.streams())["indexes"]
    assert [(e["graph"], e["vectors"]) for e in info] == [("exact", 1)]
    assert "ef_search" not in info[0]
    eng.close()


def unbuilt_graph() -> tuple[OneStreamGraph, np.ndarray, np.ndarray]:
    """A graph of 10,000 rows whose build the test steps through (no background worker),
    with the 12,000 ids and vectors (`found_mid_build` adds the last 2,000)."""
    vecs = clustered(12000, 9, 0.5)
    ids = np.arange(1, 12001, dtype=np.int64)
    idx = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000, scheduler=lambda g: None)
    idx.add(ids[:10000], vecs[:10000])
    return idx, ids, vecs


def found_mid_build(idx: OneStreamGraph, ids: np.ndarray, vecs: np.ndarray
                    ) -> tuple[float, float]:
    """Searches in the middle of a first build of the first 10,000 rows, the other 2,000
    added then (the first time): the share of a sample of rows, both sides of the part built
    and the last row added included, whose own vector finds them first, and recall@5 on 20
    queries near the rows."""
    if len(idx) == 10000:
        idx.add(ids[10000:], vecs[10000:])  # arrives during the build
    hits = [idx.search_parts(vecs[i], 1)[0].tolist() == [i + 1]
            for i in (*range(0, 12000, 301), 11999)]
    q = clustered(20, 10, 0.5)
    rec = np.mean([len(set(idx.search_parts(x, 5)[0].tolist())
                       & set(top_k(ids, vecs @ x, 5)[0].tolist())) / 5 for x in q])
    return float(np.mean(hits)), float(rec)


def test_searches_during_a_first_build_walk_the_part_built_and_scan_the_rest(monkeypatch):
    """While a first graph is built, a search walks a copy of the part built so far and
    scores every other row exactly: rows on both sides are found, and so are rows added
    after the build began."""
    from memory_node.core.vectors import faiss_index

    idx, ids, vecs = unbuilt_graph()
    seen: list[tuple[int, float, bool]] = []
    publish = faiss_index.GraphIndex._publish_partial

    def checked(self, *a, **kw):
        publish(self, *a, **kw)
        if seen:
            return
        covered = self.partial_nodes
        assert covered is not None and 0 < covered < 10000
        hits, rec = found_mid_build(self, ids, vecs)
        seen.append((covered, hits, rec >= 0.9))

    monkeypatch.setattr(faiss_index.GraphIndex, "_publish_partial", checked)
    while idx.work():
        pass
    assert seen and seen[0][1] == 1.0 and seen[0][2]
    assert idx.partial_nodes is None and not idx.building  # the whole graph serves now
    assert idx.search_parts(vecs[11999], 1)[0].tolist() == [12000]


@pytest.mark.parametrize("alone", [True, False], ids=["coarse-alone", "copy-and-coarse"])
def test_a_large_first_build_probes_a_coarse_index_for_the_rows_its_copy_lacks(monkeypatch,
                                                                               alone):
    """A first build over enough rows indexes them coarsely before the graph: from then on a
    search probes that index for every row (when it holds the recall target alone) or for
    every row the copy of the graph lacks (bounded work, not a scan of them all), from the
    first moment (no node yet) to the last, and rows added after the build began are still
    scanned exactly."""
    from memory_node.core.vectors import faiss_index

    monkeypatch.setattr(faiss_index, "COARSE_MIN_ROWS", 5000)
    build_coarse = faiss_index._Coarse.build.__func__

    def measured_as(cls, *a, **kw):
        coarse = build_coarse(cls, *a, **kw)
        if coarse is not None:
            coarse.alone = alone  # as if its measured recall held the target, or not
        return coarse

    monkeypatch.setattr(faiss_index._Coarse, "build", classmethod(measured_as))
    idx, ids, vecs = unbuilt_graph()
    seen: list[tuple[int, float, float]] = []
    publish = faiss_index.GraphIndex._publish_partial
    probed: list[int] = []
    coarse_search = faiss_index._Coarse.search

    def counted(self, q, want, start):
        probed.append(start)
        return coarse_search(self, q, want, start)

    def checked(self, *a, **kw):
        publish(self, *a, **kw)
        assert self.partial_coarse, "a build this large publishes a coarse index"
        seen.append((self.partial_nodes, *found_mid_build(self, ids, vecs)))

    monkeypatch.setattr(faiss_index.GraphIndex, "_publish_partial", checked)
    monkeypatch.setattr(faiss_index._Coarse, "search", counted)
    while idx.work():
        pass
    assert seen[0][0] == 0, "the coarse index serves before the graph has a node"
    assert any(0 < covered < 10000 for covered, _h, _r in seen)
    for covered, hits, rec in seen:
        assert hits == 1.0 and rec >= 0.9, (covered, hits, rec)
    if alone:
        assert set(probed) == {0}  # every row, the copy not walked
    else:
        assert set(probed) >= {covered for covered, _h, _r in seen}  # from the copy's end on
    assert idx.partial_nodes is None and not idx.partial_coarse  # the whole graph serves now
    assert idx.search_parts(vecs[11999], 1)[0].tolist() == [12000]


@pytest.mark.parametrize("coarse", [False, True], ids=["scan", "coarse"])
def test_a_search_during_a_first_build_says_how_much_of_the_graph_it_walked(tmp_path,
                                                                            monkeypatch,
                                                                            coarse):
    """The engine's answer during a first build names the rows in the graph so far and how
    the others were searched (scanned, or probed in a coarse index with the recall it
    measured); its results are ranked by their exact scores."""
    from engine_support import minilm

    from memory_node.core.vectors import faiss_index

    monkeypatch.setattr(faiss_index, "COARSE_MIN_ROWS", 5000 if coarse else 10**9)
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(), hnsw_min_rows=1000,
                      hnsw_m=8, hnsw_ef_construction=40)
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((40, 384))
    vecs = (centres[rng.integers(0, 40, 10000)] + 0.05 * rng.standard_normal((10000, 384))
            ).astype(np.float32)
    answers: list[dict] = []
    publish = faiss_index.GraphIndex._publish_partial

    def checked(self, *a, **kw):
        publish(self, *a, **kw)
        if not answers:  # in the background worker, between two chunks of the build
            answers.append(json.loads(eng.search('{"semantic_query": "a red door", "k": 5}')))

    monkeypatch.setattr(faiss_index.GraphIndex, "_publish_partial", checked)
    rows = [Observation(stream="imported", t=1000.0 + i, pose=Pose(0, 0)) for i in range(10000)]
    ids = eng.add_embedded(rows, vecs, minilm().model_id)
    assert eng.indexes.wait_for_graphs(300)
    assert answers, "no partial graph was handed to searches"
    ans = answers[0]
    assert ans["ok"] and ans["count"] == 5, ans
    [note] = [n for n in ans["notes"] if "rows are in it so far" in n]
    if coarse:
        assert re.search(r"(the others were|every row was) probed in a coarse index "
                         r"\(approximate, recall@5 [01]\.\d{3} on held-out rows\)$", note), note
    else:
        assert note.endswith("the others were scanned exactly"), note
    scores = [r["score"] for r in ans["results"]]
    assert scores == sorted(scores, reverse=True)
    q = minilm().embed_texts(["a red door"])[0]
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    at = {i: j for j, i in enumerate(ids)}
    for r in ans["results"]:  # exact cosines of the rows returned
        assert r["score"] == pytest.approx(float(unit[at[r["id"]]] @ q), abs=1e-5)
    eng.close()


def test_a_graph_measured_before_real_queries_is_measured_again_once_they_come():
    vecs = clustered(7000, 12, 0.5)
    idx = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000, scheduler=lambda g: None)
    idx.add(np.arange(1, 7001, dtype=np.int64), vecs)
    while idx.work():
        pass
    first = idx.calibration
    assert first is not None and first.real_queries == 0 and not idx.needs_work()
    for q in clustered(64, 13, 0.5):  # an agent's questions
        idx.search(q, 5)
    assert idx.needs_work()
    while idx.work():
        pass
    again = idx.calibration
    assert again is not None and again.real_queries == 64 and not idx.needs_work()


def test_queries_unlike_the_rows_deepen_the_search_once_they_come():
    """Held-out rows flatter a graph whose users ask unlike its rows (an agent's question is
    not a caption): once real queries come, the promise must hold on them too."""
    vecs = clustered(7000, 21, 0.15)
    ids = np.arange(1, 7001, dtype=np.int64)
    idx = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000, scheduler=lambda g: None)
    idx.add(ids, vecs)
    while idx.work():
        pass
    first = idx.calibration
    assert first is not None and first.real_queries == 0

    def asked(n: int, seed: int) -> np.ndarray:  # directions no cluster sits in
        v = np.random.default_rng(seed).standard_normal((n, DIM))
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    for q in asked(64, 6):
        idx.search(q, 5)
    while idx.work():
        pass
    again = idx.calibration
    assert again is not None and again.real_queries == 64
    assert again.ef_search > first.ef_search
    assert again.recall_at_5 >= 0.99
    assert recall_at_5(idx, ids, vecs, asked(200, 5)) >= 0.97


def test_a_restart_measures_the_graph_on_the_queries_asked_before_it(tmp_path):
    """The last real queries are kept with the cached graph: after a restart the promise in
    `streams` is measured on what users asked, not only on held-out rows."""
    settings = {"hnsw_min_rows": 1000, "hnsw_m": 8, "hnsw_ef_construction": 40}
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(), **settings)
    vecs = clustered(6000, 8, 0.4)
    rows = [Observation(stream="imported", t=1000.0 + i, pose=Pose(0, 0)) for i in range(6000)]
    eng.add_embedded(rows, vecs, "test-clusters-32")
    assert eng.indexes.wait_for_graphs(120)
    graph = eng.indexes.graph("test-clusters-32")
    assert graph is not None
    for q in clustered(64, 14, 0.4):  # what unfiltered semantic searches pass on
        graph.search_parts(q, 5)
    assert eng.close() is True  # the index cache written
    again = make_engine(tmp_path / "m", FakeClock(), PoseBox(), **settings)
    try:
        assert again.indexes.wait_for_graphs(120)
        graph = again.indexes.graph("test-clusters-32")
        assert graph is not None and not graph.exact
        measured = graph.current_calibration()
        assert measured is not None and measured.real_queries == 64
        info = json.loads(again.streams())["indexes"][0]
        assert info["calibration_queries"] == measured.queries > 64
    finally:
        again.close()


def test_a_target_no_depth_holds_is_served_by_the_cheapest_depth_near_the_best():
    """Queries a graph never reaches stay missed however deep it looks: the search then
    takes the cheapest depth whose recall the sample cannot tell from the best one (within
    a standard error), not the deepest one, and says the target is not met."""
    from memory_node.core.vectors import calibrate as cal

    rng = np.random.default_rng(30)
    vecs = rng.standard_normal((500, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = np.arange(1, 501, dtype=np.int64)
    queries = vecs[:100] + 0.01  # each finds its own row first
    order = np.argsort(-(queries @ vecs.T), axis=1)

    def search(q: np.ndarray, k: int, ef: int) -> np.ndarray:
        rows = (q[:, None, :] == queries[None, :, :]).all(axis=2).argmax(axis=1)
        out = order[rows, :k].copy()
        if ef < 64:  # a shallow walk misses every other query's best rows
            even = rows % 2 == 0
            out[even] = order[rows[even], 50:50 + k]
        lost = rows < (9 if ef >= 256 else 10)  # ten queries never reached; one of them
        out[lost] = order[rows[lost], 100:100 + k]  # from four times deeper
        return out

    snap = cal.Snapshot(search, ids, np.zeros(500, np.int16), [(ids, vecs)])
    got = cal.calibrate(snap, queries, np.empty((0, DIM), np.float32), 0.99,
                        lambda: False, [lambda want: want - 1])
    assert got is not None and not got.met
    assert got.ef_search == 64 and got.recall_at_5 == 0.9


# ---- the inverted file beside the graph ----------------------------------------------------
SPREAD = 0.05  # clusters apart: an inverted file holds the target probing a few lists


def with_inverted_file(monkeypatch, ivf: str, n: int = 9000, seed: int = 40
                       ) -> tuple[OneStreamGraph, np.ndarray, np.ndarray, np.ndarray]:
    """A graph of `n` rows above the (lowered) size that keeps an inverted file beside it,
    built and calibrated as the background worker does; with 200 queries like its rows
    (the same clusters, not stored)."""
    from memory_node.core.vectors import faiss_index

    monkeypatch.setattr(faiss_index, "COARSE_MIN_ROWS", 5000)
    data = clustered(n + 200, seed, SPREAD)
    vecs, unseen = data[:n], data[n:]
    ids = np.arange(1, n + 1, dtype=np.int64)
    idx = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000, scheduler=lambda g: None,
                         ivf=ivf)
    idx.add(ids, vecs)
    while idx.work():
        pass
    return idx, ids, vecs, unseen


def test_an_inverted_file_that_holds_the_target_serves_and_keeps_up(monkeypatch):
    """Where the inverted file holds the recall target ("prefer"), unrestricted searches
    probe it: it keeps its promise on new queries, finds rows added after it was made, and
    never returns a removed row."""
    idx, ids, vecs, unseen = with_inverted_file(monkeypatch, "prefer")
    c = idx.current_calibration()
    assert c is not None and c.met and c.searched_by == "inverted file"
    assert c.nprobe is not None and c.nprobe >= 1 and c.search_us is not None
    assert recall_at_5(idx, ids, vecs, unseen) >= 0.97
    more = clustered(600, 42, SPREAD)
    more_ids = np.arange(20001, 20601, dtype=np.int64)
    idx.add(more_ids, more)
    while idx.work():
        pass
    assert idx.pending == 0 and idx.current_calibration().searched_by == "inverted file"
    assert all(idx.search(more[i], 1)[0].tolist() == [more_ids[i]] for i in range(0, 600, 7))
    gone = ids[:3000:3]
    idx.remove_rows(gone)
    for q in vecs[:3000:30]:
        assert not set(idx.search(q, 5)[0].tolist()) & set(gone.tolist())


def test_queries_unlike_the_rows_are_held_to_the_target_by_the_inverted_file_too(monkeypatch):
    """Held-out rows flatter an inverted file as they do a graph (a row sits in a list's
    cluster; a question may sit between lists): once real queries come, the source chosen
    holds the target on them too, deeper or by the walk."""
    idx, ids, vecs, _unseen = with_inverted_file(monkeypatch, "auto")

    def asked(n: int, seed: int) -> np.ndarray:  # between the rows' clusters
        return clustered(n, seed, SPREAD)

    for q in asked(64, 46):
        idx.search(q, 5)
    while idx.work():
        pass
    c = idx.current_calibration()
    assert c is not None and c.real_queries == 64 and c.met
    assert recall_at_5(idx, ids, vecs, asked(200, 47)) >= 0.97


def test_off_keeps_no_inverted_file(monkeypatch):
    idx, _ids, _vecs, _q = with_inverted_file(monkeypatch, "off")
    c = idx.current_calibration()
    assert c is not None and c.searched_by == "graph" and c.nprobe is None
    assert idx._ivf is None and not idx.needs_work()


def test_the_faster_source_that_holds_the_target_serves():
    """Both hold the target: the one with fewer microseconds a query (measured in the same
    calibration) serves; one holds it: that one; neither: the higher recall."""
    from memory_node.core.vectors import calibrate as cal

    def measured(met: bool, r5: float, us: float, nprobe: int | None) -> cal.Calibration:
        return cal.Calibration(64, 16, r5, r5, 0.99, met, 9000, 300, 0, 1.0,
                               nprobe=nprobe, search_us=us)

    idx = OneStreamGraph(DIM)
    walk, ivf = measured(True, 0.995, 300.0, None), measured(True, 0.992, 120.0, 32)
    assert idx._pick(walk, ivf) is ivf
    assert idx._pick(walk, measured(True, 0.999, 400.0, 32)) is walk
    assert idx._pick(walk, measured(False, 0.98, 50.0, 32)) is walk
    assert idx._pick(measured(False, 0.97, 300.0, None), measured(False, 0.98, 500.0, 32)
                     ).nprobe == 32
    prefer = OneStreamGraph(DIM, ivf="prefer")
    assert prefer._pick(walk, measured(True, 0.992, 900.0, 32)).nprobe == 32


def test_the_inverted_file_is_dropped_once_the_walk_wins_on_every_real_query(monkeypatch):
    """Kept while a measurement may still find it cheaper (held-out rows flatter a graph:
    real queries can turn the choice), freed for good once the walk wins on the full set of
    real queries kept."""
    from memory_node.core.vectors import calibrate as cal
    from memory_node.core.vectors import faiss_index

    monkeypatch.setattr(faiss_index.GraphIndex, "_pick", lambda self, walk, ivf: walk)
    idx, _ids, _vecs, _q = with_inverted_file(monkeypatch, "auto")
    assert idx._ivf is not None  # measured on held-out rows only so far
    for q in clustered(cal.RECENT_QUERIES, 43, SPREAD):
        idx.search(q, 5)
    while idx.work():
        pass
    c = idx.current_calibration()
    assert c is not None and c.real_queries == cal.RECENT_QUERIES and c.searched_by == "graph"
    assert idx._ivf is None and not idx.needs_work()  # not made again for this graph


def test_a_graph_read_from_the_cache_gets_its_inverted_file_again(monkeypatch, tmp_path):
    """The inverted file is not written with the graph: a graph read back makes it again in
    the background (its node positions, rows removed since left out) and measures it."""
    idx, ids, vecs, unseen = with_inverted_file(monkeypatch, "prefer")
    path = tmp_path / "graph.faiss"
    assert idx.save_graph(path)
    again = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000,
                           scheduler=lambda g: None, ivf="prefer")
    keep = np.ones(len(ids), bool)
    keep[::5] = False  # removed while the process was down
    again.add(ids[keep], vecs[keep])
    assert again.load_graph(path)
    assert again._ivf is None and again.needs_work()
    while again.work():
        pass
    c = again.current_calibration()
    assert c is not None and c.searched_by == "inverted file"
    for q in vecs[:2000:40]:
        got = again.search(q, 5)[0]
        assert not set(got.tolist()) & set(ids[~keep].tolist())
    assert recall_at_5(again, ids[keep], vecs[keep], unseen) >= 0.97


def test_a_row_back_in_its_part_is_found_though_its_old_node_is_a_tombstone(tmp_path):
    """A graph read back after a row left its part marks that row's node dead (its vector
    still read from what the store kept); the row, added again (re-embedded after a damaged
    vector file, say), waits beside the graph until the background adds it. Until then a
    search still finds it by its own vector: the dead node with the same id, which the walk
    finds first, must not hide it."""
    vecs = clustered(3000, 50, 0.5)
    ids = np.arange(1, 3001, dtype=np.int64)
    idx = built(vecs)
    path = tmp_path / "graph.faiss"
    assert idx.save_graph(path)
    again = OneStreamGraph(DIM, m=8, ef_construction=40, min_rows=1000,
                           scheduler=lambda g: None)  # pending rows stay pending
    back = 1500
    again.add(np.delete(ids, back), np.delete(vecs, back, axis=0))
    assert again.load_graph(path, vectors_of=lambda gone: {i: vecs[i - 1] for i in gone})
    again.add(ids[back:back + 1], vecs[back:back + 1])
    assert again.pending == 1
    assert again.search(vecs[back], 1)[0].tolist() == [ids[back]]
