"""Work that failed now and must be done as soon as it can: a note kept in its Markdown file
but not in memory.db (a full disk), or stored but not indexed. Retried on a thread of its
own, soon and then less often, until it succeeds; never left for the next start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from memory_node.core.disk import is_disk_full

log = logging.getLogger(__name__)

# The first retry after this many seconds, then twice as long each time up to the cap (a full
# disk is retried at its cap: space may come back any moment and a try is cheap).
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0
DISK_FULL_RETRY_S = 2.0


class CatchUp:
    """Runs `work` on a background thread after `schedule()`, again and again until it
    returns without raising; `work` returns how many items it caught up (logged)."""

    def __init__(self, work: Callable[[], int], what: str = "notes") -> None:
        self.work, self.what = work, what
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> bool:
        """Work scheduled and not yet done."""
        return self._pending

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def schedule(self) -> None:
        """Catch up soon (a thread starts if none runs)."""
        with self._lock:
            if self._stop.is_set():
                return
            self._pending = True
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="memory-catch-up")
                self._thread.start()

    def _run(self) -> None:
        delay = FIRST_RETRY_S
        while not self._stop.is_set():
            self._wake.wait(delay)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                done = self.work()
            except Exception as exc:  # noqa: BLE001 - tried again later
                full = is_disk_full(exc)
                delay = DISK_FULL_RETRY_S if full else min(delay * 2, MAX_RETRY_S)
                log.debug("catching up %s failed (%s); again in %.0f s", self.what, exc, delay)
                continue
            if done:
                log.info("caught up %d %s that could not be stored or indexed before", done,
                         self.what)
            with self._lock:
                if not self._wake.is_set():  # nothing scheduled meanwhile: done
                    self._pending = False
                    self._thread = None
                    return
            delay = FIRST_RETRY_S

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
