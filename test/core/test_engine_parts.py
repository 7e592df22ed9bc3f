"""Big classes are split by job: no class in the package above MAX_CLASS_LINES (the engine a
facade over its operations, the store and the graph index over their parts), and the fleet
engine composed from its own parts rather than overriding the engine's methods."""

from __future__ import annotations

import ast
from pathlib import Path

from memory_node.core.engine import MemoryEngine
from memory_node.fleet.engine import FleetEngine

PACKAGE = Path(__file__).resolve().parents[2] / "memory_node"
# Every module of ours (rosidl generates memory_node/srv at setup).
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "srv" not in p.relative_to(PACKAGE).parts)
MAX_CLASS_LINES = 500


def test_no_class_is_above_the_size_limit():
    sizes = {}
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                sizes[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    for facade in ("engine.py:MemoryEngine", "sqlite_store.py:SqliteObservationStore",
                   "faiss_index.py:GraphIndex", "recorder.py:RecorderPolicy"):
        assert sizes[facade] > 0  # the walk found it
    assert {k: n for k, n in sizes.items() if n > MAX_CLASS_LINES} == {}


def test_the_fleet_engine_overrides_no_operation_of_the_engine():
    """What the fleet answers otherwise comes from its parts (fleet_parts); the one method
    it keeps is sync, which the engine's ingestion calls and the fleet has no index for."""
    own = {n for n in vars(FleetEngine) if callable(getattr(FleetEngine, n, None))
           or isinstance(vars(FleetEngine)[n], property)}
    overridden = {n for n in own if hasattr(MemoryEngine, n)}
    assert overridden <= {"__init__", "sync"}
