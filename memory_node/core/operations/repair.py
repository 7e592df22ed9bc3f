"""Start-up repair: what a crash or a full disk left half done is finished when the memory
opens (and by the notes' catch-up while it is open). The Markdown notes are the record of
notes; memory.db and the vectors follow them."""

from __future__ import annotations

import logging

import numpy as np

from memory_node.core.config import NOTE_STREAMS
from memory_node.core.operations.host import Host
from memory_node.core.places import PLACES_STREAM
from memory_node.core.types import Observation

log = logging.getLogger(__name__)


class StartupRepair:
    """Rows for notes memory.db lacks, and vectors for rows stored without one."""

    def __init__(self, host: Host):
        self.host = host

    def ingest_note_files(self) -> int:
        """Rows for Markdown entries memory.db lacks (written by hand, or a crash before the
        insert): the Markdown files are the record of notes."""
        host = self.host
        store = host._store
        known = store.note_keys()
        # Place entries are the place registry's (core/places.py), not observations.
        new = [e for e in host._notes.read_all()
               if e.key not in known and e.stream != PLACES_STREAM]
        if not new:
            return 0
        try:
            vecs: list[np.ndarray | None] = list(host._embed_texts([e.text for e in new]))
        except Exception as exc:  # noqa: BLE001
            log.warning("embedding notes from Markdown failed (%s); stored unindexed", exc)
            vecs = [None] * len(new)
        rows = []
        for e in new:
            stream = e.stream if e.stream in host.known_streams() else "events"
            tags = dict(e.tags)
            if e.hand_written:
                tags["hand_written"] = True
            rows.append(Observation(stream=stream, t=e.t, pose=e.pose, tags=tags, text=e.text,
                                    model_id=host.text_model_id, note_key=e.key))
        for row, vec in zip(rows, vecs, strict=True):
            if vec is None:
                row.model_id = None
        store.insert(rows, vecs)
        host.sync()
        return len(rows)

    def index_missing_vectors(self) -> int:
        """Embed rows stored without a vector (indexing failed when they were saved)."""
        host = self.host
        store = host._store
        rows = store.rows_without_vectors(
            [s for s in host.known_streams() if s in NOTE_STREAMS or s == "camera"])
        if not rows:
            return 0
        vecs = host._embed_texts([r.text for r in rows])
        for r, v in zip(rows, vecs, strict=True):
            if r.id is not None:  # rows read from the store
                store.set_vector(r.id, v, host.text_model_id)
        host.sync()
        return len(rows)
