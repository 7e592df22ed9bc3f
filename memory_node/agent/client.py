"""The one small interface the agent layer talks to memory through.

Skills, the MCP server and the prompt helpers only need five calls (docs/design.md's JSON
strings plus the robot's current pose) and the memory's clock, so they run unchanged on the
in-process engine (`EngineClient`, no ROS) or on the ROS services (`RosClient` in
`ros_client.py`, which imports rclpy lazily).

One name per operation, the service's verb, the same on every client and on
`MemoryEngine`: `search`, `save`, `compact`, `streams` take and answer docs/design.md's JSON
text; `ask_search`, `ask_save`, `ask_compact`, `ask_streams` answer the models of
`core/contract.py` and never raise (`ask_search` and `ask_save` take the request model or
its text). By default the `ask_*` calls go through the JSON strings (the ROS client's path:
JSON is the wire); the in-process client passes the models straight to the engine.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memory_node.core.config import DEFAULT_STREAMS
from memory_node.core.contract import (
    CompactAnswer,
    ErrorAnswer,
    SaveAnswer,
    SaveNote,
    SearchAnswer,
    SearchQuery,
    StreamsAnswer,
    VisitsAnswer,
    read_answer,
)
from memory_node.core.types import Pose

if TYPE_CHECKING:
    from memory_node.core.engine import MemoryEngine

__all__ = ["EngineClient", "MemoryClient", "error_json", "read_answer"]


def error_json(code: str, message: str) -> str:
    """A failure in the contract's shape, for failures the client itself detects."""
    return json.dumps({"ok": False, "error": {"code": code, "message": message}},
                      ensure_ascii=False)


class MemoryClient(ABC):
    """search/save/compact/streams answer docs/design.md's JSON strings; they never raise for a
    backend that is down (they answer `{"ok": false, "error": {"code": "unavailable", ...}}`).
    """

    @abstractmethod
    def search(self, query: str) -> str: ...

    @abstractmethod
    def save(self, note: str) -> str: ...

    @abstractmethod
    def compact(self) -> str: ...

    @abstractmethod
    def streams(self) -> str: ...

    @abstractmethod
    def current_pose(self) -> Pose | None:
        """The robot's pose in the world frame now, or None when unknown."""

    # Typed calls: the contract's models in and out; never raise for a failure (ErrorAnswer).
    # A request given as text is sent as it is (the memory reads it, as `search` would).
    def ask_search(self, query: SearchQuery | str
                   ) -> SearchAnswer | VisitsAnswer | ErrorAnswer:
        text = query if isinstance(query, str) else query.to_json()
        return read_answer(self.search(text), SearchAnswer)

    def ask_save(self, note: SaveNote | str) -> SaveAnswer | ErrorAnswer:
        text = note if isinstance(note, str) else note.to_json()
        return read_answer(self.save(text), SaveAnswer)

    def ask_compact(self) -> CompactAnswer | ErrorAnswer:
        return read_answer(self.compact(), CompactAnswer)

    def ask_streams(self) -> StreamsAnswer | ErrorAnswer:
        return read_answer(self.streams(), StreamsAnswer)

    def serves_fleet(self) -> bool:
        """Whether this memory is a fleet store (its streams answer lists robots), so the
        query skills take `robot`. Asked once, when the answer comes."""
        known = getattr(self, "_serves_fleet", None)
        if known is None:
            answer = self.ask_streams()
            if isinstance(answer, ErrorAnswer):
                return False
            known = self._serves_fleet = "robots" in (answer.model_extra or {})
        return known

    def now(self) -> float:
        """The memory's clock (seconds): what "seconds ago" and "N min ago" count from.

        The ROS backend answers the ROS clock, so simulated time during a bag replay works.
        """
        return time.time()

    @property
    def default_streams(self) -> Sequence[str]:
        """The configured stream names, shown when the live list cannot be had."""
        return DEFAULT_STREAMS

    def close(self) -> None:  # noqa: B027 (a no-op default: a client holding nothing keeps it)
        """Release what the client holds (a ROS node); the in-process engine stays open."""


class EngineClient(MemoryClient):
    """In-process client on a `MemoryEngine`: no ROS, same JSON as the services.

    Calls are serialised with one lock: the MCP server runs tool functions on worker threads,
    and one agent's calls do not need to overlap.
    """

    def __init__(self, engine: MemoryEngine, *, close_engine: bool = False) -> None:
        self.engine = engine
        self._close_engine = close_engine
        self._lock = threading.Lock()

    def _call(self, fn: Any, *args: Any) -> str:
        with self._lock:
            return fn(*args)

    def search(self, query: str) -> str:
        return self._call(self.engine.search, query)

    def save(self, note: str) -> str:
        return self._call(self.engine.save, note)

    def compact(self) -> str:
        return self._call(self.engine.compact)

    def streams(self) -> str:
        return self._call(self.engine.streams)

    def ask_search(self, query: SearchQuery | str
                   ) -> SearchAnswer | VisitsAnswer | ErrorAnswer:
        with self._lock:
            return self.engine.ask_search(query)

    def ask_save(self, note: SaveNote | str) -> SaveAnswer | ErrorAnswer:
        with self._lock:
            return self.engine.ask_save(note)

    def ask_compact(self) -> CompactAnswer | ErrorAnswer:
        with self._lock:
            return self.engine.ask_compact()

    def ask_streams(self) -> StreamsAnswer | ErrorAnswer:
        with self._lock:
            return self.engine.ask_streams()

    def current_pose(self) -> Pose | None:
        return self.engine.pose_provider()

    def now(self) -> float:
        return float(self.engine.clock())

    @property
    def default_streams(self) -> Sequence[str]:
        return tuple(self.engine.config.streams)

    def close(self) -> None:
        if self._close_engine:
            with self._lock:
                self.engine.close()
