"""memory-view on a long store: the page's load and a search's round trip.

    python -m bench.view_bench [--hours 8] [--runs 5]

Builds a store with the long import's rates (per hour: about 5,500 camera keyframes with a
JPEG each, 5,300 lidar rows with a cloud each, 5,700 odometry rows; `--hours` of a robot
looping the flat), the camera rows with real MiniLM vectors of their captions, in one process
(through `MemoryEngine.add_embedded` and the store), then serves it with the view
(`ViewServer`, in-process engine) and measures:

- the API: track, keyframes, notes, occupancy (first and cached), streams, a row, a thumbnail
  (first and cached), and `POST /api/search` (plain text, and JSON with a place and a window);
- the page in Debian's chromium (Playwright): from navigation until every keyframe dot the
  server sent is drawn (a fresh browser context each time: nothing cached), and a search typed
  in the box until every hit's thumbnail has loaded.

Writes bench/results/view.json and the "memory view" section of BENCHMARKS.md. The 8-hour
store of the import benchmark (`import_bench --long`) is made by a 2,000 s import and kept
nowhere; this one is made in about a minute instead, with the same row counts per hour.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine_info, percentiles, write_json, write_marked_section

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHROMIUM = "/usr/bin/chromium"
PER_HOUR = {"camera": 5526, "lidar": 5289, "odom": 5670}  # the long import's rows per hour
CAPTIONS = ["bright scene; mostly white", "dark scene; mostly brown", "a person waving",
            "a red door", "a green plant by the window", "a kitchen counter", "a sofa",
            "a bookshelf", "a corridor", "a bed", "a table and chairs", "a washing machine"]


def _loop(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A robot looping a 10 m x 7 m flat at 0.5 m/s, with a little wander."""
    perimeter = 34.0
    s = (0.5 * t) % perimeter
    x = np.where(s < 10, s, np.where(s < 17, 10, np.where(s < 27, 27 - s, 0)))
    y = np.where(s < 10, 0, np.where(s < 17, s - 10, np.where(s < 27, 7, 34 - s)))
    wobble = 0.3 * np.sin(t / 37.0)
    yaw = np.where(s < 10, 0, np.where(s < 17, math.pi / 2, np.where(s < 27, math.pi,
                                                                     -math.pi / 2)))
    return x + 1 + wobble, y + 1 - wobble, yaw


def build_store(memory: Path, hours: float) -> dict[str, Any]:
    import cv2

    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.types import Observation, Pose

    t0 = time.perf_counter()
    engine = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(memory)}))
    model = engine.text_model_id
    caption_vecs = np.asarray([engine.query_vector(model, c) for c in CAPTIONS], np.float32)
    start = 1_764_460_800.0
    span = hours * 3600
    rng = np.random.default_rng(5)
    images = []
    for i in range(len(CAPTIONS)):
        img = np.full((240, 320, 3), 40 + 15 * i, np.uint8)
        cv2.rectangle(img, (10 + 5 * i, 20), (80 + 4 * i, 100), (30 * i % 255, 200, 90), -1)
        images.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])[1].tobytes())
    (memory / "blobs" / "camera").mkdir(parents=True, exist_ok=True)
    (memory / "blobs" / "lidar").mkdir(parents=True, exist_ok=True)
    counts = {}
    store = engine.store
    assert store is not None
    for stream, per_hour in PER_HOUR.items():
        n = int(per_hour * hours)
        counts[stream] = n
        ts = np.sort(start + rng.uniform(0, span, n))
        xs, ys, yaws = _loop(ts - start)
        for lo in range(0, n, 5000):
            rows, vecs = [], []
            for i in range(lo, min(n, lo + 5000)):
                pose = Pose(x=float(xs[i]), y=float(ys[i]), z=0.3, yaw=float(yaws[i]))
                if stream == "camera":
                    k = i % len(CAPTIONS)
                    ref = f"blobs/camera/{i}.jpg"
                    (memory / ref).write_bytes(images[k])
                    rows.append(Observation("camera", float(ts[i]), pose, {"caption": k},
                                            CAPTIONS[k], ref, model_id=model))
                    vecs.append(caption_vecs[k])
                elif stream == "lidar":
                    ref = f"blobs/lidar/{i}.npy"
                    ang = np.linspace(-math.pi, math.pi, 180)
                    wall = 3.0 + np.sin(ang * 3 + i) * 0.5
                    pts = np.column_stack((wall * np.cos(ang), wall * np.sin(ang),
                                           np.linspace(-0.3, 1.0, 180))).astype(np.float32)
                    with open(memory / ref, "wb") as f:
                        np.save(f, pts)
                    rows.append(Observation("lidar", float(ts[i]), pose,
                                            {"points": 180, "frame": "lidar"}, "", ref))
                    vecs.append(None)
                else:
                    rows.append(Observation("odom", float(ts[i]), pose, {"speed": 0.5}))
                    vecs.append(None)
            if stream == "camera":
                engine.add_embedded(rows, np.asarray(vecs), model)
            else:
                store.insert(rows, vecs)
    engine.close()
    disk = sum(p.stat().st_size for p in memory.rglob("*") if p.is_file())
    return {"hours": hours, "rows": counts, "build_s": round(time.perf_counter() - t0, 1),
            "disk_mb": round(disk / 1e6, 1)}


