"""The background captioner (`describer: vlm`) against a local OpenAI-compatible stand-in:
keyframes are stored at once with the heuristic text, novel views get the model's caption
later (re-embedded), the per-minute budget holds, 429/5xx/dropped connections back off and
catch up, a dead endpoint ends in `failed`, and a restart continues the pending rows.

Budget and back-off count in a simulated clock handed to the captioner; waiting for the
worker polls a condition with a generous real-time limit."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_support import FakeClock, minilm
from vlm_server import VLMServer
from waiting import wait_until

from memory_node.core.captioner import CaptionPolicy
from memory_node.core.config import MemoryConfig
from memory_node.core.embedders.describer import VLMDescriber
from memory_node.core.engine import MemoryEngine
from memory_node.core.ingest import CameraFrame
from memory_node.core.llm import ChatClient, LLMSettings
from memory_node.core.types import Pose

COLOURS = [(0, 0, 255), (255, 0, 0), (0, 255, 0), (0, 255, 255), (255, 0, 255), (255, 255, 0),
           (255, 255, 255), (0, 128, 255)]


class SimTime:
    """The captioner's clock: sleeping advances it at once (and yields the CPU briefly)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, s: float) -> None:
        with self._lock:
            self.now += max(0.0, s)
        time.sleep(0.002)


def _image(i: int) -> np.ndarray:
    img = np.zeros((96, 128, 3), np.uint8)
    img[:] = COLOURS[i % len(COLOURS)]
    return img


def _frames(n: int, start: int = 0) -> list[CameraFrame]:
    """Frames 3 m apart: each a new place, so each a novel view."""
    return [CameraFrame(float(i), Pose(3.0 * i, 0.0), _image(i)) for i in range(start, start + n)]


def _engine(root: Path, srv_url: str, sim: SimTime, timeout: float = 5.0,
            options: dict[str, Any] | None = None, **cfg: Any) -> MemoryEngine:
    options = options or {}
    client = ChatClient(LLMSettings(base_url=srv_url, api_key="sk-test-key", model="vlm-x"),
                        timeout=timeout)
    config = MemoryConfig.from_mapping({"memory_dir": str(root), "describer": "vlm", **cfg},
                                       env={})
    return MemoryEngine(config, clock=FakeClock(), text_embedder=minilm(),
                        describer=VLMDescriber(client), llm_settings=None,
                        captioner_options={"clock": sim.clock, "sleep": sim.sleep, **options})


def make(root: Path, srv: VLMServer, sim: SimTime, **kw: Any) -> MemoryEngine:
    options = {k: kw.pop(k) for k in ("max_attempts", "policy") if k in kw}
    return _engine(root, srv.base_url, sim, options=options, **kw)


def states(eng: Any) -> dict[str, int]:
    cam = next(s for s in json.loads(eng.streams())["streams"] if s["name"] == "camera")
    return {k: cam[k] for k in ("captioned", "pending", "failed")}


def test_keyframes_are_stored_at_once_and_captioned_later(tmp_path: Path) -> None:
    sim = SimTime()
    with VLMServer() as srv:
        srv.gate.clear()  # the endpoint answers nothing until the test says so
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=60)
        try:
            ids = eng.add_stream_rows("camera", _frames(4))  # returns while every request hangs
            rows = eng.store.get(ids)
            assert all(r.tags["caption"] == "pending" for r in rows.values())
            assert all(r.text and "caption" not in r.text for r in rows.values())
            assert states(eng) == {"captioned": 0, "pending": 4, "failed": 0}
            srv.gate.set()
            wait_until(lambda: states(eng)["captioned"] == 4, "4 captioned", 90)
            rows = eng.store.get(ids)
            assert all("blue backpack" in r.text for r in rows.values())
            assert all(r.tags["caption"] == "done" for r in rows.values())
            assert "brightness" in rows[ids[0]].tags  # the heuristic tags stay
            hits = json.loads(eng.search(
                '{"stream": "camera", "semantic_query": "backpack on a chair", "k": 4}'))
            assert hits["count"] == 4 and hits["results"][0]["score"] > 0.4
            cam = next(s for s in json.loads(eng.streams())["streams"] if s["name"] == "camera")
            assert cam["caption_max_per_min"] == 60
            assert cam["caption_requests_per_hour"] >= 1 and cam["caption_tokens_per_hour"] > 0
            image_url = srv.bodies[0]["messages"][0]["content"][1]["image_url"]["url"]
            assert image_url.startswith("data:image/jpeg;base64,")
        finally:
            eng.close()


