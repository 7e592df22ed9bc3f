"""Smoke test of the benchmark suite: `python -m bench --quick` end to end, into a temporary
directory, so a change to core or bench that breaks the suite is caught. No timing asserts:
figures depend on the machine; only completeness and exactness are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_suite_writes_every_section(tmp_path: Path) -> None:
    out, report = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    env = {**os.environ, "MEMORY_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out), "--report", str(report)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = report.read_text()
    from bench.report import SECTION_TITLES

    for title in SECTION_TITLES.values():
        assert f"## {title}" in text, title
    for name in ("run", "limit", "embed", "query_2k", "prototypes_2k", "footprint_2k", "save",
                 "ingest"):
        res = json.loads((out / f"{name}.json").read_text())
        assert "error" not in res, (name, res.get("error"))
    query = json.loads((out / "query_2k.json").read_text())
    combined = query["kinds"]["combined"]
    assert combined["exact_fraction"] == 1.0
    assert combined["short_of_k"] == 0
    for kind in ("stream", "near", "time", "semantic"):
        assert query["kinds"][kind]["exact_fraction"] == 1.0, kind


def test_semantic_side_by_side_runs_and_reports_every_system(tmp_path: Path) -> None:
    """`--only semantic` at a small scale without peers: ours (warmed with real queries other
    than the measured ones), FAISS HNSW alone and numpy exact, with their recalls, in the
    report's side-by-side table."""
    out, report = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    env = {**os.environ, "MEMORY_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "semantic", "--scales", "3k", "--sets",
         "separated", "--peers", "none", "--build-watch", "none", "--queries", "20",
         "--out", str(out), "--report", str(report)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "semantic_3k_separated.json").read_text())
    rows = res["sets"]["separated"]
    assert {"memory_node", "numpy exact", "faiss HNSW efSearch 32"} <= set(rows)
    assert rows["numpy exact"]["recall_at_5"] == 1.0
    ours = rows["memory_node"]
    assert ours["recall_at_5"] == 1.0  # 3k rows: below the graph's threshold, exact
    assert ours["profile"]["fixed_us"] > 0 and ours["latency_ms"]["n"] == 20
    text = report.read_text()
    assert "## Semantic-only search side by side" in text
    assert "| well-separated clusters | memory_node |" in text
