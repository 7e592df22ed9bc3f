"""Load and soak: `memory-node` under many clients while it records, and over a long run.

    python -m bench.soak --load --clients 8 --requests 1000      # concurrency figures
    python -m bench.soak --soak --duration 7200                   # the long run

Load: the package's sample recording replays at 2x (`--rate`) into `memory-node
--use-sim-time` while `--clients` threads, each with its own ROS node, send `--requests` mixed
requests (search 80 %, save 15 %, streams 5 %) as fast as answers come. Reports every request
answered or not, p50/p99 per kind, the error codes, and the recorder's counters (drops).

Soak: the replay loops (`--loop`) for `--duration` seconds with a save every `--save-every`
seconds; the node's RSS and open file handles are sampled every 10 s, and the report gives
their slope after a warm-up, the store's growth beside the rows kept, and every warning or
error line the node printed. Results go to bench/results/soak_{load,soak}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    interrupt,
    percentiles,
    read_json,
    write_json,
    write_marked_section,
)

# The bench's own ROS domain (tests take 1..100, the demo 101..199, ros_bench 230);
# MEMORY_BENCH_DOMAIN_ID overrides it (the test suite passes its own isolated domain).
DOMAIN_ID = os.environ.get("MEMORY_BENCH_DOMAIN_ID", "231")
QUERIES = ["a bright room", "a person at the door", "red chair", "the kitchen", "plants",
           '{"stream": "camera", "near_here": true, "radius": 3, "k": 3}',
           '{"stream": "odom", "after_seconds_ago": 60, "k": 10}',
           '{"stream": "camera", "order_by": "-brightness", "k": 1}',
           '{"stream": "events", "semantic_query": "battery", "k": 3}']
NOTES = ["checked the {} by the window", "Alice asked about the {}", "the {} needs charging",
         "saw a cat near the {}", "moved the {} to the hallway"]
THINGS = ["plant", "lamp", "robot", "box", "cup", "chair", "door", "table", "cable"]


def _bin(name: str) -> str:
    """A console script of the environment this runs in (beside its interpreter)."""
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else name


def _env() -> dict[str, str]:
    env = dict(os.environ, ROS_DOMAIN_ID=DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               PYTHONUNBUFFERED="1")
    env.pop("ROS_STATIC_PEERS", None)
    return env


class Proc:
    """A child process with its output kept (and scanned for warnings and errors)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self.out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT,
                                      env=_env(), start_new_session=True)

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            if regex.search(self.log.read_text(errors="replace")):
                return
            if self.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{pattern!r} never appeared; output:\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 15.0) -> float:
        took = interrupt(self.popen, timeout)
        self.out.close()
        return took

    def problems(self) -> list[str]:
        return [ln for ln in self.log.read_text(errors="replace").splitlines()
                if re.search(r"\[(WARN|ERROR|FATAL)\]|Traceback|rosout", ln)]


def sample_bag(work: Path) -> Path:
    bag = work / "sample" / "flat_bag"
    if not bag.exists():
        subprocess.run([_bin("memory-sample-bag"), str(work / "sample")], check=True,
                       env=_env(), stdout=subprocess.DEVNULL)
    return bag


class StatsListener:
    """The recorder's latest /memory/recorder_stats."""

    def __init__(self, ctx: Any) -> None:
        import rclpy
        from std_msgs.msg import String

        self.latest: dict[str, Any] | None = None
        self.node = rclpy.create_node("bench_soak_stats", context=ctx)
        self.node.create_subscription(String, "/memory/recorder_stats", self._on, 10)
        from rclpy.executors import SingleThreadedExecutor

        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _on(self, msg: Any) -> None:
        self.latest = json.loads(msg.data)

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - the context shut down
            pass


