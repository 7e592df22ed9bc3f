"""What a day of recording costs on disk: per-row sizes measured on an imported store, and the
JPEG size of a camera frame at another resolution through the package's own encoder.

    memory-sample-bag OUT --profile go2_ros2_sdk
    memory-import OUT/flat_bag --memory-dir STORE --config config/go2_ros2_sdk.yaml
    python -m bench.disk_cost --memory-dir STORE [--image PHOTO ...] [--width 1280 --height 720]

Per stream: rows kept per second of the recording, the blob bytes on disk per row, and the
row's share of memory.db and of the vector files; then the camera blob at WIDTHxHEIGHT (the
recording's own frames scaled up, and any --image photo scaled to it), and per day: moving all
day at the recording's keyframe rates, or standing (one keyframe per stream per
max_interval).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from statistics import mean

import numpy as np

DAY_S = 86400.0


def _on_disk(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def per_row(store: Path) -> dict:
    con = sqlite3.connect(f"file:{store / 'memory.db'}?mode=ro", uri=True)
    try:
        rows = dict(con.execute("SELECT stream, count(*) FROM observations GROUP BY stream"))
        span = con.execute("SELECT max(t) - min(t) FROM observations WHERE stream IN"
                           " ('camera', 'lidar', 'odom')").fetchone()[0]
        refs = con.execute("SELECT stream, ref FROM observations WHERE ref IS NOT NULL"
                           ).fetchall()
        embedded = dict(con.execute("SELECT stream, count(*) FROM observations WHERE model_id"
                                    " IS NOT NULL GROUP BY stream"))
        dims = dict(con.execute("SELECT stream, dim FROM vector_files"))
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        page = con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()
    total_rows = sum(rows.values())
    db_per_row = pages * page / total_rows
    out = {"span_s": span, "db_bytes_per_row": round(db_per_row), "streams": {}}
    for stream, n in rows.items():
        blobs = [_on_disk(store / r) for s, r in refs if s == stream]
        vec = 4 * dims.get(stream, 0) * embedded.get(stream, 0) / n
        out["streams"][stream] = {
            "rows": n, "rows_per_s": round(n / span, 3) if span else None,
            "blob_bytes": round(mean(blobs)) if blobs else 0,
            "vector_bytes": round(vec),
            "bytes_per_row": round((mean(blobs) if blobs else 0) + vec + db_per_row)}
    return out


def jpeg_sizes(store: Path, images: list[Path], width: int, height: int) -> dict:
    """Bytes of the package's JPEG (MemoryEngine.prepare_stream_row: describe + encode at
    the recorder's quality) of frames scaled to width x height."""
    import cv2

    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.ingest import CameraFrame

    frames = sorted((store / "blobs" / "camera").glob("*.jpg"))[::10][:10]
    out: dict[str, list[int]] = {"recording_scaled": [], "photos": []}
    with tempfile.TemporaryDirectory() as tmp, MemoryEngine(
            MemoryConfig.from_mapping({"memory_dir": tmp, "compact_interval_s": 0})) as eng:
        for kind, paths in (("recording_scaled", frames), ("photos", images)):
            for p in paths:
                img = cv2.imread(str(p))
                img = cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA
                                 if img.shape[1] > width else cv2.INTER_LINEAR)
                frame = CameraFrame(t=0.0, pose=None, image_bgr=np.ascontiguousarray(img))
                eng.prepare_stream_row("camera", frame)
                assert frame.jpeg is not None
                out[kind].append(len(frame.jpeg))
    return {k: round(mean(v)) for k, v in out.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory-dir", required=True, type=Path)
    ap.add_argument("--image", action="append", default=[], type=Path)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--max-interval", type=float, default=10.0)
    args = ap.parse_args()
    rows = per_row(args.memory_dir)
    jpeg = jpeg_sizes(args.memory_dir, args.image, args.width, args.height)
    day: dict[str, dict[str, float]] = {}
    for label, size in jpeg.items():
        moving = standing = 0.0
        for stream, s in rows["streams"].items():
            if stream not in ("camera", "lidar", "odom"):
                continue
            cost = s["bytes_per_row"] - (s["blob_bytes"] - size if stream == "camera" else 0)
            moving += cost * s["rows_per_s"] * DAY_S
            standing += cost * DAY_S / args.max_interval
        day[label] = {"moving_gb": round(moving / 1e9, 2), "standing_gb": round(standing / 1e9, 2)}
    print(json.dumps({"per_row": rows, f"jpeg_{args.width}x{args.height}": jpeg,
                      "per_day": day}, indent=1))


if __name__ == "__main__":
    main()
