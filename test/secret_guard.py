"""The secrets the tests hand the package (fleet passwords, LLM API keys, tokens), and the
check that none of them reaches an output or a log: conftest scans each test's captured
output, the output of every process it started and the ROS log files written meanwhile."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path

# Each at least 6 characters and found nowhere else, so a hit is a leak, not a coincidence.
FLEET_PASSWORD = "S3CRETPW-fleet"
LLM_API_KEY = "sk-test-SECRET-0123456789abcdef"
SECRETS: set[str] = {
    FLEET_PASSWORD, LLM_API_KEY,
    "s3cret-XYZ", "hunter2", "hunter3",  # fleet URLs' passwords in test/fleet
    "sk-test-key", "sk-test-secret", "sk-test-0123456789abc", "sk-demo-key",  # LLM keys
    "S3CRETPW",
}

_outputs: list[str] = []
_lock = threading.Lock()


def register(*secrets: str) -> None:
    """Add secrets a test uses to what every output is scanned for."""
    SECRETS.update(s for s in secrets if len(s) >= 6)


def record(*texts: object) -> None:
    """Keep an output the current test produced outside pytest's capture."""
    with _lock:
        for text in texts:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            if isinstance(text, str) and text:
                _outputs.append(text)


def take_outputs() -> list[str]:
    with _lock:
        out = list(_outputs)
        _outputs.clear()
    return out


def shown(secret: str) -> str:
    """A secret as a failure message may name it."""
    return secret[:2] + "***"


def leaks(texts: Iterable[str]) -> list[str]:
    """The secrets found in any of `texts` (shown masked)."""
    found = set()
    for text in texts:
        found.update(s for s in SECRETS if s in text)
    return sorted(shown(s) for s in found)


def log_files_since(root: str | None, since: float) -> list[str]:
    """The text of the ROS log files under `root` written since `since` (time.time())."""
    if not root or not os.path.isdir(root):
        return []
    texts = []
    for path in Path(root).rglob("*"):
        try:
            if path.is_file() and path.stat().st_mtime >= since - 1.0:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return texts


_real_run = subprocess.run


def _recording_run(*args, **kwargs):  # type: ignore[no-untyped-def]
    result = _real_run(*args, **kwargs)
    record(result.stdout, result.stderr)
    return result


def install() -> None:
    """Record the output of every subprocess.run of the tests (what they capture)."""
    subprocess.run = _recording_run  # type: ignore[assignment]


def now() -> float:
    return time.time()
