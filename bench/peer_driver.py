"""Drive one peer store through its own public API on the exported workload.

Runs in the peers' virtual environment (bench/.venv-peers), never in the project's: it imports
only numpy, the standard library and the peer. Usage:

    python bench/peer_driver.py PEER DATA_DIR WORK_DIR OUT_JSON

PEER is one of sqlite-vec, chroma, milvus-lite, memsearch. DATA_DIR holds vectors.npy,
meta.npz, queries.npz and params.json (written by bench/peers.py). The driver ingests every
row, then runs each query kind it can express one query at a time, and writes latencies, ids
and scores; exactness against brute force is judged by the caller.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

Result = tuple[list[int], list[float]]


def rss_peak_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


class Workload:
    def __init__(self, data: Path):
        self.vecs = np.load(data / "vectors.npy", mmap_mode="r")
        m = np.load(data / "meta.npz")
        self.stream, self.t, self.x, self.y = m["stream"], m["t"], m["x"], m["y"]
        qz = np.load(data / "queries.npz")
        self.qvec, self.near = qz["qvec"], qz["near"]
        self.p = json.loads((data / "params.json").read_text())
        self.streams: list[str] = self.p["streams"]
        self.k: int = self.p["k"]
        self.radius: float = self.p["radius"]
        self.t_min: float = self.p["t_min"]
        self.qtexts: list[str] = self.p["query_texts"]
        texts = data / "texts.json"
        self.texts: list[str] | None = json.loads(texts.read_text()) if texts.exists() else None
        self.n = len(self.t)

    def within(self, ids: list[int], nx: float, ny: float) -> list[bool]:
        r2 = self.radius ** 2
        return [(self.x[i - 1] - nx) ** 2 + (self.y[i - 1] - ny) ** 2 <= r2 for i in ids]


def widen(fetch: Callable[[int], Result], keep: Callable[[list[int]], list[bool]], k: int,
          cap: int) -> tuple[Result, int]:
    """Ask for k, then 4x more, until k rows pass the exact check or the store runs out:
    what a user of a store without arithmetic filters must do for a radius."""
    kk = k
    rounds = 0
    while True:
        rounds += 1
        ids, scores = fetch(kk)
        ok = keep(ids)
        got = [(i, s) for i, s, o in zip(ids, scores, ok) if o]
        if len(got) >= k or len(ids) < kk or kk >= cap:
            got = got[:k]
            return ([i for i, _ in got], [s for _, s in got]), rounds
        kk = min(cap, kk * 4)


def run_kind(name: str, w: Workload, fn: Callable[[int], tuple[Result, int]],
             out: dict[str, Any]) -> None:
    nq = len(w.qvec)
    for i in range(min(10, nq)):  # warm-up
        fn(i)
    lat, ids, scores, rounds = [], [], [], []
    budget = float(w.p.get("query_budget_s", 150.0))
    start = time.perf_counter()
    for i in range(nq):
        if i >= 10 and time.perf_counter() - start > budget:
            break  # a very slow peer answers the first queries only (the report says so)
        t0 = time.perf_counter_ns()
        (r_ids, r_scores), r = fn(i)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        ids.append([int(x) for x in r_ids])
        scores.append([float(s) for s in r_scores])
        rounds.append(r)
    out["kinds"][name] = {"lat_ms": lat, "ids": ids, "scores": scores,
                          "max_fetch_rounds": max(rounds)}


# ---- sqlite-vec ---------------------------------------------------------------------------------
def peer_sqlite_vec(w: Workload, work: Path, out: dict[str, Any]) -> None:
    import sqlite_vec

    db = sqlite3.connect(str(work / "vec.db"), isolation_level=None)
    db.enable_load_extension(True)
    sqlite_vec.load(db)
    db.enable_load_extension(False)
    out["version"] = version("sqlite-vec")
    out["sqlite"] = sqlite3.sqlite_version
    db.execute(f"CREATE VIRTUAL TABLE items USING vec0(embedding float[{w.vecs.shape[1]}]"
               " distance_metric=cosine, stream text, t float, x float, y float)")
    # A plain table with an R*Tree for the one-statement exact variant (rowid IN subquery).
    db.execute("CREATE TABLE meta(id INTEGER PRIMARY KEY, stream TEXT, t REAL, x REAL, y REAL)")
    db.execute("CREATE INDEX meta_st ON meta(stream, t)")
    db.execute("CREATE VIRTUAL TABLE xy USING rtree(id, minx, maxx, miny, maxy)")
    t0 = time.perf_counter()
    db.execute("BEGIN")
    for s in range(0, w.n, 10_000):
        e = min(w.n, s + 10_000)
        rows = [(i + 1, w.vecs[i].tobytes(), w.streams[w.stream[i]], float(w.t[i]),
                 float(w.x[i]), float(w.y[i])) for i in range(s, e)]
        db.executemany("INSERT INTO items(rowid, embedding, stream, t, x, y)"
                       " VALUES (?,?,?,?,?,?)", rows)
        db.executemany("INSERT INTO meta VALUES (?,?,?,?,?)", [r[:1] + r[2:] for r in rows])
        db.executemany("INSERT INTO xy VALUES (?,?,?,?,?)",
                       [(r[0], r[4], r[4], r[5], r[5]) for r in rows])
    db.execute("COMMIT")
    out["ingest_s"] = time.perf_counter() - t0
    k, rad = w.k, w.radius
    cap = 4096  # sqlite-vec's limit on k

    def combined_meta(i: int) -> tuple[Result, int]:
        nx, ny = map(float, w.near[i])
        q = w.qvec[i].tobytes()

        def fetch(kk: int) -> Result:
            rows = db.execute(
                "SELECT rowid, distance FROM items WHERE embedding MATCH ? AND k = ?"
                " AND stream = 'camera' AND t >= ? AND x >= ? AND x <= ? AND y >= ? AND y <= ?",
                (q, kk, w.t_min, nx - rad, nx + rad, ny - rad, ny + rad)).fetchall()
            return [r[0] for r in rows], [1.0 - r[1] for r in rows]

        return widen(fetch, lambda ids: w.within(ids, nx, ny), k, cap)

    def combined_rtree(i: int) -> tuple[Result, int]:
        nx, ny = map(float, w.near[i])
        rows = db.execute(
            "SELECT rowid, distance FROM items WHERE embedding MATCH ? AND k = ? AND rowid IN ("
            " SELECT m.id FROM meta m JOIN xy ON xy.id = m.id AND xy.minx <= ? AND xy.maxx >= ?"
            " AND xy.miny <= ? AND xy.maxy >= ? WHERE m.stream = 'camera' AND m.t >= ?"
            " AND (m.x - ?) * (m.x - ?) + (m.y - ?) * (m.y - ?) <= ?)",
            (w.qvec[i].tobytes(), k, nx + rad, nx - rad, ny + rad, ny - rad, w.t_min,
             nx, nx, ny, ny, rad * rad)).fetchall()
        return ([r[0] for r in rows], [1.0 - r[1] for r in rows]), 1

    def semantic(i: int) -> tuple[Result, int]:
        rows = db.execute("SELECT rowid, distance FROM items WHERE embedding MATCH ? AND k = ?",
                          (w.qvec[i].tobytes(), k)).fetchall()
        return ([r[0] for r in rows], [1.0 - r[1] for r in rows]), 1

    run_kind("combined", w, combined_meta, out)
    out["kinds"]["combined"]["how"] = ("vec0 metadata columns (stream, t, bounding box) in the"
                                       " KNN query, exact radius check after, k widened x4"
                                       " until k rows pass")
    run_kind("combined_rtree", w, combined_rtree, out)
    out["kinds"]["combined_rtree"]["how"] = ("one statement: KNN with rowid IN (R*Tree + stream"
                                             " + time + exact radius subquery)")
    run_kind("semantic", w, semantic, out)
    out["kinds"]["semantic"]["how"] = "vec0 KNN (brute force over every chunk)"
    db.close()


# ---- ChromaDB -----------------------------------------------------------------------------------
def _chroma_collection(w: Workload, work: Path, out: dict[str, Any], metadata: bool) -> Any:
    """A persistent ChromaDB collection (default HNSW, inner product) holding every row, with
    (stream, t, x, y) metadata for filtered queries; its version and ingest time in `out`."""
    import chromadb
    from chromadb.config import Settings

    out["version"] = version("chromadb")
    client = chromadb.PersistentClient(path=str(work / "chroma"),
                                       settings=Settings(anonymized_telemetry=False))
    col = client.create_collection("bench", embedding_function=None,
                                   configuration={"hnsw": {"space": "ip"}})
    t0 = time.perf_counter()
    batch = min(5000, client.get_max_batch_size())
    for s in range(0, w.n, batch):
        e = min(w.n, s + batch)
        meta = ([{"stream": w.streams[w.stream[i]], "t": float(w.t[i]), "x": float(w.x[i]),
                  "y": float(w.y[i])} for i in range(s, e)] if metadata else None)
        col.add(ids=[str(i + 1) for i in range(s, e)], embeddings=np.asarray(w.vecs[s:e]),
                metadatas=meta)
    out["ingest_s"] = time.perf_counter() - t0
    return col


def peer_chroma(w: Workload, work: Path, out: dict[str, Any]) -> None:
    col = _chroma_collection(w, work, out, metadata=True)
    k, rad = w.k, w.radius

    def parse(res: dict[str, Any]) -> Result:
        return [int(x) for x in res["ids"][0]], [1.0 - d for d in res["distances"][0]]

    def combined(i: int) -> tuple[Result, int]:
        nx, ny = map(float, w.near[i])
        where = {"$and": [{"stream": "camera"}, {"t": {"$gte": w.t_min}},
                          {"x": {"$gte": nx - rad}}, {"x": {"$lte": nx + rad}},
                          {"y": {"$gte": ny - rad}}, {"y": {"$lte": ny + rad}}]}

        def fetch(kk: int) -> Result:
            return parse(col.query(query_embeddings=[w.qvec[i]], n_results=kk, where=where,
                                   include=["distances"]))

        return widen(fetch, lambda ids: w.within(ids, nx, ny), k, w.n)

    def semantic(i: int) -> tuple[Result, int]:
        return parse(col.query(query_embeddings=[w.qvec[i]], n_results=k,
                               include=["distances"])), 1

    run_kind("combined", w, combined, out)
    out["kinds"]["combined"]["how"] = ("where: stream, t and a bounding box ($and of"
                                       " comparisons; no arithmetic), exact radius check"
                                       " after, n_results widened x4 until k rows pass")
    run_kind("semantic", w, semantic, out)
    out["kinds"]["semantic"]["how"] = "default HNSW (space ip)"


def peer_chroma_semantic(w: Workload, work: Path, out: dict[str, Any]) -> None:
    """ChromaDB on semantic-only queries alone, at k and at 10 (bench/semantic_bench.py)."""
    col = _chroma_collection(w, work, out, metadata=False)

    def semantic(kk: int) -> Callable[[int], tuple[Result, int]]:
        def run(i: int) -> tuple[Result, int]:
            res = col.query(query_embeddings=[w.qvec[i]], n_results=kk, include=["distances"])
            return ([int(x) for x in res["ids"][0]], [1.0 - d for d in res["distances"][0]]), 1
        return run

    run_kind("semantic", w, semantic(w.k), out)
    out["kinds"]["semantic"]["how"] = "default HNSW (space ip)"
    run_kind("semantic10", w, semantic(10), out)


# ---- Milvus Lite (pymilvus) -------------------------------------------------------------------
def _milvus_expr(w: Workload, i: int) -> str:
    nx, ny = map(float, w.near[i])
    return (f'stream == "camera" and t >= {w.t_min!r} and ((x - {nx!r}) * (x - {nx!r}) + '
            f"(y - {ny!r}) * (y - {ny!r})) <= {w.radius * w.radius!r}")


def peer_milvus(w: Workload, work: Path, out: dict[str, Any]) -> None:
    from pymilvus import DataType, MilvusClient

    out["version"] = f"pymilvus {version('pymilvus')}, milvus-lite {version('milvus-lite')}"
    index_type = w.p.get("milvus_index", "FLAT")
    client = MilvusClient(str(work / "milvus.db"))
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=int(w.vecs.shape[1]))
    schema.add_field("stream", DataType.VARCHAR, max_length=16)
    for f in ("t", "x", "y"):
        schema.add_field(f, DataType.DOUBLE)
    ip = client.prepare_index_params()
    ip.add_index(field_name="vec", index_type=index_type, metric_type="IP")
    client.create_collection("bench", schema=schema, index_params=ip)
    t0 = time.perf_counter()
    for s in range(0, w.n, 5000):
        e = min(w.n, s + 5000)
        client.insert("bench", [{"id": i + 1, "vec": w.vecs[i].tolist(),
                                 "stream": w.streams[w.stream[i]], "t": float(w.t[i]),
                                 "x": float(w.x[i]), "y": float(w.y[i])} for i in range(s, e)])
    client.flush("bench")
    client.load_collection("bench")
    out["ingest_s"] = time.perf_counter() - t0
    out["index"] = index_type
    k = w.k

    def search(i: int, expr: str) -> tuple[Result, int]:
        res = client.search("bench", data=[w.qvec[i].tolist()], limit=k, filter=expr,
                            search_params={"metric_type": "IP"})
        hits = res[0]
        return ([int(h["id"]) for h in hits], [float(h["distance"]) for h in hits]), 1

    run_kind("combined", w, lambda i: search(i, _milvus_expr(w, i)), out)
    out["kinds"]["combined"]["how"] = (f"{index_type} index, filter expression with arithmetic"
                                       " (a true radius) inside the search")
    run_kind("semantic", w, lambda i: search(i, ""), out)
    out["kinds"]["semantic"]["how"] = f"{index_type} index"
    client.close()


# ---- memsearch ---------------------------------------------------------------------------------
def peer_memsearch(w: Workload, work: Path, out: dict[str, Any]) -> None:
    """memsearch's own store class (memsearch.store.MilvusStore) with our vectors.

    `MemSearch.search` embeds the query with a provider (its default fetches a model from a
    hub, which fails here) and accepts only a source-prefix filter, so it cannot express stream,
    time or radius. Its store does: upsert takes our records (dynamic fields carry stream, t, x,
    y) and search takes any Milvus filter expression; its ranking is hybrid (dense + BM25 fused
    by RRF), which is what memsearch users get.
    """
    from memsearch.store import MilvusStore

    out["version"] = f"memsearch {version('memsearch')}, milvus-lite {version('milvus-lite')}"
    store = MilvusStore(uri=str(work / "memsearch.db"), collection="bench",
                        dimension=int(w.vecs.shape[1]))
    texts = w.texts or [f"{w.streams[s]} observation {i}" for i, s in enumerate(w.stream)]
    t0 = time.perf_counter()
    for s in range(0, w.n, 2000):
        e = min(w.n, s + 2000)
        store.upsert([{"chunk_hash": str(i + 1), "embedding": w.vecs[i].tolist(),
                       "content": texts[i], "source": w.streams[w.stream[i]], "heading": "",
                       "heading_level": 0, "start_line": 0, "end_line": 0,
                       "stream": w.streams[w.stream[i]], "t": float(w.t[i]),
                       "x": float(w.x[i]), "y": float(w.y[i])} for i in range(s, e)])
    out["ingest_s"] = time.perf_counter() - t0

    def search(i: int, expr: str) -> tuple[Result, int]:
        hits = store.search(w.qvec[i].tolist(), query_text=w.qtexts[i], top_k=w.k,
                            filter_expr=expr)
        return ([int(h["chunk_hash"]) for h in hits], [float(h["score"]) for h in hits]), 1

    run_kind("combined", w, lambda i: search(i, _milvus_expr(w, i)), out)
    out["kinds"]["combined"]["how"] = ("MilvusStore.search with a filter expression on dynamic"
                                       " fields; hybrid dense + BM25 ranking (RRF)")
    run_kind("semantic", w, lambda i: search(i, ""), out)
    out["kinds"]["semantic"]["how"] = "MilvusStore.search, hybrid dense + BM25 (RRF)"
    out["cannot_express"] = ("MemSearch.search takes only a source-prefix filter: no stream,"
                             " time or radius")
    store.close()
    asyncio.set_event_loop(None)


PEERS = {"sqlite-vec": peer_sqlite_vec, "chroma": peer_chroma, "milvus-lite": peer_milvus,
         "memsearch": peer_memsearch, "chroma-semantic": peer_chroma_semantic}


def main() -> None:
    peer, data, work, out_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    work.mkdir(parents=True, exist_ok=True)
    w = Workload(data)
    out: dict[str, Any] = {"peer": peer, "n": w.n, "queries": len(w.qvec), "kinds": {},
                           "python": sys.version.split()[0]}
    t0 = time.perf_counter()
    PEERS[peer](w, work, out)
    out["wall_s"] = time.perf_counter() - t0
    out["rss_peak_mb"] = rss_peak_mb()
    for v in out["kinds"].values():
        v["lat_ms"] = [round(x, 4) for x in v["lat_ms"]]
    Path(out_path).write_text(json.dumps(out))
    print(f"{peer}: ingest {out.get('ingest_s', math.nan):.1f} s, wall {out['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
