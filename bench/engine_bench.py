"""Engine-level sections: query latency and exactness, save -> searchable, ingest, footprint and
start-up, the memory-bandwidth limit line, and MiniLM query embedding cost.

Everything runs in-process against `MemoryEngine`, one query at a time, the way an agent asks.
"""

from __future__ import annotations

import cProfile
import gc
import json
import math
import pstats
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    BENCH_DIR,
    REPO_ROOT,
    dir_size_mb,
    disk_used_mb,
    percentiles,
    rss_mb,
)
from bench.workload import (
    DIM,
    STREAMS,
    Dataset,
    LookupEmbedder,
    build_store,
    copy_store,
    load_dataset,
    minilm_embedder,
    query_texts,
    query_vectors,
    store_dir,
)

Log = Callable[[str], None]
WINDOW_S = 6 * 3600.0
RADIUS = 3.0
K = 5
QUERY_KINDS = ("stream", "near", "time", "semantic", "stream_semantic", "combined")
SEMANTIC_KINDS = ("semantic", "stream_semantic", "combined")


# ---- queries and brute force ------------------------------------------------------------------
def make_queries(ds: Dataset, nq: int) -> list[dict[str, Any]]:
    """nq queries of each kind. Near points lie on the recent trajectory (the agent asks about
    where the robot has been), offset by up to a metre."""
    rng = np.random.default_rng(ds.seed + 21)
    texts, qv = query_vectors(ds, nq)
    recent = np.nonzero(ds.t >= ds.now - WINDOW_S)[0]
    pick = rng.choice(recent, size=nq)
    near = np.stack([ds.x[pick], ds.y[pick]], 1) + rng.normal(0, 0.7, (nq, 2))
    streams = rng.choice([0, 1, 2, 3], size=nq, p=[0.6, 0.15, 0.15, 0.1])
    out = []
    for i in range(nq):
        out.append({"i": i, "text": texts[i], "vec": qv[i], "near": near[i].tolist(),
                    "stream": STREAMS[int(streams[i])]})
    return out


def request_json(kind: str, q: dict[str, Any]) -> str:
    nx, ny = q["near"]
    obj: dict[str, Any] = {"k": K}
    if kind == "stream":
        obj["stream"] = q["stream"]
    elif kind == "near":
        obj.update(near_x=nx, near_y=ny, radius=RADIUS)
    elif kind == "time":
        obj["after_seconds_ago"] = WINDOW_S
    elif kind == "semantic":
        obj["semantic_query"] = q["text"]
    elif kind == "stream_semantic":
        obj.update(stream=q["stream"], semantic_query=q["text"])
    elif kind == "combined":
        obj.update(stream="camera", near_x=nx, near_y=ny, radius=RADIUS,
                   after_seconds_ago=WINDOW_S, semantic_query=q["text"])
    return json.dumps(obj)


def candidate_mask(ds: Dataset, kind: str, q: dict[str, Any]) -> np.ndarray:
    nx, ny = q["near"]
    if kind in ("stream", "stream_semantic"):
        return ds.stream == STREAMS.index(q["stream"])
    if kind == "near":
        return (ds.x - nx) ** 2 + (ds.y - ny) ** 2 <= RADIUS * RADIUS
    if kind == "time":
        return ds.t >= ds.now - WINDOW_S
    if kind == "semantic":
        return np.ones(ds.n, bool)
    m = ds.stream == STREAMS.index("camera")
    m &= ds.t >= ds.now - WINDOW_S
    m &= (ds.x - nx) ** 2 + (ds.y - ny) ** 2 <= RADIUS * RADIUS
    return m


def brute_force(ds: Dataset, kind: str, q: dict[str, Any], k: int = K
                ) -> tuple[list[int], list[float]]:
    """The reference answer: filter every row, then rank (score desc, id desc) or newest first."""
    idx = np.nonzero(candidate_mask(ds, kind, q))[0]
    ids = idx + 1
    if kind in SEMANTIC_KINDS:
        scores = ds.vecs[idx] @ np.asarray(q["vec"], np.float32)
        order = np.lexsort((-ids, -scores))[:k]
        return ids[order].tolist(), scores[order].tolist()
    order = np.lexsort((-ids, -ds.t[idx]))[:K]
    return ids[order].tolist(), []


def same_result(got: list[int], got_scores: list[float], ref: list[int],
                ref_scores: list[float], tol: float = 2e-6) -> bool:
    """Equal to brute force, allowing reordering only among rows whose scores tie (within
    float32 rounding of two different summation orders)."""
    if got == ref:
        return True
    if len(got) != len(ref) or not ref_scores:
        return False
    if any(abs(a - b) > tol for a, b in zip(got_scores, ref_scores)):
        return False
    kth = ref_scores[-1]
    diff = set(got) ^ set(ref)
    return all(abs(s - kth) <= tol for i, s in zip(got, got_scores) if i in diff)


