"""`memory-mcp --http`: streamable HTTP on 127.0.0.1, with and without a bearer token."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from agent_support import (
    REPO,
    SERVER_MODULE,
    free_port,
    seed_dir,
    server_env,
    text_of,
    wait_for_port,
)
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from ros_helpers import Process, spawn, stop

TOKEN = "s3cret-token"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


class Server:
    def __init__(self, proc: Process, port: int, ids: dict[str, int]):
        self.proc, self.port, self.ids = proc, port, ids
        self.url = f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """Two servers started together (one without, one with a token); both stopped after."""
    started: dict[str, Server] = {}
    try:
        # The token the documented way, from the environment (not seen in `ps`).
        for name, extra in (("open", {}), ("token", {"MEMORY_MCP_TOKEN": TOKEN})):
            root: Path = tmp_path_factory.mktemp(name)
            ids = seed_dir(root)
            port = free_port()
            proc = spawn([sys.executable, "-m", SERVER_MODULE, "--memory-dir", str(root),
                          "--http", "--port", str(port)], env={**server_env(), **extra},
                         cwd=REPO)
            started[name] = Server(proc, port, ids)
        for server in started.values():
            wait_for_port(server.port, server.proc)
        yield started
    finally:
        for server in started.values():
            stop(server.proc)


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with (create_mcp_http_client(headers=headers) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


async def _exercise(url: str, ids: dict[str, int], token: str | None = None) -> None:
    async with http_session(url, token) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert len(tools) == 8
        assert "- camera: 2 observations, semantic search" in tools["query_memory"].description
        r = await s.call_tool("query_memory", {"stream": "camera", "semantic_query": "person",
                                               "k": 1})
        assert not r.is_error and text_of(r).startswith(f"#{ids['door']} camera ")
        r = await s.call_tool("remember", {"note": "Frank fixed the charging dock."})
        assert not r.is_error and text_of(r).startswith("Remembered as #")
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert "- events: 3 observations" in tools["query_memory"].description
        r = await s.call_tool("query_memory", {"stream": "camera", "radius": -3})
        assert r.is_error and text_of(r) == (
            "Error executing tool query_memory: 'radius' must be > 0, got -3 (bad_request)")
        r = await s.call_tool("where_am_i", {})
        assert not r.is_error and text_of(r).startswith("[Current pose: unknown]")


def test_http_without_token(servers):
    server = servers["open"]
    anyio.run(_exercise, server.url, server.ids)
    assert server.proc.poll() is None


def test_http_with_token(servers):
    server = servers["token"]
    anyio.run(_exercise, server.url, server.ids, TOKEN)


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", f"Basic {TOKEN}",
                                           "Bearer", f"Bearer {TOKEN}x"])
def test_http_refuses_missing_or_wrong_token(servers, authorization):
    headers = dict(MCP_HEADERS)
    if authorization is not None:
        headers["Authorization"] = authorization
    response = httpx2.post(servers["token"].url, headers=headers, content=json.dumps(INIT),
                           timeout=10)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "bearer token" in response.json()["message"]


def test_http_accepts_the_right_token_on_a_raw_request(servers):
    headers = {**MCP_HEADERS, "Authorization": f"bearer {TOKEN}"}  # scheme is case-blind
    response = httpx2.post(servers["token"].url, headers=headers, content=json.dumps(INIT),
                           timeout=10)
    assert response.status_code == 200


def test_mcp_client_with_a_wrong_token_gets_no_session(servers):
    async def attempt() -> None:
        with anyio.fail_after(30):
            async with http_session(servers["token"].url, "wrong-token") as s:
                await s.list_tools()

    with pytest.raises(Exception) as exc:  # noqa: PT011 - an exception group, checked below
        anyio.run(attempt)
    # The 401 (checked on raw requests above) reaches the SDK's caller as an MCPError.
    assert any(isinstance(e, MCPError) and "error response" in str(e) for e in leaves(exc.value))


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups (Python 3.10 has no group type)."""
    inner = getattr(exc, "exceptions", None)
    if not inner:
        return [exc]
    return [leaf for e in inner for leaf in leaves(e)]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_token_on_the_command_line_is_warned_about(tmp_path, how):
    """`--token T` is visible to every user in `ps`: it still works, with a warning that names
    MEMORY_MCP_TOKEN; the variable itself draws none. The token is never echoed."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # memory cannot open under a file: the server exits at once
    args = [sys.executable, "-m", SERVER_MODULE, "--memory-dir", str(blocker / "m"), "--http"]
    env = server_env()
    if how == "flag":
        args += ["--token", TOKEN]
    else:
        env["MEMORY_MCP_TOKEN"] = TOKEN
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "cannot open memory" in done.stderr
    assert TOKEN not in done.stderr + done.stdout
    warned = [line for line in done.stderr.splitlines() if "--token" in line]
    if how == "flag":
        assert len(warned) == 1 and "MEMORY_MCP_TOKEN" in warned[0] and "ps" in warned[0]
    else:
        assert warned == []
