"""What the operation parts read from the engine that composes them, and what may be swapped.

Parts hold the engine itself, not copies of its fields: a test or a tool may set `clock` or
`pose_provider` after the engine is built, and a part opened later must see the store the
engine opened. The engine is typed here as a protocol so this package never imports
core/engine.py back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from memory_node.core.budget import DiskBudget
from memory_node.core.config import MemoryConfig
from memory_node.core.contract import (
    CompactAnswer,
    SaveAnswer,
    SaveNote,
    StreamsAnswer,
    VisitsAnswer,
)
from memory_node.core.disk import RateLimitedLog
from memory_node.core.index_manager import IndexManager
from memory_node.core.notes import NotesLog
from memory_node.core.places import Place, Places
from memory_node.core.planner import SearchBackend
from memory_node.core.query import SearchPlan
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Pose

Clock = Callable[[], float]
PoseProvider = Callable[[], "Pose | None"]


class Host(Protocol):
    """The engine as its parts see it: configuration, clock and pose, the open parts (each
    `_name` raises Unavailable once closed), and the operations parts ask each other for."""

    config: MemoryConfig
    clock: Clock
    pose_provider: PoseProvider
    disk_log: RateLimitedLog
    store: SqliteObservationStore | None
    indexes: IndexManager | None
    backend: SearchBackend[Any] | None
    notes: NotesLog | None
    places: Places | None
    disk: DiskBudget | None
    UNSUPPORTED_SEARCH: dict[str, str]

    @property
    def _store(self) -> SqliteObservationStore: ...

    @property
    def _indexes(self) -> IndexManager: ...

    @property
    def _backend(self) -> SearchBackend[Any]: ...

    @property
    def _notes(self) -> NotesLog: ...

    @property
    def _places(self) -> Places: ...

    @property
    def _disk(self) -> DiskBudget: ...

    @property
    def text_model_id(self) -> str: ...

    def _embed_texts(self, texts: Sequence[str]) -> np.ndarray: ...

    def sync(self) -> int: ...

    def known_streams(self) -> set[str]: ...

    def has_stream(self, name: str) -> bool: ...

    def reembed_pending(self) -> int: ...

    def camera_model_id(self) -> str: ...

    def query_vector(self, model_id: str, text: str) -> np.ndarray | None: ...

    def place(self, name: str) -> Place: ...

    def run_visits(self, plan: SearchPlan) -> VisitsAnswer: ...


class Storage(Protocol):
    """Where the engine's rows live: opened with the engine, closed with it."""

    @property
    def serves(self) -> str:
        """What the engine answers from, for a server's start line."""

    def open(self) -> None:
        """Open the store (raises on failure, so a lifecycle `configure` can refuse)."""

    def close(self) -> bool:
        """Close the store; True when a cache was written for the next start."""

    def reembed_pending(self) -> int:
        """Camera rows still carrying another model's vectors than the configured one."""


class SavePart(Protocol):
    def save(self, note: SaveNote) -> SaveAnswer:
        """`save`: raises ContractError."""


class CompactPart(Protocol):
    def compact(self) -> CompactAnswer:
        """`compact`: raises ContractError."""


class StreamsPart(Protocol):
    def answer(self) -> StreamsAnswer:
        """`streams`: raises ContractError."""
