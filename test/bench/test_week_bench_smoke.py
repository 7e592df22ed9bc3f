"""Smoke test of the week benchmark (bench/week_bench.py) in its reduced mode: a quarter of an
hour of the robot's life, measured at two ages, end to end into a temporary report, so a change
that breaks the benchmark is caught. No timing asserts (figures depend on the machine): every
query kind must be answered at every age, visits found on the loop, and the table written; and
the same under a disk budget that binds (`--budget-mb`). ~15 s each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_week_bench_measures_every_kind_at_every_age(tmp_path: Path) -> None:
    out, report = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.week_bench", "--checkpoints", "0.05,0.24",
         "--queries", "4", "--work", str(tmp_path), "--out", str(out), "--report",
         str(report)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "week.json").read_text())
    assert [c["hours"] for c in res["checkpoints"]] == [0.05, 0.24]
    for cp in res["checkpoints"]:
        m = cp["m"]
        assert m["rows"] == sum(cp["written"].values()) > 0
        assert m["first_ok"] and m["open_s"] > 0 and m["rss_open_mb"] > 0
        for kind in ("combined", "semantic_only", "visits_hour", "visits_all", "place",
                     "seen_near", "newest"):
            q = m["queries"][kind]
            assert q["ok"] == q["n"] == 4, (kind, q)
        assert m["queries"]["visits_all"]["mean_count"] > 0  # the loop passes every point
    late = res["checkpoints"][-1]["m"]["queries"]
    assert late["visits_all"]["mean_count"] > res["checkpoints"][0]["m"]["queries"][
        "visits_all"]["mean_count"]
    text = report.read_text()
    assert "## A week: query costs against the store's age (issue 37)" in text
    assert "| visits, last hour |" in text and "hour 0.24 / hour 0.05 p50" in text
    # The store was a scratch directory, removed after the run.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BENCHMARKS.md", "results"]


def test_week_bench_under_a_budget_keeps_the_store_under_it_and_the_notes(tmp_path: Path
                                                                          ) -> None:
    """`--budget-mb` with a budget a quarter of an hour outgrows: the rounds and checks make
    room, the store a node would leave on stopping is under the budget, sensor rows were
    evicted, the robot's note was kept, and answers say what the budget removed."""
    out, report = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.week_bench", "--checkpoints", "0.05,0.3",
         "--queries", "3", "--budget-mb", "3", "--compact-every-h", "0.1",
         "--budget-check-s", "10", "--work", str(tmp_path), "--out", str(out), "--report",
         str(report)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "week_budget.json").read_text())
    budget = 3 * 1024 * 1024
    built = res["build"]
    assert built["rows"]["notes"] == 1  # one note at 15 min of patrol
    # Without the budget the store would be several times larger: it binds.
    assert built["checks"]["max_disk_bytes_before"] > budget
    assert built["checks"]["made_room"] and built["rounds"]
    assert all(r["ok"] and r["budget_status"] == "under" for r in built["rounds"])
    assert all(c["status"] == "under" and c["disk_bytes"] <= budget
               for c in built["checks"]["made_room"])
    for cp in res["checkpoints"]:
        assert cp["du_bytes"] <= budget, cp["du_bytes"]  # as the writer left it, closed
        for q in cp["m"]["queries"].values():
            assert q["ok"] == q["n"] == 3, q
    streams = built["final"]["streams"]
    for s in ("camera", "lidar", "odom"):
        assert 0 < streams[s]["evicted"] < built["rows"][s], (s, streams[s])
        assert streams[s]["count"] > 0  # the newest rows are kept
    assert streams["events"]["count"] == 1 and streams["events"]["evicted"] == 0
    said = [n for q in res["checkpoints"][-1]["m"]["queries"].values() for n in q["notes"]]
    assert any("removed by the disk budget" in n for n in said), said
    text = report.read_text()
    assert "## A week under a disk budget (issue 37)" in text
    assert "| notes (events) | 1 | 1 | 0 |" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BENCHMARKS.md", "results"]