# ---- the engine -----------------------------------------------------------------------------
def open_engine(mem_dir: Path, ds: Dataset, queries: list[dict[str, Any]],
                clock: Callable[[], float] | None = None, **cfg: Any):  # noqa: ANN201
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    table = {q["text"]: np.asarray(q["vec"], np.float32) for q in queries}
    emb = LookupEmbedder(ds.model_id, table)
    conf = MemoryConfig.from_mapping({"memory_dir": str(mem_dir), **cfg})
    eng = MemoryEngine(conf, clock=clock or (lambda: ds.now), text_embedder=emb,
                       llm_settings=None)
    eng.indexes.wait_for_graphs()  # steady state: graphs are built in the background
    return eng


def _timed_search(eng: Any, reqs: list[str]) -> tuple[list[float], list[dict[str, Any]]]:
    lat, outs = [], []
    for r in reqs:
        t0 = time.perf_counter_ns()
        s = eng.search(r)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        outs.append(json.loads(s))
    return lat, outs


def _profile(fn: Callable[[], Any], path: Path, top: int = 10) -> list[dict[str, Any]]:
    """cProfile `fn`, keep the full stats file; return the project's functions by cumulative
    time (which says *who* spends it) followed by the top built-ins by own time (what)."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(str(path))
    st = pstats.Stats(prof)
    ours, builtins = [], []
    stats: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.items():
        row = {"func": f"{Path(file).name}:{line}({func})", "calls": nc,
               "tottime_ms": round(tt * 1000, 2), "cumtime_ms": round(ct * 1000, 2)}
        if "memory_node" in file:
            ours.append(row)
        elif file == "~":
            builtins.append(row)
    ours.sort(key=lambda r: -r["cumtime_ms"])
    builtins.sort(key=lambda r: -r["tottime_ms"])
    return ours[:top] + builtins[:4]


def section_query(n: int, seed: int, vectors: str, nq: int, raw_dir: Path,
                  log: Log) -> dict[str, Any]:
    """Latency p50/p99 and exactness per query kind, one query at a time."""
    d = build_store(n, seed, vectors, log)
    ds = load_dataset(n, seed, vectors)
    queries = make_queries(ds, nq)
    eng = open_engine(d / "memory", ds, queries)
    cfg = eng.config
    out: dict[str, Any] = {
        "n": n, "vectors": vectors, "queries_per_kind": nq, "k": K, "radius_m": RADIUS,
        "window_s": WINDOW_S,
        "index": {"kind": ("one HNSW graph per model over every stream (faiss IndexHNSWSQ "
                           f"8-bit, inner product, best {cfg.hnsw_rerank} re-scored exactly)"
                           if cfg.hnsw_storage == "sq8" else
                           "one HNSW graph per model over every stream (faiss IndexHNSWFlat, "
                           "inner product)")
                          + " for unfiltered search (a stream as a filter on its nodes), exact "
                          "numpy scoring of filtered candidates",
                  "hnsw_storage": cfg.hnsw_storage, "hnsw_rerank": cfg.hnsw_rerank,
                  "hnsw_m": cfg.hnsw_m, "ef_construction": cfg.hnsw_ef_construction,
                  "ef_search": cfg.hnsw_ef_search, "hnsw_min_rows": cfg.hnsw_min_rows,
                  "exact_gather_max": cfg.exact_gather_max,
                  "indexes": eng.indexes.stats(), "effective_ef_search": _effective_ef(eng)},
        "kinds": {},
    }
    try:
        for kind in QUERY_KINDS:
            reqs = [request_json(kind, q) for q in queries]
            _timed_search(eng, reqs[: min(20 if n <= 100_000 else 5, nq // 2)])  # warm
            gc.collect()
            lat, outs = _timed_search(eng, reqs)
            exact = recall = 0.0
            cands, short = [], 0
            for q, o in zip(queries, outs):
                if not o.get("ok"):
                    raise RuntimeError(f"{kind} query failed: {o}")
                got = [r["id"] for r in o["results"]]
                gs = [r["score"] for r in o["results"] if r["score"] is not None]
                ref, rs = brute_force(ds, kind, q)
                cands.append(int(candidate_mask(ds, kind, q).sum()))
                exact += same_result(got, gs, ref, rs)
                recall += len(set(got) & set(ref)) / len(ref) if ref else float(not got)
                short += len(got) < min(K, cands[-1])
            # The typed planner alone (no JSON parse/serialise), for the semantic kinds.
            typed = None
            if kind in SEMANTIC_KINDS:
                parsed = [eng.parse_search(r) for r in reqs]
                tl = []
                for req in parsed:
                    t0 = time.perf_counter_ns()
                    eng.run_search(req)
                    tl.append((time.perf_counter_ns() - t0) / 1e6)
                typed = percentiles(tl)
            np.save(raw_dir / f"latency_{kind}_{n}.npy",
                    np.array([lat, cands], dtype=np.float64))  # for tail analysis
            prof = _profile(lambda reqs=reqs[: 50 if n <= 100_000 else 10]:
                            [eng.search(r) for r in reqs],
                            raw_dir / f"profile_{kind}_{n}.pstats")
            out["kinds"][kind] = {
                "latency_ms": percentiles(lat), "typed_run_search_ms": typed,
                "exact_fraction": round(exact / nq, 4), "recall_at_k": round(recall / nq, 4),
                "short_of_k": short,
                "candidates": {"p50": float(np.median(cands)), "max": int(max(cands))},
                "profile_top": prof,
            }
            log(f"  {n} {kind:9s} p50 {out['kinds'][kind]['latency_ms']['p50']:.3f} ms "
                f"p99 {out['kinds'][kind]['latency_ms']['p99']:.3f} ms "
                f"exact {exact / nq:.3f} recall {recall / nq:.3f}")
        out["ef_sweep"] = _ef_sweep(eng, ds, queries)
        # Brute-force mat-vec over all rows, for comparison with the index.
        q = np.asarray(queries[0]["vec"], np.float32)
        bl = []
        for _ in range(max(5, min(30, nq // 10))):
            t0 = time.perf_counter_ns()
            s = ds.vecs @ q
            np.argpartition(-s, K)[:K]
            bl.append((time.perf_counter_ns() - t0) / 1e6)
        out["brute_force_matvec_ms"] = percentiles(bl)
    finally:
        eng.store.close()  # the cached store is read-only here: no index persist
    return out


def _ef_sweep(eng: Any, ds: Dataset, queries: list[dict[str, Any]],
              ms: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Semantic-only latency (typed planner) and recall@5 / recall@10 against brute force at
    several efSearch values, for the engine's graph and for graphs of other M (`ms`, built
    here over the same rows); recall@5 of one-stream semantic queries beside them."""
    from memory_node.core.vectors.faiss_index import GraphIndex

    graphs = eng.indexes.graphs()
    model = ds.model_id
    g0 = graphs.get(model)
    if g0 is None or g0.exact:
        return []
    refs = {kind: [brute_force(ds, kind, q, 10)[0] for q in queries]
            for kind in ("semantic", "stream_semantic")}
    reqs = {(kind, k): [eng.parse_search(request_json(kind, q).replace(
        f'"k": {K}', f'"k": {k}')) for q in queries]
        for kind in ("semantic", "stream_semantic") for k in (K, 10)}
    out = []
    variants: list[tuple[int, Any, float | None]] = [(g0.m, g0, None)]
    for m in ms:
        t0 = time.perf_counter()
        g = GraphIndex(g0.dim, m=m, ef_construction=g0.ef_construction, min_rows=g0.min_rows,
                       storage=g0.storage, rerank=g0.rerank)
        for name, part in g0.parts.items():
            g.attach(name, part)
        g.build()
        variants.append((m, g, time.perf_counter() - t0))
    try:
        for m, g, build_s in variants:
            eng.indexes._graphs[model] = g  # noqa: SLF001 - the sweep swaps graphs in place
            for ef in (16, 32, 48, 64, 96, 128, 192, 256, 384):
                g.ef_for = lambda n, ef=ef: ef  # this graph instance only
                row: dict[str, Any] = {"m": m, "ef_search": ef, "nodes": g.nodes}
                if build_s is not None:
                    row["build_s"] = round(build_s, 1)
                for kind in ("semantic", "stream_semantic"):
                    lat, rec5, rec10 = [], 0.0, 0.0
                    for req, ref in zip(reqs[(kind, K)], refs[kind]):
                        t0n = time.perf_counter_ns()
                        pairs, _ = eng.run_search(req)
                        lat.append((time.perf_counter_ns() - t0n) / 1e6)
                        rec5 += len({o.id for o, _ in pairs} & set(ref[:K])) / max(1, len(ref[:K]))
                    for req, ref in zip(reqs[(kind, 10)], refs[kind]):
                        pairs, _ = eng.run_search(req)
                        rec10 += len({o.id for o, _ in pairs} & set(ref)) / max(1, len(ref))
                    pre = "" if kind == "semantic" else "stream_"
                    row[pre + "typed_ms"] = percentiles(lat)
                    row[pre + "recall_at_5"] = round(rec5 / len(queries), 4)
                    row[pre + "recall_at_10"] = round(rec10 / len(queries), 4)
                out.append(row)
    finally:
        eng.indexes._graphs[model] = g0  # noqa: SLF001
        for _m, g, _b in variants:
            g.__dict__.pop("ef_for", None)
    return out


