"""Start-up probe, run in a fresh process so RSS and open time are the engine's alone.

Usage: python -m bench.probe MEMORY_DIR MODEL_ID  ->  one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    mem, model_id = sys.argv[1], sys.argv[2]
    t_imp = time.perf_counter()
    import faiss  # noqa: F401 - imported here so the baseline RSS includes it

    from bench.common import peak_rss_mb, rss_mb
    from bench.workload import LookupEmbedder
    from memory_node.core.config import MemoryConfig
    from memory_node.core.engine import MemoryEngine

    import_s = time.perf_counter() - t_imp
    base = rss_mb()
    conf = MemoryConfig.from_mapping({"memory_dir": mem})
    t0 = time.perf_counter()
    eng = MemoryEngine(conf, text_embedder=LookupEmbedder(model_id), llm_settings=None)
    open_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    eng.search('{"semantic_query": "first query after start", "k": 5}')
    first_ms = (time.perf_counter() - t1) * 1000
    out = {"open_s": round(open_s, 3), "import_s": round(import_s, 3),
           "first_query_ms": round(first_ms, 2), "rss_base_mb": round(base, 1),
           "rss_mb": round(rss_mb(), 1), "peak_rss_mb": round(peak_rss_mb(), 1),
           "vectors": eng.indexes.total(), "indexes": eng.indexes.stats()}
    eng.store.close()  # no persist: the probe must leave the store as it found it
    print(json.dumps(out))


if __name__ == "__main__":
    main()
