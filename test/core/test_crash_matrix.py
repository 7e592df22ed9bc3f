"""Crash matrix: SIGKILL during ingest, save and compaction, then a restart answers the same
queries as a clean run that saw only what was acknowledged before the kill.

The writer is an in-process engine in a child process that prints one line per acknowledged
row; the clean run replays exactly those rows in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_support import T0, FakeClock, PoseBox, make_engine

from memory_node.core.types import Observation, Pose

NOW = T0 + 3 * 86400  # "now" for every engine here: the compaction rows are days old
WORDS = ["red door", "kitchen table", "charging dock", "person waving", "dark hallway",
         "green plant", "open window", "stairs going up"]
ACKS_BEFORE_KILL = 15


def ingest_item(eng, i: int) -> None:
    """Row i of the ingest workload: odometry, and a described camera frame every other row."""
    t = T0 + i * 0.5
    if i % 2:
        eng.add_observation("camera", t, Pose(i * 0.3, 1.0, yaw=0.1),
                            {"brightness": round(i / 100, 2)}, f"frame {i}: {WORDS[i % 8]}")
    else:
        eng.add_observation("odom", t, Pose(i * 0.3, 1.0), {"speed": 0.3})


def save_item(eng, clock, pose, i: int) -> str:
    """Note i of the save workload, 3 m from the one before (nothing folds)."""
    clock.t = T0 + i * 2.0
    pose.pose = Pose(i * 3.0, -1.0)
    return eng.save(f"Note {i}: saw the {WORDS[i % 8]} near waypoint {i}")


WORKER = textwrap.dedent("""
    import json, sys
    from itertools import count
    sys.path.insert(0, {test_dir!r})
    sys.path.insert(0, {here!r})
    from engine_support import make_engine, FakeClock, PoseBox
    from test_crash_matrix import NOW, ingest_item, save_item
    mode, root = {mode!r}, {root!r}
    clock, pose = FakeClock(NOW), PoseBox()
    eng = make_engine(root, clock, pose, **{extra!r})
    print("ready", flush=True)
    if mode == "ingest":
        for i in count():
            ingest_item(eng, i)
            print("ack", i, flush=True)
    elif mode == "save":
        for i in count():
            answer = json.loads(save_item(eng, clock, pose, i))
            assert answer["ok"], answer
            print("ack", i, flush=True)
    elif mode == "background":  # saves while the engine's own thread compacts
        for i in count():
            answer = json.loads(save_item(eng, clock, pose, i))
            assert answer["ok"], answer
            print("ack", i, flush=True)
    else:
        print("compacting", flush=True)
        print("done", eng.compact(), flush=True)
""")


def run_worker(mode: str, root: Path, kill_after, **extra) -> list[str]:
    """Start the writer, SIGKILL it when `kill_after(line)` says so; all lines it printed.
    `extra`: configuration of the writer's engine."""
    code = WORKER.format(test_dir=str(Path(__file__).parents[1]),
                         here=str(Path(__file__).parent), mode=mode, root=str(root),
                         extra=extra)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if kill_after(lines[-1]):
                os.kill(proc.pid, signal.SIGKILL)
                break
        lines += [s.strip() for s in proc.stdout]  # what it acknowledged before it died
    finally:
        proc.kill()
        proc.wait(30)
    assert lines and lines[0] == "ready", lines
    return lines


QUERIES = [
    '{"k": 100, "before": %(cut)s}',
    '{"stream": "odom", "k": 100, "before": %(cut)s}',
    '{"semantic_query": "a red door", "k": 5, "before": %(cut)s}',
    '{"semantic_query": "the charging dock", "stream": ["camera", "events"], "k": 3, '
    '"near_x": 6, "near_y": 1, "radius": 8, "before": %(cut)s}',
    '{"tags": {"brightness": {"gte": 0.05}}, "order_by": "-brightness", "before": %(cut)s}',
]


def answers(root: Path, cut: float, extra: tuple[str, ...] = ()) -> list:
    """The queries' answers (scores rounded, no took_ms)."""
    eng = make_engine(root, FakeClock(NOW), PoseBox())
    try:
        out = []
        for q in QUERIES + list(extra):
            res = json.loads(eng.search(q % {"cut": repr(cut)}))
            assert res["ok"], res
            for r in res["results"]:
                if r["score"] is not None:
                    r["score"] = round(r["score"], 4)
            res.pop("took_ms")
            out.append(res)
        return out
    finally:
        eng.close()


