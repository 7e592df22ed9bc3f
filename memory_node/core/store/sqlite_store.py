"""SQLite (WAL) observation store: the source of truth, shared by processes on one directory.

Layout: `observations` (one row per kept observation; `model_id` set when it has a vector),
`vectors` (where a row's float32 embedding is: its slot in the vector file of its model and
stream, and the CRC-32 of its bytes; the bytes themselves are in `vectors/`, see
vector_files.py), `vector_files` (each file's generation, dimension and committed rows),
`obs_xy` (an R*Tree on x, y for radius queries), `vector_log` (a change feed of vectors so
other processes and the in-memory indexes catch up incrementally), `archive` (rows thinned or
folded by compaction: never deleted; their vectors in `archive_vectors`), `views` (what a
camera frame covered: a sector, with its bounding box in the R*Tree `view_xy`, for
`seen_near`; kept when the row is archived), and `meta`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.store import pose_index
from memory_node.core.store.base import (
    Candidates,
    CompactionStore,
    KeyVectors,
    ObservationStore,
    VectorChange,
    VectorFeed,
)
from memory_node.core.store.eviction import EvictionStore
from memory_node.core.store.vector_files import DIR_NAME, VectorFiles, row_crcs
from memory_node.core.types import Observation, Pose, RowFilter, disc_slack, view_covers

log = logging.getLogger(__name__)

# 1: embeddings inline in observations; 2: in a `vectors` table of blobs; 3: in vector files.
SCHEMA_VERSION = "3"

# Compaction writes a vector file's live rows into a new generation once this share of its
# rows (and at least REWRITE_MIN_DEAD) are dead: archived or re-embedded.
REWRITE_DEAD_SHARE = 0.25
REWRITE_MIN_DEAD = 64

Key = tuple[str, str]  # (model_id, stream)

_COLUMNS = (
    "id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id, note_key"
)

# Up to this many ids are fetched as a UNION ALL of point lookups: `id IN (...)` first builds
# and sorts an ephemeral index of its values, an eighth of fetching a search's five rows.
POINT_LOOKUPS_MAX = 16


@functools.lru_cache(maxsize=64)
def _rows_by_id(table: str, n: int) -> str:
    """The SELECT of `n` rows of `table` by id (archived rows flagged by a trailing 1)."""
    cols = _COLUMNS + (", 1" if table == "archive" else "")
    if n <= POINT_LOOKUPS_MAX:
        return " UNION ALL ".join([f"SELECT {cols} FROM {table} WHERE id = ?"] * n)
    return f"SELECT {cols} FROM {table} WHERE id IN ({','.join('?' * n)})"


PAGE_SIZE = 8192
READ_MMAP_BYTES = 1 << 30  # the most of memory.db the read connection maps
_SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    t REAL NOT NULL,
    x REAL, y REAL, z REAL, yaw REAL,
    frame TEXT,
    pose_source TEXT NOT NULL DEFAULT 'none',
    tags TEXT NOT NULL DEFAULT '{}',
    text TEXT NOT NULL DEFAULT '',
    ref TEXT,
    model_id TEXT,
    note_key TEXT UNIQUE,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS obs_stream_t ON observations(stream, t);
CREATE INDEX IF NOT EXISTS obs_t ON observations(t);
CREATE TABLE IF NOT EXISTS vectors (
    id INTEGER PRIMARY KEY,
    slot INTEGER NOT NULL,
    crc INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS vector_files (
    model_id TEXT NOT NULL,
    stream TEXT NOT NULL,
    gen INTEGER NOT NULL,
    dim INTEGER NOT NULL,
    rows INTEGER NOT NULL,
    dead INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (model_id, stream)
);
CREATE VIRTUAL TABLE IF NOT EXISTS obs_xy USING rtree(id, min_x, max_x, min_y, max_y);
CREATE TABLE IF NOT EXISTS vector_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    obs_id INTEGER NOT NULL,
    op TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS archive (
    id INTEGER PRIMARY KEY,
    stream TEXT NOT NULL,
    t REAL NOT NULL,
    x REAL, y REAL, z REAL, yaw REAL,
    frame TEXT,
    pose_source TEXT NOT NULL,
    tags TEXT NOT NULL,
    text TEXT NOT NULL,
    ref TEXT,
    model_id TEXT,
    note_key TEXT,
    created REAL NOT NULL,
    archived_at REAL NOT NULL,
    reason TEXT NOT NULL,
    kept_id INTEGER
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS views (
    id INTEGER PRIMARY KEY,
    x REAL NOT NULL, y REAL NOT NULL, yaw REAL NOT NULL, hfov REAL NOT NULL,
    range REAL NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS view_xy USING rtree(id, min_x, max_x, min_y, max_y);
CREATE TABLE IF NOT EXISTS archive_vectors (id INTEGER PRIMARY KEY, embedding BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tag_keys (
    stream TEXT NOT NULL,
    key TEXT NOT NULL,
    numeric INTEGER NOT NULL,
    PRIMARY KEY (stream, key, numeric)
);
"""

# tag_keys: which tags each stream's rows carry (and whether as numbers), kept in the same
# transaction as the rows, so a search can check a tag name without scanning the rows. A
# catalogue filled from the rows once when an older memory.db first opens (meta flag below).
_TAG_KEYS_BACKFILL = """
INSERT OR IGNORE INTO tag_keys(stream, key, numeric)
SELECT DISTINCT o.stream, j.key, j.type IN ('integer', 'real')
FROM observations o, json_each(o.tags) j
"""


def _covers_sql(x: float, y: float, yaw: float, hfov: float, rng: float, px: float,
                py: float, r: float) -> int:
    return int(view_covers(x, y, yaw, hfov, rng, px, py, r))


_ARCHIVE_UNION = (
    "(SELECT id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id,"
    " note_key, 0 AS archived FROM observations UNION ALL"
    " SELECT id, stream, t, x, y, z, yaw, frame, pose_source, tags, text, ref, model_id,"
    " note_key, 1 AS archived FROM archive WHERE reason != 'pose')")


