"""The SQLite store's rows: writing observations and reading them back by id, stream or tag.

A row's vector goes to its vector-file slot (vector_slots.py) and its tag names to the tag
catalogue (`tag_keys`) in the same transaction as the row, so a crash never leaves a row
without them. Filtered and spatial reads (what a search asks) are in row_query.py.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from memory_node.core.store.sqlite_db import SqliteDb, rollback_if_active
from memory_node.core.store.vector_slots import VectorSlots
from memory_node.core.types import Observation, Pose, View

COLUMNS = (
    "id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id, note_key"
)

# Up to this many ids are fetched as a UNION ALL of point lookups: `id IN (...)` first builds
# and sorts an ephemeral index of its values, an eighth of fetching a search's five rows.
POINT_LOOKUPS_MAX = 16


@functools.lru_cache(maxsize=64)
def rows_by_id(table: str, n: int) -> str:
    """The SELECT of `n` rows of `table` by id (archived rows flagged by a trailing 1)."""
    cols = COLUMNS + (", 1" if table == "archive" else "")
    if n <= POINT_LOOKUPS_MAX:
        return " UNION ALL ".join([f"SELECT {cols} FROM {table} WHERE id = ?"] * n)
    return f"SELECT {cols} FROM {table} WHERE id IN ({','.join('?' * n)})"


def json_path(key: str) -> str:
    return "$." + key  # keys are validated against TAG_KEY before they get here


def row_to_observation(r: tuple) -> Observation:
    """An Observation from a row selected as COLUMNS (and, for an archive read, a trailing
    archived flag)."""
    (oid, stream, t, x, y, z, yaw, frame, source, tags, text, ref, model_id, note_key) = r[:14]
    pose = None
    if x is not None and y is not None:
        pose = Pose(x=x, y=y, z=z or 0.0, yaw=yaw or 0.0, frame=frame or "", source=source)
    return Observation(stream=stream, t=t, pose=pose, tags=json.loads(tags), text=text,
                       ref=ref, id=oid, model_id=model_id, note_key=note_key,
                       archived=bool(r[14]) if len(r) > 14 else False)


def tags_json(tags: dict[str, Any]) -> str:
    return json.dumps(tags, separators=(",", ":"))


class TagKeys:
    """The tag catalogue's writes: which tag names each stream's rows carry (and whether as
    numbers), remembered per process so a known name costs no statement."""

    def __init__(self, db: SqliteDb):
        self.db = db
        self._seen: set[tuple[str, str, bool]] = set()

    def note(self, stream: str, tags: dict[str, Any]) -> None:
        """Record the tag names of a row being written (inside the caller's transaction)."""
        new = []
        for key, value in tags.items():
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            item = (stream, key, numeric)
            if item not in self._seen:
                new.append(item)
        if new:
            self.db.w.executemany(
                "INSERT OR IGNORE INTO tag_keys(stream, key, numeric) VALUES (?, ?, ?)",
                [(st, k, int(n)) for st, k, n in new])
            self._seen.update(new)


class RowWriter:
    """Inserts rows and replaces their text, tags and vectors, one transaction per call."""

    def __init__(self, db: SqliteDb, slots: VectorSlots, tag_keys: TagKeys):
        self.db = db
        self.slots = slots
        self.tag_keys = tag_keys

    def insert(
        self, rows: Sequence[Observation], vectors: Sequence[np.ndarray | None]
    ) -> list[int]:
        if len(rows) != len(vectors):
            raise ValueError("rows and vectors differ in length")
        for obs, vec in zip(rows, vectors, strict=True):
            if vec is not None and not obs.model_id:
                raise ValueError("a row with a vector needs the model_id that made it")
        now = time.time()
        ids: list[int] = []
        with self.db.transaction() as w:
            embedded: list[tuple[int, str, str, np.ndarray]] = []
            for obs, vec in zip(rows, vectors, strict=True):
                p = obs.pose
                cur = w.execute(
                    "INSERT INTO observations(stream, t, x, y, z, yaw, frame, pose_source,"
                    " tags, text, ref, model_id, note_key, created)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        obs.stream, float(obs.t),
                        p.x if p else None, p.y if p else None,
                        p.z if p else None, p.yaw if p else None,
                        p.frame if p else None, p.source if p else "none",
                        tags_json(obs.tags), obs.text, obs.ref,
                        obs.model_id if vec is not None else None,
                        obs.note_key, now,
                    ),
                )
                oid = cur.lastrowid
                assert oid is not None  # set by the INSERT just run
                ids.append(oid)
                if p is not None:
                    w.execute("INSERT INTO obs_xy(id, min_x, max_x, min_y, max_y)"
                              " VALUES (?,?,?,?,?)", (oid, p.x, p.x, p.y, p.y))
                if obs.view is not None:
                    v = obs.view
                    w.execute(
                        "INSERT INTO views(id, x, y, yaw, hfov, range) VALUES (?,?,?,?,?,?)",
                        (oid, v.x, v.y, v.yaw, v.hfov, v.range))
                    w.execute("INSERT INTO view_xy(id, min_x, max_x, min_y, max_y)"
                              " VALUES (?,?,?,?,?)", (oid, *v.bbox()))
                if vec is not None:
                    assert obs.model_id is not None  # checked above
                    embedded.append((oid, obs.model_id, obs.stream, vec))
                    w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'add')", (oid,))
                self.tag_keys.note(obs.stream, obs.tags)
            self.slots.append(embedded)
        for obs, oid in zip(rows, ids, strict=True):
            obs.id = oid
        return ids

    def set_vector(self, obs_id: int, vector: np.ndarray, model_id: str) -> None:
        with self.db.transaction() as w:
            row = w.execute(
                "SELECT o.stream, o.model_id, v.slot FROM observations o LEFT JOIN vectors v"
                " ON v.id = o.id WHERE o.id=?", (obs_id,)).fetchone()
            if row is not None:
                stream, old_model, old_slot = row
                self.replace_vector(obs_id, stream, old_model, old_slot, vector, model_id)

    def set_text(self, obs_id: int, text: str, tags: dict[str, Any],
                 vector: np.ndarray | None = None, model_id: str | None = None) -> bool:
        """Replace a row's text and tags and, with `vector`, its embedding, in one
        transaction (a caption arriving after the row). False when the row is gone (archived
        or never there): nothing is written then."""
        db = self.db
        with db.wlock:
            db.w.execute("BEGIN IMMEDIATE")
            try:
                row = db.w.execute(
                    "SELECT o.stream, o.model_id, v.slot FROM observations o LEFT JOIN vectors v"
                    " ON v.id = o.id WHERE o.id=?", (obs_id,)).fetchone()
                if row is None:
                    db.w.execute("ROLLBACK")
                    return False
                stream, old_model, old_slot = row
                db.w.execute("UPDATE observations SET text=?, tags=? WHERE id=?",
                             (text, tags_json(tags), obs_id))
                self.tag_keys.note(stream, tags)
                if vector is not None:
                    assert model_id is not None
                    self.replace_vector(obs_id, stream, old_model, old_slot, vector, model_id)
                db.commit()
                return True
            except BaseException:
                db.rollback()
                raise

    def replace_vector(self, obs_id: int, stream: str, old_model: str,
                       old_slot: int | None, vector: np.ndarray, model_id: str) -> None:
        """Give a row a new embedding (inside the caller's write transaction): its old vector,
        if any, is dead, and leaves the old model's index first when the model changes."""
        w = self.db.w
        if old_slot is not None:
            w.execute("DELETE FROM vectors WHERE id=?", (obs_id,))
            self.slots.mark_dead(old_model, stream, 1)
            if old_model != model_id:
                w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')", (obs_id,))
        w.execute("UPDATE observations SET model_id=? WHERE id=?", (model_id, obs_id))
        self.slots.append([(obs_id, model_id, stream, vector)])
        w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'add')", (obs_id,))

    def update_tags(self, obs_id: int, tags: dict[str, Any]) -> None:
        with self.db.wlock:
            w = self.db.w
            w.execute("BEGIN IMMEDIATE")
            try:
                row = w.execute("SELECT stream FROM observations WHERE id=?",
                                (obs_id,)).fetchone()
                w.execute("UPDATE observations SET tags=? WHERE id=?", (tags_json(tags), obs_id))
                if row is not None:
                    self.tag_keys.note(row[0], tags)
                w.execute("COMMIT")
            except BaseException:
                rollback_if_active(w)
                raise


