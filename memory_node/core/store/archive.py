"""The SQLite store's archive: rows compaction thinned or folded, moved aside, never deleted.

An archived row leaves `observations` (and the R*Tree, and the vector change feed) for
`archive`, its vector copied into `archive_vectors` and its vector-file slot counted dead,
all in one transaction; its camera view stays for `seen_near` over archived rows. Only the
disk budget (eviction.py) removes archived rows for good.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from memory_node.core.store.rows import TagKeys, tags_json
from memory_node.core.store.sqlite_db import SqliteDb
from memory_node.core.store.vector_slots import Key, VectorSlots


class Archive:
    """Moves rows into the archive and reads archived vectors back (archived searches)."""

    def __init__(self, db: SqliteDb, slots: VectorSlots, tag_keys: TagKeys):
        self.db = db
        self.slots = slots
        self.tag_keys = tag_keys

    def archive(self, ids: Sequence[int], reason: str, kept: dict[int, int] | None = None,
                kept_tags: tuple[int, Callable[[int], dict]] | None = None,
                at: float | None = None) -> int:
        """`at`: the archive time to record (the compaction's clock; default wall time)."""
        if not ids:
            return 0
        kept = kept or {}
        now = time.time() if at is None else float(at)
        moved = 0
        with self.db.transaction() as w:
            vectors = self._vectors_w(ids)
            dead: dict[Key, int] = {}
            for oid in ids:
                cur = w.execute(
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
                    w.execute("INSERT OR IGNORE INTO archive_vectors(id, embedding)"
                              " VALUES (?, ?)", (oid, vec.tobytes()))
                    w.execute("DELETE FROM vectors WHERE id=?", (oid,))
                    dead[key] = dead.get(key, 0) + 1
                w.execute("DELETE FROM observations WHERE id=?", (oid,))
                w.execute("DELETE FROM obs_xy WHERE id=?", (oid,))
                if had_vec:
                    w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')", (oid,))
                moved += 1
            if kept_tags is not None and moved:
                kept_id, tags_for = kept_tags
                new_tags = tags_for(moved)
                w.execute("UPDATE observations SET tags=? WHERE id=?",
                          (tags_json(new_tags), kept_id))
                row = w.execute("SELECT stream FROM observations WHERE id=?",
                                (kept_id,)).fetchone()
                if row is not None:
                    self.tag_keys.note(row[0], new_tags)
            self.slots.retire(dead)
        return moved

    def _vectors_w(self, ids: Sequence[int]) -> dict[int, tuple[Key, np.ndarray]]:
        """{id: ((model, stream), vector)} of the rows that have one, read in the write
        transaction (archive copies them)."""
        return {oid: ((r[1], r[0]), np.array(r[5]))
                for oid, r in self.slots.read(ids, writing=True).items()}

    def archived_vectors(self, ids: Sequence[int]) -> dict[int, tuple[str | None, np.ndarray]]:
        """{id: (model id, vector)} of archived rows that kept their vector."""
        out: dict[int, tuple[str | None, np.ndarray]] = {}
        ids = [int(i) for i in ids]
        with self.db.rlock:
            for start in range(0, len(ids), 900):
                chunk = ids[start:start + 900]
                marks = ",".join("?" * len(chunk))
                for oid, model_id, blob in self.db.r.execute(
                    "SELECT a.id, a.model_id, v.embedding FROM archive a JOIN archive_vectors v"
                    f" ON v.id = a.id WHERE a.id IN ({marks})", chunk
                ):
                    out[oid] = (model_id, np.frombuffer(blob, dtype=np.float32))
        return out

    def archived_count(self) -> int:
        with self.db.rlock:
            return int(self.db.r.execute("SELECT count(*) FROM archive").fetchone()[0])
