"""Compaction and the disk budget: on request (`compact`) and in the background
(compact_interval_s > 0), one at a time."""

from __future__ import annotations

import logging
import threading
from typing import Any

from memory_node.core.budget import DiskBudget
from memory_node.core.compaction import Compactor
from memory_node.core.contract import CompactAnswer
from memory_node.core.errors import Unavailable
from memory_node.core.maintenance import Maintenance
from memory_node.core.operations.host import Host
from memory_node.core.operations.saving import NoteSaving

log = logging.getLogger(__name__)


class Upkeep:
    """`compact` and the background maintenance job of a robot's own memory. Summaries
    compaction writes are saved as notes (`NoteSaving.save_note`)."""

    def __init__(self, host: Host, saving: NoteSaving, llm_settings: Any):
        self.host = host
        self.saving = saving
        self.llm_settings = llm_settings
        self.lock = threading.Lock()  # one compaction (or budget pass) at a time
        self.job: Maintenance | None = None

    def compact(self) -> CompactAnswer:
        """`compact`: one pass (another one running: Unavailable)."""
        if not self.lock.acquire(blocking=False):
            raise Unavailable("a compaction is already running")
        host = self.host
        try:
            job = self.job
            compactor = Compactor(
                host._store, host.config, clock=host.clock, sync=host.sync,
                vector_of=host._indexes.vector, llm_settings=self.llm_settings,
                save_summary=self.saving.save_note,
                cancelled=lambda: job is not None and job.stopping)
            answer = compactor.run()
            if host._disk.budget_bytes is not None:
                answer["budget"] = host._disk.enforce()
                host.sync()
            return CompactAnswer.model_validate(answer)
        finally:
            self.lock.release()

    def start(self) -> None:
        """The disk budget, and compaction and the budget in the background
        (compact_interval_s > 0)."""
        host = self.host
        cfg = host.config
        disk = host.disk = DiskBudget(host._store, cfg)
        host._store.prepare_eviction()
        if cfg.compact_interval_s <= 0:
            return
        job = Maintenance(cfg.root, interval_s=cfg.compact_interval_s,
                          compact=self.background_compact,
                          enforce_budget=self.background_budget
                          if disk.budget_bytes is not None else None)
        disk.cancelled = lambda: job.stopping
        self.job = job
        job.start()

    def stop(self) -> None:
        """Stop the background job (first when closing: it writes to the store)."""
        if self.job is not None:
            self.job.stop()
            self.job = None

    def background_compact(self) -> None:
        try:
            self.compact()
        except Unavailable as exc:  # a requested compaction is running, or closing
            log.debug("background compaction skipped: %s", exc.message)

    def background_budget(self) -> None:
        if self.lock.acquire(blocking=False):  # else a compaction runs it
            try:
                if self.host._disk.enforce().get("rows_removed"):
                    self.host.sync()
            finally:
                self.lock.release()
