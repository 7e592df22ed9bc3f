"""memory-sync against a real PostgreSQL: everything arrives once, whatever fails on the way.

The server is stopped in the middle of a sync and started again, the sync process is SIGKILLed
inside a batch's transaction, batches are re-sent: the fleet ends up with exactly the robot's
rows (observations, notes with pose and tags, vectors, archived rows), each once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import psycopg
import pytest
from engine_support import FakeClock, PoseBox, make_engine
from waiting import wait_until

from memory_node.core.notes import NotesLog
from memory_node.core.places import Places
from memory_node.core.types import Observation, Pose, View
from memory_node.fleet.store import FleetStore, FleetUnavailable
from memory_node.fleet.sync import PAUSE_ENV, FleetSync

MODEL = "test-model-8"


def _bulk(engine, n: int, start: int = 0, t0: float = 1.0e9) -> None:
    """n rows straight into the robot's store: half with vectors, most with poses, some tags,
    a quarter with a camera view."""
    rng = np.random.default_rng(start)
    rows, vecs = [], []
    for i in range(start, start + n):
        v = rng.normal(size=8).astype(np.float32)
        v /= np.linalg.norm(v)
        has_vec = i % 2 == 0
        rows.append(Observation(
            stream="camera" if i % 3 else "lidar", t=t0 + i,
            pose=Pose(x=i * 0.1, y=-i * 0.05, yaw=0.1, frame="map") if i % 5 else None,
            tags={"i": i, "colors": ["red"] if i % 7 == 0 else []}, text=f"row {i}",
            ref=f"blobs/camera/{i}.jpg", model_id=MODEL if has_vec else None,
            view=View(i * 0.1, -i * 0.05, 0.3, 1.2, 4.0 + i % 3) if i % 4 == 1 else None))
        vecs.append(v if has_vec else None)
    engine.store.insert(rows, vecs)


def local_state(db: Path) -> dict[int, tuple]:
    """Every row of memory.db, live or archived, with its camera view: local id ->
    comparable tuple."""
    from memory_node.core.store.sqlite_store import SqliteObservationStore

    store = SqliteObservationStore(db)
    try:
        vecs = {oid: blob for oid, *_r, blob in store.all_vectors()}
    finally:
        store.close()
    con = sqlite3.connect(str(db))
    out = {}
    for r in con.execute(
            "SELECT o.id, o.stream, o.t, o.x, o.y, o.frame, o.tags, o.text, o.ref, o.model_id,"
            " o.note_key, w.x, w.y, w.yaw, w.hfov, w.range FROM observations o"
            " LEFT JOIN views w ON w.id = o.id"):
        blob = vecs.get(r[0])
        out[r[0]] = r[1:6] + (json.loads(r[6]),) + r[7:11] + (
            None if blob is None else np.frombuffer(blob, np.float32).tolist(), False,
            r[11:16])
    for r in con.execute("SELECT a.id, a.stream, a.t, a.x, a.y, a.frame, a.tags, a.text, a.ref,"
                         " a.model_id, a.note_key, w.x, w.y, w.yaw, w.hfov, w.range"
                         " FROM archive a LEFT JOIN views w ON w.id = a.id"):
        out[r[0]] = r[1:6] + (json.loads(r[6]),) + r[7:11] + ("archived", True, r[11:16])
    con.close()
    return out


def local_places(mem: Path) -> dict[str, tuple]:
    """The robot's named places as its notes hold them (removals too): key -> tuple."""
    out = {}
    for key, st in Places(NotesLog(mem / "notes")).states().items():
        p = st.place
        out[key] = (st.name, st.t, p is None) + (() if p is None else (p.x, p.y, p.radius))
    return out


def fleet_places(url: str, robot: str) -> dict[str, tuple]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name_key, name, t, removed, x, y, radius FROM memory_places"
                            " WHERE robot_id=%s", (robot,)).fetchall()
    return {r[0]: r[1:4] + (() if r[3] else r[4:7]) for r in rows}


