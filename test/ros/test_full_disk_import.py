"""memory-import into a filesystem that is too small for the bag (a real 1.5 MB tmpfs in a
private mount namespace, test/disk_support.py), then again once it was grown back: the first
run stops with exit status 3 and a last line that says how many kept rows were not stored and
why; no "cannot rollback" and no line per message; the second stores exactly what was missing,
ending with the same rows as a clean import; a third adds nothing. And disk_reserve_mb: below
it sensor rows are not stored, the import says so and exits 3, notes are still saved.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from disk_support import run_scenario

from memory_node.sim.generate import generate_sample

DURATION_S = 60.0
STREAMS = ("camera", "lidar", "odom")


def _import(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memory_node.ros.bag_import",
                           *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _rows(memory: Path) -> list[list]:
    with sqlite3.connect(memory / "memory.db") as con:
        return [list(r) for r in con.execute(
            "SELECT stream, t FROM observations WHERE stream IN ('camera', 'lidar', 'odom')"
            " ORDER BY stream, t")]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return generate_sample(tmp_path_factory.mktemp("sample"), seed=7, duration_s=DURATION_S)


@pytest.fixture(scope="module")
def clean(sample, tmp_path_factory):
    """The sample imported into a store with room: its sensor rows (stream, t)."""
    memory = tmp_path_factory.mktemp("clean") / "memory"
    done = _import(sample.bag_dir, "--memory-dir", memory)
    assert done.returncode == 0, done.stderr
    return _rows(memory)


def test_an_import_into_a_full_disk_says_so_and_the_same_command_later_fills_the_gap(
        sample, clean, tmp_path):
    r = run_scenario("import", tmp_path, timeout=240, bag=str(sample.bag_dir), size="1500k")
    first, second, third = r["first"], r["second"], r["third"]
    # A disk full before anything could be stored: the same exit status, one clear line.
    full = r["already_full"]
    assert full["rc"] == 3, full
    assert "disk full" in full["stdout"] + full["stderr"], full
    assert "Traceback" not in full["stderr"] and "cannot rollback" not in full["stderr"], full
    out = first["stdout"] + first["stderr"]
    assert first["rc"] == 3, out
    last = first["stdout"].strip().splitlines()[-1]
    assert last.startswith("memory-import: stopped, disk full: "), last
    m = re.search(r"NOT STORED: (\d+) kept rows \((\d+) disk full\)", last)
    assert m and int(m.group(1)) == int(m.group(2)) > 0, last
    assert "run the same command again" in last
    # One line about the full disk, not one per message; never SQLite's rollback error.
    assert "cannot rollback" not in out
    full_lines = [ln for ln in first["stderr"].splitlines()
                  if re.search(r"(?i)disk full|no space left|disk is full", ln)]
    assert len(full_lines) <= 2, first["stderr"]  # the rows, and the index cache at the end
    stored_first = sum(r["after_first"]["counts"].get(s, 0) for s in STREAMS)
    assert 0 < stored_first < len(clean)
    assert r["after_first"]["integrity"] == ["ok"]
    # The JPEGs of frames not stored are gone with them: the space is not held.
    assert r["blobs_after_first"] == r["after_first"]["counts"].get("camera", 0)
    # Once grown: exactly what was missing, no duplicates, the rows of a clean import.
    assert second["rc"] == 0, second["stdout"] + second["stderr"]
    assert second["stdout"].strip().splitlines()[-1].startswith("memory-import: done: ")
    assert r["end"]["rows"] == clean
    assert r["end"]["integrity"] == ["ok"]
    assert r["jpgs"] == r["end"]["counts"]["camera"]
    stored_before = sum(int(n) for n in re.findall(r"(\d+) stored before", second["stdout"]))
    assert stored_before == stored_first
    assert third["rc"] == 0 and "already imported" in third["stdout"], third


def test_below_the_disk_reserve_sensor_rows_wait_and_notes_do_not(sample, clean, tmp_path):
    """A reserve larger than any disk here: nothing of the bag is stored, the import says
    why and exits 3; a note is still saved; with the reserve lifted the import completes."""
    config = tmp_path / "reserve.yaml"
    config.write_text("/**:\n  ros__parameters:\n    disk_reserve_mb: 1000000000.0\n")
    memory = tmp_path / "memory"
    done = _import(sample.bag_dir, "--memory-dir", memory, "--config", config)
    assert done.returncode == 3, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("memory-import: stopped, disk reserve: "), last
    assert re.search(r"NOT STORED: \d+ kept rows \(\d+ disk reserve\)", last), last
    assert "disk_reserve_mb" in last
    assert done.stderr.count("disk reserve") == 1, done.stderr
    assert _rows(memory) == []
    # Notes are not sensor rows: saved below the reserve.
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    engine = MemoryEngine(MemoryConfig.from_mapping(
        {"memory_dir": str(memory), "disk_reserve_mb": 1e9}, env={}))
    try:
        answer = json.loads(engine.save("the charger is behind the sofa"))
    finally:
        engine.close()
    assert answer["ok"] and isinstance(answer["id"], int), answer
    done = _import(sample.bag_dir, "--memory-dir", memory)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _rows(memory) == clean


def test_rows_not_stored_for_another_reason_are_told_apart_from_a_full_disk():
    """A frame that failed to store for a reason other than space: exit 3 as well (not
    everything kept was stored), but the summary does not send the user to free space."""
    from memory_node.core.recorder import StreamCounters
    from memory_node.ros.bag_import import Outcome

    counters = {s: StreamCounters(received=10, kept=2, stored=2) for s in STREAMS}
    counters["camera"].stored, counters["camera"].failed = 1, 1
    outcome = Outcome(messages=30, bag_s=3.0, wall_s=1.0, counters=counters,
                      streams=list(STREAMS), not_stored={"error": 1})
    assert not outcome.complete
    line = outcome.summary()
    assert line.startswith("memory-import: incomplete: ")
    assert "NOT STORED: 1 kept rows (1 error)" in line and "space" not in line
    done = Outcome(messages=30, bag_s=3.0, wall_s=1.0, counters=counters,
                   streams=list(STREAMS))
    assert done.complete and done.summary().startswith("memory-import: done: ")
