"""The pose-history index of memory.db: what visits read instead of every posed row.

A visit to a circle is decided by the samples inside it and the sample just before and just
after each stretch of them; every other sample is outside the circle and can neither start,
extend nor end a visit. So a visits question needs:
- `pose_track`: every posed row, kept or archived, as (t, id, x, y) in time order: a compact
  copy of the pose history, read by time ranges;
- `pose_cells`: which time buckets (`BUCKET_S`) the robot spent in each `CELL_M` grid cell: the
  buckets of the cells a circle overlaps hold every sample that can be inside it;
- `pose_gaps`: consecutive samples (distinct times) further apart than `GAP_MIN_S`: the gaps a
  visits answer reports, without reading the samples between them.

Triggers on `observations` and `archive` keep all three in the writing transaction, whoever
writes (this code, compaction, a budget, an older memory_node: the triggers are part of the
database, plain SQL), so the index never lags the rows. It is a cache of the rows, never the
source of truth: when any part of it is missing or was built with other sizes, it is built
again from the rows when the store opens. `pose_cells` only ever grows (a removed row leaves
its bucket behind: a bucket too many costs a read, never a wrong visit).

Cell and bucket sizes are powers of two, so a bucket's bounds are exact in floating point and
SQL's floor agrees with Python's.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

CELL_M = 1.0
BUCKET_S = 4.0
GAP_MIN_S = 4.0
VERSION = f"2 cell={CELL_M:g} bucket={BUCKET_S:g} gap={GAP_MIN_S:g}"
META_KEY = "pose_index"
# A circle over more cells than this reads the track by time instead (it covers much of it).
MAX_CELLS = 1024
# Buckets closer than this are read as one time range: a range costs a statement's overhead,
# about what a few seconds of samples cost to read.
MERGE_S = 8.0


def _floor_sql(expr: str) -> str:
    """floor() in plain SQL (SQLite's math functions are a compile-time option)."""
    return f"(CAST({expr} AS INTEGER) - ({expr} < CAST({expr} AS INTEGER)))"


_CX, _CY, _TB = (_floor_sql(f"NEW.{c} / {v!r}") for c, v in
                 (("x", CELL_M), ("y", CELL_M), ("t", BUCKET_S)))

_TABLES = {
    "pose_track": "CREATE TABLE pose_track (t REAL NOT NULL, id INTEGER NOT NULL, x REAL NOT NULL,"
                  " y REAL NOT NULL, PRIMARY KEY (t, id)) WITHOUT ROWID",
    "pose_cells": "CREATE TABLE pose_cells (cx INTEGER NOT NULL, cy INTEGER NOT NULL,"
                  " tb INTEGER NOT NULL, PRIMARY KEY (cx, cy, tb)) WITHOUT ROWID",
    "pose_gaps": "CREATE TABLE pose_gaps (t0 REAL PRIMARY KEY, t1 REAL NOT NULL) WITHOUT ROWID",
    # How far from its row's pose any camera view reaches (its range plus the camera's offset
    # from the pose, as |dx| + |dy| >= the distance): a view that covers a point belongs to a
    # row whose pose is within this of it. 1e300 once a view's row has no pose.
    "pose_view_reach": "CREATE TABLE pose_view_reach (k INTEGER PRIMARY KEY CHECK (k = 0),"
                       " reach REAL NOT NULL)",
}
_NO_POSE_REACH = 1e300


def _row_triggers(table: str, other: str) -> dict[str, str]:
    """A posed row of `table` enters the track; leaving it, it leaves the track unless the
    same row is in `other` (compaction moves a row: into the archive first, then out)."""
    short = "obs" if table == "observations" else "arch"
    return {
        f"pose_{short}_ins": f"""CREATE TRIGGER pose_{short}_ins AFTER INSERT ON {table}
            WHEN NEW.x IS NOT NULL AND NEW.y IS NOT NULL BEGIN
            INSERT OR IGNORE INTO pose_track(t, id, x, y) VALUES (NEW.t, NEW.id, NEW.x, NEW.y);
            END""",
        f"pose_{short}_del": f"""CREATE TRIGGER pose_{short}_del AFTER DELETE ON {table}
            WHEN OLD.x IS NOT NULL AND OLD.y IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM {other} WHERE id = OLD.id) BEGIN
            DELETE FROM pose_track WHERE t = OLD.t AND id = OLD.id;
            END""",
        f"pose_{short}_upd": f"""CREATE TRIGGER pose_{short}_upd AFTER UPDATE OF t, x, y
            ON {table} BEGIN
            DELETE FROM pose_track WHERE t = OLD.t AND id = OLD.id;
            INSERT OR IGNORE INTO pose_track(t, id, x, y) SELECT NEW.t, NEW.id, NEW.x, NEW.y
            WHERE NEW.x IS NOT NULL AND NEW.y IS NOT NULL;
            END""",
    }


# The sample time just before / after {t}, as an index seek (SQLite finds max(t) WHERE t < x
# by a seek only as a scalar subquery; in FROM it reads every earlier row).
_BEFORE = "SELECT t FROM pose_track WHERE t < {t} ORDER BY t DESC LIMIT 1"
_AFTER = "SELECT t FROM pose_track WHERE t > {t} ORDER BY t LIMIT 1"

_TRIGGERS = {
    **_row_triggers("observations", "archive"),
    **_row_triggers("archive", "observations"),
    # A new sample: its cell's bucket, and the gap it falls into split in two.
    "pose_track_ins": f"""CREATE TRIGGER pose_track_ins AFTER INSERT ON pose_track BEGIN
        INSERT OR IGNORE INTO pose_cells(cx, cy, tb) VALUES ({_CX}, {_CY}, {_TB});
        DELETE FROM pose_gaps WHERE t0 = ({_BEFORE.format(t="NEW.t")});
        INSERT OR REPLACE INTO pose_gaps(t0, t1) SELECT t, NEW.t FROM
            ({_BEFORE.format(t="NEW.t")}) WHERE NEW.t - t > {GAP_MIN_S!r};
        INSERT OR REPLACE INTO pose_gaps(t0, t1) SELECT NEW.t, t FROM
            ({_AFTER.format(t="NEW.t")}) WHERE t - NEW.t > {GAP_MIN_S!r};
        END""",
    "pose_views_ins": f"""CREATE TRIGGER pose_views_ins AFTER INSERT ON views BEGIN
        INSERT INTO pose_view_reach(k, reach) VALUES (0, coalesce(
            (SELECT NEW.range + abs(NEW.x - o.x) + abs(NEW.y - o.y) FROM observations o
             WHERE o.id = NEW.id AND o.x IS NOT NULL AND o.y IS NOT NULL), {_NO_POSE_REACH!r}))
        ON CONFLICT(k) DO UPDATE SET reach = max(reach, excluded.reach);
        END""",
    # The last sample of a time gone: the gaps on either side of it become one.
    "pose_track_del": f"""CREATE TRIGGER pose_track_del AFTER DELETE ON pose_track
        WHEN NOT EXISTS (SELECT 1 FROM pose_track WHERE t = OLD.t) BEGIN
        DELETE FROM pose_gaps WHERE t0 = OLD.t OR t0 = ({_BEFORE.format(t="OLD.t")});
        INSERT OR REPLACE INTO pose_gaps(t0, t1) SELECT p, n FROM
            (SELECT ({_BEFORE.format(t="OLD.t")}) AS p, ({_AFTER.format(t="OLD.t")}) AS n)
            WHERE p IS NOT NULL AND n IS NOT NULL AND n - p > {GAP_MIN_S!r};
        END""",
}

_BACKFILL = [
    "INSERT OR IGNORE INTO pose_track(t, id, x, y) SELECT t, id, x, y FROM observations"
    " WHERE x IS NOT NULL AND y IS NOT NULL",
    "INSERT OR IGNORE INTO pose_track(t, id, x, y) SELECT t, id, x, y FROM archive"
    " WHERE x IS NOT NULL AND y IS NOT NULL",
    "INSERT OR IGNORE INTO pose_cells(cx, cy, tb) SELECT DISTINCT "
    + ", ".join(_floor_sql(f"{c} / {v!r}") for c, v in
                (("x", CELL_M), ("y", CELL_M), ("t", BUCKET_S))) + " FROM pose_track",
    "INSERT INTO pose_view_reach(k, reach) SELECT 0, max(coalesce(v.range + abs(v.x - o.x)"
    f" + abs(v.y - o.y), {_NO_POSE_REACH!r})) FROM views v LEFT JOIN (SELECT id, x, y FROM"
    " observations UNION ALL SELECT id, x, y FROM archive) o ON o.id = v.id"
    " HAVING count(*) > 0",
    "INSERT INTO pose_gaps(t0, t1) SELECT p, t FROM (SELECT lag(t) OVER (ORDER BY t) AS p, t"
    f" FROM (SELECT DISTINCT t FROM pose_track)) WHERE p IS NOT NULL AND t - p > {GAP_MIN_S!r}",
]


def is_current(conn: sqlite3.Connection) -> bool:
    """Whether every table and trigger of the index is there, built with these sizes."""
    names = {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE name LIKE 'pose\\_%' ESCAPE '\\'")}
    if not (set(_TABLES) | set(_TRIGGERS)) <= names:
        return False
    row = conn.execute("SELECT value FROM meta WHERE key=?", (META_KEY,)).fetchone()
    return row is not None and row[0] == VERSION


def ensure(conn: sqlite3.Connection) -> bool:
    """Build the index from the rows unless it is current (on the write connection, outside a
    transaction); True when it was built."""
    if is_current(conn):
        return False
    conn.execute("BEGIN IMMEDIATE")  # one process builds it; the others then see it current
    try:
        if is_current(conn):
            conn.execute("COMMIT")
            return False
        for name in _TRIGGERS:
            conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        for name, sql in _TABLES.items():
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(sql)
        for sql in _BACKFILL:  # before the triggers: one pass each, not a trigger per row
            conn.execute(sql)
        for sql in _TRIGGERS.values():
            conn.execute(sql)
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                     (META_KEY, VERSION))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return True


@dataclass(frozen=True)
class PoseExcerpt:
    """What visits to one circle need of the pose history in a time window.

    `track`: (t, x, y) in time order, the samples that may be inside the circle with the sample
    just before and just after each stretch of them (the samples left out are all outside it,
    and none of them sits between two samples of `track` that are consecutive in the history
    and inside). `first_t`, `last_t`: the window's first and last sample (None: no sample).
    `gaps`: consecutive samples of the window further apart than `gap_min_s`."""

    track: np.ndarray
    first_t: float | None
    last_t: float | None
    gaps: list[tuple[float, float]]
    gap_min_s: float


def _window(col: str, t_min: float | None, t_max: float | None) -> tuple[str, list[float]]:
    conds, params = [], []
    if t_min is not None:
        conds.append(f"{col} >= ?")
        params.append(float(t_min))
    if t_max is not None:
        conds.append(f"{col} <= ?")
        params.append(float(t_max))
    return (" AND ".join(conds) or "1"), params


def _slack(v: float, r: float) -> float:
    return 1e-9 * (1.0 + abs(v) + r)


def excerpt(conn: sqlite3.Connection, centre: tuple[float, float], radius: float,
            t_min: float | None, t_max: float | None) -> PoseExcerpt | None:
    """The excerpt of the pose history in [t_min, t_max] for visits to the circle; None when
    the circle covers too many cells for the index to help (read the whole track then)."""
    cells = _cells(centre, radius)
    if cells is None:
        return None
    where, wparams = _window("t", t_min, t_max)
    conn.execute("BEGIN")  # one snapshot: the buckets, the samples and the gaps agree
    try:
        tb_lo = -(2 ** 62) if t_min is None else math.floor(float(t_min) / BUCKET_S)
        tb_hi = 2 ** 62 if t_max is None else math.floor(float(t_max) / BUCKET_S)
        buckets: list[int] = []
        for i, j in cells:
            buckets += [row[0] for row in conn.execute(
                "SELECT tb FROM pose_cells WHERE cx = ? AND cy = ? AND tb BETWEEN ? AND ?",
                (i, j, tb_lo, tb_hi))]
        first = conn.execute(f"SELECT min(t), max(t) FROM pose_track WHERE {where}",
                             wparams).fetchone()
        gaps = [(float(a), float(b)) for a, b in conn.execute(
            f"SELECT t0, t1 FROM pose_gaps WHERE {_window('t0', t_min, None)[0]} AND"
            f" {_window('t1', None, t_max)[0]} ORDER BY t0",
            _window("t0", t_min, None)[1] + _window("t1", None, t_max)[1])]
        track = _read_ranges(conn, _ranges(buckets, t_min, t_max), where, wparams)
    finally:
        conn.execute("COMMIT")
    first_t = None if first[0] is None else float(first[0])
    last_t = None if first[1] is None else float(first[1])
    return PoseExcerpt(track, first_t, last_t, gaps, GAP_MIN_S)


def _cell_near(i: int, j: int, cx: float, cy: float, r: float) -> bool:
    """Whether cell (i, j) comes within `r` of the centre (with a hair of slack)."""
    dx = max(i * CELL_M - cx, 0.0, cx - (i + 1) * CELL_M)
    dy = max(j * CELL_M - cy, 0.0, cy - (j + 1) * CELL_M)
    return dx * dx + dy * dy <= r * r + 1e-6 * (1.0 + r * r)


def _ranges(buckets: list[int], t_min: float | None, t_max: float | None
            ) -> list[tuple[float, float]]:
    """Time ranges covering the buckets, those closer than MERGE_S read as one."""
    if not buckets:
        return []
    tb = np.unique(np.asarray(buckets, np.int64))
    starts = tb * BUCKET_S
    ends = (tb + 1) * BUCKET_S
    split = np.nonzero(starts[1:] - ends[:-1] > MERGE_S)[0]
    lo = np.concatenate([[starts[0]], starts[split + 1]])
    hi = np.concatenate([ends[split], [ends[-1]]])
    if t_min is not None:
        lo = np.maximum(lo, t_min)
    if t_max is not None:
        hi = np.minimum(hi, t_max)
    return [(float(a), float(b)) for a, b in zip(lo, hi, strict=True) if a <= b]


def _read_ranges(conn: sqlite3.Connection, ranges: list[tuple[float, float]], where: str,
                 wparams: list[float]) -> np.ndarray:
    """(t, x, y) of the samples in the ranges and, for each range, every sample at the time
    just before and just after it within the window, in (t, id) order without repeats."""
    if not ranges:
        return np.empty((0, 3), np.float64)
    sql = (
        "WITH r(a, b) AS (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')"
        " FROM json_each(?)),"
        f" edge(t) AS (SELECT (SELECT t FROM pose_track WHERE t < r.a AND {where}"
        " ORDER BY t DESC LIMIT 1) FROM r UNION"
        f" SELECT (SELECT t FROM pose_track WHERE t > r.b AND {where} ORDER BY t LIMIT 1)"
        " FROM r)"
        " SELECT p.t, p.x, p.y, p.id FROM r CROSS JOIN pose_track p ON p.t >= r.a AND p.t <= r.b"
        " UNION SELECT p.t, p.x, p.y, p.id FROM edge CROSS JOIN pose_track p ON p.t = edge.t"
        " ORDER BY 1, 4")
    rows = conn.execute(sql, [json.dumps(ranges), *wparams, *wparams]).fetchall()
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)[:, :3].copy()


