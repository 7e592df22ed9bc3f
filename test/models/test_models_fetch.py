"""`memory-models fetch | list | verify` against a local hub stand-in (HF_ENDPOINT pointing at
an HTTP server the test starts, serving tiny CLIP-shaped ONNX towers built here)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from clip_support import clip_repo_files
from hub_server import HubServer

from memory_node import models
from memory_node.core.embedders import ModelUnavailable
from memory_node.core.model_store import CLIP, MODELS_ENV, clip_options


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch):
    with HubServer(CLIP.repo_id, CLIP.revision, clip_repo_files()) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield srv


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_fetch_writes_files_and_manifest_and_prints_the_config_line(
        hub: HubServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models"))
    assert models.main(["fetch", "clip"]) == 0
    out = capsys.readouterr().out
    assert "configuration: image_embedder: clip" in out.splitlines()[-1]
    model_dir = tmp_path / "models" / "clip"
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert manifest["repo_id"] == CLIP.repo_id and manifest["revision"] == CLIP.revision
    served = clip_repo_files()
    assert set(manifest["files"]) == set(served)
    for rel, data in served.items():
        assert (model_dir / rel).read_bytes() == data
        assert manifest["files"][rel]["size"] == len(data)
        assert manifest["files"][rel]["hub_checked"] is True
    assert _leftovers(tmp_path / "models") == ["clip"]  # no staging directory left
    assert not (model_dir / ".cache").exists()
    assert models.main(["verify"]) == 0
    assert models.main(["list"]) == 0
    assert "clip: " in capsys.readouterr().out


def test_fetched_model_is_found_by_image_embedder_clip(
        hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`image_embedder: clip` with no paths uses the fetched model: camera frames get CLIP
    vectors and a camera search ranks them with the CLIP text tower."""
    from engine_support import make_engine

    from memory_node.core.ingest import CameraFrame
    from memory_node.core.types import Pose

    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models"))
    assert models.main(["fetch", "clip"]) == 0
    eng = make_engine(tmp_path / "m", image_embedder="clip")
    try:
        red = np.zeros((48, 64, 3), np.uint8)
        red[..., 2] = 255
        ids = eng.add_stream_rows("camera", [CameraFrame(1.0, Pose(0, 0), red)])
        assert eng.store.get(ids)[ids[0]].model_id == CLIP.model_id
        ans = json.loads(eng.search('{"stream": "camera", "semantic_query": "backpack"}'))
        assert ans["ok"] and ans["count"] == 1 and ans["results"][0]["score"] is not None
    finally:
        eng.close()


def test_no_fetched_model_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="memory-models fetch clip"):
        clip_options(tmp_path / "empty")


def test_wrong_hash_fails_and_keeps_the_previous_model(
        hub: HubServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "models"
    assert models.main(["fetch", "clip", "--dir", str(root)]) == 0
    before = (root / "clip" / "manifest.json").read_text()
    hub.corrupt.add(CLIP.files["image_model"])
    capsys.readouterr()
    assert models.main(["fetch", "clip", "--dir", str(root)]) == 1
    err = capsys.readouterr().err
    assert "sha256" in err and CLIP.files["image_model"] in err
    assert _leftovers(root) == ["clip"]
    assert (root / "clip" / "manifest.json").read_text() == before
    assert models.main(["verify", "clip", "--dir", str(root)]) == 0


def test_truncated_file_fails_and_installs_nothing(
        hub: HubServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "models"
    hub.truncate.add(CLIP.files["text_model"])
    assert models.main(["fetch", "clip", "--dir", str(root), "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert CLIP.files["text_model"] in err and "cut short" in err
    assert _leftovers(root) == []
    with pytest.raises(ModelUnavailable):
        clip_options(root)


def test_no_network_fails_at_once_with_what_to_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    root = tmp_path / "models"
    t0 = time.monotonic()
    assert models.main(["fetch", "clip", "--dir", str(root), "--timeout", "2"]) == 1
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert "cannot reach" in err and "HF_ENDPOINT" in err and MODELS_ENV in err
    assert _leftovers(root) == []


def test_offline_mode_fails_without_trying(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.main(["fetch", "clip", "--dir", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE" in err and "copy" in err


def test_verify_finds_a_changed_file(hub: HubServer, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "models"
    assert models.main(["fetch", "clip", "--dir", str(root)]) == 0
    tok = root / "clip" / CLIP.files["tokenizer"]
    data = bytearray(tok.read_bytes())
    data[10] ^= 1
    tok.write_bytes(bytes(data))
    capsys.readouterr()
    assert models.main(["verify", "--dir", str(root)]) == 1
    assert "tokenizer.json: sha256 differs" in capsys.readouterr().out
