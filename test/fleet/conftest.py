from __future__ import annotations

from collections.abc import Iterator

import pytest
from fleet_support import PgServer, create_database, drop_database, start_server


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    server = start_server()
    yield server
    server.close()


@pytest.fixture(scope="module")
def fleet_url(pg: PgServer) -> Iterator[str]:
    """A fresh database with the fleet schema, for one test module."""
    from memory_node.fleet.store import FleetStore

    url = create_database(pg)
    store = FleetStore(url)
    store.init_schema()
    store.close()
    yield url
    drop_database(pg, url)
