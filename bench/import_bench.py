"""memory-import throughput: bag seconds imported per wall second (x real time).

    python -m bench.import_bench --sample               # the package's sample recording
    python -m bench.import_bench --go2 [--seconds 120]  # Go2 rates, with a profile
    python -m bench.import_bench --long [--hours 8]     # a long recording, then queries

- sample: `memory-sample-bag` (seed 7, 150 s: 640x480 raw images at 12 Hz, clouds at 8 Hz,
  odometry and /tf at 20 Hz) imported into a fresh store with config/memory.yaml.
- go2: a generated recording at a Go2's rates — compressed 1280x720 JPEG camera at 15 Hz, a
  world-frame (odom) cloud of ~6k points at 7 Hz, odometry at 30 Hz, /tf at 100 Hz (odom ->
  base_link at 50 Hz and twelve leg joints at 50 Hz) — walking a 12 m x 8 m loop at 0.8 m/s;
  the camera shows 24 views of the simulated flat, cycled. Imported with go2-like settings,
  then again under cProfile (not timed): where the time goes.
- long: the same rates for `--hours` with a 320x240 camera (generation time: a full-size
  camera is no different per frame for the importer's gate, only for the kept frames), then
  the store's disk, the import's peak RSS and the query p50s (combined, semantic-only,
  visits) of the result.

Each run writes bench/results/import_<kind>.json and its part of the "memory-import" section of
BENCHMARKS.md. Wall times are on whatever machine runs this; `--cpus` (default 2) pins the
import to that many CPUs where the OS allows, as the figures in BENCHMARKS.md were measured.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import shutil
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
    machine_info,
    peak_rss_mb,
    percentiles,
    read_json,
    write_json,
    write_marked_section,
)

EPOCH_NS = 1_764_460_800 * 1_000_000_000
GO2_CONFIG = """\
/**:
  ros__parameters:
    world_frame: map
    base_frame: base_link
    odom_topic: /odom
memory_recorder:
  ros__parameters:
    use_compressed: true
    compressed_topic: /camera/image_raw/compressed
    lidar_topic: /point_cloud2
    lidar_voxel: 0.15
"""
JOINTS = [f"{leg}_{part}" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")]


def _pin(cpus: int) -> None:
    if cpus > 0 and hasattr(os, "sched_setaffinity"):
        avail = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, avail[:cpus])


def _flat_views(n: int, width: int, height: int) -> list[np.ndarray]:
    """`n` BGR views of the simulated flat at `width` x `height`, spread over the sample's
    tour (a camera's images, not noise: noise is the Haar face cascade's worst case)."""
    from memory_node.sim.floorplan import build_flat
    from memory_node.sim.render import CameraModel, Renderer
    from memory_node.sim.trajectory import Trajectory, build_tour

    plan = build_flat()
    f = width / 2.0  # the sample camera's 90 degree field of view
    camera = CameraModel(width=width, height=height, fx=f, fy=f, cx=width / 2.0,
                         cy=height * 150.0 / 240.0, z=0.40)
    renderer, tour = Renderer(plan, camera), Trajectory(build_tour(), 600.0)
    views = []
    for i, (x, y, yaw) in enumerate(tour.pose(np.linspace(0.0, 600.0, n, endpoint=False))):
        rgb, _ = renderer.render(float(x), float(y), float(yaw), plan.person if i % 4 == 0
                                 else None)
        views.append(np.ascontiguousarray(rgb[:, :, ::-1]))
    return views


def write_go2_bag(path: Path, seconds: float, *, width: int = 1280, height: int = 720,
                  seed: int = 3) -> dict[str, Any]:
    """A Go2-rate recording (see the module docstring); returns its message counts."""
    import cv2
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_KILTED)
    T = ts.types
    rng = np.random.default_rng(seed)

    def header(ns: int, frame: str) -> Any:
        return T["std_msgs/msg/Header"](T["builtin_interfaces/msg/Time"](
            ns // 1_000_000_000, ns % 1_000_000_000), frame)

    def tfs(ns: int, parent: str, child: str, xyz: tuple[float, ...], yaw: float) -> Any:
        return T["geometry_msgs/msg/TransformStamped"](header(ns, parent), child,
                                                       T["geometry_msgs/msg/Transform"](
            T["geometry_msgs/msg/Vector3"](*map(float, xyz)),
            T["geometry_msgs/msg/Quaternion"](0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))))

    def pose(t: float) -> tuple[float, float, float]:
        """A 12 m x 8 m rounded loop at ~0.8 m/s."""
        a = t * 0.8 / 31.4 * 2 * math.pi
        x, y = 6.0 * math.cos(a), 4.0 * math.sin(a)
        dx, dy = -6.0 * math.sin(a), 4.0 * math.cos(a)
        return x, y, math.atan2(dy, dx)

    # Camera frames: 24 views of the simulated flat (rooms, furniture, the person in some)
    # rendered at the camera's size along the sample's tour, JPEG-encoded once and cycled.
    frames = [np.frombuffer(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])[1],
                            np.uint8) for img in _flat_views(24, width, height)]
    world = (rng.random((60_000, 3)) * [20.0, 14.0, 2.0] - [10.0, 7.0, 0.0]).astype("<f4")
    f32 = T["sensor_msgs/msg/PointField"].FLOAT32
    fields = [T["sensor_msgs/msg/PointField"](n, 4 * i, f32, 1) for i, n in enumerate("xyz")]
    writer = Writer(path, version=Writer.VERSION_LATEST, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    conns = {t: writer.add_connection(t, m, typestore=ts) for t, m in (
        ("/tf", "tf2_msgs/msg/TFMessage"), ("/tf_static", "tf2_msgs/msg/TFMessage"),
        ("/odom", "nav_msgs/msg/Odometry"), ("/point_cloud2", "sensor_msgs/msg/PointCloud2"),
        ("/camera/image_raw/compressed", "sensor_msgs/msg/CompressedImage"))}
    counts = dict.fromkeys(conns, 0)
    TF = T["tf2_msgs/msg/TFMessage"]

    def write(topic: str, ns: int, msg: Any) -> None:
        writer.write(conns[topic], ns, ts.serialize_cdr(msg, msg.__msgtype__))
        counts[topic] += 1

    write("/tf_static", EPOCH_NS, TF([tfs(EPOCH_NS, "map", "odom", (0, 0, 0), 0.0),
                                      tfs(EPOCH_NS, "base_link", "front_camera",
                                          (0.285, 0, 0.05), 0.0)]))
    # Events: (t, kind) at each stream's rate, merged in time order.
    rates = {"tf_base": 50.0, "tf_joints": 50.0, "odom": 30.0, "cloud": 7.0, "camera": 15.0}
    phase = {"tf_base": 0.0, "tf_joints": 0.01, "odom": 0.005, "cloud": 0.02, "camera": 0.03}
    n_of = {k: int(seconds * r) for k, r in rates.items()}
    idx = dict.fromkeys(rates, 0)
    while True:
        nxt = min((phase[k] + idx[k] / rates[k], k) for k in rates if idx[k] < n_of[k]) \
            if any(idx[k] < n_of[k] for k in rates) else None
        if nxt is None:
            break
        t, kind = nxt
        i = idx[kind]
        idx[kind] += 1
        ns = EPOCH_NS + int(round(t * 1e9))
        x, y, yaw = pose(t)
        if kind == "tf_base":
            write("/tf", ns, TF([tfs(ns, "odom", "base_link", (x, y, 0.3), yaw)]))
        elif kind == "tf_joints":
            write("/tf", ns, TF([tfs(ns, "base_link", j, (0.1, 0.05, -0.1), 0.1 * math.sin(t))
                                 for j in JOINTS]))
        elif kind == "odom":
            q = T["geometry_msgs/msg/Quaternion"](0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2))
            msg = T["nav_msgs/msg/Odometry"](
                header(ns, "odom"), "base_link",
                T["geometry_msgs/msg/PoseWithCovariance"](
                    T["geometry_msgs/msg/Pose"](T["geometry_msgs/msg/Point"](x, y, 0.3), q),
                    np.zeros(36)),
                T["geometry_msgs/msg/TwistWithCovariance"](
                    T["geometry_msgs/msg/Twist"](T["geometry_msgs/msg/Vector3"](0.8, 0.0, 0.0),
                                                 T["geometry_msgs/msg/Vector3"](0.0, 0.0, 0.0)),
                    np.zeros(36)))
            write("/odom", ns, msg)
        elif kind == "cloud":
            near = world[np.hypot(world[:, 0] - x, world[:, 1] - y) < 4.0]
            data = np.ascontiguousarray(near).view(np.uint8).reshape(-1)
            write("/point_cloud2", ns, T["sensor_msgs/msg/PointCloud2"](
                header(ns, "odom"), 1, len(near), fields, False, 12, 12 * len(near), data, True))
        else:
            write("/camera/image_raw/compressed", ns, T["sensor_msgs/msg/CompressedImage"](
                header(ns, "front_camera"), "jpeg", frames[i % len(frames)]))
    writer.close()
    return {"seconds": seconds, "messages": counts, "camera": f"{width}x{height} JPEG"}


def _cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_import(bags: list[Path], memory: Path, config: Path | None,
               profile: bool = False) -> tuple[dict[str, Any], str]:
    """Import in this process (as memory-import does); the outcome and, with `profile`, the
    top of a cProfile."""
    from memory_node.core import param_file
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.recorder import ManualClock
    from memory_node.ros.bag_import import Importer, available_cpus, make_plan

    settings, cfg, _ = param_file.load(config, {"memory_dir": str(memory)})
    plan = make_plan(bags, settings, topics=None)
    t_open = time.perf_counter()
    engine = MemoryEngine(cfg, clock=ManualClock(plan.window[0] / 1e9))
    open_s = time.perf_counter() - t_open
    prof = cProfile.Profile() if profile else None
    store_prof = cProfile.Profile() if profile else None
    try:
        importer = Importer(plan, settings, engine, threads=available_cpus())
        if store_prof is not None:  # the storing thread's own profile
            store = importer.policy.store

            def profiled_store(jobs: Any) -> None:
                store_prof.runcall(store, jobs)

            importer.policy.store = profiled_store  # type: ignore[method-assign]
        if prof is not None:
            prof.enable()
        cpu0, main0 = _cpu_s(), time.thread_time()
        t0 = time.perf_counter()
        outcome = importer.run()
        wall = time.perf_counter() - t0
        main_cpu, cpu = time.thread_time() - main0, _cpu_s() - cpu0
        if prof is not None:
            prof.disable()
    finally:
        engine.close()
    # On a shared machine the wall time says more about the neighbours than the import: the
    # CPU seconds do not. The reader's thread is the critical path; the rest (storing) runs
    # beside it, so on two idle cores the import takes about max(main, all / 2).
    idle_wall = max(main_cpu, cpu / 2)
    result = outcome.as_dict() | {
        "open_s": round(open_s, 2), "wall_s": round(wall, 2),
        "speed": round(outcome.bag_s / wall, 1), "cpu_s": round(cpu, 2),
        "main_thread_cpu_s": round(main_cpu, 2), "idle_2core_wall_s": round(idle_wall, 2),
        "idle_2core_speed": round(outcome.bag_s / idle_wall, 1), "summary": outcome.summary()}
    text = ""
    if prof is not None and store_prof is not None:
        for name, p in (("reader", prof), ("store", store_prof)):
            buf = io.StringIO()
            pstats.Stats(p, stream=buf).sort_stats("cumulative").print_stats(22)
            text += f"#{name}\n" + buf.getvalue()
    return result, text


def _profile_table(text: str) -> str:
    """The cProfile listings (the reader's thread, the storing thread) as rows: thread,
    cumulative seconds, calls, function (paths from the package or site-packages on)."""
    rows, thread = [], ""
    for line in text.splitlines():
        if line.startswith("#"):
            thread = line[1:]
            continue
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[0].replace("/", "").isdigit():
            try:
                float(parts[3])
            except ValueError:
                continue
            where = parts[5]
            for mark in ("site-packages/", "/memory_node/", "/lib/python3"):
                if mark in where:
                    where = where[where.index(mark):].lstrip("/")
                    break
            rows.append(f"| {thread} | {parts[3]} | {parts[0]} | `{where}` |")
    return "\n".join(["| thread | cumulative s | calls | function |", "|---|---|---|---|",
                      *rows])


def bench_sample(work: Path) -> dict[str, Any]:
    from memory_node.session import load_sample

    sample = load_sample(work / "sample", seed=7)
    result = _median_of(RUNS, lambda i: run_import([sample.bag], work / f"memory{i}", None)[0])
    return result | {"bag": "memory-sample-bag (seed 7, 150 s)"}


RUNS = 3


def _median_of(n: int, run: Any) -> dict[str, Any]:
    """The run with the median wall time of `n` imports into fresh stores (a shared
    machine's neighbours move single runs by 20 %), with every run's wall time."""
    results = sorted((run(i) for i in range(n)), key=lambda r: r["wall_s"])
    return results[n // 2] | {"runs_wall_s": [r["wall_s"] for r in results]}


def bench_go2(work: Path, seconds: float) -> dict[str, Any]:
    bag = work / "go2_bag"
    t0 = time.perf_counter()
    info = write_go2_bag(bag, seconds)
    gen_s = time.perf_counter() - t0
    config = work / "go2_bench.yaml"
    config.write_text(GO2_CONFIG)
    result = _median_of(RUNS, lambda i: run_import([bag], work / f"memory{i}", config)[0])
    # The profile from another import (cProfile slows the threads it watches: not timed).
    _, text = run_import([bag], work / "memory_profiled", config, profile=True)
    return result | {"bag": info, "generate_s": round(gen_s, 1), "profile": text}


def bench_long(work: Path, hours: float) -> dict[str, Any]:
    bag = work / "long_bag"
    t0 = time.perf_counter()
    info = write_go2_bag(bag, hours * 3600.0, width=320, height=240)
    gen_s = time.perf_counter() - t0
    config = work / "go2_bench.yaml"
    config.write_text(GO2_CONFIG)
    memory = work / "memory"
    result, _ = run_import([bag], memory, config)
    result |= {"bag": info, "generate_s": round(gen_s, 1), "bag_mb": round(dir_size_mb(bag), 1),
               "store_mb": round(dir_size_mb(memory), 1), "peak_rss_mb": round(peak_rss_mb(), 1)}
    result["queries"] = _query_p50s(memory)
    return result


def _query_p50s(memory: Path, n: int = 50) -> dict[str, Any]:
    """p50 of combined (semantic + place + time), semantic-only and visits queries."""
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    rng = np.random.default_rng(5)
    words = ["a bright room", "someone at the door", "red chair", "dark corridor", "window"]
    with MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(memory)})) as engine:
        last = engine.store.newest_t(["camera", "lidar", "odom"]) or 0.0
        engine.clock = lambda: last
        kinds = {
            "combined": lambda i: {"stream": "camera", "semantic_query": words[i % 5],
                                   "near_x": float(rng.uniform(-6, 6)),
                                   "near_y": float(rng.uniform(-4, 4)), "radius": 2.0,
                                   "after_seconds_ago": 3600, "k": 5},
            "semantic_only": lambda i: {"semantic_query": words[i % 5], "k": 5},
            "visits": lambda i: {"visits": True, "near_x": float(rng.uniform(-6, 6)),
                                 "near_y": float(rng.uniform(-4, 4)), "radius": 1.5},
        }
        out = {}
        for kind, make in kinds.items():
            times, ok = [], 0
            for i in range(n):
                t0 = time.perf_counter()
                answer = engine.ask_search(json.dumps(make(i))).model_dump()
                times.append((time.perf_counter() - t0) * 1000)
                ok += bool(answer.get("ok"))
            out[kind] = {"p50_ms": round(percentiles(times)["p50"], 2), "ok": ok, "n": n}
        out["rows"] = engine.store.count()
    return out


def report(results: dict[str, dict[str, Any]]) -> str:
    lines = ["## memory-import: bags to memory, offline (x real time)", "",
             "Bag seconds imported per wall second, in one process, into a fresh store "
             "(the time to open the store and load the models is given apart). Command: "
             "`python -m bench.import_bench --sample --go2 --seconds S --long --hours H` "
             "(the lengths measured are the table's bag seconds).", "",
             "| recording | bag s | messages | wall s | x real time | CPU s (all / reader "
             "thread) | x real time, 2 idle cores (from CPU s) | rows camera / lidar / odom | "
             "keyframe ratio camera |", "|---|---|---|---|---|---|---|---|---|"]
    names = {"sample": "sample (150 s, raw 640x480 at 12 Hz)",
             "go2": "Go2 rates (JPEG 1280x720 15 Hz, cloud 7 Hz, odom 30 Hz, /tf 100 Hz)",
             "long": "long, Go2 rates, 320x240 camera"}
    for kind in ("sample", "go2", "long"):
        r = results.get(kind)
        if r is None:
            continue
        s = r["streams"]
        rows = " / ".join(str(s[k]["stored"] + r["resumed"].get(k, 0)) if k in s else "-"
                          for k in ("camera", "lidar", "odom"))
        cam = s.get("camera", {})
        ratio = f"{cam['kept'] / cam['received']:.1%}" if cam.get("received") else "-"
        lines.append(f"| {names[kind]} | {r['bag_s']:.0f} | {r['messages']} | "
                     f"{r['wall_s']:.1f} | **{r['speed']:.1f}x** | {r['cpu_s']:.1f} / "
                     f"{r['main_thread_cpu_s']:.1f} | {r['idle_2core_speed']:.1f}x | {rows} | "
                     f"{ratio} |")
    for kind in ("sample", "go2", "long"):
        r = results.get(kind)
        if r is not None:
            m = r.get("machine", {})
            lines.append(f"\n{kind}: measured {r.get('when', '?')}, import pinned to "
                         f"{r.get('cpus_used', '?')} of {m.get('cpus', '?')} CPUs "
                         f"({m.get('cpu', '?')}), load average {m.get('loadavg', '?')}; "
                         f"{r['summary']}")
        if r is not None and r.get("note"):
            lines.append(f"\n{kind}, note: {r['note']}")
    # The import itself keeps its CPUs busy: a load average above them plus one is others'.
    loaded = {k: r.get("machine", {}).get("loadavg", [0.0])[0] for k, r in results.items()}
    loaded = {k: v for k, v in loaded.items()
              if v > (results[k].get("cpus_used") or 2) + 1.0}
    cpus = next(iter(results.values()), {}).get("machine", {}).get("cpus", "?")
    if loaded:
        lines += ["", f"Provisional for {', '.join(loaded)}: measured while other work shared "
                  f"the machine (load average up to {max(loaded.values()):.0f} on {cpus} CPUs "
                  "as the run ended), so the wall times may be longer than an idle "
                  "machine's. The column \"2 idle cores\" is what the import's own CPU "
                  "seconds allow there: the reader's thread, the describing threads and the "
                  "storing thread share the cores, so the wall time is about max(reader "
                  "thread, all threads / 2). Re-measure on an idle machine with the commands "
                  "above."]
    long = results.get("long")
    if long is not None:
        q = long["queries"]
        lines += ["", "| long recording | wall s | rows | disk MB (bag / store) | peak RSS MB |"
                  " p50 combined ms | p50 semantic-only ms | p50 visits ms |",
                  "|---|---|---|---|---|---|---|---|",
                  f"| {long['bag_s'] / 3600:.2f} h | {long['wall_s']:.0f} | {q['rows']} | "
                  f"{long['bag_mb']:.0f} / {long['store_mb']:.0f} | {long['peak_rss_mb']:.0f} | "
                  f"{q['combined']['p50_ms']} | {q['semantic_only']['p50_ms']} | "
                  f"{q['visits']['p50_ms']} |"]
        hours = long["bag_s"] / 3600
        if hours < 7.9:
            lines += ["", f"Not measured: the 8-hour recording (`--long --hours 8`, a ~35 GB "
                      f"bag at these rates). Measured: {hours:.2f} h; import time and store "
                      "size grow linearly with the recording (the gate's work per message and "
                      "the rows per metre walked are constant), the query p50s with the rows "
                      "(see the query sections above for 10k-1M rows)."]
    go2 = results.get("go2")
    if go2 is not None and go2.get("profile"):
        lines += ["", "Where the time goes (Go2 rates; cProfile, cumulative; the reader's "
                  "thread and the storing thread: decoding, describing and encoding kept camera "
                  "frames runs on the describing threads, beside both, and is not in the "
                  "table):", "",
                  _profile_table(go2["profile"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.import_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sample", action="store_true")
    p.add_argument("--go2", action="store_true")
    p.add_argument("--long", action="store_true")
    p.add_argument("--seconds", type=float, default=120.0, help="go2: bag length (s)")
    p.add_argument("--hours", type=float, default=8.0, help="long: bag length (h)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs the import may use (0: all)")
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: temp)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--report", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    args = p.parse_args(argv)
    kinds = [k for k in ("sample", "go2", "long") if getattr(args, k)] or ["sample"]
    _pin(args.cpus)
    for kind in kinds:
        work = Path(tempfile.mkdtemp(prefix=f"import_{kind}_", dir=args.work))
        try:
            if kind == "sample":
                result = bench_sample(work)
            elif kind == "go2":
                result = bench_go2(work, args.seconds)
            else:
                result = bench_long(work, args.hours)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result |= {"machine": machine_info(), "cpus_used": args.cpus,
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        write_json(args.out / f"import_{kind}.json", result)
        print(f"{kind}: {result['summary']}", flush=True)
    results = {}
    for kind in ("sample", "go2", "long"):
        path = args.out / f"import_{kind}.json"
        if path.exists():
            results[kind] = read_json(path)
    write_marked_section(args.report, "import", report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
