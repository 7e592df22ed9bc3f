"""Semantic-only search side by side, in one run: memory_node, ChromaDB, FAISS HNSW alone and
numpy exact on the same vectors and queries (`python -m bench --only semantic`).

Three sets: well-separated clusters (`separated`), overlapping clusters (`overlap`) and
MiniLM embeddings of generated observation captions (`minilm`); `synthetic` (clusters on a
32-d manifold, the main benchmark's 1M set) on request. memory_node answers through
`MemoryEngine.search(json)` (JSON in and out, a lookup embedder: query embedding excluded),
after its graph has been built and has calibrated itself, on held-out rows and on 256
earlier real queries (not the measured ones); FAISS HNSW alone is an
`IndexHNSWFlat` (float vectors, no ids, no JSON) and numpy exact one matrix-vector product
and a partial sort, both in this process on one thread; ChromaDB runs in the peers' venv
(bench/peers.py) in its own process. Recall@5 and @10 against brute force over every row
(a row tied with the k-th exact score counts as right).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import CACHE_DIR, percentiles, read_json
from bench.engine_bench import Log, make_queries, open_engine
from bench.workload import build_store, load_dataset

FAISS_M, FAISS_EF_CONSTRUCTION, FAISS_EF = 32, 200, (32, 64, 128)
WARM_QUERIES = 256  # real queries a store in use has seen (calibrate.RECENT_QUERIES)


def _kth(ds: Any, qv: np.ndarray) -> dict[int, np.ndarray]:
    """The 5th and 10th best exact score of each query (brute force over every row)."""
    out: dict[int, list[float]] = {5: [], 10: []}
    for q in qv:
        s = ds.vecs @ q
        top = -np.partition(-s, 9)[:10]
        top.sort()
        out[5].append(float(top[::-1][4]))
        out[10].append(float(top[::-1][9]))
    return {k: np.asarray(v) for k, v in out.items()}


def _recall(got: list[list[int]], ds: Any, qv: np.ndarray, kth: np.ndarray, k: int) -> float:
    """Mean share of each query's k best rows found (a row tied with the k-th score counts)."""
    hits = 0.0
    for ids, q, t in zip(got, qv, kth, strict=False):
        ids = [i for i in ids[:k] if 1 <= i <= len(ds.vecs)]
        scores = ds.vecs[np.asarray(ids, np.int64) - 1] @ q if ids else np.empty(0)
        hits += min(int((scores >= t - 1e-6).sum()), k) / k
    return round(hits / max(1, len(got)), 4)


def _row(lat: list[float], got5: list[list[int]], got10: list[list[int]], ds: Any,
         qv: np.ndarray, kth: dict[int, np.ndarray], **extra: Any) -> dict[str, Any]:
    return {"latency_ms": percentiles(lat), "recall_at_5": _recall(got5, ds, qv, kth[5], 5),
            "recall_at_10": _recall(got10, ds, qv, kth[10], 10), **extra}


def _ours(mem: Path, ds: Any, queries: list[dict[str, Any]], qv: np.ndarray,
          kth: dict[int, np.ndarray], log: Log, warm: list[dict[str, Any]]) -> dict[str, Any]:
    """Ours after its graph is built and calibrated: first on rows held out of it (what a
    fresh store has), then again on `warm`, real queries other than the measured ones (what
    a store in use has); the measured queries come after and never join a calibration."""
    eng = open_engine(mem, ds, queries + warm)
    try:
        t0 = time.perf_counter()
        eng.indexes.wait_for_graphs()  # built, read and calibrated (background)
        start = [g for g in eng.indexes.graph_info() if g["model_id"] == ds.model_id]
        for q in warm:
            eng.search(json.dumps({"semantic_query": q["text"], "k": 5}))
        eng.indexes.wait_for_graphs()  # calibrated again, on the real queries too
        info = [g for g in eng.indexes.graph_info() if g["model_id"] == ds.model_id]
        graph = eng.indexes.graph(ds.model_id)
        measured = graph.current_calibration() if graph is not None else None
        res: dict[str, Any] = {
            "calibration": info[0] if info else None,
            "calibration_at_start": start[0] if start else None,
            "real_queries": measured.real_queries if measured is not None else 0,
            "waited_s": round(time.perf_counter() - t0, 1)}
        for k in (5, 10):
            reqs = [json.dumps({"semantic_query": q["text"], "k": k}) for q in queries]
            for r in reqs[:10]:
                eng.search(r)
            lat, got = [], []
            for r in reqs:
                t1 = time.perf_counter_ns()
                s = eng.search(r)
                lat.append((time.perf_counter_ns() - t1) / 1e6)
                got.append([x["id"] for x in json.loads(s)["results"]])
            res[k] = (lat, got)
        log(f"    memory_node {info[0] if info else '?'} (at start: {start[0] if start else '?'})")
        prof = profile_query(eng, json.dumps({"semantic_query": queries[0]["text"], "k": 5}))
        log(f"    profile {prof}")
        return _row(res[5][0], res[5][1], res[10][1], ds, qv, kth,
                    calibration=res["calibration"], waited_s=res["waited_s"], profile=prof,
                    calibration_at_start=res["calibration_at_start"],
                    real_queries=res["real_queries"])
    finally:
        # Closed without writing the index cache: the cached store stays as built, and no
        # measured query is kept with its graph for a later run's calibration.
        eng.indexes.close()
        eng.store.close()


