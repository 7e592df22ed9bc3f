"""Peer stores on the same workload: venv set-up, data export, and judging their answers.

Peers run in `bench/.venv-peers`, a virtual environment of an interpreter whose sqlite3 can
load extensions (sqlite-vec needs it), created here on first use with pinned versions. Each
peer runs in its own process (bench/peer_driver.py) so its RSS is its own; the dataset goes
over as .npy files under bench/.cache/.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import prototypes
from bench.common import BENCH_DIR, CACHE_DIR, percentiles, read_json
from bench.engine_bench import (
    RADIUS,
    WINDOW_S,
    K,
    Log,
    _timed_search,
    brute_force,
    make_queries,
    open_engine,
    request_json,
    same_result,
)
from bench.workload import STREAMS, build_store, load_dataset, row_text

PEERS_VENV = BENCH_DIR / ".venv-peers"


def _run_peer(py: Path, peer: str, data: Path, work: Path, res_path: Path,
              timeout_s: float) -> str | None:
    """Run the driver for one peer in the peers' venv; an error line, or None."""
    shutil.rmtree(work, ignore_errors=True)
    try:
        proc = subprocess.run([str(py), str(BENCH_DIR / "peer_driver.py"), peer, str(data),
                               str(work), str(res_path)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        res_path.with_suffix(".stderr").write_text(proc.stderr)
        return (proc.stderr.strip().splitlines() or ["?"])[-1]
    return None
PEER_PINS = ("sqlite-vec==0.1.9", "chromadb==1.5.9", "pymilvus==3.0.2", "milvus-lite==3.2.2",
             "memsearch==0.4.23")
PEER_NAMES = ("sqlite-vec", "chroma", "milvus-lite", "memsearch")


def _can_load_extensions(python: str) -> bool:
    code = "import sqlite3; sqlite3.connect(':memory:').enable_load_extension(True)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True).returncode == 0
    except OSError:
        return False


def find_interpreter() -> str | None:
    """A Python 3.10+ whose sqlite3 allows enable_load_extension (Debian's python3.11 does)."""
    for cand in ("/usr/bin/python3.11", "/usr/bin/python3.12", "/usr/bin/python3",
                 sys.executable):
        if Path(cand).exists() and _can_load_extensions(cand):
            return cand
    return None


def ensure_venv(log: Log) -> Path:
    py = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / ".bench-pins"
    if py.exists() and marker.exists() and marker.read_text() == "\n".join(PEER_PINS):
        return py
    interp = find_interpreter()
    if interp is None:
        raise RuntimeError("no Python whose sqlite3 can load extensions: install Debian's "
                           "python3.11 and python3.11-venv (apt-get install -y python3.11 "
                           "python3.11-venv)")
    log(f"  creating {PEERS_VENV} from {interp}")
    if not py.exists():
        subprocess.run([interp, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PINS, "psutil"], check=True)
    marker.write_text("\n".join(PEER_PINS))
    return py


def export(n: int, seed: int, vectors: str, nq: int, log: Log) -> tuple[Path, Any, list]:
    """Write the dataset and queries where the peer driver reads them (cached)."""
    build_store(n, seed, vectors, log)
    ds = load_dataset(n, seed, vectors)
    queries = make_queries(ds, nq)
    d = CACHE_DIR / f"peers_{vectors}_{n}_{seed}_{nq}"
    if not (d / "params.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "vectors.npy", ds.vecs)
        np.savez(d / "meta.npz", stream=ds.stream, t=ds.t, x=ds.x, y=ds.y)
        np.savez(d / "queries.npz", qvec=np.stack([q["vec"] for q in queries]),
                 near=np.array([q["near"] for q in queries]))
        if vectors == "minilm":  # memsearch's BM25 half ranks on the texts
            rng = np.random.default_rng(seed + 3)
            texts = [row_text(i, STREAMS[s], rng) for i, s in enumerate(ds.stream.tolist())]
            (d / "texts.json").write_text(json.dumps(texts))
        params = {"streams": list(STREAMS), "k": K, "radius": RADIUS, "query_budget_s": 150.0,
                  "t_min": ds.now - WINDOW_S, "query_texts": [q["text"] for q in queries]}
        (d / "params.json").write_text(json.dumps(params))
    return d, ds, queries


def section_peers(n: int, seed: int, vectors: str, nq: int, peers: list[str], raw_dir: Path,
                  log: Log, timeout_s: float = 1800, reuse_raw: bool = False) -> dict[str, Any]:
    """Peers on the exported workload; `reuse_raw` keeps a peer's raw answers from an
    earlier run on the same export (a peer's figures do not depend on our code), while ours
    are always measured again."""
    py = ensure_venv(log)
    data, ds, queries = export(n, seed, vectors, nq, log)
    out: dict[str, Any] = {"n": n, "queries": nq, "k": K, "peers": {}}
    # Ours, in the same run and on the same queries, for the ratios: the engine as it is and
    # with the prototyped fixes (bench/prototypes.py; they do not write to the store), measured
    # before and again after the peers; the two passes are pooled so that a change in the
    # machine's load during the run does not favour either side.
    mem = build_store(n, seed, vectors, log) / "memory"
    passes = [_measure_ours(mem, ds, queries)]
    refs = {kind: [brute_force(ds, kind, q) for q in queries] for kind in ("combined",
                                                                             "semantic")}
    raw: dict[str, dict[str, Any]] = {}
    for peer in peers:
        res_path = raw_dir / f"peer_{peer}_{n}.json"
        work = CACHE_DIR / f"peerwork_{peer}_{n}"
        t0 = time.perf_counter()
        reused = (reuse_raw and res_path.exists()
                  and res_path.stat().st_mtime > (data / "params.json").stat().st_mtime)
        log(f"  peer {peer} at {n} ..." + (" (raw answers from an earlier run)" if reused
                                            else ""))
        if not reused:
            error = _run_peer(py, peer, data, work, res_path, timeout_s)
            if error:
                out["peers"][peer] = {"error": error}
                log(f"  peer {peer} failed: {error}")
                continue
        raw[peer] = read_json(res_path)
        raw[peer]["section_s"] = round(time.perf_counter() - t0, 1)
        raw[peer]["reused_raw"] = reused
    passes.append(_measure_ours(mem, ds, queries))
    for label in ("ours", "ours_fixed"):
        out[label] = {}
        for kind in ("combined", "semantic"):
            pooled = [x for p in passes for x in p[label][kind]["lat"]]
            out[label][kind] = {
                "latency_ms": percentiles(pooled),
                "p50_first_pass": percentiles(passes[0][label][kind]["lat"])["p50"],
                "p50_last_pass": percentiles(passes[-1][label][kind]["lat"])["p50"],
                "exact_fraction": min(p[label][kind]["exact_fraction"] for p in passes),
                "recall_at_k": min(p[label][kind]["recall_at_k"] for p in passes)}
    for peer, r in raw.items():
        out["peers"][peer] = _summarise(peer, r, refs, out, log)
    return out


def _measure_ours(mem: Path, ds: Any, queries: list[dict[str, Any]]) -> dict[str, Any]:
    """Latencies and exactness of our combined and semantic queries, as is and fixed."""
    res: dict[str, Any] = {}
    for label in ("ours", "ours_fixed"):
        res[label] = {}
        eng = open_engine(mem, ds, queries)
        undo = prototypes.apply(eng) if label == "ours_fixed" else (lambda: None)
        try:
            for kind in ("combined", "semantic"):
                reqs = [request_json(kind, q) for q in queries]
                _timed_search(eng, reqs[:10])
                lat, outs = _timed_search(eng, reqs)
                ex = rec = 0.0
                for q, o in zip(queries, outs):
                    ref, ref_s = brute_force(ds, kind, q)
                    got = [r["id"] for r in o["results"]]
                    ex += same_result(got, [r["score"] for r in o["results"]], ref, ref_s)
                    rec += len(set(got) & set(ref)) / len(ref) if ref else float(not got)
                res[label][kind] = {"lat": lat, "exact_fraction": ex / len(queries),
                                    "recall_at_k": round(rec / len(queries), 4)}
        finally:
            undo()
            eng.store.close()
    return res


def _summarise(peer: str, r: dict[str, Any], refs: dict[str, list], out: dict[str, Any],
               log: Log) -> dict[str, Any]:
    """A peer's latencies, exactness against brute force and ratios to ours."""
    summary: dict[str, Any] = {k: r.get(k) for k in ("version", "ingest_s", "rss_peak_mb",
                                                      "index", "cannot_express", "wall_s",
                                                      "section_s", "reused_raw")}
    summary["kinds"] = {}
    for kind, v in r["kinds"].items():
        base = "combined" if kind.startswith("combined") else "semantic"
        ex = rec = short = 0
        done = len(v["ids"])
        for got, gs, (ref, rs) in zip(v["ids"], v["scores"], refs[base]):
            ex += same_result(got, gs, ref, rs, tol=2e-5)
            rec += len(set(got) & set(ref)) / len(ref) if ref else float(not got)
            short += len(got) < len(ref)
        lat = percentiles(v["lat_ms"])
        ours = out["ours"][base]["latency_ms"]
        fixed = out["ours_fixed"][base]["latency_ms"]
        summary["kinds"][kind] = {
            "how": v.get("how"), "latency_ms": lat, "exact_fraction": ex / done,
            "recall_at_k": rec / done, "short_of_k": short, "queries_run": done,
            "max_fetch_rounds": v.get("max_fetch_rounds"),
            "ratio_p50": round(lat["p50"] / max(ours["p50"], 1e-9), 1),
            "ratio_p99": round(lat["p99"] / max(ours["p99"], 1e-9), 1),
            "ratio_p50_fixed": round(lat["p50"] / max(fixed["p50"], 1e-9), 1),
        }
        log(f"    {peer} {kind:15s} p50 {lat['p50']:.2f} ms "
            f"({summary['kinds'][kind]['ratio_p50']}x ours, "
            f"{summary['kinds'][kind]['ratio_p50_fixed']}x fixed), exact {ex / done:.2f}, "
            f"short {short}, {done} queries")
    return summary
