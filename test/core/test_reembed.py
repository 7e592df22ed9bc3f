"""Changing the image embedder on an existing store: camera rows are re-embedded with the new
model in the background, searches keep answering and say how many rows still wait, and
switching back re-embeds from the rows' text. CLIP runs as tiny ONNX towers built here."""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path

import numpy as np
from clip_support import image_tower, text_tower, tokenizer_json
from engine_support import make_engine

from memory_node.core.ingest import CameraFrame
from memory_node.core.reembed import LOCK_FILE
from memory_node.core.types import Pose


def _clip_cfg(d: Path) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "image.onnx").write_bytes(image_tower())
    (d / "text.onnx").write_bytes(text_tower())
    (d / "tokenizer.json").write_bytes(tokenizer_json())
    return {"image_embedder": "clip", "clip_image_model": str(d / "image.onnx"),
            "clip_text_model": str(d / "text.onnx"), "clip_tokenizer": str(d / "tokenizer.json")}


def _frames(n: int) -> list[CameraFrame]:
    out = []
    for i in range(n):
        img = np.zeros((48, 64, 3), np.uint8)
        img[:] = ((40 * i) % 255, 90, 255 - (30 * i) % 255)
        out.append(CameraFrame(float(i), Pose(float(i), 0.0), img))
    return out


def _models(eng) -> set[str | None]:
    return {r.model_id for r in eng.store.rows_of(["camera"])}


def _wait_done(eng, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while eng.reembed_pending():
        assert time.monotonic() < end, "re-embedding did not finish"
        time.sleep(0.05)


def test_switching_to_clip_reembeds_camera_rows_in_the_background(tmp_path: Path) -> None:
    root = tmp_path / "m"
    eng = make_engine(root)
    ids = eng.add_stream_rows("camera", _frames(12))
    text_model = eng.text_model_id
    eng.save("the charger is under the desk")
    eng.close()
    assert ids

    cfg = _clip_cfg(tmp_path / "clip")
    # Another process holds the job: this one answers searches with the rows as they are.
    with open(root / LOCK_FILE, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        eng = make_engine(root, **cfg)
        try:
            assert eng.reembed_pending() == 12
            ans = json.loads(eng.search('{"stream": "camera", "semantic_query": "red"}'))
            assert ans["ok"] and ans["count"] == 5
            assert any("12 camera rows" in n and "re-embedded" in n for n in ans["notes"])
            cam = next(s for s in json.loads(eng.streams())["streams"] if s["name"] == "camera")
            assert cam["reembed_pending"] == 12
        finally:
            eng.close()
    eng = make_engine(root, **cfg)
    try:
        _wait_done(eng)
        clip_id = eng.camera_model_id()
        assert _models(eng) == {clip_id} and clip_id != text_model
        ans = json.loads(eng.search('{"stream": "camera", "semantic_query": "red", "k": 12}'))
        assert ans["count"] == 12 and not ans.get("notes")
        q = eng._image_embedder.embed_texts(["red"])[0]
        scores = [r["score"] for r in ans["results"]]
        assert scores == sorted(scores, reverse=True)
        top = ans["results"][0]["id"]
        assert abs(float(eng.indexes.vector(clip_id, "camera", top) @ q) - scores[0]) < 1e-4
        notes = json.loads(eng.search("charger under the desk"))
        assert notes["results"][0]["stream"] == "events"  # notes keep the text model
    finally:
        eng.close()

    eng = make_engine(root)  # and back: the rows' text gives text-model vectors again
    try:
        _wait_done(eng)
        assert _models(eng) == {text_model}
        ans = json.loads(eng.search('{"stream": "camera", "semantic_query": "blue", "k": 12}'))
        assert ans["count"] == 12 and all(r["score"] is not None for r in ans["results"])
    finally:
        eng.close()