def fleet_state(url: str, robot: str) -> dict[int, tuple]:
    out = {}
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT local_id, stream, t, x, y, frame, tags, text, ref, model_id, note_key,"
            " emb::text, archived_at IS NOT NULL, view_x, view_y, view_yaw, view_hfov,"
            " view_range FROM memory_observations WHERE robot_id=%s",
            (robot,)).fetchall()
        dup = conn.execute("SELECT count(*) - count(DISTINCT (store_id, local_id))"
                           " FROM memory_observations WHERE robot_id=%s", (robot,)).fetchone()[0]
    assert dup == 0
    for r in rows:
        emb = None if r[11] is None else np.asarray(json.loads(r[11]), np.float32).tolist()
        out[r[0]] = r[1:11] + ("archived" if r[12] else emb, r[12], r[13:18])
    return out


def assert_same(db: Path, url: str, robot: str) -> None:
    """The fleet holds exactly the robot's rows (each once) and its named places."""
    local, fleet = local_state(db), fleet_state(url, robot)
    assert set(fleet) == set(local)
    bad = [i for i in local if local[i] != fleet[i]]
    assert not bad, (bad[:3], [local[i] for i in bad[:1]], [fleet[i] for i in bad[:1]])
    assert fleet_places(url, robot) == local_places(db.parent)


def same(db: Path, url: str, robot: str) -> bool:
    """Whether assert_same holds now (for waiting until it does)."""
    try:
        assert_same(db, url, robot)
    except AssertionError:
        return False
    return True


def name_places(mem: Path, clock: FakeClock, *places: dict) -> None:
    eng = make_engine(mem, clock=clock)
    try:
        for p in places:
            clock.t += 1
            assert json.loads(eng.save(json.dumps(p)))["ok"]
    finally:
        eng.close()


def fleet_count(url: str, robot: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM memory_observations WHERE robot_id=%s",
                            (robot,)).fetchone()[0]


def sync_cmd(mem: Path, robot: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memory_node.fleet.sync", "--memory-dir", str(mem),
            "--robot-id", robot, *extra]


def sync_env(url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "MEMORY_FLEET_URL": url, **extra}


def test_everything_arrives_once_with_pose_tags_vectors_and_archives(tmp_path, fleet_url):
    clock, pose = FakeClock(), PoseBox(Pose(1.5, -2.0, yaw=0.3, frame="map"))
    eng = make_engine(tmp_path / "r1", clock=clock, pose=pose)
    try:
        eng.save(json.dumps({"note": "the red door to the lab is open", "tags": {"door": True}}))
        clock.t += 5
        pose.pose = None
        eng.save("battery at 40 percent")  # a note without a pose
        _bulk(eng, 300)
        pose.pose = Pose(1.5, -2.0, yaw=0.3, frame="map")
        for place in ({"place": "lab door", "radius": 1.5}, {"place": "dock", "x": 4, "y": 1}):
            assert json.loads(eng.save(json.dumps(place)))["ok"]
        store = FleetStore(fleet_url)
        sync = FleetSync(tmp_path / "r1", store, "r1", batch_size=64)
        assert sync.push_once() > 0
        assert_same(tmp_path / "r1" / "memory.db", fleet_url, "r1")

        # Changes after the first sync: a repeated note folds (tags change), a vector comes
        # late, compaction archives rows into a kept one.
        clock.t += 5
        pose.pose = Pose(1.5, -2.0, yaw=0.3, frame="map")
        eng.save(json.dumps({"note": "the red door to the lab is open", "tags": {"door": True}}))
        eng.store.set_vector(2, np.ones(384, np.float32) / np.sqrt(384), eng.text_model_id)
        moved = eng.store.archive([10, 11, 12], "thinned", kept={10: 13, 11: 13, 12: 13},
                                  kept_tags=(13, lambda n: {"i": 12, "thinned": n}))
        assert moved == 3
        for place in ({"place": "Dock", "x": 5, "y": 1}, {"place": "lab door", "remove": True},
                      {"place": "hall", "x": 0, "y": 9, "radius": 3}):
            clock.t += 1
            assert json.loads(eng.save(json.dumps(place)))["ok"]
        sync.push_once()
        assert_same(tmp_path / "r1" / "memory.db", fleet_url, "r1")
        with psycopg.connect(fleet_url) as conn:
            row = conn.execute(
                "SELECT map_id, x, y, tags, pose_source FROM memory_observations"
                " WHERE robot_id='r1' AND text LIKE 'the red door%%'").fetchone()
            kept = conn.execute("SELECT kept_local_id, archive_reason FROM memory_observations"
                                " WHERE robot_id='r1' AND local_id=10").fetchone()
        assert row[0] == "r1/map" and (row[1], row[2]) == (1.5, -2.0)
        assert fleet_places(fleet_url, "r1")["dock"][:4] == ("Dock", clock.t - 2, False, 5.0)
        assert row[3]["repeats"] == 2 and row[3]["door"] is True
        assert kept == (13, "thinned")
        sync.close()
        store.close()
    finally:
        eng.close()


