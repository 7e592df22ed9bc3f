"""The SQLite (WAL) observation store: the source of truth, shared by processes on one directory.

`SqliteObservationStore` is the one object the engine, compaction, the budget and the tools
hold; each of its jobs is a part of its own over the one pair of connections (sqlite_db.py):
the schema and its migrations (schema.py), rows (rows.py, row_query.py), the vector-file
slots (vector_slots.py), the archive (archive.py), the vector change feed (change_feed.py) and
the disk budget's eviction (eviction.py). This class only opens them and forwards the
interface, so a part is read and changed on its own.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory_node.core.store import pose_index, schema
from memory_node.core.store.archive import Archive
from memory_node.core.store.base import (
    Candidates,
    CompactionStore,
    KeyVectors,
    ObservationStore,
    VectorChange,
    VectorFeed,
)
from memory_node.core.store.change_feed import ChangeFeed
from memory_node.core.store.eviction import Eviction
from memory_node.core.store.row_query import RowQuery
from memory_node.core.store.rows import RowReader, RowWriter, TagKeys
from memory_node.core.store.sqlite_db import SqliteDb
from memory_node.core.store.vector_files import VectorFiles
from memory_node.core.store.vector_slots import Key, VectorSlots
from memory_node.core.types import Observation, RowFilter


class SqliteObservationStore(ObservationStore):
    """memory.db and its vector files, composed of one part per job over shared connections.

    WAL lets the read connection (searches) run while another thread or process writes.
    """

    def __init__(self, db_path: Path, *, timeout_s: float = 10.0):
        self._db = SqliteDb(db_path, timeout_s, schema.prepare)
        self.path: Path = self._db.path
        self.files: VectorFiles = self._db.files
        slots = VectorSlots(self._db)
        tag_keys = TagKeys(self._db)
        self._rows = RowWriter(self._db, slots, tag_keys)
        self._reads = RowReader(self._db)
        self._query = RowQuery(self._db)
        self._archive = Archive(self._db, slots, tag_keys)
        self._feed = ChangeFeed(self._db, slots)
        self._eviction = Eviction(self._db, slots)

    # The connections and their locks, for tests that reach under the interface. The methods
    # below forward to the parts, whose docstrings say what each does.
    @property
    def _w(self) -> sqlite3.Connection:
        return self._db.w

    @property
    def _r(self) -> sqlite3.Connection:
        return self._db.r

    @property
    def _wlock(self) -> threading.RLock:
        return self._db.wlock

    @property
    def _rlock(self) -> threading.RLock:
        return self._db.rlock

    # ---- memory.db itself (sqlite_db.py) -----------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        return self._db.get_meta(key)

    def set_meta(self, key: str, value: str) -> None:
        self._db.set_meta(key, value)

    def data_version(self) -> int:
        """Changes whenever another connection (thread or process) commits."""
        return self._db.data_version()

    def close(self) -> None:
        self._db.close()

    # ---- Rows: writes (rows.py) --------------------------------------------------------------
    def insert(
        self, rows: Sequence[Observation], vectors: Sequence[np.ndarray | None]
    ) -> list[int]:
        return self._rows.insert(rows, vectors)

    def set_vector(self, obs_id: int, vector: np.ndarray, model_id: str) -> None:
        self._rows.set_vector(obs_id, vector, model_id)

    def set_text(self, obs_id: int, text: str, tags: dict[str, Any],
                 vector: np.ndarray | None = None, model_id: str | None = None) -> bool:
        return self._rows.set_text(obs_id, text, tags, vector, model_id)

    def update_tags(self, obs_id: int, tags: dict[str, Any]) -> None:
        self._rows.update_tags(obs_id, tags)

    # ---- Rows: reads by id, stream, tag, model (rows.py) -------------------------------------
    def get(self, ids: Sequence[int], include_archived: bool = False
            ) -> dict[int, Observation]:
        return self._reads.get(ids, include_archived)

    def tagged(self, stream: str, key: str, value: str, after_id: int = 0,
               limit: int = 1000) -> list[Observation]:
        return self._reads.tagged(stream, key, value, after_id, limit)

    def tag_counts(self, stream: str, key: str) -> dict[str, int]:
        return self._reads.tag_counts(stream, key)

    def rows_not_of_model(self, stream: str, model_id: str, after_id: int = 0,
                          limit: int = 64) -> list[Observation]:
        return self._reads.rows_not_of_model(stream, model_id, after_id, limit)

    def model_counts(self, stream: str) -> dict[str | None, int]:
        return self._reads.model_counts(stream)

    def rows_without_vectors(self, streams: Sequence[str]) -> list[Observation]:
        return self._reads.rows_without_vectors(streams)

    def note_keys(self) -> set[str]:
        return self._reads.note_keys()

    def rows_of(self, streams: Sequence[str], *, before_t: float | None = None,
                after_id: int = 0, with_vectors: bool = False) -> list[Observation]:
        return self._reads.rows_of(streams, before_t=before_t, after_id=after_id,
                                   with_vectors=with_vectors)

    def tag_catalogue(self) -> dict[str, dict[str, bool]]:
        return self._reads.tag_catalogue()

    def has_tag(self, streams: Sequence[str] | None, tag: str) -> bool:
        return self._reads.has_tag(streams, tag)

    def rows(self, where: str = "", params: Sequence[Any] = ()) -> list[Observation]:
        return self._reads.rows(where, params)

    def stream_stats(self) -> list[dict]:
        return self._reads.stream_stats()

    def stream_names(self) -> set[str]:
        return self._reads.stream_names()

    def count(self) -> int:
        return self._reads.count()

    def views_of(self, ids: Sequence[int]) -> dict[int, Any]:
        return self._reads.views_of(ids)

    def newest_t(self, streams: Sequence[str]) -> float | None:
        return self._reads.newest_t(streams)

    # ---- Filtered reads and the pose history (row_query.py) ----------------------------------
    def candidates(self, filt: RowFilter) -> Candidates:
        return self._query.candidates(filt)

    def ordered(self, filt: RowFilter, order_by: str, limit: int) -> list[Observation]:
        return self._query.ordered(filt, order_by, limit)

    def pose_track(self, t_min: float | None = None, t_max: float | None = None,
                   streams: Sequence[str] | None = None) -> np.ndarray:
        return self._query.pose_track(t_min, t_max, streams)

    def pose_excerpt(self, centre: tuple[float, float], radius: float,
                     t_min: float | None = None, t_max: float | None = None
                     ) -> pose_index.PoseExcerpt | None:
        return self._query.pose_excerpt(centre, radius, t_min, t_max)

    # ---- The archive (archive.py) ------------------------------------------------------------
    def archive(self, ids: Sequence[int], reason: str, kept: dict[int, int] | None = None,
                kept_tags: tuple[int, Callable[[int], dict]] | None = None,
                at: float | None = None) -> int:
        return self._archive.archive(ids, reason, kept, kept_tags, at)

    def archived_vectors(self, ids: Sequence[int]) -> dict[int, tuple[str | None, np.ndarray]]:
        return self._archive.archived_vectors(ids)

    def archived_count(self) -> int:
        return self._archive.archived_count()

    # ---- The vector change feed (change_feed.py) ---------------------------------------------
    def max_vector_seq(self) -> int:
        return self._feed.max_vector_seq()

    def vector_changes(self, after_seq: int) -> Iterator[VectorChange]:
        return self._feed.vector_changes(after_seq)

    def vector_rows(self, ids: Sequence[int]) -> dict[int, tuple]:
        return self._feed.vector_rows(ids)

    def vector_places(self, ids: Sequence[int]) -> dict[int, tuple]:
        return self._feed.vector_places(ids)

    def added_ids_at(self, seqs: Sequence[int]) -> list[int]:
        return self._feed.added_ids_at(seqs)

    def vector_file_states(self) -> dict[Key, tuple[int, int, int]]:
        return self._feed.vector_file_states()

    def key_vectors(self, model_id: str, stream: str) -> KeyVectors:
        return self._feed.key_vectors(model_id, stream)

    def all_vectors(self) -> Iterator[tuple]:
        return self._feed.all_vectors()

    def drop_vectors(self, ids: Sequence[int], why: str) -> int:
        return self._feed.drop_vectors(ids, why)

    # ---- The disk budget's reads and writes (eviction.py) ------------------------------------
    def prepare_eviction(self) -> None:
        self._eviction.prepare_eviction()

    def max_row_id(self) -> int:
        return self._eviction.max_row_id()

    def refs_after(self, after_id: int) -> list[tuple[int, str]]:
        return self._eviction.refs_after(after_id)

    def oldest_times(self) -> dict[str, float]:
        return self._eviction.oldest_times()

    def next_t(self, streams: Sequence[str], at_or_after: float = -math.inf) -> float | None:
        return self._eviction.next_t(streams, at_or_after)

    def rows_between(self, streams: Sequence[str], t_lo: float, t_hi: float
                     ) -> list[Observation]:
        return self._eviction.rows_between(streams, t_lo, t_hi)

    def archived_with_blobs(self, streams: Sequence[str], limit: int
                            ) -> list[tuple[int, float, str]]:
        return self._eviction.archived_with_blobs(streams, limit)

    def archived_rows(self, streams: Sequence[str], limit: int
                      ) -> list[tuple[int, str, float, bool]]:
        return self._eviction.archived_rows(streams, limit)

    def pose_buckets(self, t_lo: float, t_hi: float, step: float,
                     excluding: set[int]) -> set[int]:
        return self._eviction.pose_buckets(t_lo, t_hi, step, excluding)

    def pose_samples(self, streams: Sequence[str], after_t: float, limit: int
                     ) -> list[tuple[str, int, float]]:
        return self._eviction.pose_samples(streams, after_t, limit)

    def evicted_counts(self) -> dict[str, tuple[int, float]]:
        return self._eviction.evicted_counts()

    def drop_archived_blobs(self, ids: Sequence[int]) -> list[str]:
        return self._eviction.drop_archived_blobs(ids)

    def evict(self, items: Sequence[tuple[str, int]], keep_pose: set[int], at: float
              ) -> list[str]:
        return self._eviction.evict(items, keep_pose, at)

    def finish_pending_blobs(self, root: Path) -> int:
        return self._eviction.finish_pending_blobs(root)

    def reclaim(self) -> None:
        self._eviction.reclaim()

    def free_pages(self) -> tuple[int, int, int]:
        return self._eviction.free_pages()

    def vacuum_into_incremental(self) -> bool:
        return self._eviction.vacuum_into_incremental()

    def meta_items(self, prefix: str) -> dict[str, Any]:
        return self._eviction.meta_items(prefix)


# Checked by mypy: this store is what the vector indexes and compaction are typed against.
_IS_VECTOR_FEED: type[VectorFeed] = SqliteObservationStore
_IS_COMPACTION_STORE: type[CompactionStore] = SqliteObservationStore