def _effective_ef(eng: Any) -> dict[str, int | None]:
    """efSearch each model's graph uses for a search over every stream (it grows with the
    graph's size)."""
    return {m: (None if g.exact else g.ef_for(g.nodes))
            for m, g in eng.indexes.graphs().items()}


# ---- prototypes of suggested fixes (before/after, in a scratch copy) ---------------------------
def section_prototypes(n: int, seed: int, vectors: str, nq: int,
                       log: Log, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """Before/after for fixes suggested to core, applied by bench/prototypes.py only.

    `before` (the query section's kinds at this scale, same queries) spares re-measuring
    the slow path where it takes long (1M)."""
    from bench import prototypes

    d = build_store(n, seed, vectors, log)
    ds = load_dataset(n, seed, vectors)
    queries = make_queries(ds, nq)
    mem = d / "memory"  # read-only here: the prototypes do not write to the store
    out: dict[str, Any] = {"n": n, "fixes": prototypes.DESCRIPTIONS, "kinds": {}}
    if before:
        out["before_from"] = "query section"
        for kind, v in before.items():
            out["kinds"][kind] = {"before": {"latency_ms": v["latency_ms"],
                                             "exact_fraction": v["exact_fraction"]}}
    for label in (("after",) if before else ("before", "after")):
        eng = open_engine(mem, ds, queries)
        undo = prototypes.apply(eng) if label == "after" else (lambda: None)
        try:
            for kind in QUERY_KINDS:
                reqs = [request_json(kind, q) for q in queries]
                _timed_search(eng, reqs[: min(20, nq)])
                lat, outs = _timed_search(eng, reqs)
                exact = sum(
                    same_result([r["id"] for r in o["results"]],
                                [r["score"] for r in o["results"] if r["score"] is not None],
                                *brute_force(ds, kind, q))
                    for q, o in zip(queries, outs))
                out["kinds"].setdefault(kind, {})[label] = {
                    "latency_ms": percentiles(lat), "exact_fraction": exact / nq}
                log(f"  {label:6s} {kind:9s} p50 {percentiles(lat)['p50']:.3f} ms")
        finally:
            undo()
            eng.store.close()
    return out


# ---- embedding cost ---------------------------------------------------------------------------
def section_embed(nq: int, log: Log) -> dict[str, Any]:
    """MiniLM embedding of one query (what engine-level query figures exclude)."""
    from memory_node.core.embedders.minilm import MiniLMEmbedder

    emb = MiniLMEmbedder(onnx_threads=1)
    t0 = time.perf_counter()
    emb.embed_texts(["warm-up"])
    load_s = time.perf_counter() - t0
    texts = query_texts(nq, 99)
    lat = []
    for t in texts:
        t0 = time.perf_counter_ns()
        emb.embed_texts([t])
        lat.append((time.perf_counter_ns() - t0) / 1e6)
    out = {"model": emb.model_id, "onnx_threads": 1, "load_s": round(load_s, 3),
           "one_query_ms": percentiles(lat)}
    log(f"  MiniLM one query p50 {out['one_query_ms']['p50']:.2f} ms")
    return out


# ---- save -> searchable -----------------------------------------------------------------------
def section_save(n: int, seed: int, vectors: str, nsaves: int, sustain_s: float,
                 scratch: Path, log: Log) -> dict[str, Any]:
    """Time from calling save to the note being found by a semantic search, and saves/s.

    Runs on a scratch copy of the store with the real MiniLM embedder (embedding included),
    once with the engine as it is and once with the prototyped fixes plus seeding the query
    cache with the note's own vector (the found-check searches for the note's text)."""
    from bench import prototypes

    d = build_store(n, seed, vectors, log)
    ds = load_dataset(n, seed, vectors)
    emb = minilm_embedder(threads=1)  # notes are always embedded with the real text model
    emb.embed_texts(["warm-up"])
    out: dict[str, Any] = {"n": n, "variants": {}}
    for label in ("as_is", "fixed"):
        mem = copy_store(d, scratch / f"save_{n}")
        try:
            out["variants"][label] = _save_run(mem, ds, emb, seed, nsaves, sustain_s,
                                               prototypes if label == "fixed" else None)
        finally:
            shutil.rmtree(mem, ignore_errors=True)
        v = out["variants"][label]
        log(f"  {label}: save->found p50 {v['save_to_found_ms']['p50']:.2f} ms, "
            f"{v['sustained_saves_per_s']} saves/s")
    out.update(out["variants"]["as_is"])
    return out


def _seed_query_cache(eng: Any) -> Callable[[], None]:
    """Prototype: a note's embedding also answers a later query with the same text."""
    orig = eng._embed_texts

    def embed(texts: Any) -> np.ndarray:
        vecs = orig(texts)
        if len(texts) == 1:
            eng.models.remember_query(eng.text_model_id, texts[0], vecs[0])
        return vecs

    eng._embed_texts = embed
    return lambda: setattr(eng, "_embed_texts", orig)


def _save_run(mem: Path, ds: Dataset, emb: Any, seed: int, nsaves: int, sustain_s: float,
              prototypes: Any) -> dict[str, Any]:
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.types import Pose

    start = time.time()
    step = [0]

    def pose() -> Pose:
        step[0] += 1
        a = step[0] * 0.7
        return Pose(x=20 * math.cos(a) + step[0] * 1e-3, y=20 * math.sin(a), source="tf")

    conf = MemoryConfig.from_mapping({"memory_dir": str(mem)})
    eng = MemoryEngine(conf, clock=lambda: ds.now + (time.time() - start), pose_provider=pose,
                       text_embedder=emb, llm_settings=None)
    undo: list[Callable[[], None]] = []
    if prototypes is not None:
        undo = [prototypes.apply(eng), _seed_query_cache(eng)]
    rng = np.random.default_rng(seed + 31)
    words = ("parcel", "visitor", "spill", "alarm", "ladder", "cart", "cable", "light",
             "window", "badge", "delivery", "leak", "noise", "smell", "crack", "plant")
    out: dict[str, Any] = {}
    try:
        save_ms, found_ms, after_ms, misses = [], [], [], 0
        for i in range(nsaves):
            w = rng.choice(words, 3, replace=False)
            note = f"Note {i}: {w[0]} by the {w[1]}, also a {w[2]} (checked at step {i})"
            t0 = time.perf_counter()
            res = json.loads(eng.save(note))
            t1 = time.perf_counter()
            oid = res["id"]
            q = json.dumps({"stream": "events", "semantic_query": note, "k": K})
            found = False
            while time.perf_counter() - t1 < 2.0:
                r = json.loads(eng.search(q))
                if any(x["id"] == oid for x in r.get("results", [])):
                    found = True
                    break
            t2 = time.perf_counter()
            if not found:
                misses += 1
                continue
            save_ms.append((t1 - t0) * 1000)
            found_ms.append((t2 - t0) * 1000)
            after_ms.append((t2 - t1) * 1000)
        out["save_call_ms"] = percentiles(save_ms)
        out["save_to_found_ms"] = percentiles(found_ms)
        out["return_to_found_ms"] = percentiles(after_ms)
        out["not_found_within_2s"] = misses
        t0 = time.perf_counter()
        cnt = 0
        while time.perf_counter() - t0 < sustain_s:
            eng.save(f"Sustained note {cnt}: {' '.join(rng.choice(words, 4))}")
            cnt += 1
        out["sustained_saves_per_s"] = round(cnt / (time.perf_counter() - t0), 1)
        out["sustain_s"] = sustain_s
    finally:
        for u in undo:
            u()
        eng.store.close()
    return out


# ---- ingest (engine level) ----------------------------------------------------------------------
RATES_HZ = {"camera": 14.0, "lidar": 8.0, "odom": 19.0}


def _frame(rng: np.random.Generator, w: int = 640, h: int = 480) -> np.ndarray:
    """A camera-like image: a gradient background with a few coloured rectangles."""
    img = np.empty((h, w, 3), np.uint8)
    img[:] = np.linspace(40, 200, w, dtype=np.uint8)[None, :, None]
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w - 80)), int(rng.integers(0, h - 80))
        img[y0:y0 + 80, x0:x0 + 120] = rng.integers(0, 255, 3, dtype=np.uint8)
    return img


