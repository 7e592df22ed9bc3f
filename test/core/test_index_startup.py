"""Start-up from the index cache: arrays are mapped, not copied, and cached graphs are read in
the background. Answers never change on the way: exact (and saying so) until a graph is read,
a graph found damaged then is rebuilt with one warning, and the cache files stay as written."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
from engine_support import FakeClock, PoseBox, make_engine
from test_index_cache import DIM, _manager, _small_store
from test_index_graph import QUERY, saved_with_graph

import memory_node.core.index_manager as im
from memory_node.core.types import Observation, Pose
from memory_node.core.vectors import top_k

STREAMS = ("camera", "events")


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "index").rglob("*")) if p.is_file() and p.name != ".lock"}


def _mapped_deleted(root: Path) -> list[str]:
    """Files under root/index that this process maps although they were deleted (once the
    garbage collector has run: an array in a reference cycle is unmapped when it does)."""
    gc.collect()
    with open("/proc/self/maps") as fh:
        return sorted({line.split(None, 5)[-1].strip() for line in fh
                       if str(root / "index") in line and "(deleted)" in line})


def _brute(store, stream: str, q: np.ndarray, k: int = 5) -> list[int]:
    rows = [(oid, np.frombuffer(blob, np.float32)) for oid, st, _m, _t, _x, _y, blob
            in store.all_vectors() if st == stream]
    ids = np.array([r[0] for r in rows], np.int64)
    return top_k(ids, np.stack([r[1] for r in rows]) @ q, k)[0].tolist()


def _add_rows(store, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rows = [Observation(stream=STREAMS[i % 2], t=5000.0 + seed + i, pose=Pose(i, 1),
                        model_id="m") for i in range(n)]
    store.insert(rows, list(vecs))


@pytest.fixture
def cached(tmp_path):
    """A store of 3,000 rows (two streams over the graph threshold) with a written cache."""
    root = tmp_path / "m"
    _small_store(root)
    mgr = _manager(root)
    mgr.load_or_rebuild()
    assert mgr.wait_for_graphs(120)
    assert mgr.persist()
    mgr.close()
    mgr.store.close()
    return root


@pytest.fixture
def held_graph_reads(monkeypatch):
    """Cached graphs are not read until the test sets the returned event."""
    gate = threading.Event()
    real = im.GraphSource.load

    def held(self, cancelled):
        gate.wait(120)
        return real(self, cancelled)

    monkeypatch.setattr(im.GraphSource, "load", held)
    yield gate
    gate.set()


def _check_ranking(mgr, rng) -> None:
    for _ in range(10):
        q = rng.standard_normal(DIM).astype(np.float32)
        q /= np.linalg.norm(q)
        for stream in STREAMS:
            idx = mgr.get(("m", stream))
            want = _brute(mgr.store, stream, q)
            assert idx.search(q, 5)[0].tolist() == want
            assert mgr.search("m", q, 5, (stream,))[0].tolist()[:1] == want[:1]


def test_rows_added_after_a_start_rank_exactly_and_leave_the_cache_files_alone(cached):
    mgr = _manager(cached)
    mgr.load_or_rebuild()
    assert mgr.wait_for_graphs(120)
    rng = np.random.default_rng(5)
    before = _digests(cached)
    _add_rows(mgr.store, 600, seed=0)  # fits the room after the mapped rows
    mgr.sync()
    _check_ranking(mgr, rng)
    assert _digests(cached) == before, "a file of the loaded cache changed"
    assert mgr.persist()  # replaces the generation this process mapped at its start...
    assert _mapped_deleted(cached) == []  # ...whose disk space is freed: no longer mapped
    _check_ranking(mgr, rng)
    before = _digests(cached)
    _add_rows(mgr.store, 3000, seed=1)  # more than the room: the arrays are copied
    mgr.sync()
    _check_ranking(mgr, rng)
    assert _digests(cached) == before, "a file of the loaded cache changed"
    assert mgr.persist()
    mgr.close()
    mgr.store.close()
    again = _manager(cached)  # the next start maps the cache just written
    again.load_or_rebuild()
    assert again.total() == 3000 + 3600
    _check_ranking(again, rng)
    again.close()
    again.store.close()


def test_a_graph_found_damaged_in_the_background_is_rebuilt_with_one_warning(
        tmp_path, caplog, held_graph_reads):
    root = tmp_path / "m"
    want = saved_with_graph(root)
    manifest = json.loads((root / "index" / "manifest.json").read_text())
    [graph] = (root / "index" / manifest["dir"]).glob("*.graph.hnsw")
    data = bytearray(graph.read_bytes())
    data[len(data) // 2:len(data) // 2 + 512] = bytes(range(256)) * 2
    graph.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="memory_node"):
        eng = make_engine(root, FakeClock(), PoseBox(Pose(0, 0)), hnsw_min_rows=5)
        got = json.loads(eng.search(QUERY))  # the graph is not read yet: exact, and noted
        assert got["results"] == want["results"]
        assert any("events" in n and "being read from the index cache" in n
                   for n in got["notes"])
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        held_graph_reads.set()
        assert eng.indexes.wait_for_graphs(60)
        after = json.loads(eng.search(QUERY))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and graph.name in warnings[0] and "rebuild" in warnings[0]
    assert after["results"] == want["results"] and "notes" not in after
    eng.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        eng = make_engine(root, FakeClock(), PoseBox(Pose(0, 0)), hnsw_min_rows=5)
        assert eng.indexes.wait_for_graphs(60)
        assert json.loads(eng.search(QUERY))["results"] == want["results"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    [key] = eng.indexes.keys_for(("events",))
    assert eng.indexes.graph(key[0]).builds == 0  # read from the cache, not built
    eng.close()


def _graphs_read_not_built(root: Path, caplog) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        mgr = _manager(root)
        mgr.load_or_rebuild()
        assert mgr.wait_for_graphs(120)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    graph = mgr.graph("m")
    assert not graph.exact and graph.builds == 0
    mgr.close()
    mgr.store.close()


def test_a_graph_not_read_yet_at_close_is_kept_for_the_next_start(cached, caplog,
                                                                   held_graph_reads):
    mgr = _manager(cached)
    mgr.load_or_rebuild()
    assert mgr.building("m")  # its graph is still unread
    _add_rows(mgr.store, 10, seed=1)
    mgr.sync()
    assert mgr.persist()  # carries the unread graph files over, with their checksums
    mgr.close()
    mgr.store.close()
    held_graph_reads.set()
    _graphs_read_not_built(cached, caplog)


def test_graphs_are_read_from_files_another_process_has_since_replaced(cached, caplog,
                                                                        held_graph_reads):
    reader = _manager(cached)
    reader.load_or_rebuild()
    writer = _manager(cached)  # another process with the store open, writing its cache
    writer.load_or_rebuild()
    assert writer.persist()  # a new generation; the one the reader opened is deleted
    old_dirs = [p for p in (cached / "index").iterdir() if p.is_dir()]
    assert len(old_dirs) == 1
    held_graph_reads.set()
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        assert reader.wait_for_graphs(120)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    graph = reader.graph("m")
    assert not graph.exact and graph.builds == 0
    for m in (reader, writer):
        m.close()
        m.store.close()
    _graphs_read_not_built(cached, caplog)


def test_rows_added_and_removed_while_graphs_are_read_are_ranked_once_read(cached,
                                                                            held_graph_reads):
    mgr = _manager(cached)
    mgr.load_or_rebuild()
    _add_rows(mgr.store, 300, seed=2)
    gone = list(range(1, 400, 3))  # compaction archives rows the cached graphs hold
    assert mgr.store.archive(gone, "test") == len(gone)
    mgr.sync()
    rng = np.random.default_rng(9)
    _check_ranking(mgr, rng)  # exact: the graphs are not read yet
    assert mgr.building("m")
    held_graph_reads.set()
    assert mgr.wait_for_graphs(120)
    graph = mgr.graph("m")
    assert not graph.exact and graph.builds == 0  # the cached graph, not a new one
    for stream in STREAMS:
        assert not np.isin(gone, mgr.get(("m", stream)).ids()).any()
    _check_ranking(mgr, rng)
    mgr.close()
    mgr.store.close()
