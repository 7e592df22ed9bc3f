"""Smoke test of the week benchmark (bench/week_bench.py) in its reduced mode: a quarter of an
hour of the robot's life, measured at two ages, end to end into a temporary report, so a change
that breaks the benchmark is caught. No timing asserts (figures depend on the machine): every
query kind must be answered at every age, visits found on the loop, and the table written.
~15 s."""

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
