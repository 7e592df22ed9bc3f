"""A full disk, told apart from other failures, and the free space left on the store's
filesystem, read cheaply.

SQLite reports a full disk as SQLITE_FULL ("database or disk is full"), Python's own writes as
OSError ENOSPC (or EDQUOT over a quota). Writers that meet one keep going and count what they
could not store (`NotStored`); they say so through a `RateLimitedLog`, once a minute at most,
not once per message. `FreeSpace` reads statvfs at most once per `interval_s`, so a recorder
can ask before every row whether free space is below `disk_reserve_mb`.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# SQLite's primary result codes for a full disk and for an I/O error (the low byte of the
# extended code Python 3.11+ puts on the exception as `sqlite_errorcode`).
SQLITE_FULL = 13
SQLITE_IOERR = 10
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# Reasons a kept row was not stored (the keys of recorder_stats' "not_stored").
DISK_FULL, DISK_RESERVE, STORE_ERROR = "disk_full", "disk_reserve", "error"
MB = 1024 * 1024


# An I/O error while less than this is free is taken for a full disk (see is_disk_full).
NEARLY_FULL_BYTES = 1024 * 1024


def is_disk_full(exc: BaseException | None, path: Path | str | None = None) -> bool:
    """Whether `exc` (or an exception it was raised from) says the disk is full. With `path`
    (on the filesystem written to), SQLite's "disk I/O error" counts too when that filesystem
    is (nearly) full: SQLite reports a wal-index it could not grow as SQLITE_IOERR."""
    seen = 0
    io_error = False
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
            if code is not None and code & 0xFF == SQLITE_FULL:
                return True
            if "database or disk is full" in str(exc):
                return True
            io_error = io_error or (code is not None and code & 0xFF == SQLITE_IOERR) \
                or "disk I/O error" in str(exc)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    if io_error and path is not None:
        free = FreeSpace(path, interval_s=0.0).bytes()
        return free is not None and free < NEARLY_FULL_BYTES
    return False


def disk_full_text(exc: BaseException) -> str:
    """A short reason: 'No space left on device' rather than a whole errno repr."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


class FreeSpace:
    """Free bytes on the filesystem holding `path` (for unprivileged writers: statvfs'
    f_bavail), read at most once per `interval_s` of `clock`."""

    def __init__(self, path: Path | str, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._free: int | None = None

    def bytes(self) -> int | None:
        """Free bytes (None when the filesystem cannot be asked)."""
        now = self.clock()
        with self._lock:
            if self._read_at is None or now - self._read_at >= self.interval_s:
                self._read_at = now
                try:
                    st = os.statvfs(self._existing())
                    self._free = int(st.f_bavail) * int(st.f_frsize)
                except OSError:
                    self._free = None
            return self._free

    def _existing(self) -> Path:
        """The path, or its nearest existing parent (a store not created yet)."""
        p = self.path
        while not p.exists() and p.parent != p:
            p = p.parent
        return p


class DiskReserve:
    """`reserve_mb` of free space left on the store's filesystem for everyone else: sensor
    rows pause while there is less (notes do not). 0 = no reserve."""

    def __init__(self, path: Path | str, reserve_mb: float, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reserve_bytes = int(max(0.0, float(reserve_mb)) * MB)
        self.free = FreeSpace(path, interval_s, clock)

    def reached(self) -> bool:
        """True while free space is below the reserve (never without a reserve)."""
        if self.reserve_bytes <= 0:
            return False
        free = self.free.bytes()
        return free is not None and free < self.reserve_bytes


class RateLimitedLog:
    """Says a recurring problem at most once per `period_s` per key, with how many times it
    happened since it was last said; `recovered(key, ...)` says that it ended, once per time
    the problem was said (a disk that fills and frees by turns is not a line a second)."""

    def __init__(self, say: Callable[[str], Any], period_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 say_recovered: Callable[[str], Any] | None = None) -> None:
        self.say, self.period_s, self.clock = say, period_s, clock
        self.say_recovered = say_recovered or say
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # when each key was last said
        self._since: dict[str, int] = {}  # occurrences since then
        self._active: set[str] = set()  # keys whose problem goes on
        self._unresolved: set[str] = set()  # said, and its end not said yet

    def __call__(self, key: str, message: str, n: int = 1,
                 say: Callable[[str], Any] | None = None) -> bool:
        """Count `n` occurrences; say `message` (through `say`, default the log's own) when
        the key was not said in the last period. True when said."""
        now = self.clock()
        with self._lock:
            self._active.add(key)
            self._since[key] = self._since.get(key, 0) + n
            last = self._last.get(key)
            if last is not None and now - last < self.period_s:
                return False
            count, self._since[key] = self._since[key], 0
            self._last[key] = now
            self._unresolved.add(key)
        more = f" ({count} times since last said)" if last is not None and count > n else ""
        (say or self.say)(message + more)
        return True

    def active(self, key: str) -> bool:
        with self._lock:
            return key in self._active

    def recovered(self, key: str, message: str,
                  say: Callable[[str], Any] | None = None) -> None:
        """The problem `key` ended: said when its start was said since the last end."""
        with self._lock:
            self._active.discard(key)
            if key not in self._unresolved:
                return
            self._unresolved.discard(key)
        (say or self.say_recovered)(message)


class NotStored:
    """Rows kept but not stored, counted by reason (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def total(self, reasons: tuple[str, ...] | None = None) -> int:
        with self._lock:
            return sum(n for r, n in self.counts.items() if reasons is None or r in reasons)
