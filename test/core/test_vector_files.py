"""Vector files (`vectors/`): the embeddings are on disk once, appends are all-or-nothing with
the rows naming them, compaction rewrites a file without disturbing a reader, older
memory.db files move their vectors out on open, and a damaged row is never scored."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from memory_node.core.config import MemoryConfig
from memory_node.core.index_manager import IndexManager
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose
from memory_node.core.vectors import top_k

DIM = 384


def _unit(n: int, seed: int, dim: int = DIM) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _rows(n: int, stream: str = "camera", t0: float = 1000.0) -> list[Observation]:
    return [Observation(stream=stream, t=t0 + i, pose=Pose(i * 0.1, 0.0), model_id="m")
            for i in range(n)]


def _manager(root: Path, **cfg) -> IndexManager:
    config = MemoryConfig.from_mapping({"memory_dir": str(root), "hnsw_min_rows": 10**6, **cfg},
                                       env={})
    mgr = IndexManager(config, SqliteObservationStore(config.db_path))
    mgr.load_or_rebuild()
    return mgr


def _brute(store: SqliteObservationStore, q: np.ndarray, k: int) -> list[int]:
    got = list(store.all_vectors())
    ids = np.asarray([r[0] for r in got], np.int64)
    vecs = np.stack([np.frombuffer(r[-1], np.float32) for r in got])
    return top_k(ids, vecs @ q, k)[0].tolist()


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_vectors_are_on_disk_once(tmp_path):
    """memory.db names slots (a few bytes a row); the vector file holds the floats; the index
    cache holds ids, slots and places, no vectors."""
    n = 3000
    mgr = _manager(tmp_path)
    mgr.store.insert(_rows(n), list(_unit(n, 0)))
    mgr.sync()
    assert mgr.persist()
    [vec_file] = list((tmp_path / "vectors").iterdir())
    assert n * DIM * 4 <= _allocated(vec_file) <= n * DIM * 4 + (1 << 20)
    con = sqlite3.connect(tmp_path / "memory.db")
    try:
        (table,) = con.execute("SELECT sum(pgsize) FROM dbstat WHERE name = 'vectors'").fetchone()
    finally:
        con.close()
    assert table <= 40 * n, f"{table} bytes in memory.db for {n} vectors"
    cache = sum(_allocated(p) for p in (tmp_path / "index").rglob("*") if p.is_file())
    assert cache <= 64 * n, f"{cache} bytes of index cache for {n} rows"
    q = _unit(1, 9)[0]
    assert mgr.search("m", q, 10)[0].tolist() == _brute(mgr.store, q, 10)
    mgr.close()
    mgr.store.close()


def test_a_failed_insert_leaves_nothing_and_the_next_one_lands_in_place(tmp_path):
    """A transaction that fails after writing one stream's vectors (here: a wrong dimension in
    the next stream) stores no row; the bytes it wrote are written over by the next insert."""
    st = SqliteObservationStore(tmp_path / "memory.db")
    st.insert(_rows(5), list(_unit(5, 1)))
    st.insert(_rows(2, "events"), list(_unit(2, 2)))
    bad_rows = _rows(3) + _rows(1, "events")
    bad_vecs = list(_unit(3, 3)) + [np.ones(DIM // 2, np.float32)]
    with pytest.raises(ValueError, match="dimensions"):
        st.insert(bad_rows, bad_vecs)
    assert st.count() == 7
    good = _unit(4, 4)
    ids = st.insert(_rows(4), list(good))
    st.close()
    again = SqliteObservationStore(tmp_path / "memory.db")
    try:
        got = {r[0]: np.frombuffer(r[-1], np.float32) for r in again.all_vectors()}
        assert len(got) == 11
        for oid, vec in zip(ids, good, strict=True):
            assert np.array_equal(got[oid], vec)
        (rows,) = again._r.execute(  # noqa: SLF001 - the file's committed count
            "SELECT rows FROM vector_files WHERE stream = 'camera'").fetchone()
        assert rows == 9  # 5 + 4: the failed insert's 3 rows were written over
    finally:
        again.close()


def test_compaction_rewrites_a_file_under_a_reader(tmp_path):
    """Archiving a third of a stream writes its live rows into the next generation and deletes
    the old file; an index opened before (another process would hold one) follows on its next
    sync and still answers exactly."""
    n = 600
    writer = _manager(tmp_path)
    vecs = _unit(n, 5)
    ids = writer.store.insert(_rows(n), list(vecs))
    reader = _manager(tmp_path)
    q = _unit(1, 6)[0]
    assert reader.search("m", q, 10)[0].tolist() == _brute(reader.store, q, 10)
    before = sorted(p.name for p in (tmp_path / "vectors").iterdir())
    gone = ids[::3]
    assert writer.store.archive(gone, "thinned") == len(gone)
    after = sorted(p.name for p in (tmp_path / "vectors").iterdir())
    assert len(before) == len(after) == 1 and before != after
    assert after[0].endswith(".2.f32")
    # A stream the reader has not seen yet, rewritten before its next sync.
    ev_vecs = _unit(300, 12)
    ev_ids = writer.store.insert(_rows(300, "events"), list(ev_vecs))
    assert writer.store.archive(ev_ids[:100], "thinned") == 100
    assert os.path.getsize(tmp_path / "vectors" / after[0]) == (n - len(gone)) * DIM * 4
    for mgr in (reader, writer):
        mgr.sync()
        got = mgr.search("m", q, 10)[0].tolist()
        assert got == _brute(mgr.store, q, 10)
        assert not set(got) & set(gone)
        assert mgr.total() == n - len(gone) + 200
        ev = mgr.search("m", ev_vecs[150], 1, ("events",))[0].tolist()
        assert ev == [ev_ids[150]]
        assert mgr.search("m", ev_vecs[50], 5, ("events",))[0].tolist() == [
            i for i in _brute(mgr.store, ev_vecs[50], 400) if i in set(ev_ids[100:])][:5]
    kept = [i for i in ids if i not in set(gone)][:50]
    for oid in kept:
        assert np.array_equal(reader.vector("m", "camera", oid), vecs[ids.index(oid)])
    # Archived rows keep their vectors in the archive.
    arch = writer.store.archived_vectors(gone[:5])
    assert all(np.array_equal(arch[g][1], vecs[ids.index(g)]) for g in gone[:5])
    # New rows after the rewrite land in the new generation, seen by both.
    more = writer.store.insert(_rows(3, t0=5000.0), list(_unit(3, 7)))
    for mgr in (reader, writer):
        mgr.sync()
        assert all(mgr.contains("m", "camera", i) for i in more)
    assert reader.persist()
    for mgr in (reader, writer):
        mgr.close()
        mgr.store.close()
    again = _manager(tmp_path)
    assert again.search("m", q, 10)[0].tolist() == _brute(again.store, q, 10)
    again.close()
    again.store.close()


def _schema_2_db(path: Path, vecs: np.ndarray) -> None:
    """A memory.db as schema 2 wrote it: vectors as blobs in a `vectors` table."""
    st = SqliteObservationStore(path)  # today's tables, then turned back into schema 2's
    st.insert(_rows(len(vecs)), [None] * len(vecs))
    st.close()
    con = sqlite3.connect(path)
    con.execute("DROP TABLE vectors")
    con.execute("DROP TABLE vector_files")
    con.execute("CREATE TABLE vectors (id INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")
    con.executemany("INSERT INTO vectors(id, embedding) VALUES (?, ?)",
                    [(i + 1, v.tobytes()) for i, v in enumerate(vecs)])
    con.execute("UPDATE observations SET model_id = 'm'")
    con.executemany("INSERT INTO vector_log(obs_id, op) VALUES (?, 'add')",
                    [(i + 1,) for i in range(len(vecs))])
    con.execute("UPDATE vectors SET embedding = ? WHERE id = ?",  # a stray dimension
                (np.ones(16, np.float32).tobytes(), len(vecs)))
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    con.commit()
    con.close()


def test_a_schema_2_memory_db_moves_its_vectors_into_files(tmp_path, caplog):
    n = 2000
    vecs = _unit(n, 8)
    path = tmp_path / "memory.db"
    _schema_2_db(path, vecs)
    size_before = sum(p.stat().st_size for p in tmp_path.glob("memory.db*"))
    with caplog.at_level(logging.INFO, logger="memory_node"):
        mgr = _manager(tmp_path)
    assert any("migrated from schema 2" in r.getMessage() for r in caplog.records)
    assert any(f"row {n}: a 16-d vector" in r.getMessage() for r in caplog.records)
    got = {r[0]: np.frombuffer(r[-1], np.float32) for r in mgr.store.all_vectors()}
    assert sorted(got) == list(range(1, n))
    assert all(np.array_equal(got[i + 1], vecs[i]) for i in range(n - 1))
    assert mgr.store.get([n])[n].model_id is None  # kept, unindexed
    assert mgr.store.get_meta("schema_version") == "3"
    size_after = sum(p.stat().st_size for p in tmp_path.glob("memory.db*"))
    assert size_after < size_before - n * DIM * 4 * 0.8  # the blobs' pages freed
    q = _unit(1, 10)[0]
    assert mgr.search("m", q, 5)[0].tolist() == _brute(mgr.store, q, 5)
    mgr.close()
    mgr.store.close()


def _flip_row(root: Path, stream: str, slot: int) -> Path:
    [path] = [p for p in (root / "vectors").iterdir() if f"__{stream}-" in p.name]
    with open(path, "r+b") as fh:
        fh.seek(slot * DIM * 4 + 100)
        b = fh.read(4)
        fh.seek(slot * DIM * 4 + 100)
        fh.write(bytes(x ^ 0xFF for x in b))
    return path


@pytest.mark.parametrize("with_cache", [True, False])
def test_a_damaged_vector_is_never_scored(tmp_path, caplog, with_cache):
    """A row whose bytes no longer match the checksum memory.db keeps loses its vector at the
    next start, with an error naming the file (the row stays, found by filters); the others
    answer as before."""
    n = 500
    mgr = _manager(tmp_path)
    vecs = _unit(n, 11)
    ids = mgr.store.insert(_rows(n), list(vecs))
    mgr.sync()
    if with_cache:
        assert mgr.persist()
    mgr.close()
    mgr.store.close()
    if not with_cache:
        for p in (tmp_path / "index").iterdir():
            if p.is_file():
                p.unlink()
    path = _flip_row(tmp_path, "camera", 7)
    with caplog.at_level(logging.WARNING, logger="memory_node"):
        mgr = _manager(tmp_path)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and path.name in errors[0] and "1 vectors" in errors[0], errors
    assert not mgr.contains("m", "camera", ids[7])
    assert mgr.total() == n - 1
    assert mgr.store.get([ids[7]])[ids[7]].model_id is None  # unindexed, not lost
    q = vecs[7]  # the damaged row's own vector would rank it first
    got = mgr.search("m", q, 5)[0].tolist()
    assert ids[7] not in got and got == _brute(mgr.store, q, 5)
    mgr.close()
    mgr.store.close()


def _writer(root: str, seed: int, batches: int, start, out) -> None:  # a child process
    st = SqliteObservationStore(Path(root) / "memory.db")
    written = []
    start.wait(60)
    for b in range(batches):
        vecs = _unit(3, seed * 1000 + b)
        ids = st.insert(_rows(3, t0=1000.0 + b), list(vecs))
        written += [(oid, seed * 1000 + b, j) for j, oid in enumerate(ids)]
        time.sleep(0.002)  # the other writer gets its turns in between
    st.close()
    out.put(written)


def test_processes_appending_to_one_file_take_turns(tmp_path):
    """Two processes writing the same stream at once: every acknowledged row has its own
    vector, in slots nobody else wrote, and one reader sees them all."""
    import multiprocessing as mp

    SqliteObservationStore(tmp_path / "memory.db").close()
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), seed, 150, start, out))
             for seed in (1, 2)]
    for p in procs:
        p.start()
    written = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    st = SqliteObservationStore(tmp_path / "memory.db")
    try:
        got = {r[0]: np.frombuffer(r[-1], np.float32) for r in st.all_vectors()}
        assert len(got) == 2 * 150 * 3
        for oid, seed, j in written[0] + written[1]:
            assert np.array_equal(got[oid], _unit(3, seed)[j])
        kv = st.key_vectors("m", "camera")
        assert sorted(kv.slots.tolist()) == list(range(900))  # no slot twice, none skipped
    finally:
        st.close()
    mgr = _manager(tmp_path)
    q = _unit(1, 99)[0]
    assert mgr.total() == 900 and mgr.search("m", q, 10)[0].tolist() == _brute(mgr.store, q, 10)
    mgr.close()
    mgr.store.close()


def test_a_vector_file_cut_short_is_reported_and_its_lost_rows_unindexed(tmp_path, caplog):
    """A file cut short between runs (a full disk, a hand-made copy): compaction still runs
    (a row whose bytes are gone is archived without them) with one error naming the file;
    the next start unindexes the rows it lost and answers exactly from the rest."""
    mgr = _manager(tmp_path)
    ids = mgr.store.insert(_rows(100), list(_unit(100, 13)))
    mgr.sync()
    assert mgr.persist()
    mgr.close()
    mgr.store.close()
    [path] = list((tmp_path / "vectors").iterdir())
    with open(path, "r+b") as fh:
        fh.truncate(10 * DIM * 4)
    st = SqliteObservationStore(tmp_path / "memory.db")
    with caplog.at_level(logging.ERROR, logger="memory_node"):
        assert st.archive([ids[50]], "thinned") == 1
    st.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and path.name in errors[0], errors
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="memory_node"):
        again = _manager(tmp_path)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "89 vectors" in errors[0], errors  # slots 10-99 but one
    assert again.total() == 10
    q = _unit(1, 15)[0]
    assert again.search("m", q, 5)[0].tolist() == _brute(again.store, q, 5)
    again.close()
    again.store.close()
