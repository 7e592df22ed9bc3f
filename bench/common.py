"""Shared helpers: paths, percentiles, process figures and JSON result files.

Kept free of memory_node imports so the peer driver (another interpreter) can reuse nothing
from here by accident; only the engine-side modules import it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
# Generated stores and embeddings; the smoke test points this at a temporary directory.
CACHE_DIR = Path(os.environ.get("MEMORY_BENCH_CACHE") or BENCH_DIR / ".cache")
DEFAULT_RESULTS = BENCH_DIR / "results"


def percentiles(samples_ms: list[float] | np.ndarray) -> dict[str, float]:
    """p50/p90/p99/mean/max of a list of milliseconds (empty -> NaN-free zeros)."""
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    return {
        "n": int(a.size),
        "p50": round(float(np.percentile(a, 50)), 4),
        "p90": round(float(np.percentile(a, 90)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
        "mean": round(float(a.mean()), 4),
        "max": round(float(a.max()), 4),
    }


def rss_mb() -> float:
    """Resident set size of this process, from /proc (no psutil needed)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def rss_split_mb() -> dict[str, float]:
    """This process's resident memory by kind, from /proc: `anon` (heap, graphs, copies: what
    the OS can only swap), `file` (pages of mapped files, shared libraries included: the OS
    drops them under pressure and reads them back) and `shmem`."""
    out = {"anon": 0.0, "file": 0.0, "shmem": 0.0}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                for kind in out:
                    if line.startswith(f"Rss{kind.capitalize()}:"):
                        out[kind] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return out


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def dir_size_mb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total / (1024.0 * 1024.0)


def du_bytes(path: Path) -> int:
    """Disk blocks allocated under `path` (what `du` reports, as the disk budget counts):
    holes in sparse files, such as the index cache's spare rows, take none."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def disk_used_mb(path: Path) -> float:
    """`du_bytes` in MiB."""
    return du_bytes(path) / (1024.0 * 1024.0)


def machine_info() -> dict[str, Any]:
    """What the figures were measured on; the load average says how busy the machine was."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")},
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            info["mem_gb"] = round(int(fh.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return info


@contextmanager
def timer() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["s"] = time.perf_counter() - t0


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False, default=_default))
    tmp.replace(path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def _default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def scale_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def parse_scale(text: str) -> int:
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1000, t[:-1]
    elif t.endswith("m"):
        mult, t = 1_000_000, t[:-1]
    return int(float(t) * mult)


def write_marked_section(md: Path, name: str, body: str) -> None:
    """Put `body` into the report between `<!-- name:begin -->` and `<!-- name:end -->`,
    replacing what was there (appended the first time). bench/report.py keeps such blocks
    when it regenerates the rest of the page."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{body.strip()}\n{end}"
    text = md.read_text() if md.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + section + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    md.write_text(text)


def interrupt(popen: Any, timeout: float) -> float:
    """Stop a node the way a user does: SIGINT, then (after `timeout`) SIGKILL to its process
    group. Returns the seconds it took."""
    import signal
    import subprocess

    t0 = time.monotonic()
    if popen.poll() is None:
        popen.send_signal(signal.SIGINT)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(5)
    return time.monotonic() - t0
