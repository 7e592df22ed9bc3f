"""The SQLite store's schema: its tables, and bringing an older memory.db up to them.

Layout: `observations` (one row per kept observation; `model_id` set when it has a vector),
`vectors` (where a row's float32 embedding is: its slot in the vector file of its model and
stream, and the CRC-32 of its bytes; the bytes themselves are in `vectors/`, see
vector_files.py), `vector_files` (each file's generation, dimension and committed rows),
`obs_xy` (an R*Tree on x, y for radius queries), `vector_log` (a change feed of vectors so
other processes and the in-memory indexes catch up incrementally), `archive` (rows thinned or
folded by compaction: never deleted; their vectors in `archive_vectors`), `views` (what a
camera frame covered: a sector, with its bounding box in the R*Tree `view_xy`, for
`seen_near`; kept when the row is archived), `tag_keys` (the tag catalogue), the pose-history
index (pose_index.py) and `meta`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import uuid
from typing import IO

import numpy as np

from memory_node.core.store import pose_index
from memory_node.core.store.sqlite_db import SqliteDb, rollback_if_active
from memory_node.core.store.vector_files import DIR_NAME, row_crcs
from memory_node.core.store.vector_slots import Key, VectorSlots

log = logging.getLogger(__name__)

# 1: embeddings inline in observations; 2: in a `vectors` table of blobs; 3: in vector files.
SCHEMA_VERSION = "3"

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


def prepare(db: SqliteDb) -> None:
    """Create the tables of a new memory.db, migrate an older one, fill what a newer version
    of this code added (the tag catalogue, the pose-history index); under the write lock."""
    w = db.w
    w.executescript(_SCHEMA)
    _migrate(db)
    w.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
              (SCHEMA_VERSION,))
    w.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('db_uuid', ?)",
              (uuid.uuid4().hex,))
    if w.execute("SELECT 1 FROM meta WHERE key='tag_keys'").fetchone() is None:
        w.execute("BEGIN IMMEDIATE")
        w.execute(_TAG_KEYS_BACKFILL)
        w.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('tag_keys', '1')")
        w.execute("COMMIT")
    t0 = time.perf_counter()
    if pose_index.ensure(w):
        log.info("pose-history index of %s built from its rows in %.1f s", db.path,
                 time.perf_counter() - t0)


def _migrate(db: SqliteDb) -> None:
    """Bring an older memory.db to this schema; refuse one written by a newer version."""
    w = db.w
    w.execute("BEGIN IMMEDIATE")  # one process migrates; the others then see 3
    try:
        row = w.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(SCHEMA_VERSION) if row is None else int(row[0])
        if version > int(SCHEMA_VERSION):
            raise RuntimeError(
                f"{db.path} has schema version {version}, newer than this memory_node "
                f"understands ({SCHEMA_VERSION}): upgrade memory_node or use another "
                "directory")
        moved = 0
        if version < int(SCHEMA_VERSION):
            t0 = time.perf_counter()
            moved = _move_vectors_to_files(db)
            w.execute("UPDATE meta SET value=? WHERE key='schema_version'", (SCHEMA_VERSION,))
        VectorSlots(db).remove_unnamed_files()
        w.execute("COMMIT")
    except BaseException:
        rollback_if_active(w)
        raise
    if version < int(SCHEMA_VERSION):
        try:  # the blobs' pages back to the file system (needs no other reader)
            w.execute("VACUUM")
            w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError as exc:
            log.info("memory.db not vacuumed after the migration (%s): its free pages "
                     "are reused by later rows", exc)
        log.info("memory.db migrated from schema %d to %s: %d vectors moved into %s/ "
                 "in %.1f s", version, SCHEMA_VERSION, moved, DIR_NAME,
                 time.perf_counter() - t0)


def _move_vectors_to_files(db: SqliteDb) -> int:
    """Schema 1 kept embeddings inline in observations.embedding, schema 2 in a table of
    blobs: both move into vector files, written and fsynced before the caller's
    transaction names their slots (a crash leaves the old schema, migrated again)."""
    w = db.w
    obs_cols = {r[1] for r in w.execute("PRAGMA table_info(observations)")}
    vec_cols = {r[1] for r in w.execute("PRAGMA table_info(vectors)")}
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
        cur = w.execute(source)
        while batch := cur.fetchmany(4096):  # not all at once: 1.5 GB per 1M rows
            for oid, model_id, stream, blob in batch:
                _move_one(db, files, named, oid, model_id, stream, blob)
        for fh, _dim, _rows in files.values():
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        for fh, _dim, _rows in files.values():
            fh.close()
    if "embedding" in vec_cols:
        w.execute("DROP TABLE vectors")
        w.execute("CREATE TABLE vectors (id INTEGER PRIMARY KEY,"
                  " slot INTEGER NOT NULL, crc INTEGER NOT NULL)")
    w.executemany("INSERT INTO vectors(id, slot, crc) VALUES (?, ?, ?)", named)
    w.executemany(
        "INSERT INTO vector_files(model_id, stream, gen, dim, rows) VALUES (?, ?, 1, ?, ?)",
        [(k[0], k[1], dim, rows) for k, (_f, dim, rows) in files.items()])
    # A row whose vector could not move (a stray dimension) is unindexed now.
    w.execute("UPDATE observations SET model_id = NULL WHERE model_id IS NOT NULL"
              " AND id NOT IN (SELECT id FROM vectors)")
    if "embedding" in obs_cols:
        w.execute("UPDATE observations SET embedding = NULL")
    return len(named)


def _move_one(db: SqliteDb, files: dict[Key, list], named: list[tuple[int, int, int]],
              oid: int, model_id: str, stream: str, blob: bytes) -> None:
    """Append one migrated vector to its file (opened on first use)."""
    vec = np.frombuffer(blob, np.float32)
    key = (model_id, stream)
    if key not in files:
        path = db.files.path(model_id, stream, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        fh: IO[bytes] = open(path, "wb")  # noqa: SIM115 - closed by the caller
        files[key] = [fh, len(vec), 0]
    entry = files[key]
    if len(vec) != entry[1]:
        log.warning("row %d: a %d-d vector among %d-d ones of %s in %s; left unindexed",
                    oid, len(vec), entry[1], *key)
        return
    entry[0].write(vec.tobytes())
    named.append((oid, entry[2], row_crcs(vec.reshape(1, -1))[0]))
    entry[2] += 1