def test_a_resent_batch_changes_nothing(tmp_path, fleet_url):
    eng = make_engine(tmp_path / "r2")
    _bulk(eng, 200)
    eng.close()
    name_places(tmp_path / "r2", FakeClock(), {"place": "kitchen", "x": 1, "y": 2},
                {"place": "door", "x": 3, "y": 2}, {"place": "door", "remove": True})
    store = FleetStore(fleet_url)
    sync = FleetSync(tmp_path / "r2", store, "r2", batch_size=50)
    sync.push_once()
    assert sync.stats.places_changed == 2

    def versions() -> list[tuple]:
        with psycopg.connect(fleet_url) as conn:
            return conn.execute(
                "SELECT id::text, xmin::text FROM memory_observations WHERE robot_id='r2'"
                " UNION ALL SELECT name_key, xmin::text FROM memory_places"
                " WHERE robot_id='r2' ORDER BY 1").fetchall()
    before = versions()
    sync.outbox.requeue_all()  # as if every acknowledgement had been lost
    sent_before = sync.stats.rows_sent
    sync.push_once()
    assert sync.stats.rows_sent - sent_before == 200
    assert sync.stats.rows_changed == 200  # only the first push changed anything
    sync.close()
    again = FleetSync(tmp_path / "r2", store, "r2", batch_size=50)  # a restart: places again
    again.push_once()
    assert again.stats.places_changed == 0
    assert versions() == before  # same rows, same row versions: nothing was rewritten
    assert_same(tmp_path / "r2" / "memory.db", fleet_url, "r2")
    again.close()
    store.close()


