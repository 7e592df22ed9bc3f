"""Index-layer section (`--only index`): what a query pays while graphs are built, time windows
with rows out of order, and what loading and writing the checksummed cache cost.

Every figure is a ratio against a baseline measured in the same process on the same data:
- graphs: semantic-only and combined queries while every graph is rebuilt in the background,
  against the same queries with the graphs idle; the first unfiltered query after a start with
  no cached graph, against the synchronous build the previous release ran inside that query;
- time order: the combined query's in-memory path (time window, radius, exact scoring) over
  the camera rows inserted in time order, with 5% inserted late, and the previous release's
  path for late rows (a mask over the whole stream);
- cache: start-up load (checksums and sampled verification included) and the checksum share.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import percentiles
from bench.engine_bench import (
    RADIUS,
    WINDOW_S,
    K,
    _timed_search,
    brute_force,
    make_queries,
    open_engine,
    request_json,
    same_result,
)
from bench.workload import STREAMS, build_store, copy_store, load_dataset

Log = Callable[[str], None]
PACE_S = 0.02  # between queries while graphs build
BIG_N = 200_000  # above it, a build from nothing is watched for COLD_WATCH_S, not waited for
COLD_WATCH_S = 180.0


def _p(lat: list[float]) -> dict[str, float]:
    return percentiles(lat)


def section_index(n: int, seed: int, vectors: str, nq: int, scratch: Path, log: Log
                  ) -> dict[str, Any]:
    d = build_store(n, seed, vectors, log)
    ds = load_dataset(n, seed, vectors)
    queries = make_queries(ds, nq)
    sem = [request_json("semantic", q) for q in queries]
    comb = [request_json("combined", q) for q in queries]
    out: dict[str, Any] = {"n": n, "vectors": vectors, "nq": nq}

    # ---- 1. queries while every graph is rebuilt in the background ---------------------------
    eng = open_engine(d / "memory", ds, queries)
    _timed_search(eng, sem[:20] + comb[:20])  # warm-up
    idle = {"semantic": _p(_timed_search(eng, sem)[0]), "combined": _p(_timed_search(eng, comb)[0])}
    graphs = [g for g in eng.indexes.graphs().values() if not g.exact]
    t0 = time.perf_counter()
    for g in graphs:
        g.request_rebuild()
    done = threading.Event()

    def waiter() -> None:
        eng.indexes.wait_for_graphs()
        done.set()

    threading.Thread(target=waiter, daemon=True).start()
    lat_s, lat_c, rounds = [], [], 0
    while not done.is_set():  # an agent's pace, not a saturating load: a query every 20 ms
        for a, b in zip(sem, comb):
            lat_s += _timed_search(eng, [a])[0]
            lat_c += _timed_search(eng, [b])[0]
            if done.wait(PACE_S):
                break
        rounds += 1
    rebuild_s = time.perf_counter() - t0
    during = {"semantic": _p(lat_s), "combined": _p(lat_c)}
    out["rebuild"] = {
        "graphs": [f"{g.dim}-d x {len(g)}" for g in graphs],
        "rebuild_s": round(rebuild_s, 1), "rounds": rounds, "idle": idle, "during": during,
        "ratio_p50": {k: round(during[k]["p50"] / idle[k]["p50"], 2) for k in idle},
        "ratio_p99": {k: round(during[k]["p99"] / idle[k]["p99"], 2) for k in idle}}
    log(f"  rebuild of {len(graphs)} graphs in {rebuild_s:.1f} s with queries running; p50 "
        f"semantic {during['semantic']['p50']} vs {idle['semantic']['p50']} ms idle")
    eng.close()

    # ---- 2. a start with no cached graph: first query now vs the build it used to wait for ---
    mem = copy_store(d, scratch / "index_cold", with_index=False)
    t0 = time.perf_counter()
    eng = open_engine_nowait(mem, ds, queries)
    open_s = time.perf_counter() - t0
    first = _timed_search(eng, sem[:1])
    first_ms, first_noted = first[0][0], bool(first[1][0].get("notes"))
    exact_cold = _exactness(ds, queries[:50], eng, "semantic")  # while the graphs build
    still_building = not eng.indexes.wait_for_graphs(0)
    cold = []
    # Above BIG_N the build from nothing is watched for COLD_WATCH_S only: section 1 already
    # timed a whole build, and a second and third one would add half an hour at 1M.
    big = n > BIG_N
    watch_until = time.perf_counter() + (COLD_WATCH_S if big else float("inf"))
    while not eng.indexes.wait_for_graphs(0) and time.perf_counter() < watch_until:
        cold += _timed_search(eng, sem[len(cold) % len(sem):][:1])[0]
        time.sleep(PACE_S)
    graph_ready_s: float | None = None
    noted: int | None = None
    if eng.indexes.wait_for_graphs(0):
        outs = _timed_search(eng, sem)[1]
        noted = sum(1 for o in outs if o.get("notes"))
        graph_ready_s = round(time.perf_counter() - t0, 1)
    watched_s = round(time.perf_counter() - t0, 1)
    eng.close()
    if big:  # the build the previous release ran inline: section 1's, on the same rows
        inline_build_s, inline_from = rebuild_s, "rebuild"
    else:
        # The previous release built every graph inside the first unfiltered query: that
        # build, synchronous on every core, in this process.
        eng = open_engine_nowait(copy_store(d, scratch / "index_cold2", with_index=False), ds,
                                 queries)
        eng.indexes.close()  # no background worker: measure the inline build alone
        t0 = time.perf_counter()
        for g in eng.indexes.graphs().values():
            if len(g) >= g.min_rows:
                g.build()
        inline_build_s, inline_from = time.perf_counter() - t0, "inline"
        eng.close()
    out["cold"] = {"open_s": round(open_s, 2), "first_query_ms": round(first_ms, 2),
                   "queries_while_building": _p(cold), "graphs_ready_s": graph_ready_s,
                   "watched_s": watched_s,
                   "notes_after_ready": noted, "exact_while_building": exact_cold,
                   "first_query_noted": first_noted, "still_building_after_check":
                   still_building,
                   "inline_build_s": round(inline_build_s, 1), "inline_from": inline_from,
                   "first_query_ratio": round(inline_build_s * 1000 / max(first_ms, 1e-3))}
    log(f"  cold start: first query {first_ms:.1f} ms vs {inline_build_s:.1f} s inline build")
    shutil.rmtree(scratch / "index_cold", ignore_errors=True)
    shutil.rmtree(scratch / "index_cold2", ignore_errors=True)

    # ---- 3. time windows with rows out of order ------------------------------------------------
    out["time_order"] = _time_order(ds, queries)
    log(f"  time order: {out['time_order']}")

    # ---- 4. the cache: load and write ------------------------------------------------------------
    out["cache"] = _cache_costs(d, ds, queries, scratch)
    log(f"  cache: {out['cache']}")
    return out


def open_engine_nowait(mem: Path, ds: Any, queries: list[dict[str, Any]]) -> Any:
    from bench.workload import LookupEmbedder
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    table = {q["text"]: np.asarray(q["vec"], np.float32) for q in queries}
    conf = MemoryConfig.from_mapping({"memory_dir": str(mem)})
    emb = LookupEmbedder(ds.model_id, table)
    return MemoryEngine(conf, clock=lambda: ds.now, text_embedder=emb, llm_settings=None)


def _exactness(ds: Any, queries: list[dict[str, Any]], eng: Any, kind: str) -> float:
    ok = 0
    for q in queries:
        res = eng.ask_search(request_json(kind, q)).model_dump()["results"]
        ref, ref_s = brute_force(ds, kind, q)
        ok += same_result([r["id"] for r in res], [r["score"] for r in res], ref, ref_s)
    return round(ok / len(queries), 3)


def _time_order(ds: Any, queries: list[dict[str, Any]]) -> dict[str, Any]:
    """The combined query's in-memory path over the camera rows, three ways."""
    from memory_node.core.vectors import ExactIndex, top_k

    cam = np.nonzero(ds.stream == STREAMS.index("camera"))[0]
    vecs = np.asarray(ds.vecs[cam], np.float32)
    meta = np.column_stack([ds.t[cam], ds.x[cam], ds.y[cam]])
    ids = cam.astype(np.int64) + 1
    rng = np.random.default_rng(ds.seed + 99)
    late = np.sort(rng.choice(len(cam), len(cam) // 20, replace=False))
    order_late = np.concatenate([np.setdiff1d(np.arange(len(cam)), late), rng.permutation(late)])
    t_min = ds.now - WINDOW_S
    res: dict[str, Any] = {"rows": int(len(cam)), "late_share": 0.05}
    idx_in, idx_late = ExactIndex(vecs.shape[1]), ExactIndex(vecs.shape[1])
    for lo in range(0, len(cam), 1000):  # arrive in batches, as from the recorder
        sl = np.arange(lo, min(lo + 1000, len(cam)))
        idx_in.add(ids[sl], vecs[sl], meta[sl])
        o = order_late[sl]
        idx_late.add(ids[o], vecs[o], meta[o])

    def run(fn: Callable[[dict[str, Any]], Any]) -> tuple[list[float], list[Any]]:
        for q in queries[:20]:
            fn(q)
        lat, got = [], []
        for q in queries:
            t0 = time.perf_counter_ns()
            r = fn(q)
            lat.append((time.perf_counter_ns() - t0) / 1e6)
            got.append(r[0].tolist())
        return lat, got

    def new_path(idx: ExactIndex) -> Callable[[dict[str, Any]], Any]:
        def f(q: dict[str, Any]) -> Any:
            pos = idx.filter_positions(t_min, None, tuple(q["near"]), RADIUS)
            return idx.search_positions(np.asarray(q["vec"], np.float32), K, pos)
        return f

    def old_late_path(q: dict[str, Any]) -> Any:
        # What the previous release did once any row had arrived late: compare every row.
        m = idx_late.meta()
        mask = m[:, 0] >= t_min
        pos = np.flatnonzero(mask)
        xy = m[pos, 1:]
        pos = pos[(xy[:, 0] - q["near"][0]) ** 2 + (xy[:, 1] - q["near"][1]) ** 2
                  <= RADIUS * RADIUS]
        v = idx_late.vectors_at(pos) @ np.asarray(q["vec"], np.float32)
        return top_k(idx_late.ids_at(pos), v, K)

    lat_in, got_in = run(new_path(idx_in))
    lat_late, got_late = run(new_path(idx_late))
    lat_old, got_old = run(old_late_path)
    assert got_in == got_late == got_old, "the three paths must give the same answers"
    res.update(in_order=_p(lat_in), late_now=_p(lat_late), late_before=_p(lat_old),
               ratio_late_vs_in_order=round(_p(lat_late)["p50"] / _p(lat_in)["p50"], 2),
               ratio_before_vs_now=round(_p(lat_old)["p50"] / _p(lat_late)["p50"], 2))
    return res


def _cache_costs(d: Path, ds: Any, queries: list[dict[str, Any]], scratch: Path
                 ) -> dict[str, Any]:
    import memory_node.core.vectors.index_cache as cache

    mem = copy_store(d, scratch / "index_cache")
    t0 = time.perf_counter()
    eng = open_engine_nowait(mem, ds, queries)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    files = [p for p in (mem / "index").rglob("*") if p.is_file() and p.name != ".lock"]
    for p in files:  # the checksums the open runs: the arrays (graphs: in the background)
        if p.name.endswith((".ids.npy", ".slots.npy", ".meta.npy")):
            cache._file_sum(p)  # noqa: SLF001 - the checksum pass the loader runs, timed alone
    for p in (mem / "vectors").glob("*.f32"):  # and the vector file rows the cache names
        cache._crc_prefix(p, p.stat().st_size)  # noqa: SLF001 - timed alone
    sum_s = time.perf_counter() - t0
    size_mb = sum(p.stat().st_size for p in files) / 2**20
    t0 = time.perf_counter()
    ok = eng.indexes.persist()
    persist_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    eng.indexes._verify_sample()  # noqa: SLF001 - timed alone
    verify_ms = (time.perf_counter() - t0) * 1000
    eng.close()
    shutil.rmtree(scratch / "index_cache", ignore_errors=True)
    return {"open_s": round(load_s, 2), "checksum_s": round(sum_s, 2), "checksummed": "arrays",
            "checksum_share": round(sum_s / load_s, 3), "verify_sample_ms": round(verify_ms, 1),
            "cache_mb": round(size_mb, 1), "persist_s": round(persist_s, 2), "persisted": ok}
