"""The Go2's front video: what decoding every access unit costs, what a conversion to pixels
costs, and how many conversions the keyframe gate spares (issue 39).

    python -m bench.front_video_bench [--seconds 45] [--out BENCHMARKS.md]

1. A 1280x720 H.264 stream at 30 Hz (the sample flat's rendered frames scaled up, libx264
   ultrafast, an IDR every 30 frames, one access unit per message): per access unit, the
   decode (FrontVideoDecoder), the BGR conversion (VideoPicture.to_bgr) and the gate's luma
   thumbnail (VideoPicture.gray).
2. `memory-sample-bag --profile unitree_ros2` imported with config/unitree_ros2.yaml
   (Importer in-process): pictures decoded against pictures converted.

Figures go into BENCHMARKS.md between `<!-- front_video:begin -->` and `<!-- front_video:end -->`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _stream(n: int) -> list[bytes]:
    import cv2

    from memory_node.sim.front_video import H264Encoder
    from memory_node.sim.generate import _build_world
    from memory_node.sim.render import Renderer

    world = _build_world(7, n / 30.0, 30.0)
    renderer = Renderer(world.plan, world.camera)
    enc = H264Encoder(1280, 720, 30.0)
    out = []
    for t in world.camera_t[:n].tolist():
        pose = world.sensor_pose(t, world.camera_xyz)
        img, _ = renderer.render(pose[0], pose[1], pose[2], None)
        big = cv2.resize(np.ascontiguousarray(img[:, :, ::-1]), (1280, 720),
                         interpolation=cv2.INTER_LINEAR)
        out.append(enc.encode(big))
    return out


def _per_unit(aus: list[bytes]) -> dict[str, Any]:
    from memory_node.core.front_video import FrontVideoDecoder

    dec = FrontVideoDecoder("720p")
    decode, convert, luma = [], [], []
    for au in aus:
        t0 = time.perf_counter()
        pic = dec.decode(NS(time_frame=0, video720p=au))
        decode.append(time.perf_counter() - t0)
        if pic is None:
            continue
        t0 = time.perf_counter()
        pic.gray()
        luma.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pic.to_bgr()
        convert.append(time.perf_counter() - t0)

    def ms(xs: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(xs) * 1e3, 3),
                "mean": round(statistics.fmean(xs) * 1e3, 3)}

    return {"units": len(aus), "au_bytes_median": int(statistics.median(map(len, aus))),
            "decode_ms": ms(decode), "to_bgr_ms": ms(convert), "luma_ms": ms(luma)}


def _import(seconds: float) -> dict[str, Any]:
    from memory_node.core import param_file
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.recorder import ManualClock
    from memory_node.ros.bag_import import Importer, make_plan
    from memory_node.sim.generate import generate_sample

    with tempfile.TemporaryDirectory() as tmp:
        info = generate_sample(Path(tmp) / "sample", seed=7, duration_s=seconds,
                               profile="unitree_ros2")
        config = param_file.resolve_config("unitree_ros2.yaml")
        settings, engine_config, _ = param_file.load(config, {"memory_dir": f"{tmp}/m"})
        plan = make_plan([info.bag_dir], settings, topics=None)
        engine = MemoryEngine(engine_config, clock=ManualClock(plan.window[0] / 1e9))
        try:
            importer = Importer(plan, settings, engine, threads=1)
            t0 = time.perf_counter()
            out = importer.run()
            wall = time.perf_counter() - t0
        finally:
            engine.close()
        assert importer.front_video is not None
        c = importer.front_video.decoder.counters
        cam = out.counters["camera"]
        return {"bag_s": seconds, "video_hz": info.ground_truth["topics"]["/frontvideostream"]
                ["rate_hz"], "received": c.received, "decoded": c.decoded,
                "converted": c.converted, "stored": cam.stored, "wall_s": round(wall, 2)}


def _markdown(unit: dict[str, Any], imp: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    d, b, g = unit["decode_ms"], unit["to_bgr_ms"], unit["luma_ms"]
    share = imp["converted"] / imp["decoded"] if imp["decoded"] else 0.0
    return f"""## The Go2 front video (unitree_ros2): decoding and conversions

`python -m bench.front_video_bench` (bench/front_video_bench.py); load average {load} at the end.

Per access unit of a 1280x720 H.264 stream at 30 Hz ({unit['units']} units, the sample flat's
frames scaled up, libx264 ultrafast, IDR every 30, median {unit['au_bytes_median']} bytes; smooth
rendered content decodes faster than a real camera's, so read these as a lower bound):

| step | median ms | mean ms |
|---|---|---|
| decode (FrontVideoDecoder.decode, every access unit) | {d['median']} | {d['mean']} |
| BGR conversion (VideoPicture.to_bgr, kept frames only) | {b['median']} | {b['mean']} |
| gate thumbnail (VideoPicture.gray: the luma plane, no conversion) | {g['median']} | {g['mean']} |

`memory-import` of `memory-sample-bag --profile unitree_ros2 --duration {imp['bag_s']:g}`
(320x240 H.264 at {imp['video_hz']:g} Hz) with config/unitree_ros2.yaml: {imp['received']}
messages, {imp['decoded']} pictures decoded, {imp['converted']} converted to pixels
({share:.1%}), {imp['stored']} camera rows; {imp['wall_s']} s wall.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.front_video_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=45.0, help="sample recording to import")
    p.add_argument("--units", type=int, default=300, help="720p access units to time")
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = p.parse_args(argv)
    from bench.common import write_marked_section

    unit = _per_unit(_stream(args.units))
    imp = _import(args.seconds)
    body = _markdown(unit, imp)
    write_marked_section(args.out, "front_video", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
