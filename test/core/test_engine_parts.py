"""The engine is split by operation: a facade over parts, none of them a big class, and the
fleet engine composed from its own parts rather than overriding the engine's methods."""

from __future__ import annotations

import ast
from pathlib import Path

from memory_node.core.engine import MemoryEngine
from memory_node.fleet.engine import FleetEngine

PACKAGE = Path(__file__).resolve().parents[2] / "memory_node"
ENGINE_MODULES = [PACKAGE / "core" / "engine.py", PACKAGE / "fleet" / "engine.py",
                  *sorted((PACKAGE / "core" / "operations").glob("*.py"))]
MAX_CLASS_LINES = 500


def test_no_engine_class_is_above_the_size_limit():
    sizes = {}
    for path in ENGINE_MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                sizes[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert sizes["engine.py:MemoryEngine"] > 0  # the walk found the facade
    assert {k: n for k, n in sizes.items() if n > MAX_CLASS_LINES} == {}


def test_the_fleet_engine_overrides_no_operation_of_the_engine():
    """What the fleet answers otherwise comes from its parts (fleet_parts); the one method
    it keeps is sync, which the engine's ingestion calls and the fleet has no index for."""
    own = {n for n in vars(FleetEngine) if callable(getattr(FleetEngine, n, None))
           or isinstance(vars(FleetEngine)[n], property)}
    overridden = {n for n in own if hasattr(MemoryEngine, n)}
    assert overridden <= {"__init__", "sync"}
