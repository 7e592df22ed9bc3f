"""The disk budget and compaction in the background, on a real store: an hour of a robot
driving a circle (camera keyframes as real JPEG files, odometry), notes and a named place."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from engine_support import T0, FakeClock, PoseBox, make_engine

from memory_node.agent.client import EngineClient
from memory_node.agent.skills import get_skills
from memory_node.core.compaction import choose_kept, referenced_ids
from memory_node.core.ingest import CameraFrame
from memory_node.core.types import Observation, Pose

NOW = T0 + 7200
FRAMES, FRAME_DT = 360, 10.0  # an hour of keyframes
MIB = 1024 * 1024


def circle(t: float) -> Pose:
    """A lap of 10 waypoints on a 10 m circle every 10 minutes: 40 s at each, 20 s to the
    next."""
    k, s = divmod((t - T0) % 600, 60)
    a = (k + max(0.0, s - 40) / 20) / 10 * 2 * np.pi
    return Pose(10 * np.cos(a), 10 * np.sin(a), yaw=a)


def du(root: Path) -> int:
    total = 0
    for dirpath, _d, files in os.walk(root):
        total += sum(os.stat(os.path.join(dirpath, f)).st_blocks * 512 for f in files)
    return total


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, int]:
    """The store, compacted (its first half hour thinned); (its path, the id of the
    frame a note points to)."""
    root = tmp_path_factory.mktemp("budget") / "store"
    clock, pose = FakeClock(T0), PoseBox(Pose(0, 0))
    # (no folding: the frames of a stay at a waypoint repeat each other on purpose)
    eng = make_engine(root, clock, pose, retention_s=5400.0, compact_interval_s=0,
                      fold_similarity=2.0)
    frames: list[CameraFrame] = []
    for i in range(FRAMES):
        t = T0 + i * FRAME_DT
        # The same view all the while the robot stands at a waypoint.
        view = int((t - T0) // 60)
        rng = np.random.default_rng(view)
        ramp = np.linspace(0, 160 * (view % 5) / 4, 192, dtype=np.float32)[None, :, None]
        img = np.clip(rng.random((144, 192, 3)) * 60 + ramp, 0, 255).astype(np.uint8)
        frames.append(CameraFrame(t=t, pose=circle(t), image_bgr=img))
        if len(frames) == 60:
            eng.add_stream_rows("camera", frames)
            frames = []
    odom = [Observation(stream="odom", t=T0 + i * 2.0, pose=circle(T0 + i * 2.0),
                        tags={"speed": 0.1}) for i in range(1800)]
    eng.store.insert(odom, [None] * len(odom))
    first = eng.store.rows_of(["camera"])[3]
    clock.t, pose.pose = T0 + 30, circle(T0 + 30)
    assert json.loads(eng.save(f"the frame #{first.id} shows the charging dock"))["ok"]
    clock.t, pose.pose = T0 + 1800, circle(T0 + 1800)
    assert json.loads(eng.save("met Alice by the window"))["ok"]
    assert json.loads(eng.save('{"place": "dock", "radius": 2.0, "x": 10, "y": 0}'))["ok"]
    clock.t = NOW
    assert json.loads(eng.compact())["thinned"] > 500
    eng.close()
    return root, int(first.id)  # type: ignore[arg-type]


def copy_of(built, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(built[0], root)
    return root


def ask(eng, query) -> dict:
    answer = json.loads(eng.search(query if isinstance(query, str) else json.dumps(query)))
    assert answer["ok"], answer
    return answer


def streams(eng) -> tuple[dict, dict]:
    answer = json.loads(eng.streams())
    assert answer["ok"], answer
    return answer, {s["name"]: s for s in answer["streams"]}


def blob_refs(root: Path) -> tuple[list[str], int]:
    """(refs of kept rows, archived rows that still have a blob)."""
    con = sqlite3.connect(root / "memory.db")
    try:
        live = [r[0] for r in con.execute("SELECT ref FROM observations WHERE ref IS NOT NULL")]
        arch = con.execute("SELECT count(*) FROM archive WHERE ref IS NOT NULL AND"
                           " reason != 'pose'").fetchone()[0]
        return live, int(arch)
    finally:
        con.close()


VISITS = {"visits": True, "near": "dock", "after": T0 - 1, "before": T0 + 3600}


def test_streams_reports_disk_size_and_no_budget(built, tmp_path):
    root = copy_of(built, tmp_path)
    eng = make_engine(root, FakeClock(NOW), compact_interval_s=0)
    try:
        assert eng._maintenance is None  # 0: compaction only on request
        answer, by_name = streams(eng)
        assert answer["disk_budget_bytes"] is None
        # The meter stats files it tracks; a walk of the whole tree agrees within a few pages.
        assert abs(answer["disk_bytes"] - du(root)) < 64 * 1024
        assert answer["disk_free_bytes"] == shutil.disk_usage(root).free or \
            abs(answer["disk_free_bytes"] - shutil.disk_usage(root).free) < 16 * MIB
        for entry in by_name.values():
            assert entry["evicted"] == 0
        assert by_name["camera"]["oldest_t"] == T0  # the oldest frame is archived, not gone
        assert ask(eng, {"stream": "camera", "k": 3}).get("notes") is None
    finally:
        eng.close()


def test_budget_makes_room_in_order_and_keeps_notes_places_and_visits(built, tmp_path, caplog):
    root = copy_of(built, tmp_path)
    clock = FakeClock(NOW)
    eng = make_engine(root, clock, compact_interval_s=0)
    size = streams(eng)[0]["disk_bytes"]
    visits_before = ask(eng, VISITS)
    notes_before = ask(eng, {"stream": "events", "k": 10})["count"]
    live_before, archived_blobs = blob_refs(root)
    rows = eng.store.rows_of(["camera", "odom"])
    _cells, chosen = choose_kept(rows, referenced_ids(eng.store), eng.config)
    unchosen = {r.id for r in rows if r.stream == "camera" and r.id not in chosen}
    eng.close()
    assert visits_before["count"] >= 5 and archived_blobs > 50
    assert built[1] in chosen and len(unchosen) > 50

    seen_steps = []
    for share in (0.85, 0.6, 0.3):
        budget_mb = size * share / MIB
        eng = make_engine(root, clock, compact_interval_s=0, disk_budget_mb=budget_mb,
                          fold_similarity=2.0)
        try:
            report = json.loads(eng.compact())["budget"]
            answer, by_name = streams(eng)
            # Under budget, measured as the file system sees it.
            assert answer["disk_budget_bytes"] == int(budget_mb * MIB)
            assert answer["disk_bytes"] <= answer["disk_budget_bytes"]
            assert du(root) <= answer["disk_budget_bytes"]
            live, arch = blob_refs(root)
            assert all((root / ref).is_file() for ref in live)  # no row names a lost blob
            # Order: archived keyframes' blobs go before any kept row.
            if report["rows_removed"]:
                assert arch == 0
            # Notes, summaries and places are never removed.
            assert by_name["events"]["evicted"] == 0
            assert ask(eng, {"stream": "events", "k": 10})["count"] == notes_before
            assert eng.place("dock").x == 10
            # The pose history is downsampled, not dropped: the same visits, with a note
            # saying how precise their times are.
            got = ask(eng, VISITS)
            assert got["count"] == visits_before["count"]
            for a, b in zip(got["visits"], visits_before["visits"], strict=True):
                assert abs(a["start"] - b["start"]) <= 20 and abs(a["end"] - b["end"]) <= 20
            if by_name["camera"]["evicted"]:
                assert any("downsampled by the disk budget" in n for n in got["notes"])
            # The frames compaction keeps (here: the one a note points to) go only after
            # every frame it does not keep.
            kept_ids = {r.id for r in eng.store.rows_of(["camera"])}
            if built[1] not in kept_ids:
                assert not kept_ids & unchosen
            seen_steps.append((by_name["camera"]["evicted"], built[1] in kept_ids))
        finally:
            eng.close()
    # Tighter budgets removed more camera rows; at some budget, camera rows were removed
    # while the frame the note points to was still there.
    assert [s[0] for s in seen_steps] == sorted(s[0] for s in seen_steps)
    assert any(n > 0 and there for n, there in seen_steps), seen_steps
    eng = make_engine(root, clock, compact_interval_s=0)
    try:
        # A search whose window reaches into evicted time says so; one after it does not.
        note = ask(eng, {"stream": "camera", "k": 3})["notes"]
        assert any("removed by the disk budget" in n for n in note)
        horizon = eng.disk.evicted()["camera"][1]
        later = ask(eng, {"stream": "camera", "after": horizon + 1, "k": 3})
        assert not any("disk budget" in n for n in later.get("notes") or [])
        assert ask(eng, {"stream": "events", "k": 3}).get("notes") is None
        # The agent's stream listing says so too.
        skills = {s.name: s for s in get_skills(EngineClient(eng), clock=clock)}
        listing = skills["list_memory_streams"].run().text
        camera_line = next(ln for ln in listing.splitlines() if ln.startswith("camera:"))
        assert "older rows removed to keep within the disk budget" in camera_line
    finally:
        eng.close()

    # A budget smaller than the notes need: every sensor row goes, the notes and places stay,
    # the pose history stays (coarser), and the node says so once, at error level.
    eng = make_engine(root, clock, compact_interval_s=0, disk_budget_mb=64 * 1024 / MIB)
    try:
        with caplog.at_level(logging.ERROR, logger="memory_node.core.budget"):
            assert json.loads(eng.compact())["budget"]["status"] == "over"
            eng.compact()
        said = [r for r in caplog.records if r.levelno == logging.ERROR
                and "over its disk budget" in r.getMessage()]
        assert len(said) == 1
        _answer, by_name = streams(eng)
        assert "camera" not in by_name or by_name["camera"]["count"] == 0
        assert ask(eng, {"stream": "events", "k": 10})["count"] == notes_before
        assert eng.place("dock") is not None
        track = eng.store.pose_track(T0 - 1, T0 + 3600)
        assert len(track) >= 2
        coarse = ask(eng, VISITS)
        assert any("downsampled by the disk budget" in n for n in coarse["notes"])
    finally:
        eng.close()


def test_compaction_runs_in_the_background_while_searches_and_saves_answer(built, tmp_path):
    root = copy_of(built, tmp_path)
    clock, pose = FakeClock(NOW), PoseBox(Pose(1, 1))
    # The copy is compacted already: new old rows give each round work to do.
    eng = make_engine(root, clock, pose, compact_interval_s=0.3, retention_s=600.0)
    job = eng._maintenance
    assert job is not None
    try:
        extra = [Observation(stream="odom", t=T0 + 3600 + i * 0.5, pose=Pose(0.01 * i, 5.0))
                 for i in range(2000)]
        eng.store.insert(extra, [None] * len(extra))
        answers, deadline = [], time.monotonic() + 20
        i = 0
        while (job.rounds < 2 or i < 20) and time.monotonic() < deadline:
            answers.append(ask(eng, {"semantic_query": "charging dock", "k": 3}))
            saved = json.loads(eng.save(f"check {i} at the window"))
            assert saved["ok"] and saved["indexed"], saved
            i += 1
        assert job.rounds >= 2
        con = sqlite3.connect(root / "memory.db")
        thinned = con.execute("SELECT count(*) FROM archive WHERE t >= ?",
                              (T0 + 3600,)).fetchone()[0]
        con.close()
        assert thinned > 1000  # the background rounds thinned the new rows
        assert all(a["results"] for a in answers)
        thread = job._thread
    finally:
        eng.close()
    assert thread is not None and not thread.is_alive()  # stopped cleanly with the engine


def test_background_budget_keeps_a_recording_store_under_budget(built, tmp_path):
    root = copy_of(built, tmp_path)
    size = du(root)
    eng = make_engine(root, FakeClock(NOW), compact_interval_s=0.2,
                      disk_budget_mb=size * 0.7 / MIB)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            answer, _ = streams(eng)
            if answer["disk_bytes"] <= answer["disk_budget_bytes"]:
                break
            time.sleep(0.1)
        assert answer["disk_bytes"] <= answer["disk_budget_bytes"]
    finally:
        eng.close()


def test_parameters_are_checked():
    from memory_node.core.config import ConfigError, MemoryConfig

    cfg = MemoryConfig.from_mapping({}, env={})
    assert cfg.disk_budget_mb == 0 and cfg.compact_interval_s == 3600
    with pytest.raises(ConfigError, match="disk_budget_mb"):
        MemoryConfig.from_mapping({"disk_budget_mb": -1}, env={})
    with pytest.raises(ConfigError, match="compact_interval_s"):
        MemoryConfig.from_mapping({"compact_interval_s": -5}, env={})