def _json_path(key: str) -> str:
    return "$." + key  # keys are validated against TAG_KEY before they get here


def _rollback_if_active(conn: sqlite3.Connection) -> None:
    """ROLLBACK when a transaction is still open (see SqliteObservationStore._rollback)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:  # the error being handled is the one to report
            log.warning("rollback failed: %s", exc)


class SqliteObservationStore(EvictionStore, ObservationStore):
    """One write connection and one read connection, each behind its own lock.

    WAL lets the read connection (searches) run while another thread or process writes.
    """

    def __init__(self, db_path: Path, *, timeout_s: float = 10.0):
        self.path = Path(db_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wlock = threading.RLock()
        self._rlock = threading.RLock()
        self.files = VectorFiles(self.path.parent / DIR_NAME)
        self._after_commit: list[Callable[[], None]] = []
        self._after_rollback: list[Callable[[], None]] = []
        self._unreadable_files: set[tuple[str, str, int]] = set()
        self._w = self._connect(timeout_s)
        with self._wlock:
            self._w.executescript(_SCHEMA)
            self._migrate()
            self._w.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
            self._w.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('db_uuid', ?)",
                (uuid.uuid4().hex,),
            )
            if self._w.execute("SELECT 1 FROM meta WHERE key='tag_keys'").fetchone() is None:
                self._w.execute("BEGIN IMMEDIATE")
                self._w.execute(_TAG_KEYS_BACKFILL)
                self._w.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('tag_keys', '1')")
                self._w.execute("COMMIT")
            t0 = time.perf_counter()
            if pose_index.ensure(self._w):
                log.info("pose-history index of %s built from its rows in %.1f s", self.path,
                         time.perf_counter() - t0)
        self._tag_keys_seen: set[tuple[str, str, bool]] = set()
        self._r = self._connect(timeout_s)
        # Reads through a map of the file, not a copy into SQLite's page cache per read: rows
        # by id come back faster (bench/results/NOTES.md, finding 17; the rows a search
        # returns are seldom in that cache); mapped file pages, not this process's own memory.
        self._r.execute(f"PRAGMA mmap_size={READ_MMAP_BYTES}")

    def _migrate(self) -> None:
        """Bring an older memory.db to this schema; refuse one written by a newer version."""
        self._w.execute("BEGIN IMMEDIATE")  # one process migrates; the others then see 3
        try:
            row = self._w.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(SCHEMA_VERSION) if row is None else int(row[0])
            if version > int(SCHEMA_VERSION):
                raise RuntimeError(
                    f"{self.path} has schema version {version}, newer than this memory_node "
                    f"understands ({SCHEMA_VERSION}): upgrade memory_node or use another "
                    "directory")
            moved = 0
            if version < int(SCHEMA_VERSION):
                t0 = time.perf_counter()
                moved = self._move_vectors_to_files()
                self._w.execute("UPDATE meta SET value=? WHERE key='schema_version'",
                                (SCHEMA_VERSION,))
            self._remove_unnamed_vector_files()
            self._w.execute("COMMIT")
        except BaseException:
            _rollback_if_active(self._w)
            raise
        if version < int(SCHEMA_VERSION):
            try:  # the blobs' pages back to the file system (needs no other reader)
                self._w.execute("VACUUM")
                self._w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.OperationalError as exc:
                log.info("memory.db not vacuumed after the migration (%s): its free pages "
                         "are reused by later rows", exc)
            log.info("memory.db migrated from schema %d to %s: %d vectors moved into %s/ "
                     "in %.1f s", version, SCHEMA_VERSION, moved, DIR_NAME,
                     time.perf_counter() - t0)

    def _move_vectors_to_files(self) -> int:
        """Schema 1 kept embeddings inline in observations.embedding, schema 2 in a table of
        blobs: both move into vector files, written and fsynced before the caller's
        transaction names their slots (a crash leaves the old schema, migrated again)."""
        obs_cols = {r[1] for r in self._w.execute("PRAGMA table_info(observations)")}
        vec_cols = {r[1] for r in self._w.execute("PRAGMA table_info(vectors)")}
        if "embedding" in vec_cols:
            source = ("SELECT v.id, o.model_id, o.stream, v.embedding FROM vectors v JOIN"
                      " observations o ON o.id = v.id WHERE o.model_id IS NOT NULL"
                      " ORDER BY v.id")
        elif "embedding" in obs_cols:
            source = ("SELECT id, model_id, stream, embedding FROM observations WHERE"
                      " embedding IS NOT NULL AND model_id IS NOT NULL ORDER BY id")
        else:
            return 0
        files: dict[Key, list] = {}  # key -> [open file, dim, rows]
        named: list[tuple[int, int, int]] = []  # (id, slot, crc)
        try:
            cur = self._w.execute(source)
            while batch := cur.fetchmany(4096):  # not all at once: 1.5 GB per 1M rows
                for oid, model_id, stream, blob in batch:
                    self._move_one(files, named, oid, model_id, stream, blob)
            for fh, _dim, _rows in files.values():
                fh.flush()
                os.fsync(fh.fileno())
        finally:
            for fh, _dim, _rows in files.values():
                fh.close()
        if "embedding" in vec_cols:
            self._w.execute("DROP TABLE vectors")
            self._w.execute("CREATE TABLE vectors (id INTEGER PRIMARY KEY,"
                            " slot INTEGER NOT NULL, crc INTEGER NOT NULL)")
        self._w.executemany("INSERT INTO vectors(id, slot, crc) VALUES (?, ?, ?)", named)
        self._w.executemany(
            "INSERT INTO vector_files(model_id, stream, gen, dim, rows) VALUES (?, ?, 1, ?, ?)",
            [(k[0], k[1], dim, rows) for k, (_f, dim, rows) in files.items()])
        # A row whose vector could not move (a stray dimension) is unindexed now.
        self._w.execute("UPDATE observations SET model_id = NULL WHERE model_id IS NOT NULL"
                        " AND id NOT IN (SELECT id FROM vectors)")
        if "embedding" in obs_cols:
            self._w.execute("UPDATE observations SET embedding = NULL")
        return len(named)

    def _move_one(self, files: dict[Key, list], named: list[tuple[int, int, int]], oid: int,
                  model_id: str, stream: str, blob: bytes) -> None:
        """Append one migrated vector to its file (opened on first use)."""
        vec = np.frombuffer(blob, np.float32)
        key = (model_id, stream)
        if key not in files:
            path = self.files.path(model_id, stream, 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            files[key] = [open(path, "wb"), len(vec), 0]  # noqa: SIM115 - closed by caller
        entry = files[key]
        if len(vec) != entry[1]:
            log.warning("row %d: a %d-d vector among %d-d ones of %s in %s; left unindexed",
                        oid, len(vec), entry[1], *key)
            return
        entry[0].write(vec.tobytes())
        named.append((oid, entry[2], row_crcs(vec.reshape(1, -1))[0]))
        entry[2] += 1

    def _connect(self, timeout_s: float) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self.path), timeout=timeout_s, isolation_level=None, check_same_thread=False
        )
        # A new database only (an existing one keeps its page size): a 384-d float32 vector
        # (1,536 bytes) fills 8 KiB pages to 95%, where 4 KiB pages held two and left a
        # quarter of the vectors table empty.
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        # Also a new database only: pages the disk budget frees can be given back to the file
        # system (PRAGMA incremental_vacuum) instead of only being reused.
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        conn.create_function("view_covers", 8, _covers_sql, deterministic=True)
        return conn

    # ---- writes -------------------------------------------------------------------------
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
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                embedded: list[tuple[int, str, str, np.ndarray]] = []
                for obs, vec in zip(rows, vectors, strict=True):
                    p = obs.pose
                    cur = self._w.execute(
                        "INSERT INTO observations(stream, t, x, y, z, yaw, frame, pose_source,"
                        " tags, text, ref, model_id, note_key, created)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            obs.stream, float(obs.t),
                            p.x if p else None, p.y if p else None,
                            p.z if p else None, p.yaw if p else None,
                            p.frame if p else None, p.source if p else "none",
                            json.dumps(obs.tags, separators=(",", ":")), obs.text, obs.ref,
                            obs.model_id if vec is not None else None,
                            obs.note_key, now,
                        ),
                    )
                    oid = cur.lastrowid
                    assert oid is not None  # set by the INSERT just run
                    ids.append(oid)
                    if p is not None:
                        self._w.execute(
                            "INSERT INTO obs_xy(id, min_x, max_x, min_y, max_y)"
                            " VALUES (?,?,?,?,?)",
                            (oid, p.x, p.x, p.y, p.y),
                        )
                    if obs.view is not None:
                        v = obs.view
                        self._w.execute(
                            "INSERT INTO views(id, x, y, yaw, hfov, range) VALUES (?,?,?,?,?,?)",
                            (oid, v.x, v.y, v.yaw, v.hfov, v.range))
                        self._w.execute(
                            "INSERT INTO view_xy(id, min_x, max_x, min_y, max_y)"
                            " VALUES (?,?,?,?,?)", (oid, *v.bbox()))
                    if vec is not None:
                        assert obs.model_id is not None  # checked above
                        embedded.append((oid, obs.model_id, obs.stream, vec))
                        self._w.execute(
                            "INSERT INTO vector_log(obs_id, op) VALUES (?, 'add')", (oid,)
                        )
                    self._note_tag_keys(obs.stream, obs.tags)
                self._append_vectors(embedded)
                self._commit()
            except BaseException:
                self._rollback()
                raise
        for obs, oid in zip(rows, ids, strict=True):
            obs.id = oid
        return ids

    def set_vector(self, obs_id: int, vector: np.ndarray, model_id: str) -> None:
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                row = self._w.execute(
                    "SELECT o.stream, o.model_id, v.slot FROM observations o LEFT JOIN vectors v"
                    " ON v.id = o.id WHERE o.id=?", (obs_id,)).fetchone()
                if row is not None:
                    stream, old_model, old_slot = row
                    self._replace_vector(obs_id, stream, old_model, old_slot, vector, model_id)
                self._commit()
            except BaseException:
                self._rollback()
                raise

    def set_text(self, obs_id: int, text: str, tags: dict[str, Any],
                 vector: np.ndarray | None = None, model_id: str | None = None) -> bool:
        """Replace a row's text and tags and, with `vector`, its embedding, in one
        transaction (a caption arriving after the row). False when the row is gone (archived
        or never there): nothing is written then."""
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                row = self._w.execute(
                    "SELECT o.stream, o.model_id, v.slot FROM observations o LEFT JOIN vectors v"
                    " ON v.id = o.id WHERE o.id=?", (obs_id,)).fetchone()
                if row is None:
                    self._w.execute("ROLLBACK")
                    return False
                stream, old_model, old_slot = row
                self._w.execute("UPDATE observations SET text=?, tags=? WHERE id=?",
                                (text, json.dumps(tags, separators=(",", ":")), obs_id))
                self._note_tag_keys(stream, tags)
                if vector is not None:
                    assert model_id is not None
                    self._replace_vector(obs_id, stream, old_model, old_slot, vector, model_id)
                self._commit()
                return True
            except BaseException:
                self._rollback()
                raise

    def _replace_vector(self, obs_id: int, stream: str, old_model: str,
                        old_slot: int | None, vector: np.ndarray, model_id: str) -> None:
        """Give a row a new embedding (inside the caller's write transaction): its old vector,
        if any, is dead, and leaves the old model's index first when the model changes."""
        if old_slot is not None:
            self._w.execute("DELETE FROM vectors WHERE id=?", (obs_id,))
            self._mark_dead(old_model, stream, 1)
            if old_model != model_id:
                self._w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')",
                                (obs_id,))
        self._w.execute("UPDATE observations SET model_id=? WHERE id=?", (model_id, obs_id))
        self._append_vectors([(obs_id, model_id, stream, vector)])
        self._w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'add')", (obs_id,))

    def tagged(self, stream: str, key: str, value: str, after_id: int = 0,
               limit: int = 1000) -> list[Observation]:
        """Rows of `stream` whose tag `key` equals the string `value`, in id order from
        `after_id` (background jobs find their persisted work this way)."""
        with self._rlock:
            rows = self._r.execute(
                f"SELECT {_COLUMNS} FROM observations WHERE stream=? AND id > ? AND"
                " json_extract(tags, ?) = ? ORDER BY id LIMIT ?",
                (stream, int(after_id), _json_path(key), value, int(limit))).fetchall()
        return [self._row(r) for r in rows]

    def tag_counts(self, stream: str, key: str) -> dict[str, int]:
        """How many rows of `stream` carry each value of the tag `key`."""
        with self._rlock:
            rows = self._r.execute(
                "SELECT json_extract(tags, ?) AS v, count(*) FROM observations WHERE stream=?"
                " AND v IS NOT NULL GROUP BY v", (_json_path(key), stream)).fetchall()
        return {str(v): int(n) for v, n in rows}

    def rows_not_of_model(self, stream: str, model_id: str, after_id: int = 0,
                          limit: int = 64) -> list[Observation]:
        """Rows of `stream` with a vector of another model than `model_id`, in id order."""
        with self._rlock:
            rows = self._r.execute(
                f"SELECT {_COLUMNS} FROM observations WHERE stream=? AND id > ? AND model_id"
                " IS NOT NULL AND model_id != ? ORDER BY id LIMIT ?",
                (stream, int(after_id), model_id, int(limit))).fetchall()
        return [self._row(r) for r in rows]

    def model_counts(self, stream: str) -> dict[str | None, int]:
        """Rows of `stream` per embedding model (None: no vector)."""
        with self._rlock:
            rows = self._r.execute("SELECT model_id, count(*) FROM observations WHERE stream=?"
                                   " GROUP BY model_id", (stream,)).fetchall()
        return {m: int(n) for m, n in rows}

    # ---- vector files (inside the caller's write transaction) --------------------------------
    def _commit(self) -> None:
        self._w.execute("COMMIT")
        done, self._after_commit, self._after_rollback = self._after_commit, [], []
        for action in done:
            action()

    def _rollback(self) -> None:
        """Undo the write transaction, if SQLite has not already: a COMMIT or statement that
        failed with SQLITE_FULL or SQLITE_IOERR (a full disk) rolls the transaction back
        itself, and a ROLLBACK then would raise "cannot rollback - no transaction is active"
        over the error that matters."""
        _rollback_if_active(self._w)
        undo, self._after_commit, self._after_rollback = self._after_rollback, [], []
        for action in undo:
            action()

    def _append_vectors(self, items: Sequence[tuple[int, str, str, np.ndarray]]) -> None:
        """Write each (id, model, stream, vector) after its file's committed rows, fsync, and
        name the slots: the caller's commit then makes them part of memory.db."""
        by_key: dict[Key, list[tuple[int, np.ndarray]]] = {}
        for oid, model_id, stream, vec in items:
            by_key.setdefault((model_id, stream), []).append((oid, vec))
        for (model_id, stream), rows in by_key.items():
            vecs = np.stack([np.asarray(v, np.float32).reshape(-1) for _i, v in rows])
            got = self._w.execute("SELECT gen, dim, rows FROM vector_files WHERE model_id=?"
                                  " AND stream=?", (model_id, stream)).fetchone()
            if got is None:
                gen, dim, committed = 1, vecs.shape[1], 0
                self._w.execute("INSERT INTO vector_files(model_id, stream, gen, dim, rows)"
                                " VALUES (?, ?, 1, ?, 0)", (model_id, stream, dim))
            else:
                gen, dim, committed = got
            if vecs.shape[1] != dim:
                raise ValueError(f"{model_id} vectors of {stream} have {dim} dimensions, not "
                                 f"{vecs.shape[1]}")
            self.files.append(self.files.path(model_id, stream, gen), committed, vecs)
            self._w.executemany(
                "INSERT INTO vectors(id, slot, crc) VALUES (?, ?, ?)",
                [(oid, committed + i, crc) for i, ((oid, _v), crc)
                 in enumerate(zip(rows, row_crcs(vecs), strict=True))])
            self._w.execute("UPDATE vector_files SET rows = rows + ? WHERE model_id=? AND"
                            " stream=?", (len(rows), model_id, stream))

    def _mark_dead(self, model_id: str, stream: str, n: int) -> tuple[int, int]:
        """Count `n` more dead rows (archived, re-embedded, damaged) in a file; its (rows,
        dead) after."""
        self._w.execute("UPDATE vector_files SET dead = dead + ? WHERE model_id=? AND"
                        " stream=?", (n, model_id, stream))
        return self._w.execute("SELECT rows, dead FROM vector_files WHERE model_id=? AND"
                               " stream=?", (model_id, stream)).fetchone()

    def _rewrite_vector_file(self, model_id: str, stream: str) -> None:
        """Write the live rows of a file into its next generation and move their slots (in the
        caller's transaction; the old file is deleted once it commits)."""
        gen, dim, rows = self._w.execute(
            "SELECT gen, dim, rows FROM vector_files WHERE model_id=? AND stream=?",
            (model_id, stream)).fetchone()
        live = self._w.execute(
            "SELECT v.id, v.slot FROM vectors v JOIN observations o ON o.id = v.id"
            " WHERE o.model_id=? AND o.stream=? ORDER BY v.slot", (model_id, stream)).fetchall()
        slots = np.fromiter((r[1] for r in live), np.int64, len(live))
        old = self.files.map(model_id, stream, gen, dim,
                             int(slots.max()) + 1 if len(slots) else 0).array
        old_path = self.files.path(model_id, stream, gen)
        new_path = self.files.path(model_id, stream, gen + 1)
        self._after_rollback.append(lambda: new_path.unlink(missing_ok=True))
        self.files.write_generation(
            new_path, (old[slots[i:i + 65536]] for i in range(0, len(slots), 65536)))
        self._w.executemany("UPDATE vectors SET slot=? WHERE id=?",
                            [(i, r[0]) for i, r in enumerate(live)])
        self._w.execute("UPDATE vector_files SET gen=?, rows=?, dead=0 WHERE model_id=? AND"
                        " stream=?", (gen + 1, len(live), model_id, stream))

        def drop_old() -> None:
            self.files.forget(old_path)
            old_path.unlink(missing_ok=True)

        self._after_commit.append(drop_old)
        log.info("vector file of %s in %s rewritten without its %d dead rows: %d rows, "
                 "generation %d", model_id, stream, rows - len(live), len(live), gen + 1)

    def _remove_unnamed_vector_files(self) -> None:
        """Files no generation names: a rewrite or migration a crash cut short (under the
        write lock, so no other process is writing one)."""
        if not self.files.root.is_dir():
            return
        named = {self.files.path(m, st, g).name for m, st, g in self._w.execute(
            "SELECT model_id, stream, gen FROM vector_files")}
        for p in self.files.root.iterdir():
            if p.suffix == ".f32" and p.name not in named:
                log.info("removing %s/%s: no generation of memory.db names it", DIR_NAME,
                         p.name)
                p.unlink(missing_ok=True)

    def _note_tag_keys(self, stream: str, tags: dict[str, Any]) -> None:
        """Record the tag names of a row being written (inside the caller's transaction)."""
        new = []
        for key, value in tags.items():
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            item = (stream, key, numeric)
            if item not in self._tag_keys_seen:
                new.append(item)
        if new:
            self._w.executemany(
                "INSERT OR IGNORE INTO tag_keys(stream, key, numeric) VALUES (?, ?, ?)",
                [(st, k, int(n)) for st, k, n in new])
            self._tag_keys_seen.update(new)

    def update_tags(self, obs_id: int, tags: dict[str, Any]) -> None:
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                row = self._w.execute("SELECT stream FROM observations WHERE id=?",
                                      (obs_id,)).fetchone()
                self._w.execute("UPDATE observations SET tags=? WHERE id=?",
                                (json.dumps(tags, separators=(",", ":")), obs_id))
                if row is not None:
                    self._note_tag_keys(row[0], tags)
                self._w.execute("COMMIT")
            except BaseException:
                _rollback_if_active(self._w)
                raise

    def archive(self, ids: Sequence[int], reason: str, kept: dict[int, int] | None = None,
                kept_tags: tuple[int, Callable[[int], dict]] | None = None,
                at: float | None = None) -> int:
        """`at`: the archive time to record (the compaction's clock; default wall time)."""
        if not ids:
            return 0
        kept = kept or {}
        now = time.time() if at is None else float(at)
        moved = 0
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                vectors = self._vectors_w(ids)
                dead: dict[Key, int] = {}
                for oid in ids:
                    cur = self._w.execute(
                        "INSERT OR IGNORE INTO archive(id, stream, t, x, y, z, yaw, frame,"
                        " pose_source, tags, text, ref, model_id, note_key, created,"
                        " archived_at, reason, kept_id)"
                        " SELECT id, stream, t, x, y, z, yaw, frame, pose_source, tags, text,"
                        " ref, model_id, note_key, created, ?, ?, ? FROM observations"
                        " WHERE id=?",
                        (now, reason, kept.get(oid), oid),
                    )
                    if not cur.rowcount:
                        continue
                    had_vec = oid in vectors
                    if had_vec:
                        key, vec = vectors[oid]
                        self._w.execute("INSERT OR IGNORE INTO archive_vectors(id, embedding)"
                                        " VALUES (?, ?)", (oid, vec.tobytes()))
                        self._w.execute("DELETE FROM vectors WHERE id=?", (oid,))
                        dead[key] = dead.get(key, 0) + 1
                    self._w.execute("DELETE FROM observations WHERE id=?", (oid,))
                    self._w.execute("DELETE FROM obs_xy WHERE id=?", (oid,))
                    if had_vec:
                        self._w.execute(
                            "INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')", (oid,)
                        )
                    moved += 1
                if kept_tags is not None and moved:
                    kept_id, tags_for = kept_tags
                    new_tags = tags_for(moved)
                    self._w.execute("UPDATE observations SET tags=? WHERE id=?",
                                    (json.dumps(new_tags, separators=(",", ":")), kept_id))
                    row = self._w.execute("SELECT stream FROM observations WHERE id=?",
                                          (kept_id,)).fetchone()
                    if row is not None:
                        self._note_tag_keys(row[0], new_tags)
                for (model_id, stream), n in dead.items():
                    rows, dead_now = self._mark_dead(model_id, stream, n)
                    if dead_now >= max(REWRITE_MIN_DEAD, REWRITE_DEAD_SHARE * rows):
                        self._rewrite_vector_file(model_id, stream)
                self._commit()
            except BaseException:
                self._rollback()
                raise
        return moved

    def _vectors_w(self, ids: Sequence[int]) -> dict[int, tuple[Key, np.ndarray]]:
        """{id: ((model, stream), vector)} of the rows that have one, read in the write
        transaction (archive copies them)."""
        return {oid: ((r[1], r[0]), np.array(r[5]))
                for oid, r in self._vector_rows_of(ids, writing=True).items()}

    def set_meta(self, key: str, value: str) -> None:
        with self._wlock:
            self._w.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    # ---- reads --------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._rlock:
            row = self._r.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def data_version(self) -> int:
        """Changes whenever another connection (thread or process) commits."""
        with self._rlock:
            return int(self._r.execute("PRAGMA data_version").fetchone()[0])

    def max_vector_seq(self) -> int:
        with self._rlock:
            row = self._r.execute("SELECT max(seq) FROM vector_log").fetchone()
        return int(row[0] or 0)

    @staticmethod
    def _row(r: tuple) -> Observation:
        (oid, stream, t, x, y, z, yaw, frame, source, tags, text, ref, model_id, note_key) = r[:14]
        pose = None
        if x is not None and y is not None:
            pose = Pose(x=x, y=y, z=z or 0.0, yaw=yaw or 0.0, frame=frame or "", source=source)
        return Observation(stream=stream, t=t, pose=pose, tags=json.loads(tags), text=text,
                           ref=ref, id=oid, model_id=model_id, note_key=note_key,
                           archived=bool(r[14]) if len(r) > 14 else False)

    def get(self, ids: Sequence[int], include_archived: bool = False
            ) -> dict[int, Observation]:
        """Rows by id; with `include_archived`, archived rows too (marked `archived`)."""
        out: dict[int, Observation] = {}
        ids = [int(i) for i in ids]
        tables = ("observations", "archive") if include_archived else ("observations",)
        with self._rlock:
            for table in tables:
                want = [i for i in ids if i not in out]
                for start in range(0, len(want), 500):
                    chunk = want[start:start + 500]
                    for r in self._r.execute(_rows_by_id(table, len(chunk)), chunk):
                        out[r[0]] = self._row(r)
        return out

    def _where(self, req: RowFilter) -> tuple[str, str, list[Any]]:
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
            path = _json_path(key)
            if isinstance(value, dict):
                conds.append("json_type(o.tags, ?) IN ('integer', 'real')")
                params.append(path)
                for op, bound in value.items():
                    sym = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[op]
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

    @staticmethod
    def _source(filt: RowFilter) -> str:
        return _ARCHIVE_UNION if filt.include_archived else "observations"

    def candidates(self, filt: RowFilter) -> Candidates:
        join, where, params = self._where(filt)
        sql = f"SELECT o.id, o.stream, o.model_id FROM {self._source(filt)} o {join} {where}"
        with self._rlock:
            rows = self._r.execute(sql, params).fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        return Candidates(ids=ids, streams=[r[1] for r in rows], model_ids=[r[2] for r in rows])

    def ordered(self, filt: RowFilter, order_by: str, limit: int) -> list[Observation]:
        join, where, params = self._where(filt)
        key = order_by
        if key in ("-time", "time", "score"):
            direction = "ASC" if key == "time" else "DESC"
            order = f"o.t {direction}, o.id {direction}"
        else:
            direction = "DESC" if key.startswith("-") else "ASC"
            path = _json_path(key.lstrip("-"))
            numeric = (f"(CASE WHEN json_type(o.tags, '{path}') IN ('integer', 'real')"
                       f" THEN json_extract(o.tags, '{path}') END)")
            order = f"{numeric} IS NULL, {numeric} {direction}, o.t DESC, o.id DESC"
        cols = ", ".join("o." + c.strip() for c in _COLUMNS.split(","))
        if (filt.near is not None and key in ("-time", "score") and limit > 0
                and not filt.include_archived):
            got = self._newest_near(filt, cols, limit)
            if got is not None:
                return got
        if filt.include_archived:
            cols += ", o.archived"
        sql = (f"SELECT {cols} FROM {self._source(filt)} o {join} {where} ORDER BY {order}"
               " LIMIT ?")
        with self._rlock:
            rows = self._r.execute(sql, params + [int(limit)]).fetchall()
        return [self._row(r) for r in rows]

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
        _join, where, params = self._where(dataclasses.replace(filt, near=None,
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
        with self._rlock:
            self._r.execute("BEGIN")  # one snapshot: the buckets and the rows agree
            try:
                reach = r + (pose_index.view_reach(self._r) if filt.seen_near else 0.0)
                ranges = pose_index.newest_ranges(self._r, filt.near, reach, filt.t_min,
                                                  filt.t_max)
                if ranges is None:
                    return None
                for a, b in ranges:
                    out += self._r.execute(sql, [a, b, *near_params, *params,
                                                 limit - len(out)]).fetchall()
                    if len(out) >= limit:
                        break
            finally:
                self._r.execute("COMMIT")
        return [self._row(row) for row in out]

    def archived_vectors(self, ids: Sequence[int]) -> dict[int, tuple[str | None, np.ndarray]]:
        """{id: (model id, vector)} of archived rows that kept their vector."""
        out: dict[int, tuple[str | None, np.ndarray]] = {}
        ids = [int(i) for i in ids]
        with self._rlock:
            for start in range(0, len(ids), 900):
                chunk = ids[start:start + 900]
                marks = ",".join("?" * len(chunk))
                for oid, model_id, blob in self._r.execute(
                    "SELECT a.id, a.model_id, v.embedding FROM archive a JOIN archive_vectors v"
                    f" ON v.id = a.id WHERE a.id IN ({marks})", chunk
                ):
                    out[oid] = (model_id, np.frombuffer(blob, dtype=np.float32))
        return out

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
        with self._rlock:
            rows = self._r.execute(sql, params + params).fetchall()
        return np.asarray(rows, dtype=np.float64).reshape(-1, 4)[:, :3].copy()

    def pose_excerpt(self, centre: tuple[float, float], radius: float,
                     t_min: float | None = None, t_max: float | None = None
                     ) -> pose_index.PoseExcerpt | None:
        """What visits to a circle need of the pose history in [t_min, t_max], from the
        pose-history index (see pose_index.py); None when the circle is too big for it."""
        with self._rlock:
            return pose_index.excerpt(self._r, centre, radius, t_min, t_max)

    def newest_t(self, streams: Sequence[str]) -> float | None:
        """The time of the newest row of `streams`, kept or archived."""
        if not streams:
            return None
        marks = ",".join("?" * len(streams))
        with self._rlock:
            row = self._r.execute(
                f"SELECT max(t) FROM (SELECT max(t) AS t FROM observations WHERE stream IN"
                f" ({marks}) UNION ALL SELECT max(t) FROM archive WHERE stream IN ({marks}))",
                list(streams) * 2).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def views_of(self, ids: Sequence[int]) -> dict[int, Any]:
        """{id: View} of the rows that recorded one."""
        from memory_node.core.types import View

        out: dict[int, Any] = {}
        ids = [int(i) for i in ids]
        with self._rlock:
            for start in range(0, len(ids), 900):
                chunk = ids[start:start + 900]
                marks = ",".join("?" * len(chunk))
                for oid, x, y, yaw, hfov, rng in self._r.execute(
                        f"SELECT id, x, y, yaw, hfov, range FROM views WHERE id IN ({marks})",
                        chunk):
                    out[oid] = View(x, y, yaw, hfov, rng)
        return out

    # Rows with a vector, joined to where it is (`o`: the row, `v`: its slot, `f`: its file).
    _VEC_FROM = (" FROM observations o JOIN vectors v ON v.id = o.id JOIN vector_files f"
                 " ON f.model_id = o.model_id AND f.stream = o.stream")
    # A vector row as the readers below select it: its observation's fields, then where it is.
    _VEC_SELECT = "SELECT o.id, o.stream, o.model_id, o.t, o.x, o.y, v.slot, f.gen, f.dim" + \
        _VEC_FROM

    def _vector_rows_of(self, ids: Sequence[int], writing: bool = False
                        ) -> dict[int, tuple]:
        """{id: (stream, model_id, t, x, y, vector, gen, slot)}, vectors read from their
        files (views of the maps); read again when compaction replaced a file in between.
        Rows whose file is missing or shorter than memory.db says are left out, with one
        error per file (the next start checks every row of it). `writing`: inside the write
        transaction, on its connection."""
        ids = [int(i) for i in ids]
        conn, lock = (self._w, self._wlock) if writing else (self._r, self._rlock)
        out: dict[int, tuple] = {}
        for attempt in range(5):
            out, gone = {}, None
            with lock:
                for start in range(0, len(ids), 900):
                    chunk = ids[start:start + 900]
                    marks = ",".join("?" * len(chunk))
                    for (oid, stream, model_id, t, x, y, slot, gen, dim) in \
                            conn.execute(f"{self._VEC_SELECT} WHERE o.id IN ({marks})",
                                         chunk).fetchall():
                        try:
                            arr = self.files.map(model_id, stream, gen, dim, slot + 1).array
                        except FileNotFoundError as exc:
                            gone = (model_id, stream, gen, exc)
                            continue
                        except (OSError, ValueError) as exc:
                            self._unreadable(model_id, stream, gen, exc)
                            continue
                        out[oid] = (stream, model_id, t, x, y, arr[slot], gen, slot)
            if gone is None:
                return out
            if attempt == 4:  # not a compaction's new generation: the file is gone
                self._unreadable(*gone)
        return out

    def _unreadable(self, model_id: str, stream: str, gen: int, exc: Exception) -> None:
        if (model_id, stream, gen) not in self._unreadable_files:
            self._unreadable_files.add((model_id, stream, gen))
            log.error("vector file %s of %s in %s unreadable (%s): its rows stay unindexed "
                      "until the next start checks it", self.files.path(model_id, stream, gen).name,
                      model_id, stream, exc)

    def vector_changes(self, after_seq: int) -> Iterator[VectorChange]:
        with self._rlock:
            log_rows = self._r.execute(
                "SELECT seq, obs_id, op FROM vector_log WHERE seq > ? ORDER BY seq", (after_seq,)
            ).fetchall()
        vecs = self._vector_rows_of([oid for _, oid, op in log_rows if op == "add"])
        for seq, oid, op in log_rows:
            if op == "add":
                if oid not in vecs:  # archived since; its 'del' follows in the log
                    continue
                stream, model_id, t, x, y, vec, gen, slot = vecs[oid]
                yield VectorChange(seq, oid, "add", stream, model_id, vec, t, x, y, gen, slot)
            else:
                yield VectorChange(seq, oid, "del")

    def vector_rows(self, ids: Sequence[int]) -> dict[int, tuple]:
        """{id: (stream, model_id, t, x, y, vector bytes)} for the given ids that have one."""
        return {oid: (*r[:5], np.asarray(r[5]).tobytes())
                for oid, r in self._vector_rows_of(ids).items()}

    def vector_places(self, ids: Sequence[int]) -> dict[int, tuple]:
        """{id: (stream, model_id, t, x, y, gen, slot, crc)}: where each row's vector is, and
        the CRC-32 its bytes had when written (the index cache's check against memory.db)."""
        out: dict[int, tuple] = {}
        ids = [int(i) for i in ids]
        with self._rlock:
            for start in range(0, len(ids), 900):
                chunk = ids[start:start + 900]
                marks = ",".join("?" * len(chunk))
                for row in self._r.execute(
                        "SELECT o.id, o.stream, o.model_id, o.t, o.x, o.y, f.gen, v.slot, v.crc"
                        f"{self._VEC_FROM} WHERE o.id IN ({marks})", chunk):
                    out[row[0]] = row[1:]
        return out

    def added_ids_at(self, seqs: Sequence[int]) -> list[int]:
        """Observation ids whose vector was added at the given change-feed positions."""
        seqs = [int(s) for s in seqs][:900]
        if not seqs:
            return []
        marks = ",".join("?" * len(seqs))
        with self._rlock:
            return [r[0] for r in self._r.execute(
                f"SELECT obs_id FROM vector_log WHERE op = 'add' AND seq IN ({marks})", seqs)]

    def vector_file_states(self) -> dict[Key, tuple[int, int, int]]:
        """{(model, stream): (generation, dimension, committed rows)} of every vector file."""
        with self._rlock:
            return {(m, st): (g, d, r) for m, st, g, d, r in self._r.execute(
                "SELECT model_id, stream, gen, dim, rows FROM vector_files")}

    def key_vectors(self, model_id: str, stream: str) -> KeyVectors:
        """Every vector row of one (model, stream) in slot order, with its file, as of one
        snapshot of memory.db (the indexes are built from this)."""
        with self._rlock:
            self._r.execute("BEGIN")
            try:
                state = self._r.execute(
                    "SELECT gen, dim, rows FROM vector_files WHERE model_id=? AND stream=?",
                    (model_id, stream)).fetchone()
                gen, dim, committed = state if state is not None else (0, 0, 0)
                where = ("FROM vectors v JOIN observations o ON o.id = v.id"
                         " WHERE o.model_id=? AND o.stream=?")
                (n,) = self._r.execute(f"SELECT count(*) {where}",
                                       (model_id, stream)).fetchone()
                ints = np.empty((n, 3), np.int64)  # id, slot, crc
                meta = np.empty((n, 3), np.float64)  # t, x, y
                cur = self._r.execute(
                    f"SELECT v.id, v.slot, v.crc, o.t, coalesce(o.x, 'nan'),"
                    f" coalesce(o.y, 'nan') {where} ORDER BY v.slot", (model_id, stream))
                done = 0
                while batch := cur.fetchmany(65536):
                    arr = np.asarray(batch, dtype=object)
                    ints[done:done + len(batch)] = arr[:, :3].astype(np.int64)
                    meta[done:done + len(batch)] = arr[:, 3:].astype(np.float64)
                    done += len(batch)
            finally:
                self._r.execute("COMMIT")
        return KeyVectors(model_id, stream, int(gen), int(dim), int(committed),
                          ids=ints[:done, 0].copy(), slots=ints[:done, 1].copy(),
                          crcs=ints[:done, 2].copy(), meta=meta[:done])

    def all_vectors(self) -> Iterator[tuple]:
        """(id, stream, model_id, t, x, y, vector bytes) of every vector, in id order (tools,
        tests)."""
        with self._rlock:
            ids = [r[0] for r in self._r.execute("SELECT id FROM vectors ORDER BY id")]
        for start in range(0, len(ids), 10000):
            chunk = self.vector_rows(ids[start:start + 10000])
            for oid in ids[start:start + 10000]:
                if oid in chunk:
                    yield (oid, *chunk[oid])

    def drop_vectors(self, ids: Sequence[int], why: str) -> int:
        """Unindex rows whose stored vector is damaged: the rows stay (found by filters,
        listed after scored rows), their vectors are gone, and rows with text are embedded
        again at the next start. Returns how many lost a vector."""
        dropped = 0
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                for oid in ids:
                    row = self._w.execute(
                        "SELECT o.model_id, o.stream FROM observations o JOIN vectors v ON"
                        " v.id = o.id WHERE o.id=?", (int(oid),)).fetchone()
                    if row is None:
                        continue
                    self._w.execute("DELETE FROM vectors WHERE id=?", (int(oid),))
                    self._w.execute("UPDATE observations SET model_id = NULL WHERE id=?",
                                    (int(oid),))
                    self._mark_dead(row[0], row[1], 1)
                    self._w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')",
                                    (int(oid),))
                    dropped += 1
                self._commit()
            except BaseException:
                self._rollback()
                raise
        if dropped:
            log.error("%d vectors unindexed (%s): their rows stay, found by filters; rows "
                      "with text are embedded again when the engine starts", dropped, why)
        return dropped

    def rows_without_vectors(self, streams: Sequence[str]) -> list[Observation]:
        marks = ",".join("?" * len(streams))
        with self._rlock:
            rows = self._r.execute(
                f"SELECT {_COLUMNS} FROM observations WHERE model_id IS NULL"
                f" AND text != '' AND stream IN ({marks}) ORDER BY id", list(streams)
            ).fetchall()
        return [self._row(r) for r in rows]

    def note_keys(self) -> set[str]:
        with self._rlock:
            rows = self._r.execute(
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
        sql = f"SELECT {_COLUMNS} FROM observations WHERE {' AND '.join(conds)} ORDER BY id"
        with self._rlock:
            return [self._row(r) for r in self._r.execute(sql, params)]

    def archived_count(self) -> int:
        with self._rlock:
            return int(self._r.execute("SELECT count(*) FROM archive").fetchone()[0])

    def tag_catalogue(self) -> dict[str, dict[str, bool]]:
        out: dict[str, dict[str, bool]] = {}
        with self._rlock:
            for stream, key, numeric in self._r.execute(
                    "SELECT stream, key, numeric FROM tag_keys"):
                tags = out.setdefault(stream, {})
                tags[key] = tags.get(key, False) or bool(numeric)
        return out

    def has_tag(self, streams: Sequence[str] | None, tag: str) -> bool:
        conds, params = ["json_type(tags, ?) IS NOT NULL"], [_json_path(tag)]
        if streams:
            conds.append(f"stream IN ({','.join('?' * len(streams))})")
            params += list(streams)
        with self._rlock:
            row = self._r.execute(f"SELECT 1 FROM observations WHERE {' AND '.join(conds)}"
                                  " LIMIT 1", params).fetchone()
        return row is not None

    def rows(self, where: str = "", params: Sequence[Any] = ()) -> list[Observation]:
        """Rows matching a raw SQL condition (tools and the demo; core code uses `rows_of`)."""
        sql = f"SELECT {_COLUMNS} FROM observations {('WHERE ' + where) if where else ''}"
        with self._rlock:
            return [self._row(r) for r in self._r.execute(sql + " ORDER BY id", list(params))]

    def stream_stats(self) -> list[dict]:
        with self._rlock:
            rows = self._r.execute(
                "SELECT stream, count(*), min(t), max(t), count(model_id) FROM observations"
                " GROUP BY stream ORDER BY stream"
            ).fetchall()
        return [
            {"name": s, "count": n, "first_t": a, "last_t": b, "semantic": bool(v)}
            for s, n, a, b, v in rows
        ]

    def stream_names(self) -> set[str]:
        with self._rlock:
            return {r[0] for r in self._r.execute("SELECT DISTINCT stream FROM observations")}

    def count(self) -> int:
        with self._rlock:
            return int(self._r.execute("SELECT count(*) FROM observations").fetchone()[0])

    def close(self) -> None:
        with self._wlock, self._rlock:
            for conn in (self._r, self._w):
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self.files.close()


# Checked by mypy: this store is what the vector indexes and compaction are typed against.
_IS_VECTOR_FEED: type[VectorFeed] = SqliteObservationStore
_IS_COMPACTION_STORE: type[CompactionStore] = SqliteObservationStore
