"""Object questions on the sample flat (issue 26): which furniture each camera frame shows,
the caption stand-in that answers from that ground truth, and memory-eval's object questions
answered through the caption pipeline (background captioner, re-embedding, search skills).

The recording here is made in-process (the sample world's rendered frames at its true poses,
one keyframe every 1.5 s, into an engine), not through ROS: the caption path under test starts
where the recorder hands frames to the engine."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest

from memory_node import eval as memeval
from memory_node.core.config import MemoryConfig
from memory_node.core.engine import MemoryEngine
from memory_node.core.ingest import CameraFrame
from memory_node.core.llm import ChatClient, LLMSettings
from memory_node.core.types import Pose
from memory_node.sim.caption_oracle import CaptionOracle
from memory_node.sim.generate import CAMERA, CAMERA_XYZ, EPOCH_S
from memory_node.sim.objects import IN_VIEW_M, caption, object_questions, object_truth, object_views
from memory_node.sim.render import Renderer

SEED, DURATION = 7, 150.0


def test_objects_are_seen_from_where_the_robot_was() -> None:
    truth = object_truth(SEED, DURATION)
    assert {"fridge", "kitchen_counter", "sofa", "bed", "wardrobe", "plant"} <= set(truth)
    for obj in truth.values():
        assert obj.seen_from
        for _t, x, y in obj.seen_from:
            assert math.hypot(obj.x - x, obj.y - y) <= IN_VIEW_M + 0.5  # camera ahead of base
    views = object_views(SEED, DURATION)
    # The tour starts in the kitchen, facing its counter and fridge.
    assert {"kitchen_counter", "fridge"} <= set(views.at(10.0))
    assert caption(["fridge", "kitchen_counter"]) == "a room with a fridge and a kitchen counter"
    qs = object_questions(SEED, DURATION)
    assert {q["id"] for q in qs} == {f"object-{k}" for k in truth}
    assert all(q["question"].endswith("?") and q["answer"]["seen_from"] for q in qs)


def test_caption_oracle_recognises_the_frame_it_is_shown() -> None:
    rng = np.random.default_rng(3)
    frames = [(float(i), rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)) for i in range(6)]
    with CaptionOracle(frames, lambda t: f"frame at {t:.0f}") as oracle:
        client = ChatClient(LLMSettings(oracle.base_url, "standin", "caption-oracle"))
        assert client.caption_image(frames[4][1]) == "frame at 4"


def _record(root: Path) -> None:
    """The sample tour's keyframes, rendered at the true camera poses, stored by the engine
    with the default describer (what `memory-node` records)."""
    views = object_views(SEED, DURATION)
    world = views.world
    renderer = Renderer(world.plan, CAMERA)
    engine = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(root)}, env={}))
    try:
        frames = []
        for t in np.arange(0.5, DURATION, 1.5):
            cx, cy, cyaw = world.sensor_pose(float(t), CAMERA_XYZ)
            x, y, yaw = world.traj.pose(np.array([float(t)]))[0]
            rgb, _info = renderer.render(cx, cy, cyaw, None)
            frames.append(CameraFrame(EPOCH_S + float(t), Pose(float(x), float(y), yaw=float(yaw)),
                                      np.ascontiguousarray(rgb[..., ::-1])))
        for i in range(0, len(frames), 8):
            engine.add_stream_rows("camera", frames[i:i + 8])
    finally:
        engine.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("objects") / "memory"
    _record(root)
    return root


def _ask(engine: MemoryEngine, truth: dict) -> list[memeval.Outcome]:
    from memory_node.agent.client import EngineClient
    from memory_node.agent.skills import get_skills

    skills = {s.name: s for s in get_skills(EngineClient(engine), live_descriptions=False)}
    return memeval.answer_all(skills, truth, NOW, lambda q: q["kind"] == "object")


NOW = EPOCH_S + DURATION + 1.0


def test_object_questions_answered_through_the_caption_pipeline(recorded: Path,
                                                                tmp_path: Path) -> None:
    truth = {"questions": [], "places": {}, "seed": SEED, "duration": DURATION,
             "object_questions": object_questions(SEED, DURATION)}
    baseline = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(recorded)}, env={}),
                            clock=lambda: NOW)
    try:
        heuristic = _ask(baseline, truth)
    finally:
        baseline.close()
    with contextlib.ExitStack() as stack:
        engine = memeval.camera_variant(recorded, tmp_path, truth, NOW, "standin", False,
                                        600.0, lambda s: None, stack, timeout_s=300)
        cam = memeval.camera_stream(engine)
        assert cam.pending == 0 and cam.failed == 0 and cam.captioned > 10
        # novel views only: fewer captions than keyframes
        assert cam.captioned < cam.count
        captioned = _ask(engine, truth)
    wrong = [(o.question["id"], o.got) for o in captioned if not o.ok]
    assert not wrong, wrong
    assert sum(o.ok for o in heuristic) < len(heuristic)  # the heuristic text knows no objects
