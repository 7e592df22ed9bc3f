"""The observation store interface: the source of truth the indexes are rebuilt from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from memory_node.core.query import SearchRequest
from memory_node.core.types import Observation


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
    def candidates(self, req: SearchRequest) -> Candidates:
        """Every row passing the stream, spatial, temporal and tag filters of `req`."""

    @abstractmethod
    def ordered(self, req: SearchRequest, limit: int) -> list[Observation]:
        """Rows passing the filters, ordered by `req.order_by` (time or a numeric tag)."""

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

    @abstractmethod
    def close(self) -> None: ...