class RowReader:
    """Rows by id, stream, tag or model, and what the streams hold (stats, catalogue)."""

    def __init__(self, db: SqliteDb):
        self.db = db

    def get(self, ids: Sequence[int], include_archived: bool = False
            ) -> dict[int, Observation]:
        """Rows by id; with `include_archived`, archived rows too (marked `archived`)."""
        out: dict[int, Observation] = {}
        ids = [int(i) for i in ids]
        tables = ("observations", "archive") if include_archived else ("observations",)
        with self.db.rlock:
            for table in tables:
                want = [i for i in ids if i not in out]
                for start in range(0, len(want), 500):
                    chunk = want[start:start + 500]
                    for r in self.db.r.execute(rows_by_id(table, len(chunk)), chunk):
                        out[r[0]] = row_to_observation(r)
        return out

    def tagged(self, stream: str, key: str, value: str, after_id: int = 0,
               limit: int = 1000) -> list[Observation]:
        """Rows of `stream` whose tag `key` equals the string `value`, in id order from
        `after_id` (background jobs find their persisted work this way)."""
        with self.db.rlock:
            rows = self.db.r.execute(
                f"SELECT {COLUMNS} FROM observations WHERE stream=? AND id > ? AND"
                " json_extract(tags, ?) = ? ORDER BY id LIMIT ?",
                (stream, int(after_id), json_path(key), value, int(limit))).fetchall()
        return [row_to_observation(r) for r in rows]

    def tag_counts(self, stream: str, key: str) -> dict[str, int]:
        """How many rows of `stream` carry each value of the tag `key`."""
        with self.db.rlock:
            rows = self.db.r.execute(
                "SELECT json_extract(tags, ?) AS v, count(*) FROM observations WHERE stream=?"
                " AND v IS NOT NULL GROUP BY v", (json_path(key), stream)).fetchall()
        return {str(v): int(n) for v, n in rows}

    def rows_not_of_model(self, stream: str, model_id: str, after_id: int = 0,
                          limit: int = 64) -> list[Observation]:
        """Rows of `stream` with a vector of another model than `model_id`, in id order."""
        with self.db.rlock:
            rows = self.db.r.execute(
                f"SELECT {COLUMNS} FROM observations WHERE stream=? AND id > ? AND model_id"
                " IS NOT NULL AND model_id != ? ORDER BY id LIMIT ?",
                (stream, int(after_id), model_id, int(limit))).fetchall()
        return [row_to_observation(r) for r in rows]

    def model_counts(self, stream: str) -> dict[str | None, int]:
        """Rows of `stream` per embedding model (None: no vector)."""
        with self.db.rlock:
            rows = self.db.r.execute("SELECT model_id, count(*) FROM observations WHERE stream=?"
                                     " GROUP BY model_id", (stream,)).fetchall()
        return {m: int(n) for m, n in rows}

    def rows_without_vectors(self, streams: Sequence[str]) -> list[Observation]:
        marks = ",".join("?" * len(streams))
        with self.db.rlock:
            rows = self.db.r.execute(
                f"SELECT {COLUMNS} FROM observations WHERE model_id IS NULL"
                f" AND text != '' AND stream IN ({marks}) ORDER BY id", list(streams)
            ).fetchall()
        return [row_to_observation(r) for r in rows]

    def note_keys(self) -> set[str]:
        with self.db.rlock:
            rows = self.db.r.execute(
                "SELECT note_key FROM observations WHERE note_key IS NOT NULL"
                " UNION SELECT note_key FROM archive WHERE note_key IS NOT NULL"
            ).fetchall()
        return {r[0] for r in rows}

    def rows_of(self, streams: Sequence[str], *, before_t: float | None = None,
                after_id: int = 0, with_vectors: bool = False) -> list[Observation]:
        """Rows of `streams` in id order: older than `before_t`, with ids above `after_id`,
        only those with a vector when `with_vectors` (compaction's reads)."""
        if not streams:
            return []
        conds = [f"stream IN ({','.join('?' * len(streams))})", "id > ?"]
        params: list[Any] = [*streams, int(after_id)]
        if before_t is not None:
            conds.append("t < ?")
            params.append(float(before_t))
        if with_vectors:
            conds.append("model_id IS NOT NULL")
        sql = f"SELECT {COLUMNS} FROM observations WHERE {' AND '.join(conds)} ORDER BY id"
        with self.db.rlock:
            return [row_to_observation(r) for r in self.db.r.execute(sql, params)]

    def tag_catalogue(self) -> dict[str, dict[str, bool]]:
        out: dict[str, dict[str, bool]] = {}
        with self.db.rlock:
            for stream, key, numeric in self.db.r.execute(
                    "SELECT stream, key, numeric FROM tag_keys"):
                tags = out.setdefault(stream, {})
                tags[key] = tags.get(key, False) or bool(numeric)
        return out

    def has_tag(self, streams: Sequence[str] | None, tag: str) -> bool:
        conds, params = ["json_type(tags, ?) IS NOT NULL"], [json_path(tag)]
        if streams:
            conds.append(f"stream IN ({','.join('?' * len(streams))})")
            params += list(streams)
        with self.db.rlock:
            row = self.db.r.execute(f"SELECT 1 FROM observations WHERE {' AND '.join(conds)}"
                                    " LIMIT 1", params).fetchone()
        return row is not None

    def rows(self, where: str = "", params: Sequence[Any] = ()) -> list[Observation]:
        """Rows matching a raw SQL condition (tools and the demo; core code uses `rows_of`)."""
        sql = f"SELECT {COLUMNS} FROM observations {('WHERE ' + where) if where else ''}"
        with self.db.rlock:
            return [row_to_observation(r)
                    for r in self.db.r.execute(sql + " ORDER BY id", list(params))]

    def stream_stats(self) -> list[dict]:
        with self.db.rlock:
            rows = self.db.r.execute(
                "SELECT stream, count(*), min(t), max(t), count(model_id) FROM observations"
                " GROUP BY stream ORDER BY stream"
            ).fetchall()
        return [
            {"name": s, "count": n, "first_t": a, "last_t": b, "semantic": bool(v)}
            for s, n, a, b, v in rows
        ]

    def stream_names(self) -> set[str]:
        with self.db.rlock:
            return {r[0] for r in self.db.r.execute("SELECT DISTINCT stream FROM observations")}

    def count(self) -> int:
        with self.db.rlock:
            return int(self.db.r.execute("SELECT count(*) FROM observations").fetchone()[0])

    def views_of(self, ids: Sequence[int]) -> dict[int, Any]:
        """{id: View} of the rows that recorded one."""
        out: dict[int, Any] = {}
        ids = [int(i) for i in ids]
        with self.db.rlock:
            for start in range(0, len(ids), 900):
                chunk = ids[start:start + 900]
                marks = ",".join("?" * len(chunk))
                for oid, x, y, yaw, hfov, rng in self.db.r.execute(
                        f"SELECT id, x, y, yaw, hfov, range FROM views WHERE id IN ({marks})",
                        chunk):
                    out[oid] = View(x, y, yaw, hfov, rng)
        return out

    def newest_t(self, streams: Sequence[str]) -> float | None:
        """The time of the newest row of `streams`, kept or archived."""
        if not streams:
            return None
        marks = ",".join("?" * len(streams))
        with self.db.rlock:
            row = self.db.r.execute(
                f"SELECT max(t) FROM (SELECT max(t) AS t FROM observations WHERE stream IN"
                f" ({marks}) UNION ALL SELECT max(t) FROM archive WHERE stream IN ({marks}))",
                list(streams) * 2).fetchone()
        return None if row is None or row[0] is None else float(row[0])
