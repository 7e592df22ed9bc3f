"""`memory-models fetch clip [--dir D] | list | verify`: pinned, pre-exported models fetched
from the Hugging Face hub (or a mirror at `HF_ENDPOINT`) into the models directory.

A fetch downloads every file of the pinned revision into a staging directory next to the
target, checks each file's size and sha256 against the hub's own record (a large file's ETag
is its sha256) and against any hash pinned in the code, writes `manifest.json`, and only then
renames the staging directory into place. Any failure removes the staging directory, so a
model directory is either the previous complete one or the new complete one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from memory_node.core.model_store import (
    MANIFEST,
    MODELS_ENV,
    SPECS,
    ModelSpec,
    check_files,
    models_dir,
    read_manifest,
    sha256_of,
    spec,
)

OFFLINE_HELP = (
    "Without network access to the hub: point HF_ENDPOINT at a reachable mirror, or fetch on a "
    "connected machine and copy its models directory here (then set {env} to it, or copy it "
    "to {default})."
)


class FetchError(RuntimeError):
    """A fetch that cannot complete; the message says what to do."""


def _offline_help(target_root: Path) -> str:
    return OFFLINE_HELP.format(env=MODELS_ENV, default=target_root)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def fetch(model: ModelSpec, root: Path, *, timeout_s: float = 10.0,
          log: Any = print) -> Path:
    """Download `model` into root/<name> (atomically: see the module docstring)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise FetchError(f"HF_HUB_OFFLINE is set, so nothing can be downloaded. "
                         f"{_offline_help(root)}")
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    except ImportError:  # pragma: no cover - a dependency of tokenizers
        raise FetchError("huggingface_hub is not installed (pip install huggingface_hub)") from None
    root.mkdir(parents=True, exist_ok=True)
    target = root / model.name
    stage = root / f".{model.name}.partial-{uuid.uuid4().hex[:8]}"
    endpoint = _endpoint()
    try:
        stage.mkdir()
        files: dict[str, dict[str, Any]] = {}
        for role, rel in model.files.items():
            url = hf_hub_url(model.repo_id, rel, revision=model.revision, endpoint=endpoint)
            try:
                meta = get_hf_file_metadata(url, timeout=timeout_s, endpoint=endpoint)
                t0 = time.perf_counter()
                got = Path(hf_hub_download(model.repo_id, rel, revision=model.revision,
                                           local_dir=stage, endpoint=endpoint,
                                           etag_timeout=timeout_s))
            except Exception as exc:  # noqa: BLE001 - every hub failure gets one clear line
                raise FetchError(_explain(exc, model, rel, root)) from None
            size = got.stat().st_size
            digest = sha256_of(got)
            if meta.size is not None and size != meta.size:
                raise FetchError(f"{rel}: downloaded {size} bytes, the hub says {meta.size} "
                                 "(cut short): run the fetch again")
            pinned = model.sha256.get(rel)
            if pinned and digest != pinned:
                raise FetchError(f"{rel}: sha256 {digest} is not the pinned {pinned}: the "
                                 "file is not the one this version of memory_node expects")
            etag = (meta.etag or "").strip('"')
            if _is_sha256(etag) and digest != etag:
                raise FetchError(f"{rel}: sha256 {digest} differs from the hub's {etag} "
                                 "(corrupted in transfer or by a proxy): run the fetch again")
            files[rel] = {"size": size, "sha256": digest,
                          "hub_checked": _is_sha256(etag), "role": role}
            log(f"  {rel}: {size / 1e6:.1f} MB, sha256 {digest[:12]}… "
                f"({time.perf_counter() - t0:.1f} s)")
        shutil.rmtree(stage / ".cache", ignore_errors=True)  # the hub client's bookkeeping
        manifest = {
            "name": model.name, "repo_id": model.repo_id, "revision": model.revision,
            "model_id": model.model_id, "dim": model.dim,
            "roles": dict(model.files), "io_names": dict(model.io_names),
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "endpoint": endpoint or "default", "files": files,
        }
        _write_json(stage / MANIFEST, manifest)
        old = root / f".{model.name}.old-{uuid.uuid4().hex[:8]}"
        if target.exists():
            target.rename(old)
        stage.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return target
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower())


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def _explain(exc: Exception, model: ModelSpec, rel: str, root: Path) -> str:
    """One line for a failed download: offline, not found, or the hub's own words."""
    text = f"{type(exc).__name__}: {exc}"
    name = type(exc).__name__
    where = _endpoint() or "the Hugging Face hub"
    if name in ("OfflineModeIsEnabled",) or "offline" in text.lower():
        return f"offline mode prevents downloading {rel}. {_offline_help(root)}"
    if name in ("ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException",
                "LocalEntryNotFoundError", "ConnectionError", "NetworkError") or any(
            s in text for s in ("Connection refused", "Name or service not known",
                                "Temporary failure in name resolution", "timed out")):
        return f"cannot reach {where} to download {rel} ({name}). {_offline_help(root)}"
    if name in ("RepositoryNotFoundError", "RevisionNotFoundError", "RemoteEntryNotFoundError",
                "EntryNotFoundError"):
        return (f"{where} has no {model.repo_id}@{model.revision[:12]}/{rel} ({name}); is "
                "HF_ENDPOINT a hub mirror that carries it?")
    if "Consistency check failed" in text:
        return (f"{rel} arrived cut short from {where} (fewer bytes than the hub announced): "
                "nothing was installed; run the fetch again")
    first = " ".join(text.split())[:300]
    return f"downloading {rel} from {where} failed: {first}"


