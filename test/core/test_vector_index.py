"""The vector indexes the engine uses rank like brute force: `ExactIndex` exactly, `GraphIndex`
(the HNSW graph over a model's streams) with high recall and exact scores."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from memory_node.core.vectors import ExactIndex, top_k
from memory_node.core.vectors.faiss_index import GraphIndex
from memory_node.core.vectors.hnsw_graph import halves_of as _halves_of
from memory_node.core.vectors.hnsw_graph import hnsw_of as _hnsw_of

DIM = 16
# The graph's two storages: 8-bit codes re-scored with the float vectors, or float copies,
# each as two halves walked at once (the default); "/1": one graph; "/1/12": one graph
# walking the vectors' projections on 12 principal axes.
STORAGES = ["sq8", "flat", "sq8/1", "sq8/1/12", "flat/2/12"]


# Embeddings spread most along a few axes: 8 of the 16 here, with a little in every other.
_AXES = np.random.default_rng(99).standard_normal((8, DIM))


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = (rng.standard_normal((n, 8)) @ _AXES
         + 0.3 * rng.standard_normal((n, DIM))).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _brute(ids, vecs, q, k, allowed=None):
    if allowed is not None:
        mask = np.isin(ids, allowed)
        ids, vecs = ids[mask], vecs[mask]
    return top_k(ids, vecs @ q, k)


def _exact(ids: np.ndarray, vecs: np.ndarray) -> ExactIndex:
    idx = ExactIndex(DIM)
    idx.add(ids, vecs)
    return idx


def _graph(ids: np.ndarray, vecs: np.ndarray, storage: str = "sq8", **options) -> GraphIndex:
    """A graph over one stream ("camera") holding `vecs` under `ids`; a tiny `min_rows` so the
    graph is really built and walked (inline, as no scheduler is given)."""
    storage, halves, dims = (storage.split("/") + ["", ""])[:3]
    settings = {"min_rows": 50, "ef_search": 256, "storage": storage,
                "halves": int(halves or 2), "dims": int(dims or 0), **options}
    graph = GraphIndex(DIM, **settings)
    graph.attach("camera", _exact(ids, vecs))
    return graph


def _search(idx: ExactIndex | GraphIndex, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """An unrestricted search, whichever the index."""
    if isinstance(idx, GraphIndex):
        ids, scores, building = idx.search_parts(q, k)
        assert not building  # no scheduler: the graph work is done inside the search
        return ids, scores
    return idx.search(q, k)


def test_exact_restricted_search_ranks_like_brute_force():
    """A filtered search scores its candidate ids exactly, whichever path (gather or full
    product) the candidate count picks."""
    rng = np.random.default_rng(1)
    ids = np.arange(10, 1010, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    for gather_max in (20000, 10):  # gather the candidates, or mask one full product
        idx = ExactIndex(DIM, gather_max=gather_max)
        idx.add(ids, vecs)
        assert len(idx) == len(ids)
        for trial in range(20):
            q = _unit(rng, 1)[0]
            allowed = rng.choice(ids, size=int(rng.integers(1, 60)), replace=False)
            got_ids, got_scores = idx.search(q, 5, candidates=allowed)
            want_ids, want_scores = _brute(ids, vecs, q, 5, allowed)
            assert got_ids.tolist() == want_ids.tolist(), f"trial {trial}"
            np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["exact", *STORAGES])
def test_unrestricted_search_recall(kind):
    rng = np.random.default_rng(2)
    ids = np.arange(2000, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    idx = _exact(ids, vecs) if kind == "exact" else _graph(ids, vecs, kind)
    hits = 0
    for _ in range(30):
        q = _unit(rng, 1)[0]
        got, _ = _search(idx, q, 5)
        want, _ = _brute(ids, vecs, q, 5)
        hits += len(set(got.tolist()) & set(want.tolist()))
    recall = hits / (30 * 5)
    if kind == "exact":
        assert recall == 1.0
    else:
        assert not idx.exact and idx.builds == 1  # answered through the graph
        assert recall >= 0.95


@pytest.mark.parametrize("kind", ["exact", *STORAGES])
def test_remove_and_readd(kind):
    rng = np.random.default_rng(3)
    ids = np.arange(200, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    q = vecs[17]
    if kind == "exact":
        idx = _exact(ids, vecs)
        assert idx.search(q, 1)[0][0] == 17
        assert idx.remove(np.array([17])) == 1
        assert 17 not in idx.search(q, 5)[0].tolist()
        assert 17 not in idx.search(q, 5, candidates=np.array([17, 18]))[0].tolist()
        idx.add(np.array([17]), vecs[17:18])
        assert idx.search(q, 1)[0][0] == 17
        assert len(idx) == 200
        return
    graph = _graph(ids, vecs, kind)
    assert _search(graph, q, 1)[0][0] == 17
    assert graph.remove_rows(np.array([17])) == 1  # a tombstone in the graph, skipped
    assert 17 not in _search(graph, q, 5)[0].tolist()
    assert graph.remove_rows(np.array([17])) == 0  # already gone
    graph.add_rows("camera", np.array([17]), vecs[17:18])
    assert _search(graph, q, 1)[0][0] == 17
    assert len(graph) == 200 and graph.pending == 0 and graph.builds == 1  # added, not rebuilt


def test_empty_indexes_and_bad_rows():
    """Empty indexes answer nothing; a vector of the wrong dimension, a part of another
    dimension or a part attached twice is refused and leaves the rows as they were."""
    q = np.ones(DIM, np.float32) / 4
    exact = ExactIndex(DIM)
    ids, scores = exact.search(q, 5)
    assert len(ids) == 0 and len(scores) == 0
    exact.add(np.array([1, 2]), np.stack([q, -q]))
    assert exact.search(q, 5, candidates=np.array([], np.int64))[0].tolist() == []
    assert exact.search(q, 5, candidates=np.array([999]))[0].tolist() == []
    assert exact.search(q, 10)[0].tolist() == [1, 2]
    with pytest.raises(ValueError, match="dimension"):
        exact.add(np.array([3]), np.ones((1, DIM + 1), np.float32))
    assert exact.ids().tolist() == [1, 2]

    graph = GraphIndex(DIM, min_rows=50)
    ids, scores, building = graph.search_parts(q, 5)
    assert len(ids) == 0 and len(scores) == 0 and not building
    graph.attach("camera", ExactIndex(DIM))
    assert len(graph.search_parts(q, 5)[0]) == 0
    graph.add_rows("camera", np.array([1, 2]), np.stack([q, -q]))
    with pytest.raises(ValueError, match="dimension"):
        graph.add_rows("camera", np.array([3]), np.ones((1, DIM + 1), np.float32))
    with pytest.raises(ValueError, match="dimension"):
        graph.attach("lidar", ExactIndex(DIM + 1))
    with pytest.raises(ValueError, match="already attached"):
        graph.attach("camera", ExactIndex(DIM))
    assert list(graph.parts) == ["camera"]
    assert graph.search_parts(q, 10)[0].tolist() == [1, 2]


def test_unknown_storage_is_refused():
    with pytest.raises(ValueError, match="unknown HNSW storage"):
        GraphIndex(DIM, storage="pq")


def test_below_min_rows_no_graph_is_built():
    """Below `min_rows` rows in all parts searches are exact and no graph is built; once the
    parts reach it, the graph is built (inline without a scheduler, else by the worker, with
    exact answers meanwhile)."""
    rng = np.random.default_rng(7)
    ids = np.arange(1, 601, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    scheduled: list[GraphIndex] = []
    for scheduler in (None, scheduled.append):
        graph = GraphIndex(DIM, min_rows=500, scheduler=scheduler)
        graph.attach("camera", _exact(ids[:400], vecs[:400]))
        for _ in range(10):
            q = _unit(rng, 1)[0]
            got, scores, building = graph.search_parts(q, 5)
            want, want_scores = _brute(ids[:400], vecs[:400], q, 5)
            assert got.tolist() == want.tolist() and not building
            np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
        assert graph.exact and not graph.building and not graph.needs_work()
        assert graph.builds == 0
        graph.add_rows("camera", ids[400:], vecs[400:])
        q = _unit(rng, 1)[0]
        got, _s, building = graph.search_parts(q, 5)
        if scheduler is None:
            assert not building and not graph.exact and graph.builds == 1
        else:  # the worker has not run: exact, and the answer says a graph is being built
            assert building and graph.building and graph.builds == 0
            assert got.tolist() == _brute(ids, vecs, q, 5)[0].tolist()
            assert scheduled and scheduled[-1] is graph


@pytest.mark.parametrize("storage", STORAGES)
def test_saved_graph_reused_only_with_the_same_settings(storage, tmp_path):
    rng = np.random.default_rng(4)
    ids = np.arange(1000, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    built = _graph(ids, vecs, storage)
    q = vecs[3]
    want = _search(built, q, 5)
    assert not built.exact and built.save_graph(tmp_path / "g.hnsw")
    same = _graph(ids, vecs, storage)
    assert same.load_graph(tmp_path / "g.hnsw") and not same.exact
    got = _search(same, q, 5)
    assert same.builds == 0  # the saved graph, not a new one
    assert got[0].tolist() == want[0].tolist()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    # Built with other settings: rebuilt, never adopted.
    other_m = _graph(ids, vecs, storage, m=16)
    assert not other_m.load_graph(tmp_path / "g.hnsw") and other_m.exact
    # A graph over projections on other axes than asked for is rebuilt; one over whole
    # vectors (what a projection that misses the recall target falls back to) is adopted.
    projected = storage.endswith("/12")
    for dims in (8, 0):
        other_dims = _graph(ids, vecs, storage, dims=dims)
        assert other_dims.load_graph(tmp_path / "g.hnsw") == (not projected)
    other_storage = _graph(ids, vecs, "flat" if storage == "sq8" else "sq8")
    assert not other_storage.load_graph(tmp_path / "g.hnsw")
    assert _search(other_storage, q, 5)[0].tolist() == want[0].tolist()
    assert other_storage.builds == 1
    assert not _graph(ids, vecs, storage).load_graph(tmp_path / "missing.hnsw")


def test_a_graph_saved_with_per_dimension_ranges_is_rebuilt(tmp_path):
    """Earlier releases' 8-bit codes kept a value range per dimension: such a cache is not
    adopted (its codes would be decoded with the wrong ranges) but rebuilt."""
    rng = np.random.default_rng(12)
    ids = np.arange(400, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    old = faiss.IndexHNSWSQ(DIM, faiss.ScalarQuantizer.QT_8bit, 48, faiss.METRIC_INNER_PRODUCT)
    old.hnsw.efConstruction = 200
    old.train(vecs)
    old.add(vecs)
    faiss.write_index(old, str(tmp_path / "old.hnsw"))  # with its codes, as it was saved then
    np.save(tmp_path / "old.graph_ids.npy", ids)
    graph = _graph(ids, vecs, "sq8")
    assert not graph.load_graph(tmp_path / "old.hnsw")
    got, scores = _search(graph, vecs[7], 5)
    assert got[0] == 7 and graph.builds == 1


@pytest.mark.parametrize("halves", [1, 2])
def test_rows_added_one_by_one_are_found_at_their_nodes(halves):
    """Rows added to a built graph a few at a time (odd counts: each half's next node
    alternates) are found under their own ids: a node's position maps to the right half, and
    removed rows stay out of answers."""
    rng = np.random.default_rng(13)
    ids = np.arange(1000, dtype=np.int64)
    vecs = _unit(rng, 1600)
    graph = _graph(ids, vecs[:1000], "sq8", halves=halves)
    assert _search(graph, vecs[5], 1)[0][0] == 5  # built over the first 1000
    at = 1000
    for n in (1, 3, 2, 5, 1, 7, 581):
        new = np.arange(at, at + n, dtype=np.int64)
        graph.add_rows("camera", new, vecs[at:at + n])
        at += n
        assert _search(graph, vecs[at - 1], 1)[0][0] == at - 1  # added inside the search
    assert graph.builds == 1 and graph.pending == 0
    sizes = [h.ntotal for h in _halves(graph)]  # node p is node p // 2 of half p % 2
    assert len(sizes) == halves and sum(sizes) == graph.nodes and max(sizes) - min(sizes) <= 1
    for i in (0, 999, 1000, 1001, 1003, 1004, 1599, *rng.integers(0, 1600, 40).tolist()):
        got, scores = _search(graph, vecs[i], 1)
        assert got[0] == i, f"row {i}"
        np.testing.assert_allclose(scores[0], 1.0, rtol=1e-5)
    graph.remove_rows(np.array([1001, 1004]))
    assert {1001, 1004}.isdisjoint(_search(graph, vecs[1001], 10)[0].tolist())


@pytest.mark.parametrize("storage", STORAGES)
def test_a_row_replayed_into_the_graph_twice_is_answered_once(storage):
    """A row added again without being removed (a replay over rows already indexed) becomes
    a second live node with the same id: an answer still holds it once."""
    rng = np.random.default_rng(14)
    ids = np.arange(500, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    graph = _graph(ids, vecs, storage)
    assert _search(graph, vecs[42], 1)[0].tolist() == [42]
    graph.add_rows("camera", ids[42:43], vecs[42:43])  # the same row once more
    got, _ = _search(graph, vecs[42], 5)  # (added to the graph inside the search)
    assert graph.pending == 0 and got[0] == 42
    got, _ = _search(graph, vecs[42], 5)
    assert got.tolist().count(42) == 1 and len(set(got.tolist())) == 5


def test_a_forked_child_searches_two_halves_too():
    """A process forked after a search (a worker pool) walks the second half on a thread of
    its own: the parent's walker thread does not exist there."""
    import multiprocessing

    rng = np.random.default_rng(15)
    ids = np.arange(600, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    graph = _graph(ids, vecs, "sq8", halves=2)
    assert _search(graph, vecs[9], 1)[0][0] == 9  # the parent's walker now exists
    _FORKED["graph"] = graph  # the child inherits it (a graph is not pickled)
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            got = pool.apply_async(_search_in_child, (vecs[77],)).get(timeout=60)
    finally:
        _FORKED.clear()
    assert got == [77]


_FORKED: dict[str, GraphIndex] = {}


def _search_in_child(q: np.ndarray) -> list[int]:
    return _search(_FORKED["graph"], q, 1)[0].tolist()


def test_eight_bit_graph_scores_are_exact_after_rescoring():
    rng = np.random.default_rng(5)
    ids = np.arange(3000, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    graph = _graph(ids, vecs, "sq8")
    for _ in range(10):
        q = _unit(rng, 1)[0]
        got, scores = _search(graph, q, 5)
        np.testing.assert_allclose(scores, vecs[got] @ q, rtol=1e-6)
    assert not graph.exact


def test_ties_break_by_newest_id():
    ids = np.array([5, 9, 7, 1], np.int64)
    scores = np.array([0.5, 0.5, 0.9, 0.5], np.float32)
    got, _ = top_k(ids, scores, 3)
    assert got.tolist() == [7, 9, 5]


def test_graph_work_is_never_done_inside_a_search():
    """With a scheduler (the engine's background worker), searches stay exact while no graph
    is ready, find rows added since the graph was built, skip removed rows, and never build."""
    rng = np.random.default_rng(6)
    scheduled = []
    graph = GraphIndex(DIM, min_rows=50, ef_search=256, scheduler=scheduled.append)
    graph.attach("camera", ExactIndex(DIM))
    ids = np.arange(1, 1201, dtype=np.int64)
    vecs = _unit(rng, len(ids))
    graph.add_rows("camera", ids[:1000], vecs[:1000])
    assert scheduled and graph.building and graph.builds == 0
    q = _unit(rng, 1)[0]
    got, _s, building = graph.search_parts(q, 5)
    assert building and got.tolist() == _brute(ids[:1000], vecs[:1000], q, 5)[0].tolist()
    assert graph.builds == 0  # the search did not build

    while graph.work():  # what the worker does, in the background
        pass
    assert not graph.building and graph.builds == 1

    graph.add_rows("camera", ids[1000:], vecs[1000:])  # new rows: searchable at once, exactly
    assert graph.pending == 200
    assert graph.search_parts(vecs[1099], 1)[0].tolist() == [1100]
    while graph.work():
        pass
    assert graph.pending == 0 and graph.builds == 1  # added to the live graph, not rebuilt
    assert graph.search_parts(vecs[1099], 1)[0].tolist() == [1100]

    gone = ids[::10]  # compaction removes 10%: tombstones, no rebuild
    graph.remove_rows(gone)
    keep = ~np.isin(ids, gone)
    for _ in range(20):
        q = _unit(rng, 1)[0]
        got = graph.search_parts(q, 5)[0]
        assert not np.isin(got, gone).any()
        want = _brute(ids[keep], vecs[keep], q, 5)[0]
        assert len(set(got.tolist()) & set(want.tolist())) >= 4
    assert graph.builds == 1
    graph.remove_rows(ids[1::4])  # beyond a fifth of the graph removed: rebuilt, in the background
    assert graph.builds == 1 and graph.needs_work()
    while graph.work():
        pass
    assert graph.builds == 2


def test_time_window_is_a_binary_search_whatever_the_insert_order():
    """Rows arriving out of time order (an older bag replayed, notes with past stamps) keep
    the window cut by binary search: exact, and only the window's rows are compared."""
    rng = np.random.default_rng(8)
    idx = ExactIndex(DIM)
    n = 20000
    t = np.arange(n, dtype=np.float64)
    late = rng.choice(n, n // 20, replace=False)  # 5% arrive late, in random order
    order = np.concatenate([np.setdiff1d(np.arange(n), late), rng.permutation(late)])
    ids = np.arange(1, n + 1, dtype=np.int64)
    xy = rng.uniform(0, 50, (n, 2))
    for chunk in np.array_split(order, 40):
        meta = np.column_stack([t[chunk], xy[chunk]])
        idx.add(ids[chunk], _unit(rng, len(chunk)), meta)
    gone = rng.choice(ids, 500, replace=False)
    idx.remove(gone)
    alive = ~np.isin(ids, gone)
    for _ in range(30):
        lo = float(rng.uniform(0, n))
        hi = lo + float(rng.uniform(0, n / 50))
        pos = idx.filter_positions(lo, hi, near=(25.0, 25.0), radius=20.0)
        got = np.sort(idx.ids_at(pos))
        inside = alive & (t >= lo) & (t <= hi) & (((xy - 25.0) ** 2).sum(1) <= 400.0)
        assert got.tolist() == ids[inside].tolist()
        assert idx.scanned <= (alive & (t >= lo) & (t <= hi)).sum()  # the window, no more
    everything = idx.filter_positions(-1.0, 2.0 * n, near=(25.0, 25.0), radius=20.0)
    inside = alive & (((xy - 25.0) ** 2).sum(1) <= 400.0)  # a window wider than the data
    assert np.sort(idx.ids_at(everything)).tolist() == ids[inside].tolist()
    idx.add(np.array([n + 1]), _unit(rng, 1), np.array([[5.5, 1.0, 1.0]]))  # one more, late
    assert n + 1 in idx.ids_at(idx.filter_positions(5.0, 6.0)).tolist()
    assert idx.scanned <= 3  # t = 5.0, 5.5, 6.0


def test_one_graph_over_several_streams(tmp_path):
    """One graph over several exact indexes (a model's streams): a search over all of them or
    over some streams ranks like brute force over those streams' rows, never returns a row of
    another stream, and keeps doing so through added and removed rows and a reload."""
    rng = np.random.default_rng(9)
    sizes = {"camera": 900, "lidar": 600, "events": 60}  # events: below the graph's share
    parts, rows = {}, {}
    start = 1
    for name, n in sizes.items():
        ids = np.arange(start, start + n, dtype=np.int64)
        start += n
        rows[name] = (ids, _unit(rng, n))
        parts[name] = ExactIndex(DIM)
        parts[name].add(*rows[name])
    graph = GraphIndex(DIM, min_rows=50, ef_search=64)
    for name, part in parts.items():
        graph.attach(name, part)

    def brute(q, names, k=5):
        ids = np.concatenate([rows[n][0] for n in names])
        vecs = np.concatenate([rows[n][1] for n in names])
        return _brute(ids, vecs, q, k)[0]

    def recall(names, trials=30):
        hit = 0
        for _ in range(trials):
            q = _unit(rng, 1)[0]
            got, _s, building = graph.search_parts(q, 5, names)
            assert not building
            allowed = np.concatenate([rows[n][0] for n in (names or sizes)])
            assert np.isin(got, allowed).all()
            hit += len(set(got.tolist()) & set(brute(q, names or list(sizes)).tolist()))
        return hit / (5 * trials)

    assert recall(None) >= 0.95 and graph.builds == 1  # built inline: no scheduler
    assert recall(["camera"]) >= 0.95  # the graph, camera rows as a filter on its nodes
    assert recall(["lidar", "events"]) >= 0.95
    q = _unit(rng, 1)[0]
    assert graph.search_parts(q, 5, ["events"])[0].tolist() == brute(q, ["events"]).tolist()

    new_ids = np.arange(start, start + 40, dtype=np.int64)  # new rows: found before the graph
    new_vecs = _unit(rng, 40)  # has them (searched exactly beside it)
    graph.scheduler = lambda g: None  # a worker that never runs
    graph.add_rows("lidar", new_ids, new_vecs)
    assert graph.pending == 40
    assert graph.search_parts(new_vecs[3], 1, ["lidar"])[0].tolist() == [new_ids[3]]
    assert graph.search_parts(new_vecs[3], 1, ["camera"])[0].tolist() != [new_ids[3]]
    rows["lidar"] = (np.concatenate([rows["lidar"][0], new_ids]),
                     np.concatenate([rows["lidar"][1], new_vecs]))
    gone = rows["camera"][0][::7]
    graph.remove_rows(gone)
    for _ in range(10):
        got = graph.search_parts(_unit(rng, 1)[0], 5)[0]
        assert not np.isin(got, gone).any()
    assert graph.builds == 1
    keep = ~np.isin(rows["camera"][0], gone)
    rows["camera"] = (rows["camera"][0][keep], rows["camera"][1][keep])
    assert recall(["camera"]) >= 0.95 and recall(None) >= 0.95

    assert graph.save_graph(tmp_path / "g.hnsw")  # a reload knows each node's stream again
    graph = GraphIndex(DIM, min_rows=50, ef_search=64, scheduler=lambda g: None)
    for name, part in parts.items():
        graph.attach(name, part)
    assert graph.load_graph(tmp_path / "g.hnsw") and graph.pending == 40  # never added
    assert recall(["camera"]) >= 0.95 and recall(["lidar", "events"]) >= 0.95


def _halves(graph) -> tuple:
    """The faiss graphs behind a GraphIndex (two halves by default)."""
    return _halves_of(graph._hnsw)  # noqa: SLF001 - the bytes compared


def _codes(graph) -> list[np.ndarray]:
    """Each half's node codes, node for node."""
    out = []
    for half in _halves(graph):
        storage = faiss.downcast_index(_hnsw_of(half).storage)
        out.append(faiss.vector_to_array(storage.codes).reshape(storage.ntotal, -1))
    return out


@pytest.mark.parametrize(("storage", "dims"), [("sq8", 0), ("flat", 0), ("sq8", 12)])
def test_a_saved_graph_holds_links_and_its_codes_are_encoded_again(tmp_path, storage, dims):
    """The graph file keeps links, not codes (the vector files hold the vectors): read back,
    each node's code is encoded from its row's vector again, byte for byte the one it had;
    a node removed since takes its vector from `vectors_of` (the archive)."""
    rng = np.random.default_rng(8)
    n = 3000
    ids = np.arange(1, n + 1, dtype=np.int64)
    vecs = _unit(rng, n)
    part = ExactIndex(DIM)
    part.add(ids, vecs)
    graph = GraphIndex(DIM, min_rows=50, m=16, storage=storage, dims=dims)
    graph.attach("camera", part)
    graph.build()
    want_codes = _codes(graph)
    queries = _unit(rng, 20)
    want = [graph.search_parts(q, 5)[0].tolist() for q in queries]
    assert graph.save_graph(tmp_path / "g.hnsw")
    whole = sum(len(faiss.serialize_index(h)) for h in _halves(graph))  # links and codes
    codes_bytes = sum(c.nbytes for c in want_codes)
    assert (tmp_path / "g.hnsw").stat().st_size <= whole - codes_bytes  # links only
    archived = ids[::10]  # removed after the save: their vectors are in the archive
    part2 = ExactIndex(DIM)
    keep = ~np.isin(ids, archived)
    part2.add(ids[keep], vecs[keep])
    again = GraphIndex(DIM, min_rows=50, m=16, storage=storage, dims=dims,
                       scheduler=lambda g: None)
    again.attach("camera", part2)
    asked: list[int] = []

    def vectors_of(missing: list[int]) -> dict[int, np.ndarray]:
        asked.extend(missing)
        return {i: vecs[i - 1] for i in missing}

    assert again.load_graph(tmp_path / "g.hnsw", vectors_of)
    assert sorted(asked) == archived.tolist()
    for got_codes, half_codes in zip(_codes(again), want_codes, strict=True):
        np.testing.assert_array_equal(got_codes, half_codes)
    for q, w in zip(queries, want, strict=True):
        got = again.search_parts(q, 5)[0].tolist()
        assert got == _brute(ids[keep], vecs[keep], q, 5)[0].tolist()
        assert set(got) <= set(w) | set(_brute(ids[keep], vecs[keep], q, 5)[0].tolist())


def test_a_projection_is_judged_by_where_it_ranks_each_rows_neighbours():
    """Rows spread along a few axes keep their exact neighbours among the best by their
    projection on those axes; rows spread evenly over every axis do not (the check a graph
    makes before it walks projections)."""
    from memory_node.core.vectors.projection import projection_recall

    rng = np.random.default_rng(21)
    few_axes = _unit(rng, 3000)
    assert projection_recall(few_axes, 12, 32, 200) >= 0.99
    even = rng.standard_normal((3000, DIM)).astype(np.float32)
    even /= np.linalg.norm(even, axis=1, keepdims=True)
    assert projection_recall(even, 8, 32, 200) < 0.9
