"""The SQLite store's change feed of vectors: how the in-memory indexes keep up with memory.db.

Every vector that appears or goes away is a `vector_log` entry written in the same transaction
as the row, so an index (in this process or another) that read up to a position catches up by
reading the entries after it; an index built from scratch reads each (model, stream)'s rows in
slot order as of one snapshot. This is the read side `VectorFeed` (base.py) names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np

from memory_node.core.store.base import KeyVectors, VectorChange
from memory_node.core.store.sqlite_db import SqliteDb
from memory_node.core.store.vector_slots import VEC_FROM, Key, VectorSlots

log = logging.getLogger(__name__)


class ChangeFeed:
    """The vector change feed and the reads the indexes and their cache check it with."""

    def __init__(self, db: SqliteDb, slots: VectorSlots):
        self.db = db
        self.slots = slots

    def max_vector_seq(self) -> int:
        with self.db.rlock:
            row = self.db.r.execute("SELECT max(seq) FROM vector_log").fetchone()
        return int(row[0] or 0)

    def vector_changes(self, after_seq: int) -> Iterator[VectorChange]:
        with self.db.rlock:
            log_rows = self.db.r.execute(
                "SELECT seq, obs_id, op FROM vector_log WHERE seq > ? ORDER BY seq", (after_seq,)
            ).fetchall()
        vecs = self.slots.read([oid for _, oid, op in log_rows if op == "add"])
        for seq, oid, op in log_rows:
            if op == "add":
                if oid not in vecs:  # archived since; its 'del' follows in the log
                    continue
                stream, model_id, t, x, y, vec, gen, slot = vecs[oid]
                yield VectorChange(seq, oid, "add", stream, model_id, vec, t, x, y, gen, slot)
            else:
                yield VectorChange(seq, oid, "del")

    def vector_rows(self, ids: Sequence[int]) -> dict[int, tuple]:
        """{id: (stream, model_id, t, x, y, vector bytes)} for the given ids that have one."""
        return {oid: (*r[:5], np.asarray(r[5]).tobytes())
                for oid, r in self.slots.read(ids).items()}

    def vector_places(self, ids: Sequence[int]) -> dict[int, tuple]:
        """{id: (stream, model_id, t, x, y, gen, slot, crc)}: where each row's vector is, and
        the CRC-32 its bytes had when written (the index cache's check against memory.db)."""
        out: dict[int, tuple] = {}
        ids = [int(i) for i in ids]
        with self.db.rlock:
            for start in range(0, len(ids), 900):
                chunk = ids[start:start + 900]
                marks = ",".join("?" * len(chunk))
                for row in self.db.r.execute(
                        "SELECT o.id, o.stream, o.model_id, o.t, o.x, o.y, f.gen, v.slot, v.crc"
                        f"{VEC_FROM} WHERE o.id IN ({marks})", chunk):
                    out[row[0]] = row[1:]
        return out

    def added_ids_at(self, seqs: Sequence[int]) -> list[int]:
        """Observation ids whose vector was added at the given change-feed positions."""
        seqs = [int(s) for s in seqs][:900]
        if not seqs:
            return []
        marks = ",".join("?" * len(seqs))
        with self.db.rlock:
            return [r[0] for r in self.db.r.execute(
                f"SELECT obs_id FROM vector_log WHERE op = 'add' AND seq IN ({marks})", seqs)]

    def vector_file_states(self) -> dict[Key, tuple[int, int, int]]:
        """{(model, stream): (generation, dimension, committed rows)} of every vector file."""
        with self.db.rlock:
            return {(m, st): (g, d, r) for m, st, g, d, r in self.db.r.execute(
                "SELECT model_id, stream, gen, dim, rows FROM vector_files")}

    def key_vectors(self, model_id: str, stream: str) -> KeyVectors:
        """Every vector row of one (model, stream) in slot order, with its file, as of one
        snapshot of memory.db (the indexes are built from this)."""
        with self.db.rlock:
            self.db.r.execute("BEGIN")
            try:
                state = self.db.r.execute(
                    "SELECT gen, dim, rows FROM vector_files WHERE model_id=? AND stream=?",
                    (model_id, stream)).fetchone()
                gen, dim, committed = state if state is not None else (0, 0, 0)
                where = ("FROM vectors v JOIN observations o ON o.id = v.id"
                         " WHERE o.model_id=? AND o.stream=?")
                (n,) = self.db.r.execute(f"SELECT count(*) {where}",
                                         (model_id, stream)).fetchone()
                ints = np.empty((n, 3), np.int64)  # id, slot, crc
                meta = np.empty((n, 3), np.float64)  # t, x, y
                cur = self.db.r.execute(
                    f"SELECT v.id, v.slot, v.crc, o.t, coalesce(o.x, 'nan'),"
                    f" coalesce(o.y, 'nan') {where} ORDER BY v.slot", (model_id, stream))
                done = 0
                while batch := cur.fetchmany(65536):
                    arr = np.asarray(batch, dtype=object)
                    ints[done:done + len(batch)] = arr[:, :3].astype(np.int64)
                    meta[done:done + len(batch)] = arr[:, 3:].astype(np.float64)
                    done += len(batch)
            finally:
                self.db.r.execute("COMMIT")
        return KeyVectors(model_id, stream, int(gen), int(dim), int(committed),
                          ids=ints[:done, 0].copy(), slots=ints[:done, 1].copy(),
                          crcs=ints[:done, 2].copy(), meta=meta[:done])

    def all_vectors(self) -> Iterator[tuple]:
        """(id, stream, model_id, t, x, y, vector bytes) of every vector, in id order (tools,
        tests)."""
        with self.db.rlock:
            ids = [r[0] for r in self.db.r.execute("SELECT id FROM vectors ORDER BY id")]
        for start in range(0, len(ids), 10000):
            chunk = self.vector_rows(ids[start:start + 10000])
            for oid in ids[start:start + 10000]:
                if oid in chunk:
                    yield (oid, *chunk[oid])

    def drop_vectors(self, ids: Sequence[int], why: str) -> int:
        """Unindex rows whose stored vector is damaged: the rows stay (found by filters,
        listed after scored rows), their vectors are gone, and rows with text are embedded
        again at the next start. Returns how many lost a vector."""
        dropped = 0
        with self.db.transaction() as w:
            for oid in ids:
                row = w.execute(
                    "SELECT o.model_id, o.stream FROM observations o JOIN vectors v ON"
                    " v.id = o.id WHERE o.id=?", (int(oid),)).fetchone()
                if row is None:
                    continue
                w.execute("DELETE FROM vectors WHERE id=?", (int(oid),))
                w.execute("UPDATE observations SET model_id = NULL WHERE id=?", (int(oid),))
                self.slots.mark_dead(row[0], row[1], 1)
                w.execute("INSERT INTO vector_log(obs_id, op) VALUES (?, 'del')", (int(oid),))
                dropped += 1
        if dropped:
            log.error("%d vectors unindexed (%s): their rows stay, found by filters; rows "
                      "with text are embedded again when the engine starts", dropped, why)
        return dropped