def verify(name: str, root: Path) -> list[str]:
    """Problems with a fetched model (an empty list means it matches its manifest)."""
    model_dir = root / name
    manifest = read_manifest(model_dir)
    problems = check_files(model_dir, manifest)
    pinned = SPECS[name].sha256 if name in SPECS else {}
    for rel, want in pinned.items():
        got = manifest["files"].get(rel, {}).get("sha256")
        if got != want:
            problems.append(f"{rel}: manifest sha256 {got} is not the pinned {want}")
    return problems


def config_line(model_dir: Path, default_root: Path) -> str:
    if model_dir.parent == default_root:
        return "image_embedder: clip"
    return (f"image_embedder: clip  (with {MODELS_ENV}={model_dir.parent} in the node's "
            "environment)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-models",
        description="Fetch, list and verify pinned pre-exported models (CLIP ONNX towers). "
                    f"Models live in --dir, else ${MODELS_ENV}, else "
                    "~/.local/share/memory_node/models; a node finds them there by itself.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download a pinned model (HF_ENDPOINT: a hub mirror)")
    f.add_argument("name", choices=sorted(SPECS))
    f.add_argument("--dir", type=Path, default=None, help="models directory")
    f.add_argument("--timeout", type=float, default=10.0, help="seconds per network wait")
    for cmd, text in (("list", "the models there are and which are fetched"),
                      ("verify", "check fetched files against their manifest (sha256)")):
        p = sub.add_parser(cmd, help=text)
        p.add_argument("--dir", type=Path, default=None, help="models directory")
        if cmd == "verify":
            p.add_argument("name", nargs="?", choices=sorted(SPECS))
    args = parser.parse_args(argv)
    root = (args.dir.expanduser() if args.dir else models_dir()).absolute()
    if args.cmd == "fetch":
        model = spec(args.name)
        print(f"fetching {model.name}: {model.repo_id} at {model.revision[:12]} into "
              f"{root / model.name}")
        try:
            target = fetch(model, root, timeout_s=args.timeout)
        except FetchError as exc:
            print(f"memory-models: {exc}", file=sys.stderr)
            return 1
        print(f"fetched {model.name} into {target}")
        print("configuration: " + config_line(target, models_dir().absolute()))
        return 0
    if args.cmd == "list":
        for name, model in sorted(SPECS.items()):
            try:
                manifest = read_manifest(root / name)
                state = f"fetched {manifest.get('fetched_at', '?')} at {root / name}"
            except Exception:  # noqa: BLE001 - shown as not fetched
                state = "not fetched"
            print(f"{name}: {model.about}; {model.repo_id}@{model.revision[:12]}; {state}")
        return 0
    names = [args.name] if args.name else [n for n in sorted(SPECS) if (root / n).exists()]
    if not names:
        print(f"memory-models: no fetched models in {root}", file=sys.stderr)
        return 1
    bad = 0
    for name in names:
        try:
            problems = verify(name, root)
        except Exception as exc:  # noqa: BLE001 - a missing manifest is a failed verify
            problems = [str(exc)]
        if problems:
            bad += 1
            print(f"{name}: FAILED: " + "; ".join(problems))
        else:
            print(f"{name}: ok ({root / name})")
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
