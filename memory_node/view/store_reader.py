"""What the memory view draws beyond the services' contract, read from the store directory.

The search and streams answers come from the memory client (the engine in-process or the ROS
services); the track, the keyframe dots, one row by id, its image and the lidar backdrop are
read here from `memory.db` on a read-only SQLite connection (WAL: it never blocks the writer,
and it sees each commit as soon as it is made). Everything drawn is downsampled here, so a
week-long store sends the page a few thousand points, not every row.

Images are served only from the store's `blobs/` directory: a row's `ref` that resolves
anywhere else (`..`, an absolute path, a symbolic link out) is refused.
"""

from __future__ import annotations

import io
import json
import math
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.contract import result_fields
from memory_node.core.types import Observation, Pose

__all__ = ["IMAGE_SUFFIXES", "NotFound", "StoreReader", "downsample"]

IMAGE_SUFFIXES = (".jpg", ".jpeg")
THUMB_WIDTH = 160
THUMB_CACHE = 512  # thumbnails kept in memory (about 5 KB each)
LIDAR_ROWS_MAX = 400  # lidar rows the occupancy backdrop is made from
OCCUPANCY_CELLS_MAX = 20000
# A sensor-frame scan's points this close above its lowest ones are the floor, not obstacles.
FLOOR_BAND_M = 0.15
_IMAGE_REF = "(ref LIKE '%.jpg' OR ref LIKE '%.jpeg')"
_COLUMNS = ("id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id, "
            "note_key")


class NotFound(LookupError):
    """No such row, or no image for it."""


@dataclass(frozen=True)
class Window:
    """A time window (absolute seconds; None: open)."""

    after: float | None = None
    before: float | None = None

    def sql(self, column: str = "t") -> tuple[str, list[float]]:
        conds, params = [], []
        if self.after is not None:
            conds.append(f"{column} >= ?")
            params.append(float(self.after))
        if self.before is not None:
            conds.append(f"{column} <= ?")
            params.append(float(self.before))
        return " AND ".join(conds), params


