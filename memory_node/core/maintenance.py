"""Compaction and the disk budget in the background, every `compact_interval_s`.

One thread per engine; processes sharing a memory directory (memory-recorder and
memory-server) take turns through an flock on `<memory_dir>/.maintenance.lock`, so one runs a
round while the other skips it. Compaction and eviction write in short transactions, so
searches and saves are answered while a round runs; `stop` asks the round to end at its next
batch and waits for it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUDGET_CHECK_MAX_S = 60.0  # with a budget, its size is checked at least this often


class Maintenance:
    """Runs `compact` every `interval_s` and, with a budget, `enforce_budget` every
    min(interval_s, BUDGET_CHECK_MAX_S)."""

    def __init__(self, root: Path, *, interval_s: float, compact: Callable[[], Any],
                 enforce_budget: Callable[[], Any] | None = None):
        self.root = Path(root)
        self.interval_s = float(interval_s)
        self.compact = compact
        self.enforce_budget = enforce_budget
        self.check_s = min(self.interval_s, BUDGET_CHECK_MAX_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0  # compactions run (tests, logs)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="memory-maintenance",
                                        daemon=True)
        self._thread.start()
        log.info("compaction runs every %g s in the background%s", self.interval_s,
                 f"; the disk budget is checked every {self.check_s:g} s"
                 if self.enforce_budget else "")

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("the background compaction did not stop within %g s", timeout_s)
            self._thread = None

    def _run(self) -> None:
        now = time.monotonic()
        next_compact = now + self.interval_s
        next_check = now + self.check_s
        while True:
            wait = min(next_compact, next_check if self.enforce_budget else next_compact)
            if self._stop.wait(max(0.0, wait - time.monotonic())):
                return
            now = time.monotonic()
            jobs: list[tuple[str, Callable[[], Any]]] = []
            if now >= next_compact:
                jobs.append(("compaction", self.compact))
                next_compact = now + self.interval_s
                next_check = now + self.check_s  # a compaction runs the budget too
            elif self.enforce_budget is not None and now >= next_check:
                jobs.append(("the disk budget", self.enforce_budget))
                next_check = now + self.check_s
            for what, job in jobs:
                self._one(what, job)

    def _one(self, what: str, job: Callable[[], Any]) -> None:
        try:
            fd = os.open(self.root / ".maintenance.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            log.warning("background %s skipped: %s", what, exc)
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                log.debug("background %s skipped: another process runs it", what)
                return
            try:
                job()
                if what == "compaction":
                    self.rounds += 1
            except Exception as exc:  # noqa: BLE001 - the thread outlives a failed round
                log.error("background %s failed: %s: %.200s", what, type(exc).__name__, exc)
        finally:
            os.close(fd)
