"""The SQLite store's filtered reads: every filter of a search as one SQL condition.

A `RowFilter` (streams, time window, tags, a disc or a camera view covering it, archived rows)
becomes a join and a WHERE clause over `observations` (or it and the archive); the newest rows
in a disc are read through the pose-history index (pose_index.py), newest visits first,
instead of every row ever stored there. The pose history (visits) is read here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory_node.core.store import pose_index
from memory_node.core.store.base import Candidates
from memory_node.core.store.rows import COLUMNS, json_path, row_to_observation
from memory_node.core.store.sqlite_db import SqliteDb
from memory_node.core.types import RANGE_OPS_SQL, Observation, RowFilter, disc_slack

_ARCHIVE_UNION = (
    "(SELECT id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id,"
    " note_key, 0 AS archived FROM observations UNION ALL"
    " SELECT id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id,"
    " note_key, 1 AS archived FROM archive WHERE reason != 'pose')")


def _source(filt: RowFilter) -> str:
    return _ARCHIVE_UNION if filt.include_archived else "observations"


class RowQuery:
    """Candidates and ordered rows for a filter, and the pose history, on the read
    connection."""

    def __init__(self, db: SqliteDb):
        self.db = db

    def where(self, req: RowFilter) -> tuple[str, str, list[Any]]:
        """(join clause, where clause, params) for every filter of `req`."""
        join, conds = "", []
        params: list[Any] = []
        if req.near is not None:
            nx, ny = req.near
            r = req.radius
            # The box only narrows the rows the exact disc test then decides: a hair wider.
            m = disc_slack(req.near, r)
            box = [nx + r + m, nx - r - m, ny + r + m, ny - r - m]
            in_disc = "((o.x - ?) * (o.x - ?) + (o.y - ?) * (o.y - ?)) <= ?"
            disc = [nx, nx, ny, ny, r * r]
            if req.include_archived:  # archived rows are not in the R*Tree: a plain range
                stand = ("(o.x <= ? AND o.x >= ? AND o.y <= ? AND o.y >= ? AND "
                         f"{in_disc})")
                stand_params = box + disc
            else:
                stand = ("(o.id IN (SELECT id FROM obs_xy WHERE min_x <= ? AND max_x >= ?"
                         f" AND min_y <= ? AND max_y >= ?) AND {in_disc})")
                stand_params = box + disc
            if req.seen_near:
                conds.append(
                    f"({stand} OR o.id IN (SELECT v.id FROM view_xy b JOIN views v ON v.id ="
                    " b.id WHERE b.min_x <= ? AND b.max_x >= ? AND b.min_y <= ? AND"
                    " b.max_y >= ? AND view_covers(v.x, v.y, v.yaw, v.hfov, v.range, ?, ?, ?)))")
                params += stand_params + box + [nx, ny, r]
            elif req.include_archived:
                conds.append(stand)
                params += stand_params
            else:
                join = ("JOIN obs_xy ON obs_xy.id = o.id AND obs_xy.min_x <= ? AND"
                        " obs_xy.max_x >= ? AND obs_xy.min_y <= ? AND obs_xy.max_y >= ?")
                params += box
                conds.append(in_disc)
                params += disc
        if req.streams:
            conds.append(f"o.stream IN ({','.join('?' * len(req.streams))})")
            params += list(req.streams)
        if req.t_min is not None:
            conds.append("o.t >= ?")
            params.append(req.t_min)
        if req.t_max is not None:
            conds.append("o.t <= ?")
            params.append(req.t_max)
        for key, value in req.tags.items():
            path = json_path(key)
            if isinstance(value, dict):
                conds.append("json_type(o.tags, ?) IN ('integer', 'real')")
                params.append(path)
                for op, bound in value.items():
                    sym = RANGE_OPS_SQL[op]
                    conds.append(f"json_extract(o.tags, ?) {sym} ?")
                    params += [path, bound]
            elif value is None:
                conds.append("json_extract(o.tags, ?) IS NULL")
                params.append(path)
            else:
                v = int(value) if isinstance(value, bool) else value
                conds.append(
                    "(CASE WHEN json_type(o.tags, ?) = 'array' THEN EXISTS ("
                    "SELECT 1 FROM json_each(o.tags, ?) WHERE json_each.value = ?)"
                    " ELSE json_extract(o.tags, ?) = ? END)"
                )
                params += [path, path, v, path, v]
        where = ("WHERE " + " AND ".join(conds)) if conds else ""
        return join, where, params

    def candidates(self, filt: RowFilter) -> Candidates:
        join, where, params = self.where(filt)
        sql = f"SELECT o.id, o.stream, o.model_id FROM {_source(filt)} o {join} {where}"
        with self.db.rlock:
            rows = self.db.r.execute(sql, params).fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        return Candidates(ids=ids, streams=[r[1] for r in rows], model_ids=[r[2] for r in rows])

    def ordered(self, filt: RowFilter, order_by: str, limit: int) -> list[Observation]:
        join, where, params = self.where(filt)
        key = order_by
        if key in ("-time", "time", "score"):
            direction = "ASC" if key == "time" else "DESC"
            order = f"o.t {direction}, o.id {direction}"
        else:
            direction = "DESC" if key.startswith("-") else "ASC"
            path = json_path(key.lstrip("-"))
            numeric = (f"(CASE WHEN json_type(o.tags, '{path}') IN ('integer', 'real')"
                       f" THEN json_extract(o.tags, '{path}') END)")
            order = f"{numeric} IS NULL, {numeric} {direction}, o.t DESC, o.id DESC"
        cols = ", ".join("o." + c.strip() for c in COLUMNS.split(","))
        if (filt.near is not None and key in ("-time", "score") and limit > 0
                and not filt.include_archived):
            got = self._newest_near(filt, cols, limit)
            if got is not None:
                return got
        if filt.include_archived:
            cols += ", o.archived"
        sql = (f"SELECT {cols} FROM {_source(filt)} o {join} {where} ORDER BY {order}"
               " LIMIT ?")
        with self.db.rlock:
            rows = self.db.r.execute(sql, params + [int(limit)]).fetchall()
        return [row_to_observation(r) for r in rows]

    def _newest_near(self, filt: RowFilter, cols: str, limit: int
                     ) -> list[Observation] | None:
        """The newest `limit` rows in a disc (or, seen_near, whose camera view covers it) and
        the filter's other conditions, read back in time through the pose-history index's
        buckets for the cells within reach: the rows of the newest visits, not every row ever
        stored there sorted by time (what the R*Trees give). None when the index cannot
        help (the disc and the views' reach cover too many cells)."""
        assert filt.near is not None
        nx, ny = filt.near
        r = filt.radius
        _join, where, params = self.where(dataclasses.replace(filt, near=None,
                                                               seen_near=False))
        rest = f" AND {where.removeprefix('WHERE ')}" if where else ""
        # The same tests as _where's, row by row: the disc on the row's own x and y, and
        # (seen_near) its view's box and sector.
        disc = "((o.x - ?) * (o.x - ?) + (o.y - ?) * (o.y - ?)) <= ?"
        near_params: list[Any] = [nx, nx, ny, ny, r * r]
        if filt.seen_near:
            m = disc_slack(filt.near, r)
            disc = (f"({disc} OR EXISTS (SELECT 1 FROM views v JOIN view_xy b ON b.id = v.id"
                    " WHERE v.id = o.id AND b.min_x <= ? AND b.max_x >= ? AND b.min_y <= ? AND"
                    " b.max_y >= ? AND view_covers(v.x, v.y, v.yaw, v.hfov, v.range, ?, ?, ?)))")
            near_params += [nx + r + m, nx - r - m, ny + r + m, ny - r - m, nx, ny, r]
        sql = (f"SELECT {cols} FROM observations o INDEXED BY obs_t WHERE o.t >= ? AND"
               f" o.t < ? AND {disc}{rest} ORDER BY o.t DESC, o.id DESC LIMIT ?")
        out: list[tuple] = []
        with self.db.rlock:
            self.db.r.execute("BEGIN")  # one snapshot: the buckets and the rows agree
            try:
                reach = r + (pose_index.view_reach(self.db.r) if filt.seen_near else 0.0)
                ranges = pose_index.newest_ranges(self.db.r, filt.near, reach, filt.t_min,
                                                  filt.t_max)
                if ranges is None:
                    return None
                for a, b in ranges:
                    out += self.db.r.execute(sql, [a, b, *near_params, *params,
                                                   limit - len(out)]).fetchall()
                    if len(out) >= limit:
                        break
            finally:
                self.db.r.execute("COMMIT")
        return [row_to_observation(row) for row in out]

    def pose_track(self, t_min: float | None = None, t_max: float | None = None,
                   streams: Sequence[str] | None = None) -> np.ndarray:
        """(t, x, y) of every row with a pose, kept or archived, in time order: the robot's
        pose history (visits). `streams` limits which rows count."""
        conds = ["x IS NOT NULL", "y IS NOT NULL"]
        params: list[Any] = []
        if streams:
            conds.append(f"stream IN ({','.join('?' * len(streams))})")
            params += list(streams)
        if t_min is not None:
            conds.append("t >= ?")
            params.append(float(t_min))
        if t_max is not None:
            conds.append("t <= ?")
            params.append(float(t_max))
        where = " AND ".join(conds)
        # Rows of the same time in id order: the same track (and visits) in any copy of it.
        sql = (f"SELECT t, x, y, id FROM observations WHERE {where} UNION ALL"
               f" SELECT t, x, y, id FROM archive WHERE {where} ORDER BY 1, 4")
        with self.db.rlock:
            rows = self.db.r.execute(sql, params + params).fetchall()
        return np.asarray(rows, dtype=np.float64).reshape(-1, 4)[:, :3].copy()

    def pose_excerpt(self, centre: tuple[float, float], radius: float,
                     t_min: float | None = None, t_max: float | None = None
                     ) -> pose_index.PoseExcerpt | None:
        """What visits to a circle need of the pose history in [t_min, t_max], from the
        pose-history index (see pose_index.py); None when the circle is too big for it."""
        with self.db.rlock:
            return pose_index.excerpt(self.db.r, centre, radius, t_min, t_max)