@pytest.mark.parametrize("mode", ["ingest", "save"])
def test_sigkill_while_writing(tmp_path, mode):
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    lines = run_worker(mode, crashed, lambda line: line == f"ack {ACKS_BEFORE_KILL - 1}")
    acked = [int(s.split()[1]) for s in lines if s.startswith("ack ")]
    assert acked == list(range(len(acked))) and len(acked) >= ACKS_BEFORE_KILL
    clock, pose = FakeClock(NOW), PoseBox()
    eng = make_engine(clean, clock, pose)
    for i in acked:
        ingest_item(eng, i) if mode == "ingest" else save_item(eng, clock, pose, i)
    eng.close()
    last = acked[-1]
    cut = T0 + last * (0.5 if mode == "ingest" else 2.0)
    got, want = answers(crashed, cut), answers(clean, cut)
    assert sum(a["count"] for a in want) > len(acked)
    assert got == want


def _compaction_store(root: Path) -> None:
    """Two days old: a robot idling in 150 places (odometry and camera frames of each place
    thinned to one), then moving, with camera frames that repeat (folded)."""
    eng = make_engine(root, FakeClock(NOW), PoseBox())
    rows, vecs = [], []
    for cell in range(150):
        for j in range(6):
            t = T0 - 2 * 86400 + cell * 600 + j * 20
            rows.append(Observation(stream="odom", t=t, pose=Pose(cell * 5.0, 0.2 * j),
                                    tags={"speed": 0.0}))
            vecs.append(None)
    eng.store.insert(rows, vecs)
    for k in range(60):
        ingest_item(eng, 2 * k + 1)  # camera frames, some of them repeating words
    eng.store.insert([Observation(stream="odom", t=T0 - 86400 + i, pose=Pose(i, 9.0))
                      for i in range(50)], [None] * 50)
    eng.close()


def archived(root: Path) -> int:
    con = sqlite3.connect(root / "memory.db", timeout=10)
    try:
        return int(con.execute("SELECT count(*) FROM archive").fetchone()[0])
    finally:
        con.close()


def test_sigkill_during_compaction(tmp_path):
    base, crashed, clean = tmp_path / "base", tmp_path / "crashed", tmp_path / "clean"
    _compaction_store(base)
    shutil.copytree(base, crashed)
    shutil.copytree(base, clean)
    eng = make_engine(clean, FakeClock(NOW), PoseBox())
    first = json.loads(eng.compact())
    eng.close()
    assert first["ok"] and first["thinned"] > 400  # extremes and visit ends stay

    for _ in range(3):  # three kills, each as soon as this run has archived something
        before = archived(crashed)

        def kill_after(line: str, before: int = before) -> bool:
            if line != "compacting":
                return False
            deadline = time.monotonic() + 30
            while archived(crashed) == before and time.monotonic() < deadline:
                time.sleep(0.0002)
            return True

        lines = run_worker("compact", crashed, kill_after)
        assert not any(s.startswith("done") for s in lines), "finished before the kill"
        assert before < archived(crashed) < first["archived_total"]
    # The restart finishes the job; then everything answers as after one clean compaction.
    eng = make_engine(crashed, FakeClock(NOW), PoseBox())
    again = json.loads(eng.compact())
    eng.close()
    assert again["ok"] and again["archived_total"] == first["archived_total"]
    # Every kept row with its merged/span tags: the idle hours in windows of 50 places.
    windows = tuple('{"stream": "odom", "k": 100, "after": %r, "before": %r}'
                    % (T0 - 2 * 86400 + w * 30000 - 1, T0 - 2 * 86400 + (w + 1) * 30000 - 1)
                    for w in range(3))
    assert answers(crashed, NOW, windows) == answers(clean, NOW, windows)


