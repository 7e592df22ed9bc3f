"""Shared helpers for the core tests: one real MiniLM model per process, engines on tmp dirs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from memory_node.core.config import MemoryConfig
from memory_node.core.engine import MemoryEngine
from memory_node.core.types import Pose

T0 = 1764460800.0  # 2025-11-30 00:00:00 UTC


@functools.lru_cache(maxsize=1)
def minilm():
    """The real offline text model, loaded once per test process."""
    from memory_node.core.embedders.minilm import MiniLMEmbedder

    return MiniLMEmbedder()


class FakeClock:
    """A settable clock: the engine's notion of 'now' (the ROS node clock in production)."""

    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class PoseBox:
    def __init__(self, pose: Pose | None = None):
        self.pose = pose

    def __call__(self) -> Pose | None:
        return self.pose


def make_engine(root: Path, clock: FakeClock | None = None, pose: PoseBox | None = None,
                llm_settings: Any = None, **cfg: Any) -> MemoryEngine:
    config = MemoryConfig.from_mapping({"memory_dir": str(root), **cfg}, env={})
    return MemoryEngine(config, clock=clock or FakeClock(), pose_provider=pose or PoseBox(),
                        text_embedder=minilm(), llm_settings=llm_settings)
