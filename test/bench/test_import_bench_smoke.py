"""Smoke test of memory-import's benchmark (bench/import_bench.py): a few seconds of a
Go2-rate recording and a short "long" one, end to end into a temporary report, so a change
that breaks the benchmark is caught. No timing asserts (figures depend on the machine); the
rows, the profile of both threads and the long run's queries must be there. ~30 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_bench_writes_figures_profile_and_queries(tmp_path: Path) -> None:
    out, report = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.import_bench", "--go2", "--seconds", "6", "--long",
         "--hours", "0.003", "--work", str(tmp_path), "--out", str(out), "--report",
         str(report)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    go2 = json.loads((out / "import_go2.json").read_text())
    assert go2["streams"]["camera"]["received"] == 90  # 15 Hz for 6 s
    assert go2["streams"]["camera"]["stored"] > 0 and go2["streams"]["lidar"]["stored"] > 0
    assert go2["tf_problems"] == [] and go2["pose_sources"].get("tf", 0) > 0
    long = json.loads((out / "import_long.json").read_text())
    queries = long["queries"]
    for kind in ("combined", "semantic_only", "visits"):
        assert queries[kind]["ok"] == queries[kind]["n"], (kind, queries[kind])
    assert queries["rows"] > 0 and long["store_mb"] > 0
    text = report.read_text()
    assert "## memory-import: bags to memory, offline" in text
    assert "| reader |" in text and "| store |" in text  # both threads' profiles
    assert "| long recording |" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BENCHMARKS.md", "results"]
