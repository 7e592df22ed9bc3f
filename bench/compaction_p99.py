"""Query latency while compaction (and the disk budget) runs in the background, against the
same queries on the same store with nothing running: the ratio of p99s.

    python -m bench.compaction_p99 [--rows 30000] [--queries 400] [--md BENCHMARKS.md]

The store: two days old (every sensor row is past retention_s), a robot pacing a 30 × 30 m
floor, camera rows with vectors (synthetic 384-d, ranked by the lookup embedder: query
embedding excluded) and odometry. Queries, round-robin: semantic-only, semantic within 3 m,
newest camera rows, an odometry time window. "During": the engine's own background thread
(compact_interval_s) runs its first round on a fresh copy while the queries run, one at a
time, on the calling thread; only queries answered while the round runs count; fresh copies
until enough have been timed. "Idle": the same queries on a fresh copy right after each round,
for as long as the round took (the machine's load then). With a budget: the
same round then removes rows down to half the store's size.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine_info, percentiles, write_marked_section
from bench.workload import DIM, LookupEmbedder

MODEL = "lookup-384"
NOW = 1_764_460_800.0 + 3 * 86400
QUERIES = [
    '{"semantic_query": "a red door", "k": 5}',
    '{"semantic_query": "the charging dock", "near_x": 12, "near_y": 9, "radius": 3, "k": 5}',
    '{"stream": "camera", "k": 10}',
    f'{{"stream": "odom", "after": {NOW - 2 * 86400 + 3600!r}, '
    f'"before": {NOW - 2 * 86400 + 7200!r}, "k": 20}}',
]


def engine(root: Path, **cfg):  # noqa: ANN201 - a MemoryEngine, imported lazily
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    config = MemoryConfig.from_mapping({"memory_dir": str(root), "text_embedder": MODEL, **cfg},
                                       env={})
    return MemoryEngine(config, clock=lambda: NOW, text_embedder=LookupEmbedder(MODEL))


def build(root: Path, rows: int) -> None:
    from memory_node.core.types import Observation, Pose

    rng = np.random.default_rng(5)
    eng = engine(root, compact_interval_s=0)
    t0 = NOW - 2 * 86400
    half = rows // 2
    for start in range(0, half, 2000):
        n = min(2000, half - start)
        i = np.arange(start, start + n)
        t = t0 + i * 2.0
        x = 15 + 14 * np.sin(i / 400)
        y = 15 + 14 * np.sin(i / 170)
        cams = [Observation(stream="camera", t=float(t[k]), pose=Pose(float(x[k]), float(y[k])),
                            tags={"brightness": round(float(rng.random()), 2)},
                            text=f"frame {start + k}") for k in range(n)]
        vecs = rng.normal(size=(n, DIM)).astype(np.float32)
        eng.add_embedded(cams, vecs, MODEL)
        odom = [Observation(stream="odom", t=float(t[k]) + 1, pose=Pose(float(x[k]), float(y[k])),
                            tags={"speed": 0.5}) for k in range(n)]
        eng.store.insert(odom, [None] * n)
    eng.close()


def timed(eng, until=lambda: True, n: int = 10**9) -> list[float]:  # noqa: ANN001
    out = []
    i = 0
    while len(out) < n and until():
        q = QUERIES[i % len(QUERIES)]
        i += 1
        t = time.perf_counter()
        answer = eng.search(q)
        ms = (time.perf_counter() - t) * 1000
        assert '"ok":true' in answer, answer
        out.append(ms)
    return out


def during(base: Path, work: Path, want: int, **cfg
           ) -> tuple[list[float], list[float], list[float]]:
    """(query ms while a background round ran, each round's seconds, query ms on a fresh idle
    copy right after each round, for as long as the round took: the machine's load then)."""
    samples: list[float] = []
    rounds: list[float] = []
    idle: list[float] = []
    while len(samples) < want:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        eng = engine(work, compact_interval_s=0.05, **cfg)
        job = eng._maintenance
        timed(eng, n=20)  # warm
        while job.rounds == 0 and not eng.parts.compact.lock.locked():
            time.sleep(0.001)
        t = time.perf_counter()
        samples += timed(eng, until=lambda job=job: job.rounds == 0)
        rounds.append(time.perf_counter() - t)
        eng.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        eng = engine(work, compact_interval_s=0)
        timed(eng, n=20)
        t_end = time.perf_counter() + rounds[-1]
        idle += timed(eng, until=lambda t_end=t_end: time.perf_counter() < t_end)
        eng.close()
    return samples, rounds, idle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--md", type=Path, default=None)
    ap.add_argument("--yield-s", type=float, default=None,
                    help="the pause after each compaction transaction (default: the engine's)")
    args = ap.parse_args()
    if args.yield_s is not None:
        from memory_node.core import budget, compaction

        compaction.YIELD_S = budget.YIELD_S = args.yield_s
    load_at_start = machine_info().get("loadavg")
    with tempfile.TemporaryDirectory() as tmp:
        base, work = Path(tmp) / "base", Path(tmp) / "work"
        build(base, args.rows)
        size = sum(p.stat().st_blocks * 512 for p in base.rglob("*") if p.is_file())
        comp, comp_s, idle = during(base, work, args.queries)
        budget_mb = size * 0.5 / (1024 * 1024)
        evict, evict_s, idle2 = during(base, work, args.queries, disk_budget_mb=budget_mb)
    p_idle, p_comp, p_ev = percentiles(idle), percentiles(comp), percentiles(evict)
    p_idle2 = percentiles(idle2)
    yielded = "" if args.yield_s is None else f" (pause {args.yield_s * 1000:g} ms)"
    lines = [
        "## Queries during background compaction (`python -m bench.compaction_p99`)",
        "",
        f"{args.rows:,} rows two days old (half camera with 384-d vectors, half odometry), "
        f"{size / 1e6:.0f} MB on disk{yielded}; queries round-robin over semantic-only, semantic "
        "within 3 m, newest camera rows, an odometry time window (query embedding excluded), "
        "one at a time on the thread that also serves them in a node, while the engine's own "
        "background thread runs its first round (compact_interval_s) on a fresh copy. "
        f"Machine: {machine_info().get('cpu', '')} {machine_info().get('cpus', '')} CPUs, "
        f"shared with other work (load average {load_at_start} at the start, "
        f"{machine_info().get('loadavg')} at the end): compare the ratios, not the "
        "milliseconds.",
        "",
        "| | queries | p50 ms | p99 ms | p99 / idle | round s |",
        "|---|---|---|---|---|---|",
        f"| idle | {p_idle['n']} | {p_idle['p50']:.3f} | {p_idle['p99']:.3f} | 1.00 | |",
        f"| during compaction | {p_comp['n']} | {p_comp['p50']:.3f} | {p_comp['p99']:.3f} | "
        f"{p_comp['p99'] / p_idle['p99']:.2f} | {np.median(comp_s):.2f} |",
        f"| idle (after each budget round) | {p_idle2['n']} | {p_idle2['p50']:.3f} | "
        f"{p_idle2['p99']:.3f} | 1.00 | |",
        f"| during compaction + budget (to half the size) | {p_ev['n']} | {p_ev['p50']:.3f} | "
        f"{p_ev['p99']:.3f} | {p_ev['p99'] / p_idle2['p99']:.2f} | {np.median(evict_s):.2f} |",
    ]
    body = "\n".join(lines)
    print(body)
    if args.md is not None:
        write_marked_section(args.md, "compaction-p99", body)


if __name__ == "__main__":
    main()
