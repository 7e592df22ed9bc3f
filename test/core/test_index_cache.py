"""The index cache (`index/`): damage is detected and rebuilt with one warning, never answered
from; writers in several processes (and kills mid-write) leave a valid cache or none."""

from __future__ import annotations

import json
import logging
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from engine_support import FakeClock, PoseBox, make_engine

from memory_node.core.types import Pose

CFG = {"hnsw_min_rows": 5}  # graphs exist (and are cached) even on a small store
TEXTS = ["Met Alice at the front door, she brought a parcel", "Charged the battery in the dock",
         "The kitchen light is flickering", "A red ball lies under the sofa",
         "Bob waved from the garden", "The lab door was left open", "Water on the hall floor",
         "The printer ran out of paper", "A cat sat on the window sill",
         "Delivered the mail to room 12", "Heard a loud bang near the garage",
         "The blue chair moved to the corridor"]
CAMERA = ["camera sees a person at the door", "camera sees a dark corridor",
          "camera sees a red sofa and a lamp", "camera sees a bright window",
          "camera sees the charging dock", "camera sees a parcel on the floor",
          "camera sees two people talking", "camera sees an open fridge",
          "camera sees a bicycle by the wall", "camera sees green plants",
          "camera sees a closed garage door", "camera sees a cat on a sill"]
QUERIES = ["who was at the door", "battery", "something red", "a cat",
           '{"stream": "camera", "semantic_query": "a door", "k": 3}',
           '{"semantic_query": "parcel", "near_x": 0, "near_y": 0, "radius": 6, "k": 4}',
           '{"stream": "events", "semantic_query": "garden", "after_seconds_ago": 500}']


def _answers(eng) -> list:
    out = []
    for q in QUERIES:
        res = json.loads(eng.search(q))
        assert res["ok"], res
        out.append([(r["id"], round(r["score"], 5)) for r in res["results"]])
    return out


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory):
    """A store with two cached streams of equal size (12 events, 12 camera rows) and a
    backup of an older cache of it (6 + 6 rows)."""
    root = tmp_path_factory.mktemp("cache") / "m"
    clock = FakeClock()
    pose = PoseBox(Pose(0.0, 0.0))
    eng = make_engine(root, clock, pose, **CFG)
    for i in range(6):
        clock.t += 60
        pose.pose = Pose(i * 0.5, 0.0)
        eng.save(TEXTS[i])
        eng.add_observation("camera", clock.t, pose.pose, {}, CAMERA[i])
    # Each cache with its graph built over all its rows: on a loaded host a close can come
    # before the background build, and the two caches' graphs were then the same file.
    assert eng.indexes.wait_for_graphs(60)
    eng.close()
    older = root.parent / "older-index"
    shutil.copytree(root / "index", older)
    eng = make_engine(root, clock, pose, **CFG)
    for i in range(6, 12):
        clock.t += 60
        pose.pose = Pose(i * 0.5, 0.0)
        eng.save(TEXTS[i])
        eng.add_observation("camera", clock.t, pose.pose, {}, CAMERA[i])
    want = _answers(eng)
    assert eng.indexes.wait_for_graphs(60)
    eng.close()
    return root, clock, older, want


def _gen(root: Path) -> Path:
    manifest = json.loads((root / "index" / "manifest.json").read_text())
    return root / "index" / manifest.get("dir", ".")


def _file(root: Path, stream: str, part: str) -> Path:
    [p] = [p for p in _gen(root).iterdir() if p.name.endswith(f"__{stream}.{part}")]
    return p


def _graph(root: Path, part: str) -> Path:
    """A file of the one graph over every stream of the text model."""
    [p] = [p for p in _gen(root).iterdir() if p.name.endswith(f".graph.{part}")]
    return p


def _older_graph(root: Path, older: Path) -> None:
    """The graph files of an older cache of the same store, in place of the current ones."""
    manifest = json.loads((older / "manifest.json").read_text())
    for part in ("hnsw", "graph_ids.npy"):
        [src] = [p for p in (older / manifest["dir"]).iterdir()
                 if p.name.endswith(f".graph.{part}")]
        shutil.copyfile(src, _graph(root, part))