def _client(idx: int, n: int, seed: int, out_path: Path, timeout: float) -> None:
    """One client process: its own rclpy, one node, `n` requests one after another."""
    import rclpy

    from memory_node.ros.cli import ServiceCaller

    rng = random.Random(seed + idx)
    rclpy.init()
    caller = ServiceCaller(f"bench_soak_client_{idx}")
    out = []
    try:
        for i in range(n):
            r = rng.random()
            if r < 0.80:
                verb, payload = "search", rng.choice(QUERIES)
            elif r < 0.95:
                verb = "save"
                payload = rng.choice(NOTES).format(rng.choice(THINGS)) + f" (c{idx} #{i})"
            else:
                verb, payload = "streams", None
            start = time.perf_counter()
            answer = json.loads(caller.call(verb, payload, timeout))
            ms = (time.perf_counter() - start) * 1000
            code = "ok" if answer.get("ok") else answer["error"]["code"]
            message = "" if answer.get("ok") else answer["error"]["message"]
            out.append({"verb": verb, "ms": ms, "code": code, "message": message[:120],
                        "unanswered": code == "unavailable" and "did not answer" in message})
    finally:
        caller.close()
        rclpy.try_shutdown()
        out_path.write_text(json.dumps(out))


def _client_process(idx: int, n: int, seed: int, out_path: Path) -> subprocess.Popen:
    """Each client in a process of its own, as separate agents or tools would be (several
    rclpy executors spinning in threads of one process lose responses of their own)."""
    code = ("import sys; from pathlib import Path; from bench.soak import _client; "
            f"_client({idx}, {n}, {seed}, Path({str(out_path)!r}), 30.0)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_load(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import rclpy

    bag = sample_bag(work)
    node = Proc([_bin("memory-node"), "--use-sim-time", "--memory-dir", str(work / "mem_load")],
                work / "load_node.log")
    ctx = rclpy.Context()
    os.environ.update(_env())
    rclpy.init(context=ctx)
    stats = StatsListener(ctx)
    replay = None
    try:
        node.wait_for(r"active: /memory/search", 180)
        replay = Proc([_bin("memory-replay"), str(bag), "--rate", str(args.rate)],
                      work / "load_replay.log")
        time.sleep(3.0)  # the replay's clock is running before the first request
        start = time.monotonic()
        procs = [_client_process(i, args.requests, args.seed, work / f"client_{i}.json")
                 for i in range(args.clients)]
        for proc in procs:
            proc.wait()
        took = time.monotonic() - start
        results: list[dict[str, Any]] = []
        for i in range(args.clients):
            results += json.loads((work / f"client_{i}.json").read_text())
        replay.popen.wait(600)
        time.sleep(2 * 1.0 + 5.0)  # the recorder's last stats
        per_kind = {}
        for verb in ("search", "save", "streams"):
            ms = [r["ms"] for r in results if r["verb"] == verb]
            codes: dict[str, int] = {}
            for r in results:
                if r["verb"] == verb:
                    codes[r["code"]] = codes.get(r["code"], 0) + 1
            per_kind[verb] = {"n": len(ms), **percentiles(ms), "codes": codes,
                              "not_ok": sorted({r["message"] for r in results
                                                if r["verb"] == verb and r["code"] != "ok"})[:5]}
        rec = stats.latest or {}
        return {
            "clients": args.clients, "requests_per_client": args.requests, "rate": args.rate,
            "total": len(results), "unanswered": sum(r["unanswered"] for r in results),
            "took_s": round(took, 1), "per_kind": per_kind,
            "recorder": {s: {k: rec.get(s, {}).get(k) for k in ("received", "kept", "dropped",
                                                                 "stored", "failed")}
                         for s in ("camera", "lidar", "odom")},
            "node_problems": node.problems(),
        }
    finally:
        if replay is not None:
            replay.stop()
        node.stop()
        rclpy.try_shutdown(context=ctx)


def _slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t seconds, value) in value per hour."""
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return 0.0 if den == 0 else sum((t - mt) * (v - mv) for t, v in samples) / den * 3600


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import psutil
    import rclpy

    from memory_node.ros.cli import ServiceCaller

    bag = sample_bag(work)
    mem = work / "mem_soak"
    node = Proc([_bin("memory-node"), "--use-sim-time", "--memory-dir", str(mem)],
                work / "soak_node.log")
    ctx = rclpy.Context()
    os.environ.update(_env())
    rclpy.init(context=ctx)
    stats = StatsListener(ctx)
    caller = ServiceCaller("bench_soak_saver", context=ctx)
    replay = None
    samples: list[dict[str, float]] = []
    saves = {"ok": 0, "failed": 0}
    failures: list[str] = []
    try:
        node.wait_for(r"active: /memory/search", 180)
        proc = psutil.Process(node.popen.pid)
        replay = Proc([_bin("memory-replay"), str(bag), "--rate", str(args.rate), "--loop"],
                      work / "soak_replay.log")
        # Saves need the replay's /clock (use_sim_time): until it runs they rightly answer
        # unavailable ("no /clock yet"), which is start-up, not the soak.
        deadline = time.monotonic() + 120
        while not json.loads(caller.call("save", "soak starts", 30.0)).get("ok"):
            if time.monotonic() > deadline:
                raise RuntimeError("no save succeeded within 120 s of starting the replay")
        start = time.monotonic()
        next_sample = start
        i = 0
        while time.monotonic() - start < args.duration:
            note = random.Random(i).choice(NOTES).format(THINGS[i % len(THINGS)]) + f" #{i}"
            answer = json.loads(caller.call("save", note, 30.0))
            saves["ok" if answer.get("ok") else "failed"] += 1
            if not answer.get("ok"):
                failures.append(answer["error"]["message"][:200])
            i += 1
            if time.monotonic() >= next_sample:
                rec = stats.latest or {}
                samples.append({"t": round(time.monotonic() - start, 1),
                                "rss_mb": proc.memory_info().rss / 2**20,
                                "fds": proc.num_fds(), "store_mb": _dir_bytes(mem) / 2**20,
                                "stored": sum((rec.get(s) or {}).get("stored", 0)
                                              for s in ("camera", "lidar", "odom")),
                                "dropped": sum((rec.get(s) or {}).get("dropped", 0)
                                               for s in ("camera", "lidar", "odom"))})
                next_sample += 10.0
            time.sleep(args.save_every)
        warm = [s for s in samples if s["t"] >= args.warmup]
        streams = json.loads(caller.call("streams", None, 30.0))
        rows = sum(s["count"] for s in streams.get("streams", []))
        return {
            "duration_s": args.duration, "rate": args.rate, "saves": saves,
            "save_failures": failures[:20],
            "samples": len(samples), "warmup_s": args.warmup,
            "rss_mb": {"first": round(warm[0]["rss_mb"], 1) if warm else None,
                       "last": round(warm[-1]["rss_mb"], 1) if warm else None,
                       "slope_mb_per_h": round(_slope_per_hour(
                           [(s["t"], s["rss_mb"]) for s in warm]), 2)},
            "fds": {"min": min((s["fds"] for s in warm), default=None),
                    "max": max((s["fds"] for s in warm), default=None),
                    "slope_per_h": round(_slope_per_hour([(s["t"], s["fds"]) for s in warm]),
                                         2)},
            "store_mb": round(_dir_bytes(mem) / 2**20, 1), "rows": rows,
            "store_kb_per_row": round(_dir_bytes(mem) / 1024 / max(rows, 1), 2),
            "recorder_dropped": samples[-1]["dropped"] if samples else None,
            "node_problems": node.problems(),
            "series": samples,
        }
    finally:
        caller.close()
        if replay is not None:
            replay.stop()
        stop_s = node.stop()
        rclpy.try_shutdown(context=ctx)
        print(f"memory-node stopped in {stop_s:.1f} s", file=sys.stderr)


def _rss_per_row(soak: dict[str, Any]) -> str:
    """RSS growth after warm-up per row stored meanwhile: memory that tracks what is kept
    (vectors in the index) rather than a leak shows as a few kB per row."""
    warm = [s for s in soak.get("series", []) if s["t"] >= soak["warmup_s"]]
    if len(warm) < 2 or warm[-1]["stored"] <= warm[0]["stored"]:
        return "n/a"
    rows = warm[-1]["stored"] - warm[0]["stored"]
    return f"{(warm[-1]['rss_mb'] - warm[0]['rss_mb']) * 1024 / rows:.1f} kB ({rows} rows)"


def render(load: dict[str, Any] | None, soak: dict[str, Any] | None) -> str:
    """The report's load and soak section (BENCHMARKS.md, between soak markers)."""
    L = ["## Load and soak (memory-node while it records)", ""]
    if load:
        L += [f"Load: `python -m bench.soak --load --clients {load['clients']} --requests "
              f"{load['requests_per_client']}` — {load['clients']} client processes, each "
              f"{load['requests_per_client']} requests one after another (search 80 %, save "
              f"15 %, streams 5 %), while the sample recording replays at {load['rate']}x into "
              f"`memory-node --use-sim-time`. {load['total']:,} requests in {load['took_s']} s: "
              f"**{load['unanswered']} unanswered**.", "",
              "| kind | n | p50 ms | p99 ms | answers |", "|---|---|---|---|---|"]
        for verb, k in load["per_kind"].items():
            codes = ", ".join(f"{c} {n}" for c, n in k["codes"].items())
            L.append(f"| {verb} | {k['n']} | {k['p50']:.1f} | {k['p99']:.1f} | {codes} |")
        rec = load["recorder"]
        L += ["", "Recorder meanwhile: " + "; ".join(
            f"{s} received {c['received']}, kept {c['kept']}, dropped {c['dropped']}"
            for s, c in rec.items()) + "."]
        reasons = sorted({re.sub(r"\d+(\.\d+)?", "N", m)[:100]
                          for k in load["per_kind"].values() for m in k.get("not_ok", [])})
        L += [f"Answers other than ok, by reason: {'; '.join(reasons)}." if reasons else "", ""]
    if soak:
        L += [f"Soak: `python -m bench.soak --soak --duration {soak['duration_s']:.0f}` — the "
              f"replay loops at {soak['rate']}x with a save every few seconds; samples every "
              f"10 s, slopes after {soak['warmup_s']:.0f} s of warm-up. Saves "
              f"{soak['saves']['ok']} answered ok, {soak['saves']['failed']} not; RSS "
              f"{soak['rss_mb']['first']} → {soak['rss_mb']['last']} MB (slope "
              f"{soak['rss_mb']['slope_mb_per_h']} MB/h); open files {soak['fds']['min']}–"
              f"{soak['fds']['max']} (slope {soak['fds']['slope_per_h']}/h); store "
              f"{soak['store_mb']} MB for {soak['rows']:,} rows ({soak['store_kb_per_row']} "
              f"kB/row); recorder drops {soak['recorder_dropped']}; error lines "
              f"{sum('[WARN]' not in ln for ln in soak['node_problems'])}. RSS per row kept "
              f"over the run: {_rss_per_row(soak)}.", ""]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", action="store_true", help="the concurrency run")
    p.add_argument("--soak", action="store_true", help="the long run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=1000, help="per client")
    p.add_argument("--rate", type=float, default=2.0, help="replay rate")
    p.add_argument("--duration", type=float, default=7200.0, help="soak seconds")
    p.add_argument("--save-every", type=float, default=3.0, help="soak: seconds between saves")
    p.add_argument("--warmup", type=float, default=120.0, help="soak: seconds left out of slopes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: temp)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    args = p.parse_args(argv)
    if not (args.load or args.soak):
        p.error("say --load, --soak or both")
    work = args.work or Path(tempfile.mkdtemp(prefix="memory_node-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    for name, run in (("load", run_load), ("soak", run_soak)):
        if getattr(args, name):
            result = run(args, work)
            write_json(args.out / f"soak_{name}.json", result)
            shown = {k: v for k, v in result.items() if k != "series"}
            shown["node_problems"] = result["node_problems"][:20]
            print(json.dumps(shown, indent=1))
    if args.out == DEFAULT_RESULTS:
        found = {n: read_json(args.out / f"soak_{n}.json")
                 for n in ("load", "soak") if (args.out / f"soak_{n}.json").exists()}
        write_marked_section(REPO_ROOT / "BENCHMARKS.md", "soak",
                             render(found.get("load"), found.get("soak")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
