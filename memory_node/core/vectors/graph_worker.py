"""The background graph worker: one thread at the lowest CPU priority that builds and extends
every HNSW graph (and reads cached graphs at start-up), so no query waits for graph work.
Searches of a graph that is not ready are exact meanwhile (`GraphIndex`).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

from memory_node.core.vectors.faiss_index import GraphIndex

log = logging.getLogger(__name__)


class GraphWorker:
    """One background thread at the lowest CPU priority doing every index's graph work (full
    builds in cancellable chunks, then pending rows in short slices), so no query waits.
    Other work (reading cached graphs) is submitted as tasks, run before any index's work."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or os.cpu_count() or 1
        _WORKERS.add(self)
        self._queue: list[GraphIndex | Callable[[Callable[[], bool]], None]] = []
        self._cv = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def schedule(self, idx: GraphIndex) -> None:
        with self._cv:
            if self._stopped:
                return
            if not any(i is idx for i in self._queue):
                self._queue.append(idx)
            self._start()

    def submit(self, task: Callable[[Callable[[], bool]], None]) -> None:
        """Run `task(cancelled)` in the background ahead of queued index work (a graph read
        from the cache must not lose its turn to a build of the same graph from scratch)."""
        with self._cv:
            if self._stopped:
                return
            at = next((i for i, q in enumerate(self._queue) if isinstance(q, GraphIndex)),
                      len(self._queue))
            self._queue.insert(at, task)
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memory-graph-worker",
                                            daemon=True)
            self._thread.start()
        self._cv.notify_all()

    def _run(self) -> None:
        try:  # Linux: nice is per thread; the build's OpenMP threads inherit it
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        while True:
            with self._cv:
                while not self._queue and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                idx = self._queue.pop(0)
                self._busy = True
            more = False
            try:
                if isinstance(idx, GraphIndex):
                    more = idx.work(cancelled=lambda: self._stopped, threads=self.threads)
                else:
                    idx(lambda: self._stopped)
            except Exception:  # noqa: BLE001 - searches stay exact; logged once per failure
                log.exception("background graph work failed; searches of it stay exact")
            with self._cv:
                self._busy = False
                if more and not self._stopped and not any(i is idx for i in self._queue):
                    self._queue.append(idx)
                self._cv.notify_all()
            time.sleep(0.0005)  # let a query waiting for the graph take it between slices

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._stopped = True
            self._queue.clear()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)


_WORKERS: weakref.WeakSet[GraphWorker] = weakref.WeakSet()


@atexit.register
def _stop_workers() -> None:
    """A daemon thread still inside faiss when the interpreter exits aborts the process
    ("terminate called without an active exception"): stop each worker at its next chunk."""
    for worker in list(_WORKERS):
        worker.stop(timeout_s=60.0)
