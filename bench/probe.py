"""Start-up probe, run in a fresh process so RSS and open time are the engine's alone.

Usage: python bench/probe.py MEMORY_DIR MODEL_ID [now|ready]  ->  one JSON line on stdout.
`now` (default) asks the first query as soon as the engine is open (cached graphs may still be
read in the background: that query is exact and its notes say so); `ready` waits until the
background has read (or built) every graph first. Self-contained apart from the engine and
the lookup embedder, so that the same probe can measure another checkout (`--before`: run with
that checkout first on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import sys
import time

QUERIES = 20  # after the first: RSS once a few searches have run


def rss_mb() -> dict[str, float]:
    """Resident memory: total, anonymous, file-backed (mapped files and libraries), peak."""
    keys = {"VmRSS:": "total", "RssAnon:": "anon", "RssFile:": "file", "VmHWM:": "peak"}
    out = dict.fromkeys(keys.values(), 0.0)
    with open("/proc/self/status") as fh:
        for line in fh:
            k = line.split(None, 1)[0]
            if k in keys:
                out[keys[k]] = round(int(line.split()[1]) / 1024.0, 1)
    return out


def main() -> None:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run as a script: bench/'s modules are not top-level modules
    mem, model_id = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "now"
    t_imp = time.perf_counter()
    import faiss  # noqa: F401 - imported here so the baseline RSS includes it

    from bench.workload import LookupEmbedder
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    import_s = time.perf_counter() - t_imp
    base = rss_mb()
    conf = MemoryConfig.from_mapping({"memory_dir": mem})
    t0 = time.perf_counter()
    eng = MemoryEngine(conf, text_embedder=LookupEmbedder(model_id), llm_settings=None)
    open_s = time.perf_counter() - t0
    out: dict = {"mode": mode, "open_s": round(open_s, 3), "import_s": round(import_s, 3),
                 "rss_base": base, "rss_open": rss_mb()}
    if mode == "ready":  # graphs read from the cache (the wait includes no build when read)
        wait = getattr(eng.indexes, "wait_for_cached_graphs", eng.indexes.wait_for_graphs)
        out["graphs_ready"] = wait(3600)
        out["graphs_ready_s"] = round(time.perf_counter() - t0, 3)
    t1 = time.perf_counter()
    res = eng.ask_search('{"semantic_query": "first query after start", "k": 5}').model_dump()
    out.update(first_query_ms=round((time.perf_counter() - t1) * 1000, 2),
               open_and_first_query_s=round(time.perf_counter() - t0, 3),
               first_query_notes=res.get("notes", []))
    for i in range(QUERIES):
        eng.search(f'{{"semantic_query": "query {i} after start", "k": 5}}')
    out.update(rss=rss_mb(), vectors=eng.indexes.total(), indexes=eng.indexes.stats())
    eng.indexes.close()  # no persist: the probe must leave the store as it found it
    eng.store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
