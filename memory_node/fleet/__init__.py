"""Fleet memory: robots push their local stores to one PostgreSQL + pgvector database
(`memory-sync`), and the same JSON contract is served over it (`FleetEngine`).

Imports are lazy: psycopg and pgvector are needed only when a fleet store is used."""

from __future__ import annotations

from typing import Any

__all__ = ["FleetEngine", "FleetStore", "FleetSync", "open_engine", "resolve_fleet_url"]


def __getattr__(name: str) -> Any:
    if name in ("FleetEngine", "open_engine"):
        from memory_node.fleet import engine

        return getattr(engine, name)
    if name == "FleetStore":
        from memory_node.fleet.store import FleetStore

        return FleetStore
    if name == "FleetSync":
        from memory_node.fleet.sync import FleetSync

        return FleetSync
    if name == "resolve_fleet_url":
        from memory_node.fleet.credentials import resolve_fleet_url

        return resolve_fleet_url
    raise AttributeError(name)
