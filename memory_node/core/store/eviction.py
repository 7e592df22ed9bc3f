"""The disk budget's writes on the SQLite store: removing rows for good, in short transactions.

Compaction only moves rows aside (the `archive` table); the budget (core/budget.py) removes
them. A removed sensor row that is the only pose sample of its stretch of time stays in the
archive as a pose sample (reason `pose`: time and pose only, no text, tags, vector or blob),
so the pose history is downsampled, never dropped. Each batch is one transaction that also
counts what it removed (meta `evicted:<stream>`, `evicted_t:<stream>`) and names the blob
files to delete (meta `evict_pending_blobs`); the files are deleted after the commit, and a
crash in between leaves the names for the next run (`finish_pending_blobs`).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memory_node.core.store.rows import COLUMNS, row_to_observation
from memory_node.core.store.sqlite_db import SqliteDb
from memory_node.core.store.vector_slots import Key, VectorSlots
from memory_node.core.types import Observation

POSE_REASON = "pose"
PENDING_KEY = "evict_pending_blobs"


def _marks(n: int) -> str:
    return ",".join("?" * n)


class Eviction:
    """The reads and writes the disk budget needs, on the store's connections."""

    def __init__(self, db: SqliteDb, slots: VectorSlots):
        self.db = db
        self.slots = slots

    def prepare_eviction(self) -> None:
        """The indexes eviction and `oldest_times` read the archive by (oldest first)."""
        with self.db.wlock:
            self.db.w.execute("CREATE INDEX IF NOT EXISTS archive_stream_t ON archive(stream, t)")
            self.db.w.execute("CREATE INDEX IF NOT EXISTS archive_t ON archive(t)")

    # ---- reads ----------------------------------------------------------------------------
    def max_row_id(self) -> int:
        with self.db.rlock:
            row = self.db.r.execute("SELECT max(m) FROM (SELECT max(id) AS m FROM observations"
                                    " UNION ALL SELECT max(id) FROM archive)").fetchone()
        return int(row[0] or 0)

    def refs_after(self, after_id: int) -> list[tuple[int, str]]:
        """(id, blob ref) of rows added after `after_id`, kept or already archived (the disk
        meter counts their files)."""
        with self.db.rlock:
            return [(int(i), str(r)) for i, r in self.db.r.execute(
                "SELECT id, ref FROM observations WHERE id > ? AND ref IS NOT NULL UNION ALL"
                " SELECT id, ref FROM archive WHERE id > ? AND ref IS NOT NULL ORDER BY 1",
                (int(after_id), int(after_id)))]

    def oldest_times(self) -> dict[str, float]:
        """{stream: the time of its oldest row, kept or archived} (pose samples left by the
        budget do not count: they are no longer the stream's rows)."""
        out: dict[str, float] = {}
        with self.db.rlock:
            streams = [r[0] for r in self.db.r.execute(
                "SELECT DISTINCT stream FROM observations UNION SELECT DISTINCT stream FROM"
                " archive")]
            for s in streams:
                row = self.db.r.execute(
                    "SELECT min(t) FROM (SELECT min(t) AS t FROM observations WHERE stream=?"
                    " UNION ALL SELECT min(t) FROM archive WHERE stream=? AND reason != ?)",
                    (s, s, POSE_REASON)).fetchone()
                if row[0] is not None:
                    out[s] = float(row[0])
        return out

    def next_t(self, streams: Sequence[str], at_or_after: float = -math.inf) -> float | None:
        """The time of the oldest kept row of `streams` at or after `at_or_after`."""
        if not streams:
            return None
        with self.db.rlock:
            row = self.db.r.execute(f"SELECT min(t) FROM observations WHERE stream IN"
                                    f" ({_marks(len(streams))}) AND t >= ?",
                                    [*streams, float(at_or_after)]).fetchone()
        return None if row[0] is None else float(row[0])

    def rows_between(self, streams: Sequence[str], t_lo: float, t_hi: float
                     ) -> list[Observation]:
        """Kept rows of `streams` with t_lo <= t < t_hi, in time order."""
        if not streams:
            return []
        with self.db.rlock:
            rows = self.db.r.execute(
                f"SELECT {COLUMNS} FROM observations WHERE stream IN"
                f" ({_marks(len(streams))}) AND t >= ? AND t < ? ORDER BY t, id",
                [*streams, float(t_lo), float(t_hi)]).fetchall()
        return [row_to_observation(r) for r in rows]

    def archived_with_blobs(self, streams: Sequence[str], limit: int
                            ) -> list[tuple[int, float, str]]:
        """(id, t, ref) of the oldest archived rows of `streams` that still have a blob."""
        with self.db.rlock:
            return [(int(i), float(t), str(r)) for i, t, r in self.db.r.execute(
                f"SELECT id, t, ref FROM archive WHERE stream IN ({_marks(len(streams))})"
                " AND ref IS NOT NULL AND reason != ? ORDER BY t LIMIT ?",
                [*streams, POSE_REASON, int(limit)])]

    def archived_rows(self, streams: Sequence[str], limit: int
                      ) -> list[tuple[int, str, float, bool]]:
        """(id, stream, t, has a pose) of the oldest archived rows of `streams`."""
        with self.db.rlock:
            return [(int(i), s, float(t), x is not None) for i, s, t, x in self.db.r.execute(
                f"SELECT id, stream, t, x FROM archive WHERE stream IN ({_marks(len(streams))})"
                " AND reason != ? ORDER BY t LIMIT ?", [*streams, POSE_REASON, int(limit)])]

    def pose_buckets(self, t_lo: float, t_hi: float, step: float,
                     excluding: set[int]) -> set[int]:
        """The `step`-long buckets of [t_lo, t_hi) that hold a pose sample (a kept row or an
        archived one) other than the rows in `excluding`."""
        out: set[int] = set()
        with self.db.rlock:
            for oid, t in self.db.r.execute(
                    "SELECT id, t FROM observations WHERE t >= ? AND t < ? AND x IS NOT NULL"
                    " UNION ALL SELECT id, t FROM archive WHERE t >= ? AND t < ? AND x IS NOT"
                    " NULL", (t_lo, t_hi, t_lo, t_hi)):
                if oid not in excluding:
                    out.add(math.floor(t / step))
        return out

    def pose_samples(self, streams: Sequence[str], after_t: float, limit: int
                     ) -> list[tuple[str, int, float]]:
        """(table, id, t) of up to `limit` pose-only samples after `after_t`: rows of
        `streams` (the odometry) and the pose samples the budget left, in time order."""
        cond = f"stream IN ({_marks(len(streams))}) AND " if streams else "0 AND "
        with self.db.rlock:
            rows = self.db.r.execute(
                f"SELECT 'observations', id, t FROM observations WHERE {cond} t > ? AND x IS"
                " NOT NULL UNION ALL SELECT 'archive', id, t FROM archive WHERE reason = ? AND"
                " t > ? ORDER BY 3, 2 LIMIT ?",
                [*streams, after_t, POSE_REASON, after_t, int(limit)]).fetchall()
        return [(str(a), int(b), float(c)) for a, b, c in rows]

    def evicted_counts(self) -> dict[str, tuple[int, float]]:
        """{stream: (rows the budget removed, the newest time it removed one at)}."""
        out: dict[str, tuple[int, float]] = {}
        with self.db.rlock:
            rows = self.db.r.execute("SELECT key, value FROM meta WHERE key LIKE 'evicted:%'"
                                     " OR key LIKE 'evicted_t:%'").fetchall()
        counts = {k.split(":", 1)[1]: int(v) for k, v in rows if k.startswith("evicted:")}
        times = {k.split(":", 1)[1]: float(v) for k, v in rows if k.startswith("evicted_t:")}
        for s, n in counts.items():
            out[s] = (n, times.get(s, -math.inf))
        return out

    # ---- writes ---------------------------------------------------------------------------
    def drop_archived_blobs(self, ids: Sequence[int]) -> list[str]:
        """Forget the blobs of archived rows (the rows stay); returns the files to delete,
        named in meta until `finish_pending_blobs` deletes them."""
        with self.db.transaction() as w:
            refs: list[str] = []
            for start in range(0, len(ids), 500):
                chunk = [int(i) for i in ids[start:start + 500]]
                refs += [r[0] for r in w.execute(
                    f"SELECT ref FROM archive WHERE id IN ({_marks(len(chunk))}) AND ref IS"
                    " NOT NULL", chunk)]
                w.execute(f"UPDATE archive SET ref = NULL WHERE id IN ({_marks(len(chunk))})",
                          chunk)
            self._add_pending(refs)
        return refs

    def evict(self, items: Sequence[tuple[str, int]], keep_pose: set[int], at: float
              ) -> list[str]:
        """Remove rows for good: `items` are (table, id), table `observations` or `archive`.
        A row in `keep_pose` stays in the archive as a pose sample only. One transaction,
        counting the removed rows per stream; returns the blob files to delete (see
        `drop_archived_blobs`)."""
        refs: list[str] = []
        counted: dict[str, list[float]] = {}
        with self.db.transaction() as w:
            dead: dict[Key, int] = {}
            for table, oid in items:
                got = self._evict_one(table, int(oid), int(oid) in keep_pose, at, dead)
                if got is None:
                    continue
                stream, t, ref, counts = got
                if ref:
                    refs.append(ref)
                if not counts:  # a pose sample left earlier: counted when it was left
                    continue
                c = counted.setdefault(stream, [0, -math.inf])
                c[0] += 1
                c[1] = max(c[1], t)
            for stream, (n, t) in counted.items():
                w.execute(
                    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET value = CAST(value AS INTEGER) + CAST(excluded.value AS INTEGER)",
                    (f"evicted:{stream}", str(int(n))))
                w.execute(
                    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET value = max(CAST(value AS REAL), CAST(excluded.value AS REAL))",
                    (f"evicted_t:{stream}", repr(float(t))))
            self.slots.retire(dead)
            self._add_pending(refs)
        return refs

    def _evict_one(self, table: str, oid: int, keep_pose: bool, at: float,
                   dead: dict[Key, int]
                   ) -> tuple[str, float, str | None, bool] | None:
        w = self.db.w
        if table == "observations":
            row = w.execute("SELECT stream, t, ref, model_id, x FROM observations WHERE id=?",
                            (oid,)).fetchone()
            if row is None:
                return None
            stream, t, ref, model_id, x = row
            if w.execute("DELETE FROM vectors WHERE id=?", (oid,)).rowcount:
                dead[(model_id, stream)] = dead.get((model_id, stream), 0) + 1
                w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')", (oid,))
            if keep_pose and x is not None:
                w.execute(
                    "INSERT OR REPLACE INTO archive(id, stream, t, x, y, z, yaw, frame,"
                    " pose_source, tags, text, ref, model_id, note_key, created, archived_at,"
                    " reason, kept_id) SELECT id, stream, t, x, y, z, yaw, frame, pose_source,"
                    " '{}', '', NULL, NULL, NULL, created, ?, ?, NULL FROM observations"
                    " WHERE id=?", (at, POSE_REASON, oid))
            w.execute("DELETE FROM observations WHERE id=?", (oid,))
            w.execute("DELETE FROM obs_xy WHERE id=?", (oid,))
            reason = None
        else:
            row = w.execute("SELECT stream, t, ref, reason FROM archive WHERE id=?",
                            (oid,)).fetchone()
            if row is None:
                return None
            stream, t, ref, reason = row
            w.execute("DELETE FROM archive_vectors WHERE id=?", (oid,))
            if keep_pose:
                if reason == POSE_REASON:
                    return None  # already nothing but a pose
                w.execute("UPDATE archive SET tags='{}', text='', ref=NULL, model_id=NULL,"
                          " note_key=NULL, reason=?, kept_id=NULL, archived_at=? WHERE id=?",
                          (POSE_REASON, at, oid))
            else:
                w.execute("DELETE FROM archive WHERE id=?", (oid,))
        w.execute("DELETE FROM views WHERE id=?", (oid,))
        w.execute("DELETE FROM view_xy WHERE id=?", (oid,))
        return str(stream), float(t), ref, reason != POSE_REASON

    def _add_pending(self, refs: list[str]) -> None:
        if not refs:
            return
        row = self.db.w.execute("SELECT value FROM meta WHERE key=?", (PENDING_KEY,)).fetchone()
        pending = json.loads(row[0]) if row else []
        self.db.w.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                          (PENDING_KEY, json.dumps(pending + refs)))

    def finish_pending_blobs(self, root: Path) -> int:
        """Delete the blob files removed rows named (committed); returns the bytes freed."""
        raw = self.db.get_meta(PENDING_KEY)
        if not raw:
            return 0
        freed = 0
        for ref in json.loads(raw):
            path = Path(root) / ref
            if ".." in Path(ref).parts or not ref.startswith("blobs/"):
                continue  # only files of the store's own blobs/ are ever deleted
            try:
                freed += path.stat().st_blocks * 512
                path.unlink()
            except FileNotFoundError:
                pass
        with self.db.wlock:
            self.db.w.execute("DELETE FROM meta WHERE key=?", (PENDING_KEY,))
        return freed

    def reclaim(self) -> None:
        """Give freed database pages back to the file system: incremental vacuum (a store
        created with auto_vacuum incremental) and a WAL checkpoint that truncates the log."""
        with self.db.wlock:
            try:
                if self.db.w.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
                    # executescript steps the pragma to the end (execute frees one page)
                    self.db.w.executescript("PRAGMA incremental_vacuum;")
                self.db.w.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.OperationalError:
                pass  # a reader holds the log: the next run checkpoints it

    def free_pages(self) -> tuple[int, int, int]:
        """(auto_vacuum mode, free pages, page size) of memory.db."""
        with self.db.wlock:
            mode = self.db.w.execute("PRAGMA auto_vacuum").fetchone()[0]
            free = self.db.w.execute("PRAGMA freelist_count").fetchone()[0]
            size = self.db.w.execute("PRAGMA page_size").fetchone()[0]
        return int(mode), int(free), int(size)

    def vacuum_into_incremental(self) -> bool:
        """Turn an older memory.db (no auto_vacuum) into one whose freed pages can be given
        back (one VACUUM, once); False when another connection keeps it from running."""
        with self.db.wlock:
            try:
                self.db.w.execute("PRAGMA auto_vacuum=INCREMENTAL")
                self.db.w.execute("VACUUM")
                self.db.w.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                return True
            except sqlite3.OperationalError:
                return False

    def meta_items(self, prefix: str) -> dict[str, Any]:
        with self.db.rlock:
            return {k: v for k, v in self.db.r.execute(
                "SELECT key, value FROM meta WHERE key LIKE ?", (prefix + "%",))}
