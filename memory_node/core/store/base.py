"""The observation store interface: the source of truth the indexes are rebuilt from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from memory_node.core.store.vector_files import VectorMap
from memory_node.core.types import Observation, RowFilter


@dataclass
class Candidates:
    """Rows that pass every filter of a request, as parallel arrays (for exact scoring)."""

    ids: np.ndarray  # int64
    streams: list[str]
    model_ids: list[str | None]


@dataclass
class VectorChange:
    """One entry of the vector change feed: a vector appeared (`add`) or went away (`del`)."""

    seq: int
    obs_id: int
    op: str
    stream: str | None = None
    model_id: str | None = None
    vector: np.ndarray | None = None
    t: float | None = None  # the row's time and place, for pre-filtering in memory
    x: float | None = None
    y: float | None = None
    gen: int | None = None  # where the vector is: its file's generation and its slot there
    slot: int | None = None


@dataclass
class KeyVectors:
    """Every vector row of one (model, stream) in slot order, and its file's state."""

    model_id: str
    stream: str
    gen: int  # 0: no file
    dim: int
    rows: int  # committed rows in the file (dead ones included)
    ids: np.ndarray  # int64
    slots: np.ndarray  # int64, increasing
    crcs: np.ndarray  # int64: CRC-32 of each row's bytes
    meta: np.ndarray  # (n, 3) float64: t, x, y (NaN: no pose)


class ObservationStore(ABC):
    """Durable rows + filters. Implementations must be safe to share between threads."""

    @abstractmethod
    def insert(
        self, rows: Sequence[Observation], vectors: Sequence[np.ndarray | None]
    ) -> list[int]:
        """Insert rows atomically (all or none); returns their ids in order."""

    @abstractmethod
    def get(self, ids: Sequence[int]) -> dict[int, Observation]: ...

    @abstractmethod
    def candidates(self, where: RowFilter) -> Candidates:
        """Every row passing the stream, spatial, temporal and tag filters of `where`."""

    @abstractmethod
    def ordered(self, where: RowFilter, order_by: str, limit: int) -> list[Observation]:
        """Rows passing the filters, ordered by `order_by`: 'time', '-time' (also for
        'score'), or a numeric tag ('-brightness': highest first; rows without it last)."""

    @abstractmethod
    def vector_changes(self, after_seq: int) -> Iterator[VectorChange]:
        """The change feed of vectors since `after_seq` (adds carry the vector)."""

    @abstractmethod
    def set_vector(self, obs_id: int, vector: np.ndarray, model_id: str) -> None: ...

    @abstractmethod
    def archive(self, ids: Sequence[int], reason: str, kept: dict[int, int] | None = None,
                kept_tags: tuple[int, Callable[[int], dict]] | None = None) -> int:
        """Move rows out of the searchable set into the archive; nothing is destroyed.

        `kept_tags` = (id, f): in the same transaction, row id's tags become f(rows moved), so a
        crash never leaves rows archived without the kept row counting them."""

    @abstractmethod
    def stream_stats(self) -> list[dict]: ...

    def tag_catalogue(self) -> dict[str, dict[str, bool]] | None:
        """stream -> {tag name: whether it ever holds a number}, for checking and suggesting
        tag names; None when the store does not keep one (then names are not checked)."""
        return None

    def has_tag(self, streams: Sequence[str] | None, tag: str) -> bool:
        """Whether any row (of `streams`, or any) carries `tag`: the catalogue's double check."""
        return True

    # Named places, visits, view-cone searches and the archive: a store that lacks one of these
    # leaves it unimplemented; an engine over such a store names the request fields it cannot
    # serve in `MemoryEngine.UNSUPPORTED_SEARCH` (answered bad_request, never called). The
    # fleet engine serves them all, from its own PostgreSQL store.
    def pose_track(self, t_min: float | None = None, t_max: float | None = None,
                   streams: Sequence[str] | None = None) -> np.ndarray:
        """(t, x, y) of every row with a pose, kept or archived, in time order (visits)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no pose history")

    def archived_vectors(self, ids: Sequence[int]) -> dict[int, tuple[str | None, np.ndarray]]:
        """{id: (model id, vector)} of archived rows that kept their vector."""
        raise NotImplementedError(f"{type(self).__name__} has no archive to search")

    def newest_t(self, streams: Sequence[str]) -> float | None:
        """The time of the newest row of `streams`, kept or archived."""
        raise NotImplementedError

    @abstractmethod
    def close(self) -> None: ...


class VectorFileReader(Protocol):
    """The read side of a store's vector files: where a generation is, and a map of it."""

    def path(self, model_id: str, stream: str, gen: int) -> Path: ...

    def map(self, model_id: str, stream: str, gen: int, dim: int, rows: int) -> VectorMap: ...


class VectorFeed(Protocol):
    """What the vector indexes and their on-disk cache read from a store: the change feed and
    its position, each (model, stream)'s rows and file, the checks the cache is verified
    with. Nothing else, so the indexes do not depend on one store's class."""

    @property
    def files(self) -> VectorFileReader: ...

    def data_version(self) -> int:
        """Changes whenever another connection commits: the feed is read only then."""
        ...

    def max_vector_seq(self) -> int: ...

    def vector_changes(self, after_seq: int) -> Iterator[VectorChange]: ...

    def vector_file_states(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        """{(model, stream): (generation, dimension, committed rows)}."""
        ...

    def key_vectors(self, model_id: str, stream: str) -> KeyVectors: ...

    def drop_vectors(self, ids: Sequence[int], why: str) -> int: ...

    def vector_places(self, ids: Sequence[int]) -> dict[int, tuple]: ...

    def added_ids_at(self, seqs: Sequence[int]) -> list[int]: ...

    def archived_vectors(self, ids: Sequence[int]) -> dict[int, tuple[str | None, np.ndarray]]:
        ...

    def get_meta(self, key: str) -> str | None:
        """The cache's manifest names the database by its `db_uuid`."""
        ...


class CompactionStore(Protocol):
    """What compaction (`core/compaction.py`) reads and writes: rows by age and id, the
    archive, and the meta keys that record how far it got."""

    def rows_of(self, streams: Sequence[str], *, before_t: float | None = None,
                after_id: int = 0, with_vectors: bool = False) -> list[Observation]: ...

    def archive(self, ids: Sequence[int], reason: str, kept: dict[int, int] | None = None,
                kept_tags: tuple[int, Callable[[int], dict]] | None = None,
                at: float | None = None) -> int: ...

    def archived_count(self) -> int: ...

    def rows_between(self, streams: Sequence[str], t_lo: float, t_hi: float
                     ) -> list[Observation]: ...

    def next_t(self, streams: Sequence[str], at_or_after: float = ...) -> float | None: ...

    def newest_t(self, streams: Sequence[str]) -> float | None: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...