def section_ingest(rates: list[float], seconds: float, scratch: Path, log: Log) -> dict[str, Any]:
    """A Go2-rate message stream into the engine, the way a recorder would feed it.

    Messages arrive on a timer thread at camera 14 Hz, lidar 8 Hz, odometry 19 Hz (times
    `rate`); a keyframe gate (config/go2.yaml: 0.5 m, 0.5 rad, 10 s) keeps camera and lidar
    frames; a bounded queue (16, as in the config) feeds a worker that describes and embeds
    camera batches of 4 and stores lidar scans; a full queue drops the message. The robot
    trots at 0.8 m/s along a circle. The ROS recorder itself is not in this figure.
    """
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.ingest import CameraFrame, LidarScan
    from memory_node.core.types import Pose

    out: dict[str, Any] = {"seconds": seconds, "rates": {}}
    emb = minilm_embedder(threads=1)
    emb.embed_texts(["warm-up"])
    try:
        import psutil

        proc = psutil.Process()
    except ImportError:  # pragma: no cover - psutil is in the dev requirements
        proc = None
    for rate in rates:
        mem = scratch / f"ingest_{rate}"
        shutil.rmtree(mem, ignore_errors=True)
        conf = MemoryConfig.from_mapping({"memory_dir": str(mem)})
        eng = MemoryEngine(conf, text_embedder=emb, llm_settings=None)
        eng.describer.describe(_frame(np.random.default_rng(0)))  # load detectors
        rng = np.random.default_rng(int(rate * 10))
        frames = [_frame(rng) for _ in range(8)]
        pts = rng.normal(0, 3, (8000, 3)).astype(np.float32)
        q: queue.Queue = queue.Queue(maxsize=16)
        counts = {"received": {s: 0 for s in RATES_HZ}, "kept": {"camera": 0, "lidar": 0},
                  "dropped": 0, "described": 0, "embedded": 0, "stored": 0}
        stop = threading.Event()
        t_start = time.perf_counter()

        def robot_pose(t: float) -> Pose:
            a = 0.8 * t / 5.0  # 0.8 m/s on a 5 m circle
            return Pose(x=5 * math.cos(a), y=5 * math.sin(a), yaw=a + math.pi / 2, source="tf")

        def producer() -> None:
            nxt = {s: 0.0 for s in RATES_HZ}
            last: dict[str, tuple[float, Pose] | None] = {"camera": None, "lidar": None}
            while not stop.is_set():
                now = time.perf_counter() - t_start
                if now >= seconds:
                    break
                for s, hz in RATES_HZ.items():
                    if now < nxt[s]:
                        continue
                    nxt[s] += 1.0 / (hz * rate)
                    counts["received"][s] += 1
                    if s == "odom":
                        continue  # odometry feeds the pose only
                    p = robot_pose(now * rate)
                    prev = last[s]
                    keep = prev is None or (
                        p.distance_to(prev[1].x, prev[1].y) >= 0.5
                        or abs(p.yaw - prev[1].yaw) >= 0.5 or now * rate - prev[0] >= 10.0)
                    if not keep:
                        continue
                    last[s] = (now * rate, p)
                    counts["kept"][s] += 1
                    try:
                        q.put_nowait((s, now, p))
                    except queue.Full:
                        counts["dropped"] += 1
                time.sleep(0.001)

        def worker() -> None:
            while not (stop.is_set() and q.empty()):
                try:
                    item = q.get(timeout=0.05)
                except queue.Empty:
                    continue
                batch = [item]
                while item[0] == "camera" and len(batch) < 4:
                    try:
                        nxt_item = q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt_item[0] != "camera":
                        _store(nxt_item)
                        continue
                    batch.append(nxt_item)
                if item[0] == "camera":
                    cams = [CameraFrame(t=1.7e9 + b[1], pose=b[2],
                                        image_bgr=frames[counts["described"] % 8 + 0])
                            for b in batch]
                    eng.add_stream_rows("camera", cams)
                    counts["described"] += len(cams)
                    counts["embedded"] += len(cams)
                    counts["stored"] += len(cams)
                else:
                    for b in batch:
                        _store(b)

        def _store(item: tuple) -> None:
            _s, t, p = item
            eng.add_stream_rows("lidar", [LidarScan(1.7e9 + t, p, pts)])
            counts["stored"] += 1

        cpu0 = proc.cpu_times() if proc else None
        th_p = threading.Thread(target=producer, daemon=True)
        th_w = threading.Thread(target=worker, daemon=True)
        th_p.start()
        th_w.start()
        rss_peak = 0.0
        while th_p.is_alive():
            rss_peak = max(rss_peak, rss_mb())
            time.sleep(0.2)
        stop.set()
        drain0 = time.perf_counter()
        th_w.join(timeout=120)
        wall = time.perf_counter() - t_start
        cpu = None
        if proc and cpu0:
            c1 = proc.cpu_times()
            cpu = round(100 * ((c1.user - cpu0.user) + (c1.system - cpu0.system)) / wall, 1)
        r = {
            "rate": rate, "received": counts["received"],
            "received_per_s": {s: round(v / seconds, 1) for s, v in counts["received"].items()},
            "kept": counts["kept"],
            "kept_per_s": round(sum(counts["kept"].values()) / seconds, 2),
            "described_per_s": round(counts["described"] / wall, 2),
            "embedded_per_s": round(counts["embedded"] / wall, 2),
            "stored": counts["stored"], "dropped": counts["dropped"],
            "drain_s": round(time.perf_counter() - drain0, 2),
            "cpu_percent": cpu, "rss_peak_mb": round(max(rss_peak, rss_mb()), 1),
        }
        out["rates"][str(rate)] = r
        log(f"  ingest {rate}x: kept {r['kept']} described/s {r['described_per_s']} dropped "
            f"{r['dropped']} cpu {cpu}%")
        eng.store.close()
        shutil.rmtree(mem, ignore_errors=True)
    return out