def test_server_stopped_mid_sync_then_restarted_loses_and_duplicates_nothing(
        tmp_path, pg, fleet_url):
    if not pg.local:
        pytest.skip("stops the server: only on the self-contained test server")
    mem = tmp_path / "r3"
    eng = make_engine(mem)
    _bulk(eng, 1500)
    proc = subprocess.Popen(sync_cmd(mem, "r3", "--batch-size", "100", "--interval", "0.1"),
                            env=sync_env(fleet_url, **{PAUSE_ENV: "0.05"}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []  # its output so far, read as it comes

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: fleet_count(fleet_url, "r3") >= 300, "the first batches", 60)
        pg.stop()  # mid-sync: batches are in flight
        _bulk(eng, 500, start=1500)  # the robot keeps recording with the fleet away
        assert json.loads(eng.save(json.dumps({"place": "charger", "x": 1, "y": 2})))["ok"]
        # The loss noticed: the sync backs off and retries while the robot keeps recording.
        wait_until(lambda: any("retrying in" in line for line in lines), "a failed push", 60)
        pg.start()
        _bulk(eng, 200, start=2000)
        wait_until(lambda: fleet_count(fleet_url, "r3") == 2200, "every row", 90)
        wait_until(lambda: "charger" in fleet_places(fleet_url, "r3"), "the place", 30)
        wait_until(lambda: same(mem / "memory.db", fleet_url, "r3"), "the fleet to hold "
                   "exactly the robot's rows and places", 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=30)
        eng.close()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert "retrying in" in out  # the loss was noticed and retried
    assert "fleet store reachable again" in out, out  # ... and the sync recovered


def _idle_in_transaction(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name='memory-sync'"
            " AND state='idle in transaction'").fetchone()[0] > 0


def test_sigkill_mid_batch_loses_and_duplicates_nothing(tmp_path, fleet_url):
    mem = tmp_path / "r4"
    eng = make_engine(mem)
    _bulk(eng, 500)
    eng.close()
    name_places(mem, FakeClock(), {"place": "kitchen", "x": 1, "y": 2})
    env = sync_env(fleet_url, **{PAUSE_ENV: "0.4"})
    for later in (False, True):  # inside the first batch; inside a later one
        committed = fleet_count(fleet_url, "r4")
        proc = subprocess.Popen(sync_cmd(mem, "r4", "--once", "--batch-size", "100"),
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if later:  # once a batch of this run has committed, the open one is a later one
            wait_until(lambda n=committed: fleet_count(fleet_url, "r4") > n,
                       "a committed batch", 60)
        wait_until(lambda: _idle_in_transaction(fleet_url), "a batch's open transaction", 60)
        before = fleet_count(fleet_url, "r4")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: not _idle_in_transaction(fleet_url), "the rollback", 30)
        assert fleet_count(fleet_url, "r4") == before  # the killed batch left nothing
    done = subprocess.run(sync_cmd(mem, "r4", "--once", "--batch-size", "100"),
                          env=sync_env(fleet_url), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_same(mem / "memory.db", fleet_url, "r4")
    with psycopg.connect(fleet_url) as conn:
        acked = conn.execute("SELECT acked_seq FROM memory_sync_state WHERE robot_id='r4'"
                             ).fetchone()[0]
    con = sqlite3.connect(str(mem / "memory.db"))
    assert con.execute("SELECT count(*) FROM fleet_outbox WHERE seq > ?", (acked,)
                       ).fetchone()[0] == 0
    con.close()


def test_once_gives_up_with_exit_1_when_the_fleet_stays_away(tmp_path):
    mem = tmp_path / "r5"
    eng = make_engine(mem)
    eng.close()
    url = f"postgresql://nobody@/nowhere?host={tmp_path}&connect_timeout=1"
    done = subprocess.run(sync_cmd(mem, "r5", "--once", "--timeout", "2"),
                          env=sync_env(url), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "not everything was acknowledged" in done.stderr


def test_once_without_a_memory_refuses_and_creates_nothing(tmp_path, fleet_url):
    """A mistyped --memory-dir is an error, not an empty store and "0 rows sent"."""
    missing, empty = tmp_path / "no" / "such" / "dir", tmp_path / "empty"
    empty.mkdir()
    for mem in (missing, empty):
        done = subprocess.run(sync_cmd(mem, "r6", "--once"), env=sync_env(fleet_url),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"no memory at {mem}" in done.stderr
    assert not (tmp_path / "no").exists() and list(empty.iterdir()) == []
    assert fleet_count(fleet_url, "r6") == 0


def test_a_version_1_fleet_is_upgraded_and_every_row_gains_its_view(tmp_path, fleet_url):
    mem = tmp_path / "r6"
    eng = make_engine(mem)
    _bulk(eng, 120)
    eng.close()
    store = FleetStore(fleet_url)
    first = FleetSync(mem, store, "r6")
    first.push_once()
    first.close()
    # As version 1 left things: no views in the fleet, and the robot's record of what the
    # fleet acknowledged says nothing of a schema version.
    with psycopg.connect(fleet_url, autocommit=True) as conn:
        conn.execute("UPDATE memory_observations SET view_x = NULL, view_y = NULL,"
                     " view_yaw = NULL, view_hfov = NULL, view_range = NULL, view_box = NULL")
        conn.execute("UPDATE memory_fleet_meta SET value = '1' WHERE key = 'schema_version'")
    con = sqlite3.connect(str(mem / "memory.db"))
    ident = json.loads(con.execute("SELECT value FROM meta WHERE key='fleet_identity'")
                       .fetchone()[0])
    del ident["schema"]
    con.execute("UPDATE meta SET value=? WHERE key='fleet_identity'", (json.dumps(ident),))
    con.commit()
    con.close()
    store.drop_connection()
    robot = FleetSync(mem, store, "r6", init_schema=False)  # a robot role may not upgrade
    with pytest.raises(FleetUnavailable, match="--init-schema"):
        robot.push_once()
    robot.close()
    store.init_schema()  # the owner upgrades
    again = FleetSync(mem, store, "r6", init_schema=False)
    assert again.push_once() == 120  # every row once more, now with its view
    assert_same(mem / "memory.db", fleet_url, "r6")
    again.close()
    store.close()
