"""A week of a robot's life in one store: every query kind at hour 1, day 1 and day 7.

    python -m bench.week_bench                       # 7 days (the figures in BENCHMARKS.md)
    python -m bench.week_bench --days 1 --queries 30 # a day, in a few minutes
    python -m bench.week_bench --budget-mb 500 --queries 40  # the week under a disk budget

The store is written through the core ingest the recorder and memory-import use
(`MemoryEngine.add_stream_rows` for camera frames and lidar scans, `add_observation`, and
`save` for the robot's notes), at the rows per second the recorder keeps at Go2 rates
(BENCHMARKS.md, memory-import, 8 h at Go2 rates: camera 1.53, lidar 1.47, odometry 1.58 kept
rows per second while walking; a standing robot keeps one keyframe per stream per
`max_interval`, 10 s).
A Go2 walks an hour per battery: each day has `--active-hours` patrols of one hour round a
12 m x 8 m loop at 0.8 m/s, from a dock where it stands (and records) the rest of the day, and
a note every 15 minutes of patrol. The camera is 64x48 (views of the simulated flat along the
loop, JPEG-encoded by the ingest), the lidar scans 300 points: the rows, their poses, views
and vectors are what a full-size camera gives; the blobs are smaller. Descriptions are the
default OpenCV describer's, embedded by MiniLM; a text already embedded is not embedded again
(the vector is the same), so the week builds in minutes. Without `--budget-mb` the store keeps
every row; with it, the writing engine has that `disk_budget_mb` and the bench runs a
compaction (`MemoryEngine.ask_compact`, which runs the budget after it) every
`--compact-every-h` simulated hours. The background thread is off (`compact_interval_s` 0):
its interval is wall-clock time, and the bench writes a simulated day in a couple of minutes,
so it would run once a simulated half-day or so. Each round's time and result, and at each
day's end the store's size on disk (a du-style walk of the memory directory, and the
`streams` answer's `disk_bytes`), rows kept, evicted and oldest time per stream are recorded.

At each checkpoint the writing engine closes (writing its index cache, as a node does on
shutdown) and a fresh process opens the store and times its start-up, its memory and every
query kind on it: the same questions at every age, so the columns compare.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    dir_size_mb,
    du_bytes,
    machine_info,
    percentiles,
    rss_mb,
    write_json,
    write_marked_section,
)

T0 = 1_764_489_600.0  # 2025-11-30 08:00 UTC: the first patrol starts the store
KEPT_PER_S = {"camera": 1.53, "lidar": 1.47, "odom": 1.58}  # walking, Go2 rates
MIB = 1024 * 1024
MAX_INTERVAL_S = 10.0  # standing: one keyframe per stream this often
PATROL_STARTS_H = (0.0, 3.0, 6.0, 9.0, 12.0, 1.5, 4.5, 7.5)  # hours after 08:00, by count
SPEED = 0.8
LOOP = (6.0, 4.0)  # the ellipse's half axes (m)
DOCK_ANGLE = math.pi
NOTE_EVERY_S = 900.0
CAMERA_BATCH = 4
WORDS = ["a bright room", "someone at the door", "red chair", "dark corridor", "window",
         "the kitchen counter", "a plant by the sofa"]
NOTES = ["battery at {p}%: patrol continues", "door to the hall was open", "checked the "
         "kitchen, nothing on the floor", "person walked past the sofa", "charging dock clear"]
WARM_UP = len(WORDS)  # queries per kind before the timed ones: every text once
KINDS = ("combined", "semantic_only", "visits_hour", "visits_all", "place", "seen_near",
         "newest")
KIND_TEXT = {
    "combined": "semantic + place + last hour (camera)",
    "semantic_only": "semantic only",
    "visits_hour": "visits, last hour",
    "visits_all": "visits, whole history",
    "place": "place (near), newest first",
    "seen_near": "seen_near (camera)",
    "newest": "time-ordered, newest first (camera)",
}


class MemoEmbedder:
    """The text model, embedding each distinct text once (the vectors are the model's)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.memo: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        new = sorted({t for t in texts if t not in self.memo})
        if new:
            for t, v in zip(new, np.asarray(self.inner.embed_texts(new), np.float32),
                            strict=True):
                self.memo[t] = v
        return np.stack([self.memo[t] for t in texts])


def loop_pose(angle: float) -> tuple[float, float, float]:
    x, y = LOOP[0] * math.cos(angle), LOOP[1] * math.sin(angle)
    dx, dy = -LOOP[0] * math.sin(angle), LOOP[1] * math.cos(angle)
    return x, y, math.atan2(dy, dx)


def _angular_speed(angle: float) -> float:
    """d(angle)/dt for SPEED along the ellipse."""
    return SPEED / math.hypot(LOOP[0] * math.sin(angle), LOOP[1] * math.cos(angle))


def patrols(days: float, active_hours: int) -> list[tuple[float, float]]:
    """(start, end) of each patrol: `active_hours` one-hour patrols a day."""
    out = []
    for d in range(math.ceil(days)):
        for h in sorted(PATROL_STARTS_H[:active_hours]):
            a = T0 + d * 86400.0 + h * 3600.0
            if a < T0 + days * 86400.0:
                out.append((a, min(a + 3600.0, T0 + days * 86400.0)))
    return out


def events(days: float, active_hours: int, seed: int) -> list[tuple[float, str, tuple]]:
    """(t, stream, (x, y, yaw)) of every kept row, in time order."""
    rng = np.random.default_rng(seed)
    end = T0 + days * 86400.0
    walks = patrols(days, active_hours)
    out: list[tuple[float, str, tuple]] = []
    # The angle along the loop through each patrol, integrated at 0.1 s.
    track_t: list[np.ndarray] = []
    track_a: list[np.ndarray] = []
    for a, b in walks:
        ts = np.arange(a, b, 0.1)
        ang = np.empty(len(ts))
        cur = DOCK_ANGLE
        for i in range(len(ts)):
            ang[i] = cur
            cur += _angular_speed(cur) * 0.1
        track_t.append(ts)
        track_a.append(ang)
    dock = loop_pose(DOCK_ANGLE)
    for stream, rate in KEPT_PER_S.items():
        t = T0 + float(rng.uniform(0, 1.0))
        wi = 0
        while t < end:
            while wi < len(walks) and walks[wi][1] <= t:
                wi += 1
            walking = wi < len(walks) and walks[wi][0] <= t < walks[wi][1]
            if walking:
                ts, ang = track_t[wi], track_a[wi]
                j = min(int((t - walks[wi][0]) / 0.1), len(ang) - 1)
                pose = loop_pose(float(ang[j]))
                step = float(rng.exponential(1.0 / rate)) * 0.5 + 0.5 / rate
            else:
                noise = rng.normal(0, 0.003, 2)
                pose = (dock[0] + float(noise[0]), dock[1] + float(noise[1]), dock[2])
                step = MAX_INTERVAL_S
                nxt = walks[wi][0] if wi < len(walks) else end
                if t + step > nxt:  # the next patrol starts: keyframes resume at once
                    step = max(nxt - t, 0.05)
            out.append((t, stream, pose))
            t += step
    out.sort(key=lambda e: e[0])
    return out


def store_state(engine: Any, memory: Path, hours: float) -> dict[str, Any]:
    """The store's size and each stream's rows kept / evicted / oldest, from `streams`."""
    ans = engine.ask_streams().model_dump()
    wal = memory / "memory.db-wal"
    return {"hours": round(hours, 3), "du_bytes": du_bytes(memory),
            "wal_bytes": wal.stat().st_blocks * 512 if wal.exists() else 0,
            "disk_bytes": ans.get("disk_bytes"), "disk_budget_bytes": ans.get("disk_budget_bytes"),
            "streams": {s["name"]: {"count": s["count"], "evicted": s.get("evicted", 0),
                                    "oldest_t": s.get("oldest_t"), "first_t": s.get("first_t"),
                                    "last_t": s.get("last_t")}
                        for s in ans.get("streams") or []}}


def build(memory: Path, days: float, active_hours: int, checkpoints_h: list[float],
          seed: int, on_checkpoint: Any, budget_mb: float = 0.0,
          compact_every_h: float = 0.0, budget_check_s: float = 60.0) -> dict[str, Any]:
    """Write the store through the engine, calling `on_checkpoint(hours)` at each one; with
    `compact_every_h`, a compaction (and the budget) every that many simulated hours, and the
    budget alone every `budget_check_s` simulated seconds (as the background thread does)."""
    from bench.import_bench import _flat_views
    from memory_node.core.config import MemoryConfig
    from memory_node.core.embedders.minilm import MiniLMEmbedder
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.ingest import CameraFrame, LidarScan
    from memory_node.core.types import Pose, View

    views = _flat_views(48, 64, 48)
    evs = events(days, active_hours, seed)
    rng = np.random.default_rng(seed + 1)
    world = (rng.random((300, 3)) * [8.0, 8.0, 1.5] - [4.0, 4.0, 0.0]).astype(np.float32)
    text = MemoEmbedder(MiniLMEmbedder(onnx_threads=1))
    settings: dict[str, Any] = {"memory_dir": str(memory)}
    if compact_every_h > 0:
        settings.update(disk_budget_mb=budget_mb, compact_interval_s=0.0)
    cfg = MemoryConfig.from_mapping(settings)
    counts = dict.fromkeys(("camera", "lidar", "odom", "notes"), 0)
    state = {"now": T0, "pose": None}
    write_s = 0.0
    rounds: list[dict[str, Any]] = []
    days_state: list[dict[str, Any]] = []
    next_round = T0 + compact_every_h * 3600.0 if compact_every_h > 0 else math.inf
    next_day = T0 + 86400.0
    next_check = T0 + budget_check_s if compact_every_h > 0 and budget_mb > 0 else math.inf
    checks = {"n": 0, "took_s": 0.0, "max_took_s": 0.0, "made_room": [],
              "max_disk_bytes_before": 0}

    def open_engine() -> Any:
        return MemoryEngine(cfg, clock=lambda: state["now"], pose_provider=lambda: state["pose"],
                            text_embedder=text)

    engine = open_engine()
    pending: list[Any] = []
    next_note = T0 + NOTE_EVERY_S
    walks = patrols(days, active_hours)
    marks = sorted(h for h in checkpoints_h if h * 3600.0 <= days * 86400.0 + 1e-6)
    mi = 0
    t_start = time.perf_counter()

    def flush() -> None:
        if pending:
            engine.add_stream_rows("camera", pending)
            counts["camera"] += len(pending)
            pending.clear()

    def compaction_round(at: float) -> None:
        """One compaction + budget round through the engine's compact path, timed."""
        nonlocal t_start
        flush()
        write_s_now = time.perf_counter() - t_start
        state["now"] = at
        t0 = time.perf_counter()
        ans = engine.ask_compact().model_dump()
        took = time.perf_counter() - t0
        budget = ans.get("budget") or {}
        rounds.append({"hours": round((at - T0) / 3600.0, 3), "took_s": round(took, 3),
                       "ok": bool(ans.get("ok")), "thinned": ans.get("thinned"),
                       "folded": ans.get("folded"), "budget_status": budget.get("status"),
                       "budget_took_s": budget.get("took_s"),
                       "rows_removed": budget.get("rows_removed", 0),
                       "blobs_removed": budget.get("blobs_removed", 0),
                       "disk_bytes_before": budget.get("disk_bytes_before"),
                       "disk_bytes": budget.get("disk_bytes"),
                       "error": None if ans.get("ok") else ans.get("error")})
        if at >= next_day - 1e-6:
            days_state.append(store_state(engine, memory, (at - T0) / 3600.0))
        t_start = time.perf_counter() - write_s_now

    def budget_check(at: float) -> None:
        """The budget alone, as the background thread runs it between compactions."""
        nonlocal t_start
        flush()
        write_s_now = time.perf_counter() - t_start
        t0 = time.perf_counter()
        rep = engine.disk.enforce()
        if rep.get("rows_removed"):
            engine.sync()
        took = time.perf_counter() - t0
        checks["n"] += 1
        checks["took_s"] += took
        checks["max_took_s"] = max(checks["max_took_s"], took)
        checks["max_disk_bytes_before"] = max(checks["max_disk_bytes_before"],
                                              rep.get("disk_bytes_before") or 0)
        if rep.get("rows_removed") or rep.get("blobs_removed"):
            checks["made_room"].append({
                "hours": round((at - T0) / 3600.0, 3), "took_s": round(took, 3),
                "status": rep.get("status"), "rows_removed": rep.get("rows_removed", 0),
                "blobs_removed": rep.get("blobs_removed", 0),
                "disk_bytes_before": rep.get("disk_bytes_before"),
                "disk_bytes": rep.get("disk_bytes")})
        t_start = time.perf_counter() - write_s_now

    for t, stream, (x, y, yaw) in evs:
        if t >= next_check:
            budget_check(t)
            next_check = t + budget_check_s
        while next_round <= min(t, next_day) or next_day <= t:
            if next_round <= next_day:
                compaction_round(next_round)
                if abs(next_round - next_day) < 1e-6:
                    next_day += 86400.0
                next_round += compact_every_h * 3600.0
            else:  # a day's end between rounds: its state as it is
                if compact_every_h > 0:
                    flush()
                    days_state.append(store_state(engine, memory, (next_day - T0) / 3600.0))
                next_day += 86400.0
        while mi < len(marks) and t >= T0 + marks[mi] * 3600.0:
            flush()
            write_s += time.perf_counter() - t_start
            state_at = (store_state(engine, memory, marks[mi]) if compact_every_h > 0
                        else None)
            engine.close()
            on_checkpoint(marks[mi], dict(counts), round(write_s, 1), state_at)
            engine = open_engine()
            t_start = time.perf_counter()
            mi += 1
        pose = Pose(x, y, yaw=yaw, frame="map", source="tf")
        state["now"], state["pose"] = t, pose
        if stream == "camera":
            angle = math.atan2(y / LOOP[1], x / LOOP[0]) % (2 * math.pi)
            img = views[int(angle / (2 * math.pi) * len(views)) % len(views)]
            pending.append(CameraFrame(t, pose, img, view=View(x, y, yaw, 1.57, 4.0)))
            if len(pending) >= CAMERA_BATCH:
                flush()
        elif stream == "lidar":
            engine.add_stream_rows("lidar", [LidarScan(t, pose, world + [x, y, 0.0])])
            counts["lidar"] += 1
        else:
            engine.add_observation("odom", t, pose, {"speed": SPEED})
            counts["odom"] += 1
        if t >= next_note and any(a <= t < b for a, b in walks):
            note = NOTES[counts["notes"] % len(NOTES)].format(p=90 - counts["notes"] % 60)
            saved = engine.ask_save(json.dumps({"note": note})).model_dump()
            if not saved.get("ok"):
                raise RuntimeError(f"a note was refused: {saved}")
            counts["notes"] += 1
            next_note = t + NOTE_EVERY_S
    flush()
    write_s += time.perf_counter() - t_start
    final = store_state(engine, memory, days * 24.0) if compact_every_h > 0 else None
    engine.close()
    while mi < len(marks):
        on_checkpoint(marks[mi], dict(counts), round(write_s, 1), final)
        mi += 1
    out: dict[str, Any] = {"rows": counts, "write_s": round(write_s, 1), "events": len(evs),
                           "distinct_texts_embedded": len(text.memo)}
    if compact_every_h > 0:
        checks["took_s"] = round(checks["took_s"], 3)
        checks["max_took_s"] = round(checks["max_took_s"], 3)
        out.update(budget_mb=budget_mb, compact_every_h=compact_every_h, rounds=rounds,
                   budget_check_s=budget_check_s, checks=checks, days=days_state,
                   final=final)
    return out


# ---- measuring one checkpoint (a fresh process) ---------------------------------------------
def _queries(rng: np.random.Generator, kind: str, i: int) -> dict[str, Any]:
    x, y, _ = loop_pose(float(rng.uniform(0, 2 * math.pi)))
    near = {"near_x": round(x + float(rng.normal(0, 0.3)), 3),
            "near_y": round(y + float(rng.normal(0, 0.3)), 3)}
    word = WORDS[i % len(WORDS)]
    return {
        "combined": {"stream": "camera", "semantic_query": word, **near, "radius": 2.0,
                     "after_seconds_ago": 3600, "k": 5},
        "semantic_only": {"semantic_query": word, "k": 5},
        "visits_hour": {"visits": True, **near, "radius": 1.5, "after_seconds_ago": 3600},
        "visits_all": {"visits": True, **near, "radius": 1.5},
        "place": {**near, "radius": 2.0, "k": 5},
        "seen_near": {"stream": "camera", **near, "radius": 1.0, "seen_near": True, "k": 5},
        "newest": {"stream": "camera", "order_by": "-time", "k": 5},
    }[kind]


def measure(memory: Path, n: int, seed: int, budget_mb: float = 0.0) -> dict[str, Any]:
    """Open the store as a node does (timed), then every query kind `n` times. With a budget
    the measuring engine has it too, but no background round (the writer runs those)."""
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    settings: dict[str, Any] = {"memory_dir": str(memory)}
    if budget_mb > 0:
        settings.update(disk_budget_mb=budget_mb, compact_interval_s=0.0)
    rss0 = rss_mb()
    t0 = time.perf_counter()
    engine = MemoryEngine(MemoryConfig.from_mapping(settings))
    open_s = time.perf_counter() - t0
    last = engine.store.newest_t(["camera", "lidar", "odom"]) or T0
    engine.clock = lambda: last
    t1 = time.perf_counter()
    first = engine.ask_search(json.dumps({"semantic_query": WORDS[0], "k": 5})).model_dump()
    first_s = time.perf_counter() - t1
    rss_open = rss_mb()
    engine.indexes.wait_for_cached_graphs(120)
    engine.indexes.wait_for_graphs(600)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for kind in KINDS:
        times, ok, counts, notes = [], 0, [], set()
        for i in range(n + WARM_UP):
            q = json.dumps(_queries(rng, kind, i))
            ts = time.perf_counter()
            answer = engine.ask_search(q).model_dump()
            ms = (time.perf_counter() - ts) * 1000
            if i < WARM_UP:  # each query text embedded once (an agent repeats its questions)
                continue
            times.append(ms)
            ok += bool(answer.get("ok"))
            counts.append(answer.get("count") or 0)
            notes.update(str(x)[:160] for x in answer.get("notes") or [])
        p = percentiles(times)
        out[kind] = {"p50_ms": round(p["p50"], 3), "p99_ms": round(p["p99"], 3), "ok": ok,
                     "n": n, "mean_count": round(float(np.mean(counts)), 1),
                     "notes": sorted(notes)[:4]}
    rows = engine.store.count()
    graphs = engine.indexes.graph_info()
    engine.close()
    return {"graphs": graphs, "open_s": round(open_s, 3), "first_answer_s": round(first_s, 3),
            "first_ok": bool(first.get("ok")), "rss_before_open_mb": round(rss0, 1),
            "rss_open_mb": round(rss_open, 1), "rss_after_queries_mb": round(rss_mb(), 1),
            "rows": rows, "queries": out}


def _measure_in_child(memory: Path, n: int, seed: int, budget_mb: float = 0.0
                      ) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.week_bench", "--measure", str(memory),
                           "--queries", str(n), "--seed", str(seed),
                           "--budget-mb", str(budget_mb)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _label(hours: float) -> str:
    if hours < 24:
        return f"hour {hours:g}"
    return f"day {math.floor(hours / 24):g}"


def report(res: dict[str, Any]) -> str:
    cps = res["checkpoints"]
    first, last = cps[0], cps[-1]
    labels = [_label(c["hours"]) for c in cps]
    lines = ["## A week: query costs against the store's age (issue 37)", "",
             f"Command: `{res['command']}`. One store written through the "
             "core ingest (`add_stream_rows`, `add_observation`, `save`) at "
             "the rows a Go2's recorder keeps: walking, camera 1.53, lidar 1.47, odometry "
             "1.58 rows/s (memory-import's 8 h at Go2 rates); docked, one keyframe per stream "
             f"every {MAX_INTERVAL_S:g} s; {res['active_hours']} one-hour patrols a day round a "
             "12 m x 8 m loop at 0.8 m/s, a note every 15 min of patrol. Camera 64x48 JPEG "
             "(views of the simulated flat), lidar 300 points: the rows, poses, views and "
             "vectors of a full-size camera, smaller blobs. No disk budget (the next "
             "section is the same week under one): every row is kept. At each age a fresh "
             "process opens the store (its index cache written by the writer's close) and "
             "asks each kind "
             f"{res['queries']} times (after {res.get('warm_up', 3)} warm-up queries: each "
             "query text embedded once), points on the loop. The ages "
             "(hours " + ", ".join(f"{h:g}" for h in res["hours"]) + ") end with the first "
             "hour of a day's patrols, so \"the last hour\" is a patrol hour at each.", "",
             "| | " + " | ".join(labels) + " |", "|---|" + "---|" * len(cps)]

    def row(name: str, fmt: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(fmt(c) for c in cps) + " |")

    row("rows (camera / lidar / odom / notes)",
        lambda c: " / ".join(str(c["written"][k]) for k in ("camera", "lidar", "odom", "notes")))
    row("store MB (memory.db MB)", lambda c: f"{c['store_mb']:.0f} ({c['db_mb']:.0f})")
    row("start-up s (engine open / first answer)",
        lambda c: f"{c['m']['open_s']:.2f} / {c['m']['first_answer_s']:.2f}")
    row("RSS MB (open / after queries)",
        lambda c: f"{c['m']['rss_open_mb']:.0f} / {c['m']['rss_after_queries_mb']:.0f}")
    lines += ["", "| query kind | " + " | ".join(f"{lb} p50 / p99 ms" for lb in labels)
              + f" | {_label(last['hours'])} / {_label(first['hours'])} p50 | p99 |",
              "|---|" + "---|" * (len(cps) + 2)]
    for kind in KINDS:
        q = [c["m"]["queries"][kind] for c in cps]
        r50 = q[-1]["p50_ms"] / max(q[0]["p50_ms"], 1e-9)
        r99 = q[-1]["p99_ms"] / max(q[0]["p99_ms"], 1e-9)
        lines.append(f"| {KIND_TEXT[kind]} | " + " | ".join(
            f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f}" for x in q)
            + f" | **{r50:.2f}x** | {r99:.2f}x |")
    per_visit = [c["m"]["queries"]["visits_all"]["p50_ms"]
                 / max(c["m"]["queries"]["visits_all"]["mean_count"], 1e-9) for c in cps]
    lines += ["", "Visits over the whole history per visit in the answer (p50 / mean count): "
              + " / ".join(f"{v:.3f} ms" for v in per_visit) + f" ({' / '.join(labels)})."]
    counts = " · ".join(f"{KIND_TEXT[k]}: " + " / ".join(
        f"{c['m']['queries'][k]['mean_count']:g}" for c in cps) for k in KINDS)
    m = res.get("machine", {})
    lines += ["", "What each kind's cost follows: combined searches the last hour's rows (a "
              "binary search in each index's time order, then the disc); semantic-only searches "
              "the model's graph index (HNSW or its inverted file, as its calibration chose; "
              "exact below 20k rows); visits read the pose-history index's "
              "excerpt for the circle (the samples in the cells it overlaps, in the window); "
              "place and seen_near newest first read back in time through the index's buckets "
              "until k rows are found; newest first reads the (stream, t) index. \"Visits, "
              "whole history\" answers every visit ever made (count, total_s): its cost "
              "follows the visits in the answer (the mean count below), which a robot pacing "
              "the same loop adds every lap; per visit it stays flat."]
    lines += ["", f"Mean answer count per kind (results or visits; {' / '.join(labels)}): "
              f"{counts}.", "",
              f"Measured {res.get('when', '?')} on {m.get('cpus', '?')} CPUs "
              f"({m.get('cpu', '?')}), load average {m.get('loadavg', '?')} (a shared "
              f"machine); writing the store took {res['build']['write_s']:.0f} s for "
              f"{res['build']['events']} kept sensor rows "
              f"({res['build']['distinct_texts_embedded']} distinct texts embedded)."]
    return "\n".join(lines)


def _mib(n: float | None) -> str:
    return "?" if n is None else f"{n / MIB:.0f}"


def budget_report(res: dict[str, Any], plain: dict[str, Any] | None = None) -> str:
    """The week under a disk budget: size against budget per day, rows kept and evicted,
    the rounds' times, and the query table next to the no-budget run's (`plain`)."""
    b = res["build"]
    budget = b["budget_mb"] * MIB
    cps = res["checkpoints"]
    labels = [_label(c["hours"]) for c in cps]
    sensors = ("camera", "lidar", "odom")
    lines = ["## A week under a disk budget (issue 37)", "",
             f"Command: `{res['command']}`. The same week as the section above (the same "
             "rows, poses, notes and questions), written by an engine with `disk_budget_mb` "
             f"{b['budget_mb']:g}; every {b['compact_every_h']:g} simulated hour(s) the bench "
             "runs a compaction through the engine's compact path (`ask_compact`, which runs "
             "the budget after it), the background thread off (its interval is wall-clock "
             "time, and the bench writes a simulated day in minutes). Sizes are MiB on disk "
             "(allocated blocks, as the budget counts): a du-style walk of the memory "
             "directory, and the `streams` answer's `disk_bytes`; rows kept are the `streams` "
             "answer's counts (live rows; thinned rows are archived, not counted), evicted "
             "its `evicted`.", "",
             "| day end | du MiB | disk_bytes MiB | budget MiB | du / budget | kept camera / "
             "lidar / odom / notes (events) | evicted camera / lidar / odom | oldest camera "
             "row |",
             "|---|---|---|---|---|---|---|---|"]
    days = list(b.get("days") or [])
    for d in days:
        st = d["streams"]
        oldest = st.get("camera", {}).get("oldest_t")
        lines.append(
            f"| {d['hours'] / 24:g} | {_mib(d['du_bytes'])} | {_mib(d['disk_bytes'])} | "
            f"{_mib(budget)} | {d['du_bytes'] / budget:.2f} | "
            + " / ".join(str(st.get(s, {}).get("count", 0)) for s in (*sensors, "events"))
            + " | " + " / ".join(str(st.get(s, {}).get("evicted", 0)) for s in sensors)
            + " | " + ("?" if oldest is None else f"day {(oldest - T0) / 86400:.2f}") + " |")
    final = b.get("final") or {}
    written = b["rows"]
    lines += ["", f"At the end ({final.get('hours', 0) / 24:.2f} days; du "
              f"{_mib(final.get('du_bytes'))} MiB, budget {_mib(budget)} MiB):", "",
              "| stream | written | kept | evicted | archived (thinned, not evicted) | "
              "oldest row (age in days) |", "|---|---|---|---|---|---|"]
    for s in (*sensors, "events", "summaries"):
        st = (final.get("streams") or {}).get(s, {})
        kept, ev = st.get("count", 0), st.get("evicted", 0)
        oldest = st.get("oldest_t")
        end_t = T0 + final.get("hours", 0) * 3600
        age = "?" if oldest is None else f"{(end_t - oldest) / 86400:.2f}"
        n = written.get("notes" if s == "events" else s, 0)
        name = {"events": "notes (events)", "summaries": "summaries (compaction's)"}.get(s, s)
        lines.append(f"| {name} | {n if s != 'summaries' else '-'} | {kept} | {ev} | "
                     f"{max(n - kept - ev, 0) if s != 'summaries' else '-'} | {age} |")
    rounds = b.get("rounds") or []
    if rounds:
        took = [r["took_s"] for r in rounds]
        ev_rounds = [r for r in rounds if r.get("rows_removed") or r.get("blobs_removed")]
        p = percentiles(took)
        worst = max((r.get("disk_bytes") or 0) for r in rounds)
        lines += ["", f"Rounds: {len(rounds)} (compaction, then the budget); each took "
                  f"p50 {p['p50']:.2f} s, p99 {p['p99']:.2f} s, max {max(took):.2f} s. "
                  f"{len(ev_rounds)} made room"
                  + (f" (first at hour {ev_rounds[0]['hours']:g}; budget step p50 "
                     f"{percentiles([r['budget_took_s'] or 0 for r in ev_rounds])['p50']:.2f} s, "
                     f"max {max(r['budget_took_s'] or 0 for r in ev_rounds):.2f} s; "
                     f"{sum(r['rows_removed'] for r in ev_rounds)} rows and "
                     f"{sum(r['blobs_removed'] for r in ev_rounds)} blobs removed in all)"
                     if ev_rounds else "")
                  + f". Largest size after a round: {_mib(worst)} MiB "
                  f"({worst / budget:.2f} of the budget); rounds not ok: "
                  f"{sum(not r['ok'] for r in rounds)}."]
    ck = b.get("checks") or {}
    if ck.get("n"):
        made = ck["made_room"]
        lines += ["", f"Between rounds the budget alone every {b['budget_check_s']:g} "
                  f"simulated s (as the background thread checks it): {ck['n']} checks, "
                  f"{ck['took_s']:.1f} s in all, the longest {ck['max_took_s']:.2f} s; "
                  f"{len(made)} made room"
                  + (f" (p50 {percentiles([x['took_s'] for x in made])['p50']:.2f} s, "
                     f"{sum(x['rows_removed'] for x in made)} rows removed in all)"
                     if made else "")
                  + f". Largest size a check found: {_mib(ck['max_disk_bytes_before'])} MiB "
                  f"({ck['max_disk_bytes_before'] / budget:.2f} of the budget)."]
    lines += ["", "| query kind | " + " | ".join(f"{lb} p50 / p99 ms" for lb in labels)
              + (" | no budget, " + _label(plain["checkpoints"][-1]["hours"])
                 + " p50 / p99 ms" if plain else "") + " |",
              "|---|" + "---|" * (len(cps) + (1 if plain else 0))]
    for kind in KINDS:
        q = [c["m"]["queries"][kind] for c in cps]
        cells = [f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f}" for x in q]
        if plain:
            x = plain["checkpoints"][-1]["m"]["queries"][kind]
            cells.append(f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f}")
        lines.append(f"| {KIND_TEXT[kind]} | " + " | ".join(cells) + " |")
    lines += ["", "Rows in the store at each age (kept + archived): "
              + " / ".join(str(c["m"]["rows"]) for c in cps) + f" ({' / '.join(labels)}); "
              "start-up s (open / first answer): "
              + " / ".join(f"{c['m']['open_s']:.2f} / {c['m']['first_answer_s']:.2f}"
                           for c in cps)
              + "; mean answer count, visits over the whole history: "
              + " / ".join(f"{c['m']['queries']['visits_all']['mean_count']:g}" for c in cps)
              + "."]
    notes = sorted({n for c in cps for k in KINDS for n in c["m"]["queries"][k]["notes"]
                    if "disk budget" in n})
    if notes:
        lines += ["", "What the answers said about the budget (e.g.): " + "; ".join(
            f"\"{n}\"" for n in notes[:2]) + "."]
    m = res.get("machine", {})
    lines += ["", "Queries while a round runs are not timed here (the rounds run between "
              "the writes, in the writing process); see \"Queries during background "
              "compaction\" above (`bench.compaction_p99`) for p99 during compaction and "
              "the budget against idle.", "",
              f"Measured {res.get('when', '?')} on {m.get('cpus', '?')} CPUs "
              f"({m.get('cpu', '?')}), load average {m.get('loadavg', '?')} (a shared "
              f"machine); writing took {b['write_s']:.0f} s (the rounds not counted) for "
              f"{b['events']} sensor rows."]
    return "\n".join(lines)


def _plain(out: Path) -> dict[str, Any] | None:
    """The no-budget run's results, for the columns next to the budget run's."""
    f = out / "week.json"
    return json.loads(f.read_text()) if f.exists() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.week_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, default=7,
                   help="the oldest age measured (days; default ages: hour 1, day 1, day D)")
    p.add_argument("--active-hours", type=int, default=4, choices=range(0, 9),
                   help="one-hour patrols a day (the rest docked)")
    p.add_argument("--checkpoints", default=None,
                   help="ages (hours) to measure at, the store as long as the last (default: "
                   "1, 25 and 24 D + 1: each age ends with the morning's first patrol, so the "
                   "last hour is a patrol hour at every age)")
    p.add_argument("--queries", type=int, default=60, help="queries per kind and age")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget-mb", type=float, default=0.0,
                   help="the writing engine's disk_budget_mb (MiB; 0: none, every row kept); "
                   "results to week_budget.json and the report's week-budget section")
    p.add_argument("--compact-every-h", type=float, default=1.0,
                   help="with --budget-mb: a compaction and budget round every this many "
                   "simulated hours (default 1: compact_interval_s 3600 in the store's time)")
    p.add_argument("--budget-check-s", type=float, default=60.0,
                   help="with --budget-mb: the budget alone every this many simulated seconds "
                   "between rounds (default 60, as the background thread checks it)")
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the store (printed)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--report", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the report from the last run's week.json")
    p.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.queries, args.seed, args.budget_mb)))
        return 0
    if args.budget_mb < 0 or (args.budget_mb > 0 and args.compact_every_h <= 0):
        p.error("--budget-mb must be >= 0 and --compact-every-h > 0")
    name = "week_budget" if args.budget_mb > 0 else "week"
    section = "week-budget" if args.budget_mb > 0 else "week"
    if args.report_only:
        res = json.loads((args.out / f"{name}.json").read_text())
        write_marked_section(args.report, section,
                             budget_report(res, _plain(args.out)) if args.budget_mb > 0
                             else report(res))
        return 0
    if args.checkpoints is None:
        hours = sorted({1.0, 25.0, 24.0 * args.days + 1.0} if args.days >= 1 else {1.0})
    else:
        hours = sorted({float(h) for h in args.checkpoints.split(",") if h.strip()})
    days = hours[-1] / 24.0
    work = Path(tempfile.mkdtemp(prefix="week_", dir=args.work))
    memory = work / "memory"
    checkpoints: list[dict[str, Any]] = []

    def on_checkpoint(h: float, written: dict[str, int], write_s: float,
                      state: dict[str, Any] | None) -> None:
        closed = du_bytes(memory)  # as a node leaves the store when it stops
        m = _measure_in_child(memory, args.queries, args.seed, args.budget_mb)
        cp = {"hours": h, "written": written, "write_s": write_s,
              "store_mb": round(dir_size_mb(memory), 1),
              "db_mb": round((memory / "memory.db").stat().st_size / 1e6, 1), "m": m}
        if state is not None:  # the writer's streams answer, just before it closed
            cp["state"] = state
            cp["du_bytes"] = closed
        checkpoints.append(cp)
        print(f"{_label(h)}: {m['rows']} rows, open {m['open_s']} s, " + ", ".join(
            f"{k} {v['p50_ms']}/{v['p99_ms']} ms" for k, v in m["queries"].items()),
            flush=True)

    try:
        built = build(memory, days, args.active_hours, hours, args.seed, on_checkpoint,
                      budget_mb=args.budget_mb,
                      compact_every_h=args.compact_every_h if args.budget_mb > 0 else 0.0,
                      budget_check_s=args.budget_check_s)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"store kept at {memory}")
    res = {"days": args.days, "hours": hours, "active_hours": args.active_hours,
           "queries": args.queries, "warm_up": WARM_UP,
           "build": built, "checkpoints": checkpoints, "machine": machine_info(),
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python -m bench.week_bench " + " ".join(argv if argv is not None
                                                               else sys.argv[1:])}
    write_json(args.out / f"{name}.json", res)
    write_marked_section(args.report, section,
                         budget_report(res, _plain(args.out)) if args.budget_mb > 0
                         else report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
