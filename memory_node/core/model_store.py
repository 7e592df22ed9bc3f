"""Fetched models on disk: where they live, what their manifest says, and whether the files
still match it. No network here (that is `memory_node.models`), so the engine can find a
fetched CLIP model without importing the hub client.

Layout: `<models dir>/<name>/` holds the model's files under their hub paths and
`manifest.json` (repo, revision, and per file its size and sha256). The models directory is
`$MEMORY_NODE_MODELS`, else `$XDG_DATA_HOME/memory_node/models` (`~/.local/share/...`). A
directory copied from another machine works as it is: only the manifest and the files count.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_node.core.embedders.base import ModelUnavailable

MODELS_ENV = "MEMORY_NODE_MODELS"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ModelSpec:
    """A pinned model: hub repository, revision (a commit, so the files cannot change under
    the pin), the files by role, and the ONNX input/output names the embedder feeds."""

    name: str
    repo_id: str
    revision: str
    files: Mapping[str, str]  # role -> path in the repository
    model_id: str
    dim: int
    io_names: Mapping[str, str] = field(default_factory=dict)
    # Known sha256 per repository path. Empty where they were not known when the pin was
    # written: the hub's own content hash (the ETag of a large file) is checked on fetch and
    # the hashes go into the manifest, which `verify` checks afterwards.
    sha256: Mapping[str, str] = field(default_factory=dict)
    about: str = ""


# OpenAI CLIP ViT-B/32, exported to ONNX (int8-quantised towers, 89 MB + 65 MB) by the
# transformers.js project. Pinned at a commit so a fetch today and in a year get the same
# bytes; the quantised towers keep a robot's download and memory small.
CLIP = ModelSpec(
    name="clip",
    repo_id="Xenova/clip-vit-base-patch32",
    revision="4c1807b705b1d015fb032789cc4d221b23025a6f",
    files={
        "image_model": "onnx/vision_model_quantized.onnx",
        "text_model": "onnx/text_model_quantized.onnx",
        "tokenizer": "tokenizer.json",
    },
    model_id="clip:vit-b-32-q8",
    dim=512,
    io_names={
        "image_input": "pixel_values",
        "image_output": "image_embeds",
        "text_input": "input_ids",
        "text_output": "text_embeds",
    },
    about="OpenAI CLIP ViT-B/32, int8 ONNX towers + tokenizer (~155 MB)",
)

SPECS: dict[str, ModelSpec] = {CLIP.name: CLIP}


def models_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where fetched models live (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get(MODELS_ENV):
        return Path(env[MODELS_ENV]).expanduser()
    data = env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME") or "~", ".local", "share")
    return Path(data).expanduser() / "memory_node" / "models"


def spec(name: str) -> ModelSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(SPECS))}") from None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(model_dir: Path) -> dict[str, Any]:
    """The manifest of a fetched model; ModelUnavailable when it is missing or unreadable."""
    path = model_dir / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelUnavailable(f"no fetched model at {model_dir} ({MANIFEST} missing)") from None
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"{path} is unreadable: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ModelUnavailable(f"{path} is not a model manifest")
    return data


def check_files(model_dir: Path, manifest: Mapping[str, Any], hashes: bool = True) -> list[str]:
    """Problems with a fetched model's files (empty when every file has its recorded size and,
    with `hashes`, its sha256)."""
    problems = []
    for rel, want in manifest["files"].items():
        path = model_dir / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != want.get("size"):
            problems.append(f"{rel}: {size} bytes, the manifest says {want.get('size')}")
            continue
        if hashes and sha256_of(path) != want.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the manifest")
    return problems


def clip_options(root: Path | None = None) -> dict[str, Any]:
    """ClipEmbedder arguments for the fetched CLIP model, or ModelUnavailable saying how to
    get one. Checks presence and sizes (hashes are `memory-models verify`'s: 155 MB of
    sha256 on every start would cost seconds on a robot)."""
    root = models_dir() if root is None else root
    model_dir = root / CLIP.name
    try:
        manifest = read_manifest(model_dir)
    except ModelUnavailable as exc:
        raise ModelUnavailable(
            f"image_embedder 'clip': {exc}. Run `memory-models fetch clip` (or copy a models "
            f"directory from a machine that has one and set {MODELS_ENV}), or set "
            "clip_image_model, clip_text_model and clip_tokenizer to exported ONNX files"
        ) from None
    problems = check_files(model_dir, manifest, hashes=False)
    if problems:
        raise ModelUnavailable(
            f"fetched CLIP model at {model_dir} is incomplete ({'; '.join(problems)}): run "
            "`memory-models fetch clip` again")
    roles = manifest.get("roles") or dict(CLIP.files)
    io = manifest.get("io_names") or dict(CLIP.io_names)
    return {
        "image_model_path": model_dir / roles["image_model"],
        "text_model_path": model_dir / roles["text_model"],
        "tokenizer_path": model_dir / roles["tokenizer"],
        "model_id": manifest.get("model_id") or CLIP.model_id,
        **{k: v for k, v in io.items() if k in (
            "image_input", "image_output", "text_input", "text_output")},
    }
