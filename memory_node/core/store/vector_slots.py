"""Where the SQLite store's vectors are: slots of the vector files, named in memory.db.

The `vectors` table names each row's slot in the file of its model and stream (and the CRC-32
its bytes had), `vector_files` each file's generation, dimension, committed and dead rows.
Writes here run inside the caller's write transaction: a vector is written and fsynced after
its file's committed rows before the transaction names its slot, so a crash leaves at most
bytes no row names. Dead rows (archived, re-embedded, damaged) are counted, and a file with
enough of them is written again without them as its next generation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from memory_node.core.store.sqlite_db import SqliteDb
from memory_node.core.store.vector_files import DIR_NAME, row_crcs

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (model_id, stream)

# Compaction writes a vector file's live rows into a new generation once this share of its
# rows (and at least REWRITE_MIN_DEAD) are dead: archived or re-embedded.
REWRITE_DEAD_SHARE = 0.25
REWRITE_MIN_DEAD = 64

# Rows with a vector, joined to where it is (`o`: the row, `v`: its slot, `f`: its file).
VEC_FROM = (" FROM observations o JOIN vectors v ON v.id = o.id JOIN vector_files f"
            " ON f.model_id = o.model_id AND f.stream = o.stream")
# A vector row as `VectorSlots.read` selects it: its observation's fields, then where it is.
_VEC_SELECT = "SELECT o.id, o.stream, o.model_id, o.t, o.x, o.y, v.slot, f.gen, f.dim" + \
    VEC_FROM


class VectorSlots:
    """Appends, reads, retires and rewrites the vector-file slots memory.db names."""

    def __init__(self, db: SqliteDb):
        self.db = db
        self.files = db.files
        self._unreadable_files: set[tuple[str, str, int]] = set()

    # ---- writes (inside the caller's write transaction) --------------------------------------
    def append(self, items: Sequence[tuple[int, str, str, np.ndarray]]) -> None:
        """Write each (id, model, stream, vector) after its file's committed rows, fsync, and
        name the slots: the caller's commit then makes them part of memory.db."""
        w = self.db.w
        by_key: dict[Key, list[tuple[int, np.ndarray]]] = {}
        for oid, model_id, stream, vec in items:
            by_key.setdefault((model_id, stream), []).append((oid, vec))
        for (model_id, stream), rows in by_key.items():
            vecs = np.stack([np.asarray(v, np.float32).reshape(-1) for _i, v in rows])
            got = w.execute("SELECT gen, dim, rows FROM vector_files WHERE model_id=?"
                            " AND stream=?", (model_id, stream)).fetchone()
            if got is None:
                gen, dim, committed = 1, vecs.shape[1], 0
                w.execute("INSERT INTO vector_files(model_id, stream, gen, dim, rows)"
                          " VALUES (?, ?, 1, ?, 0)", (model_id, stream, dim))
            else:
                gen, dim, committed = got
            if vecs.shape[1] != dim:
                raise ValueError(f"{model_id} vectors of {stream} have {dim} dimensions, not "
                                 f"{vecs.shape[1]}")
            self.files.append(self.files.path(model_id, stream, gen), committed, vecs)
            w.executemany(
                "INSERT INTO vectors(id, slot, crc) VALUES (?, ?, ?)",
                [(oid, committed + i, crc) for i, ((oid, _v), crc)
                 in enumerate(zip(rows, row_crcs(vecs), strict=True))])
            w.execute("UPDATE vector_files SET rows = rows + ? WHERE model_id=? AND"
                      " stream=?", (len(rows), model_id, stream))

    def mark_dead(self, model_id: str, stream: str, n: int) -> tuple[int, int]:
        """Count `n` more dead rows (archived, re-embedded, damaged) in a file; its (rows,
        dead) after."""
        self.db.w.execute("UPDATE vector_files SET dead = dead + ? WHERE model_id=? AND"
                          " stream=?", (n, model_id, stream))
        return self.db.w.execute("SELECT rows, dead FROM vector_files WHERE model_id=? AND"
                                 " stream=?", (model_id, stream)).fetchone()

    def retire(self, dead: dict[Key, int]) -> None:
        """Count the dead rows of each file; rewrite the files that now hold enough of them."""
        for (model_id, stream), n in dead.items():
            rows, dead_now = self.mark_dead(model_id, stream, n)
            if dead_now >= max(REWRITE_MIN_DEAD, REWRITE_DEAD_SHARE * rows):
                self.rewrite(model_id, stream)

    def rewrite(self, model_id: str, stream: str) -> None:
        """Write the live rows of a file into its next generation and move their slots (in the
        caller's transaction; the old file is deleted once it commits)."""
        w = self.db.w
        gen, dim, rows = w.execute(
            "SELECT gen, dim, rows FROM vector_files WHERE model_id=? AND stream=?",
            (model_id, stream)).fetchone()
        live = w.execute(
            "SELECT v.id, v.slot FROM vectors v JOIN observations o ON o.id = v.id"
            " WHERE o.model_id=? AND o.stream=? ORDER BY v.slot", (model_id, stream)).fetchall()
        slots = np.fromiter((r[1] for r in live), np.int64, len(live))
        old = self.files.map(model_id, stream, gen, dim,
                             int(slots.max()) + 1 if len(slots) else 0).array
        old_path = self.files.path(model_id, stream, gen)
        new_path = self.files.path(model_id, stream, gen + 1)
        self.db.after_rollback.append(lambda: new_path.unlink(missing_ok=True))
        self.files.write_generation(
            new_path, (old[slots[i:i + 65536]] for i in range(0, len(slots), 65536)))
        w.executemany("UPDATE vectors SET slot=? WHERE id=?",
                      [(i, r[0]) for i, r in enumerate(live)])
        w.execute("UPDATE vector_files SET gen=?, rows=?, dead=0 WHERE model_id=? AND"
                  " stream=?", (gen + 1, len(live), model_id, stream))

        def drop_old() -> None:
            self.files.forget(old_path)
            old_path.unlink(missing_ok=True)

        self.db.after_commit.append(drop_old)
        log.info("vector file of %s in %s rewritten without its %d dead rows: %d rows, "
                 "generation %d", model_id, stream, rows - len(live), len(live), gen + 1)

    def remove_unnamed_files(self) -> None:
        """Files no generation names: a rewrite or migration a crash cut short (under the
        write lock, so no other process is writing one)."""
        if not self.files.root.is_dir():
            return
        named = {self.files.path(m, st, g).name for m, st, g in self.db.w.execute(
            "SELECT model_id, stream, gen FROM vector_files")}
        for p in self.files.root.iterdir():
            if p.suffix == ".f32" and p.name not in named:
                log.info("removing %s/%s: no generation of memory.db names it", DIR_NAME,
                         p.name)
                p.unlink(missing_ok=True)

    # ---- reads ----------------------------------------------------------------------------
    def read(self, ids: Sequence[int], writing: bool = False) -> dict[int, tuple]:
        """{id: (stream, model_id, t, x, y, vector, gen, slot)}, vectors read from their
        files (views of the maps); read again when compaction replaced a file in between.
        Rows whose file is missing or shorter than memory.db says are left out, with one
        error per file (the next start checks every row of it). `writing`: inside the write
        transaction, on its connection."""
        ids = [int(i) for i in ids]
        db = self.db
        conn, lock = (db.w, db.wlock) if writing else (db.r, db.rlock)
        out: dict[int, tuple] = {}
        for attempt in range(5):
            out, gone = {}, None
            with lock:
                for start in range(0, len(ids), 900):
                    chunk = ids[start:start + 900]
                    marks = ",".join("?" * len(chunk))
                    for (oid, stream, model_id, t, x, y, slot, gen, dim) in \
                            conn.execute(f"{_VEC_SELECT} WHERE o.id IN ({marks})",
                                         chunk).fetchall():
                        try:
                            arr = self.files.map(model_id, stream, gen, dim, slot + 1).array
                        except FileNotFoundError as exc:
                            gone = (model_id, stream, gen, exc)
                            continue
                        except (OSError, ValueError) as exc:
                            self._unreadable(model_id, stream, gen, exc)
                            continue
                        out[oid] = (stream, model_id, t, x, y, arr[slot], gen, slot)
            if gone is None:
                return out
            if attempt == 4:  # not a compaction's new generation: the file is gone
                self._unreadable(*gone)
        return out

    def _unreadable(self, model_id: str, stream: str, gen: int, exc: Exception) -> None:
        if (model_id, stream, gen) not in self._unreadable_files:
            self._unreadable_files.add((model_id, stream, gen))
            log.error("vector file %s of %s in %s unreadable (%s): its rows stay unindexed "
                      "until the next start checks it", self.files.path(model_id, stream, gen).name,
                      model_id, stream, exc)