# ---- footprint and start-up -------------------------------------------------------------------
def _probe(mem: Path, model_id: str, mode: str = "now", python: str | None = None
           ) -> dict[str, Any]:
    """bench/probe.py in a fresh process; with `python` (another checkout's interpreter,
    `<checkout>/.venv/bin/python`), the engine of that checkout measured by this probe."""
    import os

    root = Path(python).absolute().parents[2] if python else REPO_ROOT
    cmd = [python or sys.executable, str(BENCH_DIR / "probe.py"), str(mem), model_id, mode]
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"probe failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


PROBE_RUNS = 3  # start-ups per figure: the median, since other work shares the machine


def _probe_median(mem: Path, model_id: str, mode: str = "now", python: str | None = None,
                  runs: int = PROBE_RUNS) -> dict[str, Any]:
    """The probe run whose open + first query is the median of `runs`, with every run's
    figure (`runs_s`; the first may read files from disk, later ones from the page cache)."""
    got = [_probe(mem, model_id, mode, python) for _ in range(runs)]
    key = "open_and_first_query_s"
    for g in got:  # a previous release's probe may lack the combined figure
        g.setdefault(key, round(g["open_s"] + g["first_query_ms"] / 1000, 3))
    got.sort(key=lambda g: g[key])
    return {**got[len(got) // 2], "runs_s": [g[key] for g in got]}


def _per_100k(p: dict[str, Any], n: int) -> dict[str, float]:
    """RSS a probe added over its imports, per 100k rows, by kind."""
    per = n / 100_000
    return {k: round((p["rss"][k] - p["rss_base"][k]) / per, 1)
            for k in ("total", "anon", "file")}


def section_footprint(n: int, seed: int, vectors: str, log: Log,
                      rebuild_max_n: int = 100_000, before: str | None = None
                      ) -> dict[str, Any]:
    """RSS (anonymous and file-backed) and disk per 100k rows; start-up with the index cache
    (first query at once, exact while graphs are read; and once graphs are read), without it,
    and (`before`: another checkout's interpreter) the previous release's start on the same
    store.

    Above `rebuild_max_n` rows the rebuild is not run again (at 1M it takes tens of minutes
    here): the figure measured when the cached store was built is reported instead."""
    d = build_store(n, seed, vectors, log)
    mem = d / "memory"
    ds_model = (d / "model_id").read_text()
    db = sum(p.stat().st_size for p in mem.glob("memory.db*")) / 2**20
    if (mem / "vectors").is_dir():  # the vector files (since manifest 5): the store's too
        db += disk_used_mb(mem / "vectors")
    idx = disk_used_mb(mem / "index")
    manifest = json.loads((mem / "index" / "manifest.json").read_text())
    # Manifest 4 lists one graph per model; earlier ones flagged each stream's entry.
    graphs = len(manifest.get("graphs") or []) or sum(1 for k in manifest["keys"]
                                                       if k.get("hnsw"))
    parts = _disk_parts(mem, manifest)
    now = _probe_median(mem, ds_model, "now")
    # Waiting for graphs means building them when the cache has none (minutes to an hour).
    ready = _probe_median(mem, ds_model, "ready") if graphs else None
    prev = _probe_median(mem, ds_model, "now", before) if before else None
    if n > rebuild_max_n and (d / "build.json").exists():
        b = json.loads((d / "build.json").read_text())
        rebuilt = {"open_s": b["rebuild_and_persist_s"], "from_build_log": True,
                   "note": b.get("note", "")}
    else:
        saved = mem / "index.bench_saved"
        if saved.exists():
            shutil.rmtree(saved)
        (mem / "index").rename(saved)
        try:
            rebuilt = _probe(mem, ds_model)
        finally:
            shutil.rmtree(mem / "index", ignore_errors=True)
            saved.rename(mem / "index")
    per = n / 100_000
    out = {
        "n": n, "disk_db_mb": round(db, 1), "disk_index_mb": round(idx, 1),
        "disk_index_apparent_mb": round(dir_size_mb(mem / "index"), 1),
        "disk_per_100k_mb": round((db + idx) / per, 1),
        "disk_parts_per_100k_mb": {k: round(v / per, 1) for k, v in parts.items()},
        "cached_graphs": graphs, "start_cache_load": now, "start_graphs_ready": ready,
        "start_before": prev, "start_rebuild": rebuilt,
        "rss_per_100k_mb": _per_100k(ready or now, n)["total"],
        "rss_per_100k_split_mb": {"graphs_ready": _per_100k(ready, n) if ready else None,
                                  "first_query_exact": _per_100k(now, n)},
    }
    log(f"  {n}: open + first query {now['open_and_first_query_s']:.2f} s (exact: "
        f"{bool(now['first_query_notes'])}), graphs read after "
        f"{ready['graphs_ready_s'] if ready else '(none cached)'} s"
        + (f", before {prev['open_s']:.2f} s + {prev['first_query_ms']:.0f} ms" if prev else "")
        + f"; RSS/100k {out['rss_per_100k_split_mb']}, disk {db + idx:.0f} MB")
    return out


def _disk_parts(mem: Path, manifest: dict[str, Any]) -> dict[str, float]:
    """Where the disk goes (MB allocated): memory.db's vectors table and the rest of it, the
    vector files, and the cache's id, slot and time/place arrays, and graphs (a cache of an
    earlier release also held vector arrays)."""
    import sqlite3

    con = sqlite3.connect(f"file:{mem / 'memory.db'}?mode=ro", uri=True)
    try:
        vec_b = con.execute("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = 'vectors'"
                            ).fetchone()[0]
    finally:
        con.close()
    db_b = sum(p.stat().st_blocks * 512 for p in mem.glob("memory.db*"))
    out = {"db_vectors": vec_b, "db_rest": db_b - vec_b, "cache_vectors": 0,
           "cache_ids_meta": 0, "cache_graphs": 0,
           "vector_files": sum(p.stat().st_blocks * 512 for p in (mem / "vectors").glob("*"))}
    for p in (mem / "index" / manifest.get("dir", ".")).iterdir():
        kind = ("cache_vectors" if p.name.endswith(".vecs.npy") else
                "cache_graphs" if ".graph." in p.name else "cache_ids_meta")
        out[kind] += p.stat().st_blocks * 512
    return {k: v / 2**20 for k, v in out.items()}


# ---- the hardware limit line --------------------------------------------------------------------
def section_limit(log: Log, mib: int = 512, reps: int = 7) -> dict[str, Any]:
    """Memory bandwidth from a numpy copy (read + write bytes / time, best of `reps`)."""
    a = np.ones(mib * 2**20 // 8, np.float64)
    b = np.empty_like(a)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    bw = 2 * a.nbytes / best
    m = np.random.default_rng(0).normal(size=(100_000, DIM)).astype(np.float32)
    q = m[0].copy()
    mv = math.inf
    for _ in range(reps * 2):
        t0 = time.perf_counter()
        m @ q
        mv = min(mv, time.perf_counter() - t0)
    out = {"copy_bandwidth_gb_s": round(bw / 1e9, 2), "copy_mib": mib,
           "matvec_100k_best_ms": round(mv * 1000, 3),
           "matvec_100k_at_bandwidth_ms": round(m.nbytes / bw * 1000, 3),
           "bytes_per_vector": DIM * 4}
    log(f"  memory bandwidth {bw / 1e9:.1f} GB/s; 100k mat-vec {mv * 1000:.2f} ms")
    return out


def limit_ms(candidates: float, bandwidth_gb_s: float) -> float:
    """Time to stream `candidates` float32 384-d vectors from memory once."""
    return candidates * DIM * 4 / (bandwidth_gb_s * 1e9) * 1000


def cleanup_scratch(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["section_query", "section_save", "section_ingest", "section_footprint",
           "section_limit", "section_embed", "section_prototypes", "limit_ms", "store_dir",
           "BENCH_DIR"]
