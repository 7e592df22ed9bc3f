"""The SQLite store's connections: what every part of the store shares.

One write connection and one read connection to memory.db, each behind its own lock, and the
vector files next to it. WAL lets the read connection (searches) run while another thread or
process writes. The parts of the store (schema, rows, vector slots, archive, change feed,
eviction) each hold this one object rather than a connection of their own, so they write in
each other's transactions.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from memory_node.core.store.vector_files import DIR_NAME, VectorFiles
from memory_node.core.types import view_covers

log = logging.getLogger(__name__)

PAGE_SIZE = 8192
READ_MMAP_BYTES = 1 << 30  # the most of memory.db the read connection maps


def _covers_sql(x: float, y: float, yaw: float, hfov: float, rng: float, px: float,
                py: float, r: float) -> int:
    return int(view_covers(x, y, yaw, hfov, rng, px, py, r))


def rollback_if_active(conn: sqlite3.Connection) -> None:
    """ROLLBACK when a transaction is still open (see SqliteDb.rollback)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:  # the error being handled is the one to report
            log.warning("rollback failed: %s", exc)


class SqliteDb:
    """memory.db's two connections and locks, and the write transaction's after-commit and
    after-rollback actions (a vector file a rewrite replaced is deleted only once the
    transaction naming its successor commits)."""

    def __init__(self, db_path: Path, timeout_s: float,
                 prepare: Callable[[SqliteDb], None]):
        """`prepare` brings the file to this schema, under the write lock, before the read
        connection opens."""
        self.path = Path(db_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.wlock = threading.RLock()
        self.rlock = threading.RLock()
        self.files = VectorFiles(self.path.parent / DIR_NAME)
        self.after_commit: list[Callable[[], None]] = []
        self.after_rollback: list[Callable[[], None]] = []
        self.w = self._connect(timeout_s)
        with self.wlock:
            prepare(self)
        self.r = self._connect(timeout_s)
        # Reads through a map of the file, not a copy into SQLite's page cache per read: rows
        # by id come back faster (bench/results/NOTES.md, finding 17; the rows a search
        # returns are seldom in that cache); mapped file pages, not this process's own memory.
        self.r.execute(f"PRAGMA mmap_size={READ_MMAP_BYTES}")

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

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the write connection: committed when the block ends,
        rolled back (and its after-rollback actions run) when it raises."""
        with self.wlock:
            self.w.execute("BEGIN IMMEDIATE")
            try:
                yield self.w
                self.commit()
            except BaseException:
                self.rollback()
                raise

    def commit(self) -> None:
        self.w.execute("COMMIT")
        done, self.after_commit, self.after_rollback = self.after_commit, [], []
        for action in done:
            action()

    def rollback(self) -> None:
        """Undo the write transaction, if SQLite has not already: a COMMIT or statement that
        failed with SQLITE_FULL or SQLITE_IOERR (a full disk) rolls the transaction back
        itself, and a ROLLBACK then would raise "cannot rollback - no transaction is active"
        over the error that matters."""
        rollback_if_active(self.w)
        undo, self.after_commit, self.after_rollback = self.after_rollback, [], []
        for action in undo:
            action()

    def get_meta(self, key: str) -> str | None:
        with self.rlock:
            row = self.r.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        with self.wlock:
            self.w.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def data_version(self) -> int:
        """Changes whenever another connection (thread or process) commits."""
        with self.rlock:
            return int(self.r.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        with self.wlock, self.rlock:
            for conn in (self.r, self.w):
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self.files.close()
