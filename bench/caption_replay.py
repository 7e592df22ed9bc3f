"""Keyframes kept with `describer: vlm` against a slow, rate-limiting endpoint, next to the
default describer: the recorder (own process, use_sim_time) fed by `memory-replay` of the
sample Go2-like bag, and a local OpenAI-compatible stand-in that answers each caption request
after `--latency` seconds and refuses every fifth with HTTP 429.

Captions are off the recording path, so the camera keyframes kept should equal the default
describer's, with none dropped or failed; the stand-in's log gives the requests per minute
(the budget is `caption_max_per_min`).

    python -m bench.caption_replay [--rate 2] [--duration 150] [--latency 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, CACHE_DIR
from memory_node.sim.chat_endpoint import Answer, ChatEndpoint, assistant, completion, error


class _StandIn(ChatEndpoint):
    """Answers after `latency_s`, and refuses every fifth request with HTTP 429."""

    def __init__(self, latency_s: float):
        self.latency_s = latency_s
        self.times: list[float] = []
        super().__init__()

    def answer(self, body: dict[str, Any], request: Any = None) -> Answer:
        self.times.append(time.time())
        n = len(self.times)
        time.sleep(self.latency_s)
        if n % 5 == 0:
            return 429, error("rate limited")
        return 200, completion(assistant(f"a room, {n}"))

    def peak_per_min(self) -> int:
        return max((sum(1 for u in self.times if t <= u < t + 60) for t in self.times),
                   default=0)


def _run(describer: str, sample: Any, rate: float, scratch: Path, domain: int,
         latency_s: float, max_per_min: float, drain_s: float) -> dict[str, Any]:
    from memory_node.session import NodeProcess, isolated_env

    env = isolated_env(domain)
    standin = _StandIn(latency_s)
    standin.start()
    env.update({"VLM_BASE_URL": standin.base_url, "VLM_API_KEY": "sk-bench-standin",
                "VLM_MODEL": "standin"})
    mem = scratch / f"mem_{describer}"
    shutil.rmtree(mem, ignore_errors=True)
    rec = NodeProcess(["-m", "memory_node.ros.recorder", "--ros-args", "-p",
                       "use_sim_time:=true", "-p", f"memory_dir:={mem}", "-p",
                       f"describer:={describer}", "-p", f"caption_max_per_min:={max_per_min}"],
                      env, scratch / f"recorder_{describer}.log", python=sys.executable)
    try:
        rec.wait_for("recording", timeout=120)
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "memory_node.ros.replay", str(sample.bag),
                        "--rate", str(rate), "--wait-subscribers", "10"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=False)
        replay_s = time.time() - t0
        time.sleep(drain_s)
    finally:
        rec.stop()
        standin.stop()
    stats = next(json.loads(line.split("recorder stopped:", 1)[1].strip())
                 for line in rec.lines if "recorder stopped:" in line)
    db = sqlite3.connect(mem / "memory.db")
    tags = dict(db.execute(
        "SELECT coalesce(json_extract(tags, '$.caption'), 'not admitted'), count(*) FROM "
        "observations WHERE stream='camera' GROUP BY 1").fetchall())
    db.close()
    cam = stats["camera"]
    return {"describer": describer, "replay_s": round(replay_s, 1),
            "camera_kept": cam["kept"], "camera_dropped": cam["dropped"],
            "camera_failed": cam["failed"], "caption_states": tags,
            "requests": len(standin.times), "peak_requests_per_min": standin.peak_per_min(),
            "requests_during_replay": sum(1 for t in standin.times if t <= t0 + replay_s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.caption_replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=150.0)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--max-per-min", type=float, default=4.0)
    parser.add_argument("--drain", type=float, default=20.0, help="seconds after the replay")
    parser.add_argument("--domain", type=int, default=232)
    parser.add_argument("--describers", default="opencv,vlm",
                        help="the runs, in order (comma-separated)")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "caption_replay.json")
    args = parser.parse_args(argv)
    from memory_node.session import load_sample

    sample = load_sample(CACHE_DIR / f"go2_bag_{int(args.duration)}", seed=7,
                         duration_s=args.duration)
    out: dict[str, Any] = {"rate": args.rate, "bag_s": args.duration, "latency_s": args.latency,
                           "caption_max_per_min": args.max_per_min, "runs": []}
    with tempfile.TemporaryDirectory() as d:
        for describer in args.describers.split(","):
            res = _run(describer, sample, args.rate, Path(d), args.domain, args.latency,
                       args.max_per_min, args.drain)
            print(json.dumps(res), flush=True)
            out["runs"].append(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