def newest_ranges(conn: sqlite3.Connection, centre: tuple[float, float], radius: float,
                  t_min: float | None, t_max: float | None, batch: int = 64
                  ) -> Iterator[tuple[float, float]] | None:
    """Half-open time ranges [a, b) in which the robot was in a cell the circle overlaps,
    newest first, disjoint, from the buckets that meet [t_min, t_max]: every posed row
    inside the circle (kept or archived) lies in one. None when the circle covers too many
    cells. Reads `batch` buckets per cell at a time, so a caller that stops early (k rows
    found) reads only the newest."""
    cells = _cells(centre, radius)
    if cells is None:
        return None
    return _newest_ranges(conn, cells, t_min, t_max, batch)


def _newest_ranges(conn: sqlite3.Connection, cells: list[tuple[int, int]],
                   t_min: float | None, t_max: float | None, batch: int
                   ) -> Iterator[tuple[float, float]]:
    tb_lo = -(2 ** 62) if t_min is None else math.floor(float(t_min) / BUCKET_S)
    below = 2 ** 62 if t_max is None else math.floor(float(t_max) / BUCKET_S)
    while below >= tb_lo:
        got: list[int] = []
        cut = tb_lo  # every cell's buckets from here up are read
        for i, j in cells:
            tbs = [r[0] for r in conn.execute(
                "SELECT tb FROM pose_cells WHERE cx = ? AND cy = ? AND tb BETWEEN ? AND ?"
                " ORDER BY tb DESC LIMIT ?", (i, j, tb_lo, below, batch))]
            if len(tbs) == batch:
                cut = max(cut, tbs[-1])
            got += tbs
        if not got:
            return
        tb = np.unique(np.asarray([v for v in got if v >= cut], np.int64))[::-1]
        split = np.nonzero(tb[:-1] - tb[1:] > 1 + MERGE_S / BUCKET_S)[0]
        tops = np.concatenate([[tb[0]], tb[split + 1]])
        bottoms = np.concatenate([tb[split], [tb[-1]]])
        for top, bottom in zip(tops.tolist(), bottoms.tolist(), strict=True):
            yield bottom * BUCKET_S, (top + 1) * BUCKET_S
        below = cut - 1


def view_reach(conn: sqlite3.Connection) -> float:
    """How far from its row's pose any stored camera view reaches (0: no view)."""
    row = conn.execute("SELECT reach FROM pose_view_reach WHERE k = 0").fetchone()
    return 0.0 if row is None else float(row[0])


def _cells(centre: tuple[float, float], radius: float) -> list[tuple[int, int]] | None:
    """The cells that overlap the circle; None when more than MAX_CELLS would."""
    cx, cy = float(centre[0]), float(centre[1])
    r = float(radius)
    if not all(math.isfinite(v) for v in (cx, cy, r)):
        return None
    x0, x1 = (math.floor((cx - r - _slack(cx, r)) / CELL_M),
              math.floor((cx + r + _slack(cx, r)) / CELL_M))
    y0, y1 = (math.floor((cy - r - _slack(cy, r)) / CELL_M),
              math.floor((cy + r + _slack(cy, r)) / CELL_M))
    if (x1 - x0 + 1) * (y1 - y0 + 1) > MAX_CELLS:
        return None
    return [(i, j) for i in range(x0, x1 + 1) for j in range(y0, y1 + 1)
            if _cell_near(i, j, cx, cy, r)]