def downsample(n: int, max_points: int) -> np.ndarray:
    """Indices of at most `max_points` of `n` items, evenly spread, first and last kept."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max(2, max_points)).round().astype(np.int64))


class StoreReader:
    """Read-only queries on one memory directory, safe from any thread (one connection each)."""

    def __init__(self, memory_dir: Path | str) -> None:
        self.root = Path(memory_dir).expanduser().resolve()
        self.db_path = self.root / "memory.db"
        self.blobs = self.root / "blobs"
        self._local = threading.local()
        self._thumbs: OrderedDict[int, bytes] = OrderedDict()
        self._thumbs_lock = threading.Lock()
        self._occupancy: tuple[Any, dict[str, Any]] | None = None
        self._image_streams: tuple[Any, list[str]] | None = None

    # ---- connection ---------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            if not self.db_path.is_file():
                raise FileNotFoundError(f"no memory store at {self.root} (no memory.db)")
            con = sqlite3.connect(f"{self.db_path.as_uri()}?mode=ro", uri=True,
                                  timeout=10.0, check_same_thread=False)
            con.execute("PRAGMA query_only = ON")
            self._local.con = con
        return con

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._db().execute(sql, list(params)).fetchall()

    def data_version(self) -> tuple[int, int]:
        """Changes whenever rows are added or removed (a cheap key for caches)."""
        row = self._query("SELECT max(id), count(*) FROM observations")[0]
        return int(row[0] or 0), int(row[1])

    # ---- what the map draws -------------------------------------------------------------
    def image_streams(self) -> list[str]:
        """Streams whose rows carry a keyframe image (camera streams), each found by one
        indexed look-up; asked again only once rows were added."""
        newest = self._query("SELECT max(id) FROM observations")[0][0]
        cached = self._image_streams
        if cached is not None and cached[0] == newest:
            return cached[1]
        names = [r[0] for r in self._query("SELECT DISTINCT stream FROM observations")]
        found = sorted(n for n in names if self._query(
            f"SELECT 1 FROM observations WHERE stream = ? AND {_IMAGE_REF} LIMIT 1", [n]))
        self._image_streams = (newest, found)
        return found

    def world_frame(self) -> str:
        row = self._query("SELECT frame FROM observations WHERE x IS NOT NULL AND frame IS NOT"
                          " NULL AND frame != '' ORDER BY id DESC LIMIT 1")
        return str(row[0][0]) if row else "map"

    def track(self, window: Window, max_points: int) -> list[list[float]]:
        """[t, x, y] of the robot's path (odometry rows; every posed row when there are none),
        in time order, downsampled to at most `max_points`."""
        has_odom = self._query("SELECT 1 FROM observations WHERE stream = 'odom' LIMIT 1")
        conds = ["x IS NOT NULL", "y IS NOT NULL"]
        params: list[Any] = []
        if has_odom:
            conds.append("stream = 'odom'")
        where, wparams = window.sql()
        if where:
            conds.append(where)
            params += wparams
        rows = self._query(f"SELECT t, x, y FROM observations WHERE {' AND '.join(conds)}"
                           " ORDER BY t, id", params)
        keep = downsample(len(rows), max_points)
        return [[round(rows[i][0], 3), round(rows[i][1], 3), round(rows[i][2], 3)]
                for i in keep]

    def keyframes(self, window: Window, max_points: int) -> tuple[list[list[Any]], int]:
        """([id, t, x, y, yaw] of posed camera keyframes in time order, downsampled; how many
        there are in the window)."""
        streams = self.image_streams()
        if not streams:
            return [], 0
        where, params = window.sql()
        marks = ",".join("?" * len(streams))
        rows = self._query(
            f"SELECT id, t, x, y, yaw FROM observations WHERE stream IN ({marks}) AND "
            f"{_IMAGE_REF} AND x IS NOT NULL{' AND ' + where if where else ''} ORDER BY t, id",
            [*streams, *params])
        keep = downsample(len(rows), max_points)
        return ([[rows[i][0], round(rows[i][1], 3), round(rows[i][2], 3), round(rows[i][3], 3),
                  round(rows[i][4] or 0.0, 3)] for i in keep], len(rows))

    def notes(self, window: Window, max_points: int) -> list[dict[str, Any]]:
        """The agent's notes (stream `events`) with a pose, newest last, at most max_points
        (the newest)."""
        where, params = window.sql()
        rows = self._query(
            "SELECT id, t, x, y, text, tags FROM observations WHERE stream = 'events' AND x IS"
            f" NOT NULL{' AND ' + where if where else ''} ORDER BY t DESC, id DESC LIMIT ?",
            [*params, int(max_points)])
        return [{"id": r[0], "t": r[1], "x": r[2], "y": r[3], "text": r[4],
                 "tags": json.loads(r[5] or "{}")} for r in reversed(rows)]

    # ---- one row --------------------------------------------------------------------------
    def _row(self, row_id: int) -> tuple[Observation, bool]:
        for table, archived in (("observations", False), ("archive", True)):
            rows = self._query(f"SELECT {_COLUMNS} FROM {table} WHERE id = ?", [row_id])
            if rows:
                (oid, stream, t, x, y, z, yaw, frame, source, tags, text, ref, model_id,
                 note_key) = rows[0]
                pose = None
                if x is not None and y is not None:
                    pose = Pose(x=x, y=y, z=z or 0.0, yaw=yaw or 0.0, frame=frame or "",
                                source=source)
                return Observation(stream=stream, t=t, pose=pose, tags=json.loads(tags),
                                   text=text, ref=ref, id=oid, model_id=model_id,
                                   note_key=note_key, archived=archived), archived
        raise NotFound(f"no row with id {row_id}")

    def row(self, row_id: int) -> dict[str, Any]:
        """The row as one search result item (no score)."""
        obs, _ = self._row(row_id)
        item = result_fields(obs, None)
        if item["pose"] == {}:
            item["pose"] = {"x": None, "y": None, "z": None, "yaw": None, "frame": None,
                            "source": "none"}
        if item["archived"] is None:
            del item["archived"]
        return item

    def neighbours(self, row_id: int) -> tuple[int | None, int | None]:
        """The camera keyframes just before and just after the row (any camera stream)."""
        obs, _ = self._row(row_id)
        before: list[tuple[float, int]] = []
        after: list[tuple[float, int]] = []
        for stream in self.image_streams():  # one indexed look-up each way per stream
            before += [(r[1], r[0]) for r in self._query(
                f"SELECT id, t FROM observations WHERE stream = ? AND {_IMAGE_REF} AND "
                "t <= ? AND (t < ? OR id < ?) ORDER BY t DESC, id DESC LIMIT 1",
                [stream, obs.t, obs.t, row_id])]
            after += [(r[1], r[0]) for r in self._query(
                f"SELECT id, t FROM observations WHERE stream = ? AND {_IMAGE_REF} AND "
                "t >= ? AND (t > ? OR id > ?) ORDER BY t, id LIMIT 1",
                [stream, obs.t, obs.t, row_id])]
        return (max(before)[1] if before else None), (min(after)[1] if after else None)

    # ---- images ---------------------------------------------------------------------------
    def _image_path(self, ref: str | None) -> Path | None:
        """The blob's path when it is an image inside blobs/ (never anywhere else)."""
        if not ref or not ref.lower().endswith(IMAGE_SUFFIXES):
            return None
        try:
            path = (self.root / ref).resolve()
        except (OSError, RuntimeError, ValueError):
            return None
        if not path.is_relative_to(self.blobs) or not path.is_file():
            return None
        return path

    def image(self, row_id: int, thumb: bool = False) -> bytes:
        """The row's keyframe as JPEG bytes (`thumb`: THUMB_WIDTH wide, cached)."""
        if thumb:
            with self._thumbs_lock:
                data = self._thumbs.get(row_id)
                if data is not None:
                    self._thumbs.move_to_end(row_id)
                    return data
        obs, _ = self._row(row_id)
        path = self._image_path(obs.ref)
        if path is None:
            raise NotFound(f"row {row_id} has no image")
        data = path.read_bytes()
        if not thumb:
            return data
        data = _thumbnail(data)
        with self._thumbs_lock:
            self._thumbs[row_id] = data
            while len(self._thumbs) > THUMB_CACHE:
                self._thumbs.popitem(last=False)
        return data

    # ---- lidar backdrop -------------------------------------------------------------------
    def occupancy(self, cell: float = 0.1) -> dict[str, Any]:
        """Cells of the world (x, y, hits) where lidar points fell, seen from above: made from
        up to LIDAR_ROWS_MAX lidar rows spread over the store, cached until rows change."""
        version = (self.data_version(), cell)
        cached = self._occupancy
        if cached is not None and cached[0] == version:
            return cached[1]
        rows = self._query("SELECT x, y, yaw, frame, tags, ref FROM observations WHERE"
                           " stream = 'lidar' AND ref LIKE '%.npy' AND x IS NOT NULL"
                           " ORDER BY t")
        counts: dict[tuple[int, int], int] = {}
        for i in downsample(len(rows), LIDAR_ROWS_MAX):
            x, y, yaw, frame, tags, ref = rows[i]
            pts = self._points(ref)
            if pts is None or len(pts) == 0:
                continue
            cloud_frame = json.loads(tags or "{}").get("frame")
            if cloud_frame and cloud_frame == frame:
                world = pts[:, :2]  # a cloud already in the world frame (a map chunk)
                world = world[pts[:, 2] > 0.05]
            else:  # a scan in the robot's frame: place it at the row's pose, floor left out
                low = np.percentile(pts[:, 2], 2)
                if np.percentile(pts[:, 2], 98) - low > 2 * FLOOR_BAND_M:  # 3-D: has a floor
                    pts = pts[pts[:, 2] > low + FLOOR_BAND_M]
                c, s = math.cos(yaw or 0.0), math.sin(yaw or 0.0)
                world = np.column_stack((x + c * pts[:, 0] - s * pts[:, 1],
                                         y + s * pts[:, 0] + c * pts[:, 1]))
            keys = np.floor(world / cell).astype(np.int64)
            uniq, n = np.unique(keys, axis=0, return_counts=True)
            for (kx, ky), k in zip(uniq.tolist(), n.tolist(), strict=True):
                counts[(kx, ky)] = counts.get((kx, ky), 0) + k
        while len(counts) > OCCUPANCY_CELLS_MAX:  # too fine for the page: coarser cells
            cell *= 2
            merged: dict[tuple[int, int], int] = {}
            for (kx, ky), k in counts.items():
                key = (kx // 2, ky // 2)
                merged[key] = merged.get(key, 0) + k
            counts = merged
        cells = [[round((kx + 0.5) * cell, 3), round((ky + 0.5) * cell, 3), k]
                 for (kx, ky), k in counts.items()]
        out = {"ok": True, "cell": cell, "cells": cells, "scans": min(len(rows),
                                                                      LIDAR_ROWS_MAX)}
        self._occupancy = (version, out)
        return out

    def _points(self, ref: str | None) -> np.ndarray | None:
        if not ref:
            return None
        try:
            path = (self.root / ref).resolve()
            if not path.is_relative_to(self.blobs):
                return None
            pts = np.load(io.BytesIO(path.read_bytes()), allow_pickle=False)
        except (OSError, ValueError):
            return None
        pts = np.asarray(pts, np.float64)
        return pts.reshape(-1, 3) if pts.size % 3 == 0 else None

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None


def _thumbnail(jpeg: bytes) -> bytes:
    import cv2

    img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        return jpeg
    h, w = img.shape[:2]
    if w <= THUMB_WIDTH:
        return jpeg
    small = cv2.resize(img, (THUMB_WIDTH, max(1, round(h * THUMB_WIDTH / w))),
                       interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 75])
    return buf.tobytes() if ok else jpeg