def _rows_per_stream(root: Path) -> tuple[dict[str, int], dict[str, int], set[str], set[str]]:
    """({stream: rows kept or archived}, {stream: rows the budget counts as removed}, the blob
    refs rows name, the blob files there are)."""
    con = sqlite3.connect(root / "memory.db", timeout=10)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = dict(con.execute(
            "SELECT stream, count(*) FROM (SELECT stream FROM observations UNION ALL"
            " SELECT stream FROM archive WHERE reason != 'pose') GROUP BY stream").fetchall())
        evicted = {k.split(":", 1)[1]: int(v) for k, v in con.execute(
            "SELECT key, value FROM meta WHERE key LIKE 'evicted:%'")}
        refs = {r[0] for r in con.execute("SELECT ref FROM observations WHERE ref IS NOT NULL"
                                          " UNION SELECT ref FROM archive WHERE ref IS NOT"
                                          " NULL")}
    finally:
        con.close()
    files = {str(p.relative_to(root)) for p in (root / "blobs").rglob("*") if p.is_file()}
    return rows, evicted, refs, files


def _store_with_blobs(root: Path) -> tuple[dict[str, int], set[str]]:
    """The compaction store plus 150 camera rows with real JPEG files; (rows per stream, blob
    files)."""
    import cv2
    import numpy as np

    _compaction_store(root)
    eng = make_engine(root, FakeClock(NOW), PoseBox())
    rng = np.random.default_rng(3)
    for i in range(150):
        ok, jpeg = cv2.imencode(".jpg", (rng.random((120, 160, 3)) * 255).astype(np.uint8))
        assert ok
        eng.add_observation("camera", T0 - 2 * 86400 + i * 400, Pose(i * 5.0, 0.0),
                            {"brightness": 0.5}, f"frame {i}", blob=jpeg.tobytes(),
                            blob_ext="jpg")
    eng.close()
    before, _, refs, files = _rows_per_stream(root)
    assert refs == files and len(files) == 150
    return before, files


def _size(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def test_sigkill_while_saving_during_background_compaction(tmp_path):
    """Saves answered while the engine's own thread compacts and makes room, then a kill:
    every acknowledged note is there, every removed row counted, no row names a lost blob."""
    root = tmp_path / "store"
    before, _files = _store_with_blobs(root)
    budget_mb = _size(root) * 0.4 / (1024 * 1024)

    def kill_after(line: str) -> bool:
        return line.startswith("ack ") and sum(_rows_per_stream(root)[1].values()) > 0

    lines = run_worker("background", root, kill_after, compact_interval_s=0.05,
                       disk_budget_mb=budget_mb)
    acked = [int(s.split()[1]) for s in lines if s.startswith("ack ")]
    assert acked == list(range(len(acked))) and acked
    rows, evicted, refs, files_now = _rows_per_stream(root)
    assert refs <= files_now
    for stream, n in before.items():
        assert n - rows.get(stream, 0) == evicted.get(stream, 0), stream
    eng = make_engine(root, FakeClock(NOW), PoseBox())
    try:
        notes = json.loads(eng.search('{"stream": "events", "k": 100, "order_by": "time"}'))
        texts = [r["text"] for r in notes["results"]]
        for i in acked:
            assert any(t.startswith(f"Note {i}:") for t in texts), i
    finally:
        eng.close()


def test_sigkill_during_disk_budget(tmp_path):
    """A kill while the budget removes rows and blobs: what it removed is counted, no row
    names a lost blob, and the next run finishes the job (no file left behind)."""
    root = tmp_path / "store"
    before, files = _store_with_blobs(root)
    budget_mb = _size(root) * 0.4 / (1024 * 1024)

    def kill_after(line: str) -> bool:
        if line != "compacting":
            return False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _rows, evicted, _refs, files_now = _rows_per_stream(root)
            if sum(evicted.values()) or files_now != files:
                return True
            time.sleep(0.0005)
        return True

    lines = run_worker("compact", root, kill_after, disk_budget_mb=budget_mb)
    assert not any(s.startswith("done") for s in lines), "finished before the kill"
    rows, evicted, refs, files_now = _rows_per_stream(root)
    assert refs <= files_now  # every blob a row names is there
    for stream, n in before.items():  # every row gone is counted, and only those
        assert n - rows.get(stream, 0) == evicted.get(stream, 0), stream
    # The restart finishes: under budget, no blob file without a row.
    eng = make_engine(root, FakeClock(NOW), PoseBox(), disk_budget_mb=budget_mb)
    try:
        done = json.loads(eng.compact())
        assert done["ok"] and done["budget"]["status"] == "under"
    finally:
        eng.close()
    rows, evicted, refs, files_now = _rows_per_stream(root)
    assert refs == files_now
    for stream, n in before.items():
        assert n - rows.get(stream, 0) == evicted.get(stream, 0), stream