def test_only_novel_views_are_admitted(tmp_path: Path) -> None:
    sim = SimTime()
    with VLMServer() as srv:
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=60)
        try:
            same = [CameraFrame(float(i), Pose(0.2 * i, 0.0), _image(0)) for i in range(5)]
            moved = [CameraFrame(10.0, Pose(5.0, 0.0), _image(0))]
            turned = [CameraFrame(11.0, Pose(5.0, 0.0, yaw=math.pi / 2), _image(0))]
            changed = [CameraFrame(12.0, Pose(5.0, 0.0, yaw=math.pi / 2), _image(1))]
            ids = []
            for batch in (same, moved, turned, changed):
                ids += eng.add_stream_rows("camera", batch)
            rows = eng.store.get(ids)
            admitted = [i for i in ids if "caption" in rows[i].tags]
            assert admitted == [ids[0], ids[5], ids[6], ids[7]]
            assert eng.store.count() >= 8  # every keyframe kept, captioned or not
            wait_until(lambda: states(eng)["captioned"] == 4, "4 captioned", 90)
        finally:
            eng.close()


def test_budget_holds_through_429s_and_500s(tmp_path: Path) -> None:
    sim = SimTime()
    times: list[float] = []

    def plan(n: int, body: dict[str, Any]) -> Any:
        if n % 3 == 0:
            return (429, "rate limited")
        if n % 5 == 0:
            return (500, "upstream exploded")
        return ("ok", f"a red chair, picture {n}")

    with VLMServer(plan) as srv:
        srv.on_request = lambda n: times.append(sim.clock())
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=3)
        try:
            eng.add_stream_rows("camera", _frames(10))
            wait_until(lambda: states(eng)["captioned"] == 10, "10 captioned", 90)
            assert states(eng) == {"captioned": 10, "pending": 0, "failed": 0}
            assert len(times) > 10  # the refused requests were retried
            for t in times:  # any 60 s holds at most 3 requests
                assert sum(1 for u in times if t <= u < t + 60.0) <= 3
        finally:
            eng.close()


def test_outage_backs_off_then_catches_up(tmp_path: Path) -> None:
    sim = SimTime()
    times: list[float] = []

    def plan(n: int, body: dict[str, Any]) -> Any:
        return "drop" if n <= 5 else ("ok", f"a kitchen table, picture {n}")

    with VLMServer(plan) as srv:
        srv.on_request = lambda n: times.append(sim.clock())
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=30)
        try:
            eng.add_stream_rows("camera", _frames(6))
            wait_until(lambda: states(eng)["captioned"] == 6, "6 captioned", 90)
            gaps = np.diff(times[:6])
            assert all(b > a * 1.5 for a, b in zip(gaps, gaps[1:], strict=False))  # growing
            assert states(eng)["failed"] == 0
        finally:
            eng.close()


def test_dead_endpoint_ends_in_failed_not_lost(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = SimTime()
    eng = _engine(tmp_path / "m", f"http://127.0.0.1:{port}/v1", sim,
                  options={"max_attempts": 3}, caption_max_per_min=30)
    try:
        ids = eng.add_stream_rows("camera", _frames(3))
        wait_until(lambda: states(eng)["failed"] == 3, "3 failed", 90)
        rows = eng.store.get(ids)
        assert all("cannot reach" in r.tags["caption_error"] for r in rows.values())
        assert all(r.text for r in rows.values())  # the heuristic text stays searchable
        assert states(eng)["pending"] == 0
    finally:
        eng.close()


def test_a_bad_request_answer_fails_at_once(tmp_path: Path) -> None:
    sim = SimTime()
    with VLMServer(lambda n, body: (400, "image too large")) as srv:
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=30)
        try:
            eng.add_stream_rows("camera", _frames(2))
            wait_until(lambda: states(eng)["failed"] == 2, "2 failed", 90)
            assert srv.count == 2
        finally:
            eng.close()


