"""`memory-mcp`: the memory skills as an MCP server (official SDK, `MCPServer`).

    memory-mcp [--memory-dir D | --ros] [--http [--host H] [--port P] [--token T]]

Backends: an in-process engine on D (default; `AGENT_MEMORY_DIR`, then ./agent_memory), or the
query server's ROS services with `--ros` (ROS arguments go after `--ros-args`). Transports:
stdio (default; stdout is the protocol, so every log line goes to stderr), or streamable HTTP
at http://H:P/mcp with `--http`, bound to 127.0.0.1 unless told otherwise. With a token
(`MEMORY_MCP_TOKEN`, or `--token`, which any user can read in `ps` and so draws a warning)
every HTTP request needs `Authorization: Bearer T`; others get 401.

The tools are exactly `skills.get_skills()`: same names, descriptions and JSON schemas as the
OpenAI-style specs. `MemoryMCPServer` overrides `MCPServer.list_tools` to build the list at
each `tools/list` (so `query_memory`'s description carries the live stream names and counts;
the result is marked immediately stale with a zero cache TTL) and `MCPServer.call_tool` to
run the skill, whose argument checks and readable errors are shared with every framework; a
failed skill raises `ToolError`, which the client sees as an `is_error` result.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio
from mcp.server.caching import CacheHint
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.context import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from mcp_types import Tool as MCPTool

from memory_node import __version__
from memory_node.agent.client import EngineClient, MemoryClient
from memory_node.agent.http_guard import BearerTokenMiddleware
from memory_node.agent.prompt import MEMORY_PROMPT_SECTION
from memory_node.agent.skills import Clock, Skill, get_skills
from memory_node.agent.source_args import (
    MEMORY_DIR_DEFAULT,
    add_memory_source_args,
    check_memory_source_args,
    fleet_memory_client,
    ros_memory_client,
)
from memory_node.core.parameters import split_ros_args
from memory_node.core.secrets import mask_log_handlers

__all__ = ["BearerTokenMiddleware", "MemoryMCPServer", "main"]

# the module path also when run as `python -m` (there __name__ is "__main__")
log = logging.getLogger(__spec__.name if __spec__ is not None else __name__)

SERVER_NAME = "memory_node"
TOKEN_ENV = "MEMORY_MCP_TOKEN"


class MemoryMCPServer(MCPServer):
    """An MCPServer whose tools are the memory skills of one client, listed live."""

    def __init__(self, client: MemoryClient, *, clock: Clock | None = None,
                 name: str = SERVER_NAME) -> None:
        super().__init__(
            name,
            version=__version__,
            instructions=MEMORY_PROMPT_SECTION,
            # The tool list changes with the memory: tell clients not to reuse a cached one.
            cache_hints={"tools/list": CacheHint(ttl_ms=0)},
        )
        self.client = client
        self.clock = clock
        # For dispatch only: the description is irrelevant there, so no streams() call.
        self._skills: dict[str, Skill] = {
            s.name: s for s in get_skills(client, clock=clock, live_descriptions=False)}

    async def list_tools(self) -> list[MCPTool]:
        """The skills as MCP tools, descriptions computed now (a blocking client call, so on
        a worker thread)."""
        skills = await anyio.to_thread.run_sync(
            functools.partial(get_skills, self.client, clock=self.clock))
        return [
            MCPTool(
                name=s.name,
                description=s.description,
                input_schema=s.parameters,
                annotations=ToolAnnotations(read_only_hint=s.read_only, destructive_hint=False,
                                            idempotent_hint=s.read_only,
                                            open_world_hint=False),
            )
            for s in skills
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> CallToolResult:
        skill = self._skills.get(name)
        if skill is None:
            raise ToolError(f"Unknown tool: {name}")
        result = await anyio.to_thread.run_sync(functools.partial(skill.run, **arguments))
        if result.is_error:
            raise ToolError(f"Error executing tool {name}: {result.message}")
        return CallToolResult(content=[TextContent(type="text", text=result.text)])


# ---- command line -------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memory-mcp",
        description="Serve the robot memory's skills over MCP (stdio by default).",
        epilog="ROS arguments for --ros go after --ros-args (e.g. -p use_sim_time:=true "
               "-p world_frame:=map).")
    add_memory_source_args(p, f"in-process engine on this memory directory ({MEMORY_DIR_DEFAULT})",
                           exclusive=True)
    p.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    p.add_argument("--host", default=None, help="HTTP bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    p.add_argument("--token", default=None,
                   help=f"HTTP bearer token; prefer ${TOKEN_ENV} (a command line shows in ps, "
                        "so this option draws a warning); none: no auth")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


def _make_client(args: argparse.Namespace, ros_args: list[str]) -> MemoryClient:
    if args.ros:
        from memory_node.ros.common import ros_network

        log.info("memory-mcp: memory over the ROS 2 services on %s", ros_network())
        return ros_memory_client(args, ros_args, "memory-mcp")
    if args.fleet_url is not None:
        return fleet_memory_client(args)
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    values = {"memory_dir": args.memory_dir} if args.memory_dir else {}
    engine = MemoryEngine(MemoryConfig.from_mapping(values))
    return EngineClient(engine, close_engine=True)


async def _serve_http(server: MemoryMCPServer, host: str, port: int, token: str | None,
                      log_level: str) -> None:
    import uvicorn

    app: Any = server.streamable_http_app(host=host)
    if token:
        app = BearerTokenMiddleware(app, token)
    elif host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without a token: anyone who reaches the port can read and "
                    "write the robot's memory", host)
    # log_config=None: uvicorn's loggers go through the root logger, to stderr.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                            log_config=None)
    log.info("memory-mcp: streamable HTTP on http://%s:%d/mcp%s", host, port,
             " (bearer token required)" if token else "")
    await uvicorn.Server(config).serve()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, ros_args = split_ros_args(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.http and (args.host or args.port is not None or args.token):
        parser.error("--host, --port and --token go with --http")
    check_memory_source_args(parser, args, ros_args)
    if args.token is not None:
        # Any user on the machine can read a command line (ps, /proc/PID/cmdline).
        print(f"memory-mcp: warning: --token is visible to every user of this machine in ps; "
              f"set {TOKEN_ENV} in the environment instead", file=sys.stderr, flush=True)
    # stdout is the protocol on stdio: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mask_log_handlers()  # uvicorn's access log would show a ?token= query, for one
    try:
        client = _make_client(args, ros_args)
    except Exception as exc:  # noqa: BLE001 - one clear line, not a trace, for a bad setup
        log.error("memory-mcp: cannot open memory: %s", exc)
        return 1
    try:
        server = MemoryMCPServer(client)
        if args.http:
            token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
            port = 8000 if args.port is None else args.port
            anyio.run(_serve_http, server, args.host or "127.0.0.1", port, token or None,
                      args.log_level)
        else:
            log.info("memory-mcp: serving on stdio")
            server.run()
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
