"""The memory view's fixtures: a store made by `memory-import` of the package's sample flat
(60 s, seed 7; generated and imported once per run, about 10 s), and the view served over it
from this process (an in-process engine, as `memory-view --memory-dir` serves it)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memory_node.agent.client import EngineClient
from memory_node.core.config import MemoryConfig
from memory_node.core.engine import MemoryEngine
from memory_node.sim.generate import generate_sample
from memory_node.view.server import ViewBackend, ViewServer
from memory_node.view.store_reader import StoreReader

DURATION_S = 60.0


@pytest.fixture(scope="session")
def imported_store(tmp_path_factory) -> Path:
    """The sample recording imported by memory-import (a subprocess, as a user runs it)."""
    tmp = tmp_path_factory.mktemp("view_store")
    info = generate_sample(tmp / "sample", seed=7, duration_s=DURATION_S)
    exe = Path(sys.executable).parent / "memory-import"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "memory_node.ros.bag_import"]
    done = subprocess.run([*cmd, str(info.bag_dir), "--memory-dir", str(tmp / "memory")],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "memory"


def open_view(memory: Path, token: str | None = None, pose_provider: Any = None
              ) -> tuple[ViewServer, MemoryEngine]:
    engine = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(memory)}),
                          pose_provider=pose_provider)
    server = ViewServer(ViewBackend(EngineClient(engine), StoreReader(memory), str(memory)),
                        "127.0.0.1", 0, token=token).start()
    return server, engine


@pytest.fixture(scope="module")
def view(imported_store) -> Iterator[tuple[ViewServer, MemoryEngine]]:
    server, engine = open_view(imported_store)
    yield server, engine
    server.stop()
    engine.close()


def camera_ids(memory: Path) -> set[int]:
    """Ids of the stored camera keyframes with a pose (what the map draws)."""
    with sqlite3.connect(f"file:{memory / 'memory.db'}?mode=ro", uri=True) as con:
        return {r[0] for r in con.execute(
            "SELECT id FROM observations WHERE stream = 'camera' AND x IS NOT NULL")}


def http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
         method: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def get_json(url: str, **kwargs: Any) -> tuple[int, Any]:
    status, _, body = http(url, **kwargs)
    return status, json.loads(body)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