def wait_for_indexes(base: str, timeout_s: float = 900.0) -> float:
    """Seconds until every index is built (a store over the graph threshold builds its HNSW
    graph in the background at open; measuring during that measures the build)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        _, body = _get(f"{base}/api/streams")
        indexes = json.loads(body).get("indexes") or []
        if all(ix["graph"] in ("ready", "exact") for ix in indexes):
            return time.monotonic() - t0
        time.sleep(2)
    raise TimeoutError("the indexes were not ready in time")


def _get(url: str, data: bytes | None = None) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=120) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000, body


def _timed(url: str, runs: int, data: bytes | None = None) -> dict[str, Any]:
    samples = [_get(url, data)[0] for _ in range(runs)]
    return {**percentiles(samples), "first_ms": round(samples[0], 1)}


def measure_api(base: str, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("track", "keyframes", "notes", "streams"):
        out[name] = _timed(f"{base}/api/{name}", runs)
    first, body = _get(f"{base}/api/occupancy")
    out["occupancy"] = {"first_ms": round(first, 1), **percentiles(
        [_get(f"{base}/api/occupancy")[0] for _ in range(runs)]),
        "cells": len(json.loads(body)["cells"])}
    _, kf = _get(f"{base}/api/keyframes")
    frames = json.loads(kf)
    out["keyframes"]["shown"], out["keyframes"]["total"] = len(frames["keyframes"]), \
        frames["total"]
    ids = [k[0] for k in frames["keyframes"]]
    out["row"] = _timed(f"{base}/api/rows/{ids[len(ids) // 2]}", runs)
    thumbs = [_get(f"{base}/api/rows/{i}/image?thumb=1")[0] for i in ids[:runs]]
    out["thumbnail_first"] = percentiles(thumbs)
    out["thumbnail_cached"] = percentiles(
        [_get(f"{base}/api/rows/{i}/image?thumb=1")[0] for i in ids[:runs]])
    out["search_text"] = _timed(f"{base}/api/search", runs, b"a red door")
    window = json.dumps({"semantic_query": "a green plant", "near_x": 5.0, "near_y": 1.0,
                         "radius": 2.0, "after": frames["keyframes"][0][1],
                         "before": frames["keyframes"][-1][1], "k": 10}).encode()
    out["search_near_window"] = _timed(f"{base}/api/search", runs, window)
    return out


def measure_page(url: str, runs: int, shown: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    loads, searches = [], []
    queries = ["a red door", "a person waving", "a sofa", "a bookshelf", "a corridor",
               "a bed", "a kitchen counter"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"])
        try:
            for i in range(runs):
                context = browser.new_context(viewport={"width": 1400, "height": 860})
                page = context.new_page()
                t0 = time.perf_counter()
                page.goto(url)
                page.wait_for_function(
                    f"document.querySelectorAll('#map .keyframe').length === {shown} && "
                    "document.querySelectorAll('#track polyline').length > 0",
                    timeout=120_000)
                loads.append((time.perf_counter() - t0) * 1000)
                page.fill("input#search", queries[i % len(queries)])
                t0 = time.perf_counter()
                page.press("input#search", "Enter")
                page.wait_for_selector("#results .hit")
                page.wait_for_function("[...document.querySelectorAll('#results .hit img')]"
                                       ".every(i => i.complete && i.naturalWidth > 0)")
                searches.append((time.perf_counter() - t0) * 1000)
                context.close()
        finally:
            browser.close()
    return {"load": {**percentiles(loads), "first_ms": round(loads[0], 1)},
            "search": percentiles(searches)}


def report(res: dict[str, Any]) -> str:
    s, a, pg = res["store"], res["api"], res["page"]
    rows = s["rows"]
    lines = [
        "## Memory view (memory-view) on a long store",
        "",
        f"Command: `python -m bench.view_bench --hours {s['hours']:g}`. A store with the "
        f"8-hour import's rows per hour, {s['hours']:g} h: {rows['camera']} camera keyframes "
        f"(JPEG each, MiniLM vectors of their captions), {rows['lidar']} lidar rows (a cloud "
        f"each), {rows['odom']} odometry rows; {s['disk_mb']} MB, built in {s['build_s']} s "
        "in one process; measured once its HNSW graph was built and calibrated "
        f"({res['indexes_ready_s']:.0f} s after opening). The 8-hour benchmark store itself "
        "(`import_bench --long`, a 2,000 s import) is kept nowhere, so it was not measured. "
        "The view serves it in-process (`memory-view --memory-dir`); times are wall "
        "milliseconds on the shared 2-core machine, the browser (Debian's chromium, "
        "headless) on the same cores.",
        "",
        "| what | p50 ms | p90 ms | first ms | note |",
        "|---|---|---|---|---|",
        f"| page load, until every keyframe dot is drawn (fresh context) | "
        f"**{pg['load']['p50']:.0f}** | {pg['load']['p90']:.0f} | {pg['load']['first_ms']:.0f}"
        f" | {a['keyframes']['shown']} of {a['keyframes']['total']} keyframes shown, "
        f"track 3000 points |",
        f"| search in the page: Enter until every hit's thumbnail has loaded | "
        f"**{pg['search']['p50']:.0f}** | {pg['search']['p90']:.0f} | – | k = 5 |",
    ]
    names = [("search_text", "POST /api/search, plain text"),
             ("search_near_window", "POST /api/search, JSON: near + radius + window, k 10"),
             ("track", "GET /api/track (3000 of the odometry rows)"),
             ("keyframes", "GET /api/keyframes (3000 dots)"),
             ("notes", "GET /api/notes"), ("streams", "GET /api/streams"),
             ("occupancy", f"GET /api/occupancy ({a['occupancy']['cells']} cells; first "
                           "builds it, then cached)"),
             ("row", "GET /api/rows/{id}"),
             ("thumbnail_first", "GET /api/rows/{id}/image?thumb=1, first"),
             ("thumbnail_cached", "the same thumbnail again (memory cache)")]
    for key, label in names:
        v = a[key]
        lines.append(f"| {label} | {v['p50']:.1f} | {v['p90']:.1f} | "
                     f"{v.get('first_ms', '–')} | |")
    m = res["machine"]
    lines += ["", f"Measured {res['when']} on {m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs; "
              f"load average at start {m.get('loadavg', '?')}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.view_bench")
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", type=Path, default=None,
                        help="build the store here and keep it (default: a temporary dir)")
    args = parser.parse_args()
    from memory_node.agent.client import EngineClient
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.view.server import ViewBackend, ViewServer
    from memory_node.view.store_reader import StoreReader

    tmp = Path(tempfile.mkdtemp(prefix="view_bench_"))
    memory = args.keep or tmp / "memory"
    try:
        machine = machine_info()
        store = build_store(memory, args.hours)
        print(f"store: {store}", flush=True)
        engine = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(memory)}))
        server = ViewServer(ViewBackend(EngineClient(engine), StoreReader(memory)),
                            "127.0.0.1", 0).start()
        try:
            base = server.url.rstrip("/")
            ready = wait_for_indexes(base)
            print(f"indexes ready after {ready:.0f} s", flush=True)
            api = measure_api(base, args.runs)
            print(f"api: {json.dumps(api)}", flush=True)
            page = measure_page(server.url, args.runs, api["keyframes"]["shown"])
            print(f"page: {page}", flush=True)
        finally:
            server.stop()
            engine.close()
        res = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": machine, "store": store, "indexes_ready_s": round(ready, 1),
               "api": api, "page": page}
        write_json(RESULTS / "view.json", res)
        write_marked_section(ROOT / "BENCHMARKS.md", "view", report(res))
        print(report(res))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
