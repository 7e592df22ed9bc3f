"""Shared helpers for the agent tests: seeded memories, MCP server processes and sessions (the
real model and engines come from engine_support)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engine_support import FakeClock, PoseBox
from engine_support import make_engine as _make_engine

from memory_node.core.contract import SaveAnswer, SaveNote
from memory_node.core.engine import MemoryEngine
from memory_node.core.ingest import LidarScan
from memory_node.core.types import Pose

REPO = Path(__file__).resolve().parents[2]
# No LLM in tests: compaction reports its summary step as unavailable and calls nothing.
NO_LLM_ENV = {"VLM_API_KEY": "", "OPENAI_API_KEY": "", "VLM_BASE_URL": "",
              "OPENAI_BASE_URL": ""}
SERVER_MODULE = "memory_node.agent.mcp_server"


Clock = FakeClock  # a settable clock: the memory's "now"


def make_engine(root: Path, clock: Clock | None = None, pose: PoseBox | None = None
                ) -> MemoryEngine:
    """An engine on the real model; its clock is the wall clock unless one is given."""
    return _make_engine(root, clock or time.time, pose or PoseBox())


def seed(engine: MemoryEngine, now: float) -> dict[str, int]:
    """A small memory: camera descriptions in two places, a lidar scan, two notes."""
    ids = {}
    ids["door"] = engine.add_observation(
        "camera", now - 300, Pose(1.2, -0.4, yaw=1.5708),
        {"brightness": 0.82, "colors": ["red", "white"], "person": True},
        "bright scene; mostly red, white; one person")
    ids["hall"] = engine.add_observation(
        "camera", now - 3 * 3600, Pose(6.0, 4.0, yaw=0.0),
        {"brightness": 0.2, "colors": ["gray"], "person": False},
        "dark scene; mostly gray; no people")
    engine.add_stream_rows("lidar", [LidarScan(now - 200, Pose(1.0, -0.5),
                                               [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])])
    ids["bob"] = _note_at(engine, "Met Bob at the front door; he asked for a glass of water.",
                          now - 120, Pose(1.0, -0.3, yaw=0.0))
    ids["kitchen"] = _note_at(engine, "The kitchen is at the end of the hall.", now - 60,
                              Pose(5.5, 4.2, yaw=3.1416))
    return ids


def _note_at(engine: MemoryEngine, text: str, t: float, pose: Pose) -> int:
    """A note saved through the engine's `save` as if the robot stood at `pose` at `t`."""
    clock, pose_provider = engine.clock, engine.pose_provider
    engine.clock, engine.pose_provider = (lambda: t), (lambda: pose)
    try:
        answer = engine.ask_save(SaveNote(note=text))
    finally:
        engine.clock, engine.pose_provider = clock, pose_provider
    assert isinstance(answer, SaveAnswer), answer
    assert answer.id is not None and not answer.folded, answer
    return answer.id


def seed_dir(root: Path, now: float | None = None) -> dict[str, int]:
    """Seed a memory directory through an engine that is closed again (a server opens it)."""
    engine = make_engine(root)
    try:
        return seed(engine, time.time() if now is None else now)
    finally:
        engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: Any, timeout: float = 60.0) -> None:
    """Until the server accepts connections (fails with its output if it exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited ({proc.poll()}):\n{proc.output}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise AssertionError(f"server did not listen on {port}:\n{proc.output}")


def server_env() -> dict[str, str]:
    """What an MCP server subprocess needs: the checkout on its path, this run's ROS domain."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("ROS_", "RMW_", "LD_", "AMENT_")) or k in ("HOME", "PATH")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(NO_LLM_ENV)
    return env


@contextlib.asynccontextmanager
async def stdio_session(*args: str) -> AsyncIterator[Any]:
    """A real MCP client session with `python -m memory_node.agent.mcp_server ARGS` on stdio."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", SERVER_MODULE, *args],
                                   env=server_env(), cwd=str(REPO))
    with tempfile.TemporaryFile("w+") as errlog:  # the server's log (stderr), not shown
        async with (stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            yield session


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content)