def _numpy_exact(ds: Any, qv: np.ndarray, kth: dict[int, np.ndarray]) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    vecs = np.ascontiguousarray(ds.vecs, np.float32)
    out: dict[int, tuple[list[float], list[list[int]]]] = {}
    with threadpool_limits(1, "blas"):
        for k in (5, 10):
            lat, got = [], []
            for q in qv:
                t0 = time.perf_counter_ns()
                s = vecs @ q
                top = np.argpartition(-s, k)[:k]
                top = top[np.argsort(-s[top])]
                lat.append((time.perf_counter_ns() - t0) / 1e6)
                got.append((top + 1).tolist())
            out[k] = (lat, got)
    return _row(out[5][0], out[5][1], out[10][1], ds, qv, kth,
                how="vecs @ q, argpartition, 1 thread")


def _faiss_hnsw(ds: Any, qv: np.ndarray, kth: dict[int, np.ndarray], tag: str,
                log: Log) -> dict[str, Any]:
    import faiss

    path = CACHE_DIR / f"faiss_hnsw_{tag}_M{FAISS_M}_efc{FAISS_EF_CONSTRUCTION}.index"
    t0 = time.perf_counter()
    if path.exists():
        index = faiss.read_index(str(path))
        build_s = read_json(path.with_suffix(".json"))["build_s"]
    else:
        index = faiss.IndexHNSWFlat(ds.vecs.shape[1], FAISS_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = FAISS_EF_CONSTRUCTION
        faiss.omp_set_num_threads(2)
        index.add(np.ascontiguousarray(ds.vecs, np.float32))
        faiss.omp_set_num_threads(1)
        build_s = round(time.perf_counter() - t0, 1)
        faiss.write_index(index, str(path))
        path.with_suffix(".json").write_text(json.dumps({"build_s": build_s}))
    log(f"    faiss HNSW M {FAISS_M}: build {build_s} s")
    faiss.omp_set_num_threads(1)
    rows = {}
    for ef in FAISS_EF:
        params = faiss.SearchParametersHNSW()
        params.efSearch = ef
        out = {}
        for k in (5, 10):
            lat, got = [], []
            for q in qv:
                t1 = time.perf_counter_ns()
                _, pos = index.search(q.reshape(1, -1), k, params=params)
                lat.append((time.perf_counter_ns() - t1) / 1e6)
                got.append((pos[0][pos[0] >= 0] + 1).tolist())
            out[k] = (lat, got)
        rows[str(ef)] = _row(out[5][0], out[5][1], out[10][1], ds, qv, kth, build_s=build_s,
                             how=f"IndexHNSWFlat M {FAISS_M}, efConstruction "
                                 f"{FAISS_EF_CONSTRUCTION}, efSearch {ef}, 1 thread")
    return rows


def _chroma(n: int, seed: int, vectors: str, nq: int, raw_dir: Path, log: Log
            ) -> dict[str, Any]:
    from bench.peers import _run_peer, ensure_venv, export

    py = ensure_venv(log)
    data, _ds, _q = export(n, seed, vectors, nq, log)
    res_path = raw_dir / f"semantic_chroma_{vectors}_{n}.json"
    work = CACHE_DIR / f"peerwork_chroma_semantic_{n}"
    error = _run_peer(py, "chroma-semantic", data, work, res_path, 3600)
    if error:
        return {"error": error}
    return read_json(res_path)


def _while_building(d: Path, ds: Any, queries: list[dict[str, Any]], qv: np.ndarray,
                   kth: dict[int, np.ndarray], scratch: Path, log: Log,
                   watch_s: float = 600.0) -> dict[str, Any]:
    """Semantic-only queries (one every 20 ms) while the graph is built from nothing in the
    background: the store opened without its index cache. Latency and recall@5 over the whole
    build, and over its second half (a copy of the part built is walked, the rest scanned)."""
    from bench.index_bench import open_engine_nowait
    from bench.workload import copy_store

    mem = copy_store(d, scratch / "semantic_cold", with_index=False)
    t0 = time.perf_counter()
    eng = open_engine_nowait(mem, ds, queries)
    opened = time.perf_counter() - t0
    graph = eng.indexes.graph(ds.model_id)
    lat: list[float] = []
    got: list[list[int]] = []
    qi: list[int] = []
    covered: list[int] = []
    how: list[str] = []  # how each query found the rows outside the graph
    coarse_recall: float | None = None
    i = 0
    try:
        while graph is not None and graph.exact and time.perf_counter() - t0 < watch_s:
            q = queries[i % len(queries)]
            raw = json.dumps({"semantic_query": q["text"], "k": 5})
            part = graph.partial_nodes or 0
            how.append("coarse alone" if graph.partial_coarse_alone
                       else "copy + coarse" if graph.partial_coarse
                       else "copy + scan" if part else "exact")
            if graph.partial_coarse_recall is not None:
                coarse_recall = graph.partial_coarse_recall
            t1 = time.perf_counter_ns()
            s = eng.search(raw)
            lat.append((time.perf_counter_ns() - t1) / 1e6)
            got.append([x["id"] for x in json.loads(s)["results"]])
            qi.append(i % len(queries))
            covered.append(part)
            i += 1
            time.sleep(0.02)
        ready = time.perf_counter() - t0
    finally:
        eng.close()
    if not lat:
        return {"error": "the graph was ready before the first query"}
    idx = np.asarray(qi)
    half = len(lat) // 2
    rec_all = _recall(got, ds, qv[idx], kth[5][idx], 5)
    rec_half = _recall(got[half:], ds, qv[idx[half:]], kth[5][idx[half:]], 5)
    log(f"    while building: {len(lat)} queries, p50 {np.median(lat):.3f} ms, recall@5 "
        f"{rec_all:.3f}, graph ready after {ready:.1f} s")
    return {"latency_ms": percentiles(lat), "recall_at_5": rec_all,
            "second_half_latency_ms": percentiles(lat[half:]),
            "second_half_recall_at_5": rec_half, "queries": len(lat),
            "with_partial_graph": int(sum(c > 0 for c in covered)),
            "searched_by": {k: how.count(k) for k in sorted(set(how))},
            "coarse_recall_at_5_held_out": coarse_recall,
            "open_s": round(opened, 2), "graph_ready_s": round(ready, 1),
            "watched_s": watch_s}


def section_semantic(n: int, seed: int, sets: list[str], nq: int, raw_dir: Path, log: Log,
                     peers: bool = True, watch: str = "separated") -> dict[str, Any]:
    """Every system on every set at `n` rows, one query at a time; on set `watch`, ours
    also while its graph is built from nothing."""
    out: dict[str, Any] = {"n": n, "queries": nq, "sets": {}}
    for vectors in sets:
        log(f"  semantic {vectors} at {n} ...")
        d = build_store(n, seed, vectors, log)
        ds = load_dataset(n, seed, vectors)
        queries = make_queries(ds, nq)
        warm = make_queries(ds, nq + WARM_QUERIES)[nq:]  # asked before, never measured
        qv = np.stack([np.asarray(q["vec"], np.float32) for q in queries])
        kth = _kth(ds, qv)
        rows: dict[str, Any] = {}
        rows["memory_node"] = _ours(d / "memory", ds, queries, qv, kth, log, warm)
        rows["numpy exact"] = _numpy_exact(ds, qv, kth)
        for ef, r in _faiss_hnsw(ds, qv, kth, f"{vectors}_{n}_{seed}", log).items():
            rows[f"faiss HNSW efSearch {ef}"] = r
        if peers:
            raw = _chroma(n, seed, vectors, nq, raw_dir, log)
            if "error" in raw:
                rows["chroma"] = {"error": raw["error"]}
            else:
                got5 = raw["kinds"]["semantic"]["ids"]
                got10 = raw["kinds"]["semantic10"]["ids"]
                rows["chroma"] = _row(raw["kinds"]["semantic"]["lat_ms"], got5, got10, ds,
                                      qv, kth, version=raw.get("version"),
                                      ingest_s=round(raw.get("ingest_s") or 0, 1),
                                      how=raw["kinds"]["semantic"].get("how"))
        if vectors == watch:  # one set: a build takes minutes here
            out.setdefault("building", {})[vectors] = _while_building(
                d, ds, queries, qv, kth, raw_dir / "scratch", log)
        # Ours again after the others: the machine's load moves; both passes are kept.
        again = _ours(d / "memory", ds, queries, qv, kth, log, warm)
        rows["memory_node"]["p50_second_pass"] = again["latency_ms"]["p50"]
        for name, r in rows.items():
            if "latency_ms" in r:
                log(f"    {name:28s} p50 {r['latency_ms']['p50']:.3f} ms p99 "
                    f"{r['latency_ms']['p99']:.3f} ms recall@5 {r['recall_at_5']:.3f} "
                    f"@10 {r['recall_at_10']:.3f}")
        out["sets"][vectors] = rows
    return out


def profile_query(eng: Any, raw: str, reps: int = 300) -> dict[str, Any]:
    """Where one semantic-only query's time goes, request text to answer text: each stage of
    `MemoryEngine.search` run on its own, `reps` times (median µs), and the whole call.
    *Fixed* is everything but the graph search: what a query pays whatever the index."""
    from memory_node.core.contract import SearchAnswer, result_fields
    from memory_node.core.engine import dumps
    from memory_node.core.vectors import top_k

    stages: dict[str, list[float]] = {k: [] for k in (
        "parse + validate", "plan", "catch-up check + query vector", "graph search",
        "rank (top-k of hits)", "row fetch (one SELECT)", "result models", "JSON text")}
    whole: list[float] = []
    for r in range(reps + 20):
        ns = time.perf_counter_ns
        t = [ns()]
        sq = eng.read_search(raw)
        t.append(ns())
        plan = eng.plan(sq)
        t.append(ns())
        backend = eng.backend
        backend.catch_up()
        keys = eng.indexes.keys_for(plan.streams)
        qvecs = {m: eng.query_vector(m, plan.semantic_query) for m in {k[0] for k in keys}}
        t.append(ns())
        notes: list[str] = []
        hits = backend._unfiltered(plan.filter, keys, qvecs, plan.k, notes)
        t.append(ns())
        ids, vals = top_k(np.concatenate(hits.ids), np.concatenate(hits.scores), plan.k)
        t.append(ns())
        rows = eng.store.get(ids.tolist())
        t.append(ns())
        results = [result_fields(rows[i], float(s))
                   for i, s in zip(ids.tolist(), vals.tolist(), strict=True)]
        ans = SearchAnswer.model_validate(
            {"results": results, "count": len(results), "notes": notes or None})
        ans.took_ms = 0.1
        t.append(ns())
        dumps(ans)
        t.append(ns())
        t1 = ns()
        eng.search(raw)
        t2 = ns()
        if r >= 20:
            for name, a, b in zip(stages, t, t[1:], strict=False):
                stages[name].append((b - a) / 1e3)
            whole.append((t2 - t1) / 1e3)
    med = {k: round(float(np.median(v)), 1) for k, v in stages.items()}
    fixed = round(sum(v for k, v in med.items() if k != "graph search"), 1)
    return {"stages_us": med, "fixed_us": fixed, "sum_us": round(sum(med.values()), 1),
            "whole_call_us": round(float(np.median(whole)), 1), "reps": reps}
