"""HNSW build settings vs recall@5 and latency on one stream's vectors (a side experiment).

Usage: python -m bench.hnsw_sweep [--n 100000] [--vectors synthetic] [--scale 1000000]
Takes the camera rows of a cached store's vectors, builds HNSW graphs (inner product) with
several (storage, M, efConstruction) — float copies (IndexHNSWFlat) or 8-bit codes
(IndexHNSWSQ) whose best RERANK candidates are re-scored exactly, as the engine does — and
measures single-query latency and recall@5 against brute force at several efSearch values.
Writes bench/results/history/hnsw_sweep.json.
"""

from __future__ import annotations

import argparse
import os
import time

import faiss
import numpy as np

from bench.common import DEFAULT_RESULTS, percentiles, write_json
from bench.workload import STREAMS, build_store, load_dataset, query_vectors

CONFIGS = (("flat", 32, 80), ("flat", 32, 200), ("flat", 48, 200), ("sq8", 32, 80),
           ("sq8", 48, 200))
EF = (64, 128, 256, 384, 512)
RERANK = 40


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=100_000, help="camera vectors to index")
    p.add_argument("--scale", type=int, default=1_000_000)
    p.add_argument("--vectors", default="synthetic")
    p.add_argument("--queries", type=int, default=100)
    args = p.parse_args()
    build_store(args.scale, 1, args.vectors)
    ds = load_dataset(args.scale, 1, args.vectors)
    cam = np.nonzero(ds.stream == STREAMS.index("camera"))[0][: args.n]
    x = np.ascontiguousarray(ds.vecs[cam])
    _texts, q = query_vectors(ds, args.queries)
    truth = [set(np.argsort(-(x @ qq))[:5].tolist()) for qq in q]
    out = {"n": len(x), "vectors": args.vectors, "results": []}
    for storage, m, efc in CONFIGS:
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        if storage == "sq8":
            idx = faiss.IndexHNSWSQ(x.shape[1], faiss.ScalarQuantizer.QT_8bit, m,
                                    faiss.METRIC_INNER_PRODUCT)
        else:
            idx = faiss.IndexHNSWFlat(x.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = efc
        t0 = time.perf_counter()
        idx.train(x)
        idx.add(x)
        build_s = time.perf_counter() - t0
        faiss.omp_set_num_threads(1)
        for ef in EF:
            idx.hnsw.efSearch = ef
            lat, rec = [], 0.0
            for qq, tr in zip(q, truth):
                t1 = time.perf_counter_ns()
                _s, i = idx.search(qq.reshape(1, -1), RERANK if storage == "sq8" else 13)
                found = i[0][i[0] >= 0]
                if storage == "sq8":
                    found = found[np.argsort(-(x[found] @ qq))]
                lat.append((time.perf_counter_ns() - t1) / 1e6)
                rec += len(set(found[:5].tolist()) & tr) / 5
            r = {"storage": storage, "m": m, "ef_construction": efc,
                 "build_s_2_threads": round(build_s, 1),
                 "ef_search": ef, "latency_ms": percentiles(lat),
                 "recall_at_5": round(rec / len(q), 4)}
            out["results"].append(r)
            print(storage, r["m"], efc, ef, r["build_s_2_threads"], r["latency_ms"]["p50"],
                  r["recall_at_5"], flush=True)
    write_json(DEFAULT_RESULTS / "history" / "hnsw_sweep.json", out)


if __name__ == "__main__":
    main()