def _npy_same_shape(path: Path, make) -> None:
    arr = np.load(path)
    np.save(path, make(arr).astype(arr.dtype))


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _random_unit(a: np.ndarray) -> np.ndarray:
    v = _rng().standard_normal(a.shape)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _garbage_inside(path: Path, n: int = 1024) -> None:
    data = bytearray(path.read_bytes())
    mid = max(0, len(data) // 2 - n // 2)
    data[mid:mid + n] = _rng().integers(0, 256, min(n, len(data) - mid), np.uint8).tobytes()
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _edit_manifest(root: Path, edit, fix_checksum: bool = False) -> None:
    path = root / "index" / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    if fix_checksum and "checksum" in manifest:  # as a careful forger would
        rest = {k: v for k, v in manifest.items() if k != "checksum"}
        manifest["checksum"] = f"{zlib.crc32(json.dumps(rest, sort_keys=True).encode()):08x}"
    path.write_text(json.dumps(manifest))


# name -> (damage(root, older_backup), file the warning must name; None: no damage to report)
FAULTS = {
    "slots reversed": (lambda r, o: _npy_same_shape(_file(r, "events", "slots.npy"),
                                                    lambda a: a[::-1]), "events.slots.npy"),
    "slots one row changed": (
        lambda r, o: _npy_same_shape(_file(r, "camera", "slots.npy"),
                                     lambda a: np.concatenate([a[:3], a[4:5], a[4:]])),
        "camera.slots.npy"),
    "slots truncated": (lambda r, o: _truncate(_file(r, "events", "slots.npy")),
                        "events.slots.npy"),
    "slots empty": (lambda r, o: _file(r, "events", "slots.npy").write_bytes(b""),
                    "events.slots.npy"),
    "slots garbage inside": (lambda r, o: _garbage_inside(_file(r, "camera", "slots.npy"), 64),
                             "camera.slots.npy"),
    "ids permuted": (lambda r, o: _npy_same_shape(_file(r, "events", "ids.npy"),
                                                  lambda a: a[::-1]), "events.ids.npy"),
    "meta random": (lambda r, o: _npy_same_shape(_file(r, "camera", "meta.npy"),
                                                 lambda a: _rng().random(a.shape) * 1e9),
                    "camera.meta.npy"),
    "graph garbage inside": (lambda r, o: _garbage_inside(_graph(r, "hnsw")), "graph.hnsw"),
    "graph truncated": (lambda r, o: _truncate(_graph(r, "hnsw")), "graph.hnsw"),
    "graph ids reversed": (lambda r, o: _npy_same_shape(_graph(r, "graph_ids.npy"),
                                                        lambda a: a[::-1]),
                           "graph.graph_ids.npy"),
    # Both streams' rows are slots 0-11 of their own files: the two files are equal.
    "slots swapped between streams": (
        lambda r, o: _swap(_file(r, "events", "slots.npy"), _file(r, "camera", "slots.npy")),
        None),
    "all files swapped between streams": (
        lambda r, o: [_swap(_file(r, "events", p), _file(r, "camera", p))
                      for p in ("ids.npy", "slots.npy", "meta.npy")],
        "npy"),
    "graph of an older cache": (_older_graph, "graph.hnsw"),
    "manifest not JSON": (lambda r, o: (r / "index" / "manifest.json").write_text("{\"ver"),
                          "manifest.json"),
    "manifest seq edited": (lambda r, o: _edit_manifest(r, lambda m: m.update(seq=m["seq"] - 6)),
                            "manifest.json"),
    "manifest of another store": (
        lambda r, o: _edit_manifest(r, lambda m: m.update(db_uuid="elsewhere"), True),
        "manifest.json"),
    "manifest row count edited, checksum fixed": (
        lambda r, o: _edit_manifest(r, lambda m: m["keys"][0].update(n=m["keys"][0]["n"] - 1),
                                    True), "npy"),
    "manifest seq edited, checksum fixed": (
        lambda r, o: _edit_manifest(r, lambda m: m.update(seq=m["seq"] - 6), True), None),
    "files of the cache deleted": (lambda r, o: shutil.rmtree(_gen(r)) if _gen(r) != r / "index"
                                   else [p.unlink() for p in _gen(r).glob("*.npy")], "npy"),
    "older cache of the same store": (
        lambda r, o: (shutil.rmtree(r / "index"), shutil.copytree(o, r / "index")), None),
    "cache deleted": (lambda r, o: shutil.rmtree(r / "index"), None),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_cache_never_changes_an_answer(clean_store, tmp_path, caplog, fault):
    root0, clock, older, want = clean_store
    root = tmp_path / "m"
    shutil.copytree(root0, root)
    damage, named = FAULTS[fault]
    damage(root, older)
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        eng = make_engine(root, FakeClock(clock.t), PoseBox(), **CFG)
        got = _answers(eng)  # cached graphs may still be read: answers are exact meanwhile
        assert eng.indexes.wait_for_graphs(60)  # a damaged graph is found in the background
        got_after = _answers(eng)
    eng.close()
    assert got == want, f"{fault}: answers differ from the clean store's"
    assert got_after == want, f"{fault}: answers differ once the graphs were read"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if named is None:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        assert named in warnings[0] and "rebuild" in warnings[0], warnings[0]
    # The next start finds the cache rewritten and whole: no warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        eng = make_engine(root, FakeClock(clock.t), PoseBox(), **CFG)
        assert _answers(eng) == want
    eng.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---- several writers, kills mid-write ------------------------------------------------------
DIM = 32


def _small_store(root: Path, n: int = 3000) -> None:
    """A store of `n` rows with random vectors (no model needed) and no cache yet."""
    from memory_node.core.store.sqlite_store import SqliteObservationStore
    from memory_node.core.types import Observation

    root.mkdir(parents=True, exist_ok=True)
    st = SqliteObservationStore(root / "memory.db")
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rows = [Observation(stream=("camera", "events")[i % 2], t=1000.0 + i, pose=Pose(i, 0),
                        model_id="m") for i in range(n)]
    st.insert(rows, list(vecs))
    st.close()


def _manager(root: Path, **cfg):
    from memory_node.core.config import MemoryConfig
    from memory_node.core.index_manager import IndexManager
    from memory_node.core.store.sqlite_store import SqliteObservationStore

    config = MemoryConfig.from_mapping({"memory_dir": str(root), "hnsw_min_rows": 1000, **cfg},
                                       env={})
    return IndexManager(config, SqliteObservationStore(config.db_path))


def _persist_loop(root: str, times: int, out) -> None:  # runs in a child process
    mgr = _manager(Path(root))
    mgr.load_or_rebuild()
    failed = []
    for _ in range(times):
        try:
            if mgr.persist() is not True:
                failed.append("not persisted")
        except Exception as exc:  # noqa: BLE001 - counted, reported by the test
            failed.append(f"{type(exc).__name__}: {exc}")
    out.put(failed)


def _load_loop(root: str, times: int, out) -> None:  # a reader starting while others write
    from memory_node.core.index_manager import CacheLock

    failed = []
    for _ in range(times):
        mgr = _manager(Path(root))
        try:
            with CacheLock(mgr.config.index_dir, shared=True):
                if not mgr._load():  # noqa: SLF001 - the loader itself is under test
                    failed.append("no cache")
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{type(exc).__name__}: {exc}")
    out.put(failed)


def _loads_clean(root: Path, caplog) -> None:
    """A start on `root` loads a whole cache (or finds none), never warns, and holds exactly
    memory.db's vectors."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        mgr = _manager(root)
        mgr.load_or_rebuild()
        assert mgr.wait_for_cached_graphs(120)  # cached graphs are checked in the background
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    rows = mgr.store.vector_rows(range(1, 10**6))
    assert mgr.total() == len(rows)
    for oid, (stream, model_id, *_r, blob) in list(rows.items())[::97]:
        assert np.array_equal(mgr.vector(model_id, stream, oid), np.frombuffer(blob, np.float32))
    mgr.store.close()


def test_processes_persisting_to_one_directory_all_succeed(tmp_path, caplog):
    import multiprocessing as mp

    root = tmp_path / "m"
    _small_store(root)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_persist_loop, args=(str(root), 25, out)) for _ in range(4)]
    procs.append(ctx.Process(target=_load_loop, args=(str(root), 40, out)))
    for p in procs:
        p.start()
    failures = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    # 100 writes by 4 processes, 40 loads while they ran: none failed ("no cache" can only be
    # the reader's first load, before any writer finished once).
    assert [f for f in failures if f and f != ["no cache"] * len(f)] == []
    _loads_clean(root, caplog)
    left = sorted(p.name for p in (root / "index").iterdir())
    assert len([n for n in left if n.startswith("g-")]) == 1, left  # no leftovers


_KILLED_WRITER = """
import sys, time
sys.path.insert(0, {test_dir!r})
from test_index_cache import _manager
from pathlib import Path
mgr = _manager(Path({root!r}))
mgr.load_or_rebuild()
print("ready", flush=True)
while True:
    mgr.persist()
"""


def test_sigkill_mid_persist_leaves_a_valid_cache_or_none(tmp_path, caplog):
    import os
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "m"
    _small_store(root, 20000)
    code = _KILLED_WRITER.format(test_dir=str(Path(__file__).parent), root=str(root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                         str(Path(__file__).parents[1])])}
    rng = np.random.default_rng(11)
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env,
                                text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(float(rng.uniform(0.0, 0.4)))  # somewhere inside a write
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(30)
        _loads_clean(root, caplog)


def test_interrupt_mid_persist_keeps_the_previous_cache(tmp_path, caplog, monkeypatch):
    """A second Ctrl-C lands inside the write: the cache written before stays whole."""
    import memory_node.core.vectors.index_cache as cache

    root = tmp_path / "m"
    _small_store(root)
    mgr = _manager(root)
    mgr.load_or_rebuild()
    assert mgr.persist() is True
    real = cache._write_npy
    calls = []

    def interrupted(path, arr):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, arr)

    monkeypatch.setattr(cache, "_write_npy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mgr.persist()
    monkeypatch.undo()
    mgr.store.close()
    _loads_clean(root, caplog)


def test_close_says_whether_the_cache_was_written(tmp_path, caplog, monkeypatch):
    import memory_node.core.index_manager as im
    import memory_node.core.vectors.index_cache as cache

    eng = make_engine(tmp_path / "a")
    eng.save("a note")
    assert eng.close() is True

    eng = make_engine(tmp_path / "b")
    eng.save("a note")

    def refused(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "_write_npy", refused)
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        assert eng.close() is False
    assert "index cache not written" in caplog.text and "PermissionError" in caplog.text
    monkeypatch.undo()

    eng = make_engine(tmp_path / "c")  # another process is writing the cache right now
    eng.save("a note")
    monkeypatch.setattr(im, "PERSIST_LOCK_TIMEOUT_S", 0.2)
    held = im.CacheLock(eng.config.index_dir, shared=False)
    assert held.acquire()
    try:
        assert eng.close() is False
    finally:
        held.release()


@pytest.mark.parametrize("stream", ["events", "camera"])
def test_a_damaged_vector_file_row_is_embedded_again(clean_store, tmp_path, caplog, stream):
    """The vector files are data, not cache: a row whose bytes fail the checksum memory.db
    keeps is never scored; it is unindexed with one error naming the file, and its text is
    embedded again at the same start, so the answers are the clean store's."""
    root0, clock, _older, want = clean_store
    root = tmp_path / "m"
    shutil.copytree(root0, root)
    [path] = [p for p in (root / "vectors").iterdir() if f"__{stream}-" in p.name]
    data = bytearray(path.read_bytes())
    row = 384 * 4
    data[3 * row + 40:3 * row + 48] = bytes(8)
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        eng = make_engine(root, FakeClock(clock.t), PoseBox(), **CFG)
        got = _answers(eng)
    eng.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and path.name in errors[0], errors
    assert got == want


def test_an_existing_memory_db_keeps_its_page_size_and_rows(tmp_path):
    """An upgrade opens a database written with 4 KiB pages as it is: same rows, same pages."""
    import sqlite3

    from memory_node.core.store.sqlite_store import SqliteObservationStore
    from memory_node.core.types import Observation

    path = tmp_path / "memory.db"
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size=4096")
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    st = SqliteObservationStore(path)
    vecs = np.random.default_rng(1).standard_normal((10, DIM)).astype(np.float32)
    st.insert([Observation(stream="camera", t=1000.0 + i, model_id="m") for i in range(10)],
              list(vecs))
    st.close()
    again = SqliteObservationStore(path)
    try:
        got = {oid: np.frombuffer(blob, np.float32) for oid, *_r, blob in again.all_vectors()}
    finally:
        again.close()
    assert sorted(got) == list(range(1, 11))
    assert all(np.array_equal(got[i + 1], vecs[i]) for i in range(10))
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA page_size").fetchone()[0] == 4096
    finally:
        con.close()
