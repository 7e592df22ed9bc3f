"""A real MCP client session with `memory-mcp --memory-dir D` over stdio."""

from __future__ import annotations

import re

import anyio
import pytest
from agent_support import make_engine, seed_dir, stdio_session, text_of

from memory_node.agent.client import EngineClient
from memory_node.agent.prompt import MEMORY_PROMPT_SECTION
from memory_node.agent.skills import get_skills

SKILL_NAMES = ["list_memory_streams", "query_memory", "remember", "query_agent_memory",
               "compact_memory", "visits", "name_place", "where_am_i"]


def _streams_part(description: str) -> str:
    return description.split("Streams now:")[1]


def test_stdio_server_lists_live_tools_and_answers_every_call(tmp_path):
    ids = seed_dir(tmp_path / "mem")
    empty = make_engine(tmp_path / "empty")  # for the reference schemas and descriptions

    async def session_checks() -> None:
        async with stdio_session("--memory-dir", str(tmp_path / "mem")) as s:
            listed = (await s.list_tools()).tools
            assert [t.name for t in listed] == SKILL_NAMES
            # The same schemas as every other framework gets (they do not depend on memory).
            by = {t.name: t for t in listed}
            reference = {k.name: k for k in get_skills(EngineClient(empty))}
            for name in SKILL_NAMES:
                assert by[name].input_schema == reference[name].parameters
                if name != "query_memory":
                    assert by[name].description == reference[name].description
            assert by["remember"].annotations.read_only_hint is False
            assert by["query_memory"].annotations.read_only_hint is True
            streams = _streams_part(by["query_memory"].description)
            assert "- camera: 2 observations, semantic search" in streams
            assert "- events: 2 observations" in streams and "- lidar: 1 observation" in streams

            async def call(name: str, **arguments):
                return await s.call_tool(name, arguments)

            r = await call("list_memory_streams")
            assert not r.is_error and text_of(r).startswith("camera: 2 observations")
            r = await call("query_memory", stream="camera", semantic_query="a person", k=1)
            assert not r.is_error
            assert re.match(rf"#{ids['door']} camera .* at x=1\.20 y=-0\.40 heading=90° "
                            r"score=", text_of(r))
            r = await call("query_agent_memory", semantic_query="the kitchen", k=1)
            assert text_of(r).startswith(f"#{ids['kitchen']} events ")
            r = await call("remember", note="Erin asked to be woken at seven.")
            assert not r.is_error
            assert re.fullmatch(r"Remembered as #\d+ at .*, at an unknown place\.", text_of(r))
            r = await call("compact_memory")
            assert not r.is_error and text_of(r).startswith("Compaction done")
            r = await call("where_am_i")  # no TF in-process: the pose is unknown, not an error
            assert not r.is_error and text_of(r).startswith("[Current pose: unknown]")

            # The description follows memory: listed again, the new note is counted.
            again = {t.name: t for t in (await s.list_tools()).tools}
            assert "- events: 3 observations" in _streams_part(again["query_memory"].description)

            # Errors are tool errors with a readable message, and the server lives on.
            r = await call("query_memory", stream="camera", radius=-1)
            assert r.is_error
            assert text_of(r) == ("Error executing tool query_memory: 'radius' must be > 0, "
                                  "got -1 (bad_request)")
            r = await call("query_memory", stream="kitchen")
            assert r.is_error and "unknown stream 'kitchen'. Valid: camera" in text_of(r)
            r = await call("query_memory", stream="camera", k="many")
            assert r.is_error and "'k' must be a positive integer, got a string" in text_of(r)
            r = await call("query_memory", stream="camera", shape="round")
            assert r.is_error and "unknown argument 'shape' of query_memory" in text_of(r)
            r = await call("remember")
            assert r.is_error and "missing argument 'note'" in text_of(r)
            r = await call("teleport")
            assert r.is_error and "Unknown tool: teleport" in text_of(r)
            r = await call("query_memory", stream="camera", k=1)
            assert not r.is_error and text_of(r).startswith(f"#{ids['door']} camera ")

            assert s.server_capabilities is not None and s.server_capabilities.tools

    try:
        anyio.run(session_checks)
    finally:
        empty.close()


def test_empty_memory_and_the_prompt_section_as_server_instructions(tmp_path):
    async def check() -> None:
        async with stdio_session("--memory-dir", str(tmp_path)) as s:
            assert s.instructions == MEMORY_PROMPT_SECTION
            assert s.server_info.name == "memory_node"
            r = await s.call_tool("query_memory", {"stream": "camera"})
            assert not r.is_error and text_of(r) == "No matching observations found."
            desc = {t.name: t for t in (await s.list_tools()).tools}["query_memory"].description
            assert desc.endswith("Memory holds no observations yet; configured streams: "
                                 "camera, lidar, odom, events, summaries.")

    anyio.run(check)


def test_bad_command_lines_are_refused_with_a_reason(capsys):
    from memory_node.agent.mcp_server import main

    for argv in (["--memory-dir", "d", "--ros"], ["--port", "9000"], ["--token", "t"],
                 ["--timeout", "3"], ["--ros-args", "-p", "x:=1"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "memory-mcp: error:" in capsys.readouterr().err
