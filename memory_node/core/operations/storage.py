"""A robot's own memory directory: opened with the engine (store, notes, places, models,
indexes, start-up repair, background jobs) and closed with it (the index cache written for
the next start)."""

from __future__ import annotations

import logging
import time
from typing import Any

from memory_node.core.index_manager import IndexManager
from memory_node.core.local_backend import LocalBackend
from memory_node.core.notes import NotesLog
from memory_node.core.operations.host import Host
from memory_node.core.operations.models import Models
from memory_node.core.operations.repair import StartupRepair
from memory_node.core.operations.saving import NoteSaving
from memory_node.core.operations.upkeep import Upkeep
from memory_node.core.places import Places
from memory_node.core.store.sqlite_store import SqliteObservationStore

log = logging.getLogger(__name__)


class LocalStorage:
    """`Storage` over a memory directory: SQLite, Markdown notes and the vector indexes."""

    def __init__(self, host: Host, models: Models, repair: StartupRepair, saving: NoteSaving,
                 upkeep: Upkeep):
        self.host = host
        self.models = models
        self.repair = repair
        self.saving = saving
        self.upkeep = upkeep
        self.reembedder: Any = None
        self._reembed_done = False
        self._reembed_checked = -1e9
        self._reembed_count = 0

    @property
    def serves(self) -> str:
        return f"memory at {self.host.config.root.resolve()}"

    def open(self) -> None:
        """Create the directory, open the store, load models and build or load the indexes.

        Raises on failure (a missing model, an unwritable directory) so a lifecycle
        `configure` can refuse to activate with the reason.
        """
        host = self.host
        cfg = host.config
        t0 = time.perf_counter()
        for d in (cfg.root, cfg.notes_dir, cfg.index_dir, cfg.blobs_dir):
            d.mkdir(parents=True, exist_ok=True)
        host.store = store = SqliteObservationStore(cfg.db_path)
        host.notes = NotesLog(cfg.notes_dir)
        self.saving.reopen()
        host.places = Places(host._notes)
        self.models.load()
        host.indexes = indexes = IndexManager(cfg, store)
        indexes.load_or_rebuild()
        host.backend = LocalBackend(store, indexes)
        picked = self.repair.ingest_note_files()
        indexed = self.repair.index_missing_vectors()
        self.models.resume_captions()
        self.start_reembed()
        self.upkeep.start()
        log.info(
            "memory opened at %s: %d observations, %d vectors, %d notes picked up from "
            "Markdown, %d rows indexed late, in %.2f s", cfg.root, store.count(),
            indexes.total(), picked, indexed, time.perf_counter() - t0)

    def close(self) -> bool:
        """Write the index cache and close the store. Returns True when the cache was written;
        False when it was not (another process held it, or a write failed: logged), in which
        case the next start loads the previous cache and catches up from memory.db."""
        host = self.host
        persisted = False
        self.upkeep.stop()  # first: it writes to the store
        self.saving.catch_up.close()
        self.models.stop_captioner()
        if self.reembedder is not None:
            self.reembedder.stop()
            self.reembedder = None
        if host.indexes is not None and host.store is not None:
            try:
                persisted = host.indexes.persist()
            except Exception as exc:  # noqa: BLE001 - the index is a cache; log and go on
                log.warning("index cache not written (%s: %s); the next start catches up "
                            "from memory.db", type(exc).__name__, exc)
        if host.indexes is not None:
            host.indexes.close()
        if host.store is not None:
            host.store.close()
        host.store = None
        host.backend = None
        return persisted

    def start_reembed(self) -> None:
        """Camera rows embedded by another model than the configured one (the image
        embedder changed) get the new model's vectors in the background."""
        from memory_node.core.reembed import Reembedder

        host = self.host
        models = self.models
        job = Reembedder(host._store, host.config.root, target=host.camera_model_id,
                         image_embedder=lambda: models.image_embedder,
                         embed_texts=host._embed_texts, sync=host.sync)
        if job.pending() and job.start():
            log.info("%d camera rows carry another model's vectors: re-embedding them with "
                     "%s in the background", job.pending(), host.camera_model_id())
            self.reembedder = job

    def reembed_pending(self) -> int:
        """Camera rows still carrying another model's vectors than the configured one.

        Counting scans the camera rows, so searches do not pay for it each time: once zero,
        it stays zero (only a process configured otherwise writes other vectors); until then
        it is counted at most once a second."""
        if self._reembed_done:
            return 0
        now = time.monotonic()
        if now - self._reembed_checked >= 1.0:
            target = self.host.camera_model_id()
            counts: dict[str | None, int] = self.host._store.model_counts("camera")
            self._reembed_count = sum(int(n) for m, n in counts.items()
                                      if m is not None and m != target)
            self._reembed_checked = now
            self._reembed_done = self._reembed_count == 0
        return self._reembed_count