def test_restart_continues_pending_captions(tmp_path: Path) -> None:
    sim = SimTime()
    with VLMServer(lambda n, body: ("ok", f"a green sofa {n}")) as srv:
        srv.gate.clear()
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=30, timeout=0.5)
        ids = eng.add_stream_rows("camera", _frames(3))
        # The endpoint answers nothing: the process ends with every caption pending (a request
        # that timed out was retried at once on the simulated clock: how many were sent
        # before the close depends on the machine's load, not on the captioner).
        assert states(eng) == {"captioned": 0, "pending": 3, "failed": 0}
        eng.close()
        srv.gate.set()
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=30)
        try:
            assert states(eng)["pending"] + states(eng)["captioned"] == 3
            wait_until(lambda: states(eng)["captioned"] == 3, "3 captioned", 90)
            assert all("green sofa" in r.text for r in eng.store.get(ids).values())
        finally:
            eng.close()


def test_policy_remembers_admitted_views_across_a_restart(tmp_path: Path) -> None:
    sim = SimTime()
    with VLMServer() as srv:
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=60)
        eng.add_stream_rows("camera", _frames(2))
        wait_until(lambda: states(eng)["captioned"] == 2, "2 captioned", 90)
        eng.close()
        eng = make(tmp_path / "m", srv, sim, caption_max_per_min=60,
                   policy=CaptionPolicy())
        try:
            again = eng.add_stream_rows("camera", [CameraFrame(5.0, Pose(0.1, 0.0), _image(0)),
                                           CameraFrame(6.0, Pose(9.0, 0.0), _image(0))])
            rows = eng.store.get(again)
            # the captioned view at (0, 0) was read back: not captioned twice; (9, 0) is new
            assert "caption" not in rows[again[0]].tags
            assert rows[again[1]].tags["caption"] == "pending"
        finally:
            eng.close()


def test_caption_max_per_min_must_be_positive(tmp_path: Path) -> None:
    from memory_node.core.config import ConfigError, MemoryConfig

    with pytest.raises(ConfigError, match="caption_max_per_min"):
        MemoryConfig.from_mapping({"caption_max_per_min": 0}, env={})


def test_an_exhausted_budget_waits_instead_of_polling(tmp_path: Path) -> None:
    """With the budget spent and rows pending, the worker sleeps until the window reopens:
    new keyframes wake it once each, not into a loop of database reads (which stole CPU from
    the recorder)."""
    with VLMServer() as srv:
        client = ChatClient(LLMSettings(base_url=srv.base_url, api_key="sk-test-key",
                                        model="vlm-x"))
        config = MemoryConfig.from_mapping({"memory_dir": str(tmp_path / "m"),
                                            "describer": "vlm", "caption_max_per_min": 1},
                                           env={})
        eng = MemoryEngine(config, clock=FakeClock(), text_embedder=minilm(),
                           describer=VLMDescriber(client), llm_settings=None)
        try:
            eng.add_stream_rows("camera", _frames(3))
            wait_until(lambda: states(eng)["captioned"] == 1, "1 captioned", 90)
            reads = []
            real = eng.store.tagged
            eng.store.tagged = lambda *a, **k: reads.append(1) or real(*a, **k)  # type: ignore[method-assign]
            for i in range(3):
                eng.add_stream_rows("camera", _frames(1, start=10 + i))
                time.sleep(0.3)
            assert len(reads) <= 3  # at most one look per wake-up
            assert states(eng) == {"captioned": 1, "pending": 5, "failed": 0}
        finally:
            eng.close()
