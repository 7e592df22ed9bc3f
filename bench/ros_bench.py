"""ROS round trip: `/memory/search` answered by `memory-server` in another process.

The server runs on a scratch copy of the store, with ROS discovery kept on this host and a
domain id of its own so it cannot meet other tests' nodes. Queries use absolute `after`
(the server's clock is the wall clock, the data's times are in the past); each query text is
sent once before timing so the server's query-embedding cache is warm, which leaves the
figure as transport + JSON + engine, like the engine-level one plus ROS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, REPO_ROOT, percentiles
from bench.engine_bench import (
    RADIUS,
    WINDOW_S,
    Log,
    brute_force,
    make_queries,
    same_result,
)
from bench.workload import build_store, copy_store, load_dataset

# Test runs here take domain ids 1..100 (from their pid) and the demo 101..199: the bench uses
# the other range ROS 2 documents as safe on Linux (215..232), so its nodes meet no others.
DOMAIN_ID = "230"
TOPICS = {"camera": "/camera/image_raw", "lidar": "/lidar/points", "odom": "/odom"}


def _server_cmd(mem: Path, fixed: bool) -> list[str]:
    args = ["--ros-args", "-p", f"memory_dir:={mem}", "-r", "__node:=bench_server"]
    if fixed:
        return [sys.executable, "-m", "bench.ros_server_fixed", *args]
    exe = REPO_ROOT / ".venv" / "bin" / "memory-server"
    return [str(exe) if exe.exists() else "memory-server", *args]


def section_ros(n: int, seed: int, vectors: str, nq: int, log: Log) -> dict[str, Any]:
    if not (REPO_ROOT / "memory_node" / "ros" / "server.py").exists():
        return {"skipped": "memory_node/ros/server.py does not exist yet"}
    if vectors != "minilm":
        return {"skipped": "the server embeds queries with MiniLM: needs a MiniLM store"}
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ["ROS_DOMAIN_ID"] = DOMAIN_ID
    d = build_store(n, seed, vectors, log)
    ds = load_dataset(n, seed, vectors)
    queries = make_queries(ds, nq)
    import rclpy

    from memory_node.ros.cli import ServiceCaller

    out: dict[str, Any] = {"n": n, "queries": nq, "variants": {}}
    rclpy.init(args=["bench_ros_client"])
    caller = ServiceCaller("bench_ros_client")
    try:
        for label in ("as_is", "fixed"):
            try:
                out["variants"][label] = _ros_variant(d, ds, queries, caller, label == "fixed",
                                                      log)
            except Exception as exc:  # noqa: BLE001 - report the variant's failure
                out["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        caller.close()
        rclpy.try_shutdown()
    out.update(out["variants"].get("as_is", {}))
    return out


def _ros_variant(d: Path, ds: Any, queries: list[dict[str, Any]], caller: Any, fixed: bool,
                 log: Log) -> dict[str, Any]:
    scratch = BENCH_DIR / "results" / "raw" / "scratch" / f"ros_{ds.n}"
    mem = copy_store(d, scratch)
    t0 = time.perf_counter()
    # A file, not a pipe: a full pipe would block it. Read and closed in the finally below.
    logf = tempfile.TemporaryFile("w+")  # noqa: SIM115
    srv = subprocess.Popen(_server_cmd(mem, fixed), cwd=REPO_ROOT, env=dict(os.environ),
                           stdout=logf, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    out: dict[str, Any] = {}
    try:
        first = caller.call("streams", None, timeout=180.0)
        if not json.loads(first).get("ok"):
            raise RuntimeError(f"server did not come up: {first}")
        out["server_ready_s"] = round(time.perf_counter() - t0, 2)
        # Transport + JSON alone: a request the server refuses at parse time (bad_request).
        tl = []
        for _ in range(len(queries)):
            t1 = time.perf_counter_ns()
            caller.call("search", '{"k": 0}')
            tl.append((time.perf_counter_ns() - t1) / 1e6)
        out["bad_request_round_trip_ms"] = percentiles(tl)
        t_min = ds.now - WINDOW_S
        kinds = {
            "combined": lambda q: {"stream": "camera", "near_x": q["near"][0],
                                   "near_y": q["near"][1], "radius": RADIUS,
                                   "after": t_min, "semantic_query": q["text"], "k": 5},
            "semantic": lambda q: {"semantic_query": q["text"], "k": 5},
        }
        for kind, make in kinds.items():
            reqs = [json.dumps(make(q)) for q in queries]
            for r in reqs:  # warm the server's query-embedding cache
                caller.call("search", r)
            lat, exact, took = [], 0, []
            for q, r in zip(queries, reqs):
                t1 = time.perf_counter_ns()
                ans = caller.call("search", r)
                lat.append((time.perf_counter_ns() - t1) / 1e6)
                o = json.loads(ans)
                if not o.get("ok"):
                    raise RuntimeError(f"search failed: {ans[:300]}")
                took.append(o.get("took_ms", 0.0))
                exact += same_result([x["id"] for x in o["results"]],
                                     [x["score"] for x in o["results"]],
                                     *brute_force(ds, kind, q), tol=1e-4)
            out[kind] = {"round_trip_ms": percentiles(lat), "server_took_ms":
                         percentiles(took), "exact_fraction": exact / len(queries)}
            log(f"  ROS {'fixed' if fixed else 'as is'} {kind}: p50 "
                f"{out[kind]['round_trip_ms']['p50']:.2f} ms (server "
                f"{out[kind]['server_took_ms']['p50']:.2f} ms), exact {exact / len(queries)}")
    finally:
        try:
            os.killpg(srv.pid, signal.SIGINT)
            srv.wait(timeout=60)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait()
        logf.seek(0)
        out["server_log_tail"] = logf.read()[-3000:].splitlines()[-15:]
        logf.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def section_ros_ingest(rates: list[float], duration_s: float, scratch_root: Path,
                       log: Log, python: str | None = None,
                       one_process: bool = False, domain: int | None = None) -> dict[str, Any]:
    """The recorder fed by `memory-replay` of the sample Go2-like bag at each rate.

    The bag (memory_node.sim: camera 12 Hz, lidar 8 Hz, odometry 20 Hz, TF) is generated once
    and cached; the recorder runs alone in its own process with use_sim_time (`one_process`:
    `memory-node --use-sim-time`, recorder and server with their shared TF listener); its CPU
    and RSS are sampled during the replay and until its queue has drained; the counters are its
    own (the "recorder stopped: {...}" line it logs on SIGINT). `python` runs the node of
    another checkout (its interpreter); the replay is always this checkout's.
    """
    if not (REPO_ROOT / "memory_node" / "ros" / "recorder.py").exists() or not (
            REPO_ROOT / "memory_node" / "ros" / "replay.py").exists():
        return {"skipped": "memory_node/ros/recorder.py or replay.py does not exist yet"}
    import psutil

    from bench.common import CACHE_DIR
    from memory_node.session import NodeProcess, isolated_env, load_sample

    sample = load_sample(CACHE_DIR / f"go2_bag_{int(duration_s)}", seed=7,
                         duration_s=duration_s)
    env = isolated_env(int(DOMAIN_ID) + 1 if domain is None else domain)
    out: dict[str, Any] = {"bag_duration_s": duration_s, "rates": {},
                           "node": "memory-node" if one_process else "memory-recorder"}
    for rate in rates:
        mem = scratch_root / f"ros_ingest_{rate}"
        shutil.rmtree(mem, ignore_errors=True)
        logs = scratch_root / f"ros_ingest_{rate}_logs"
        logs.mkdir(parents=True, exist_ok=True)
        node_args = (["-m", "memory_node.ros.main", "--use-sim-time", "--memory-dir",
                      str(mem)] if one_process else
                     ["-m", "memory_node.ros.recorder", "--ros-args", "-p",
                      "use_sim_time:=true", "-p", f"memory_dir:={mem}"])
        rec = NodeProcess(node_args, env, logs / "recorder.log",
                          python=python or sys.executable)
        try:
            rec.wait_for("recording", timeout=120)
            ps = psutil.Process(rec.proc.pid)
            cpu0 = ps.cpu_times()
            rss_peak = 0.0
            t0 = time.perf_counter()
            replay = subprocess.Popen(
                [sys.executable, "-m", "memory_node.ros.replay", str(sample.bag), "--rate",
                 str(rate), "--wait-subscribers", "10"], env=env, stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT, start_new_session=True)
            while replay.poll() is None:
                rss_peak = max(rss_peak, ps.memory_info().rss / 2**20)
                time.sleep(0.2)
            replay_s = time.perf_counter() - t0
            # Drained when the recorder has been idle for 1.5 s (or 60 s passed).
            idle_since, last = None, ps.cpu_times()
            while time.perf_counter() - t0 < replay_s + 60:
                time.sleep(0.5)
                rss_peak = max(rss_peak, ps.memory_info().rss / 2**20)
                cur = ps.cpu_times()
                busy = (cur.user + cur.system - last.user - last.system) / 0.5
                last = cur
                if busy < 0.1:
                    idle_since = idle_since or time.perf_counter()
                    if time.perf_counter() - idle_since >= 1.5:
                        break
                else:
                    idle_since = None
            wall = (idle_since or time.perf_counter()) - t0
            cpu1 = ps.cpu_times()
            cpu = 100 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
        finally:
            t_stop = time.perf_counter()
            code = rec.stop()
            stop_s = time.perf_counter() - t_stop
        stats = None
        for line in rec.lines:
            if "recorder stopped:" in line:
                stats = json.loads(line.split("recorder stopped:", 1)[1].strip())
        if stats is None:
            out["rates"][str(rate)] = {"error": "no final counters in the recorder log"}
            continue
        bag_s = duration_s / rate
        cam = stats["camera"]
        r = {
            "rate": rate, "replay_s": round(replay_s, 2), "processing_s": round(wall, 2),
            "in_bag": {s: sample.truth["topics"][t]["count"] for s, t in TOPICS.items()},
            "received": {s: stats[s]["received"] for s in TOPICS},
            "received_per_s": {s: round(stats[s]["received"] / replay_s, 1) for s in TOPICS},
            "bag_s_at_rate": round(bag_s, 2),
            "kept": {s: stats[s]["kept"] for s in ("camera", "lidar", "odom")},
            "kept_per_s": round(sum(stats[s]["kept"] for s in ("camera", "lidar", "odom"))
                                / bag_s, 2),
            "described_per_s": round(cam["stored"] / wall, 2),
            "embedded_per_s": round(cam["stored"] / wall, 2),
            "dropped": {s: stats[s]["dropped"] for s in ("camera", "lidar", "odom")},
            "failed": {s: stats[s]["failed"] for s in ("camera", "lidar", "odom")},
            "cpu_percent": round(cpu, 1), "rss_peak_mb": round(rss_peak, 1), "counters": stats,
            "stop_s": round(stop_s, 2), "exit_code": code,
        }
        out["rates"][str(rate)] = r
        log(f"  ROS ingest {rate}x: kept {r['kept']}, dropped {r['dropped']}, "
            f"cpu {r['cpu_percent']}%, rss {r['rss_peak_mb']} MB")
        shutil.rmtree(mem, ignore_errors=True)
    return out
