"""Vector indexes: `ExactIndex` (numpy, one per embedding model and stream) and, in
`faiss_index`, `GraphIndex` (one HNSW graph per model over its streams' exact indexes, a
facade over the graph_* modules, `coarse`, `partial_graph`, `projection` and `hnsw_graph`);
`index_cache` (their cache on disk) and `graph_worker` (the background graph thread) serve
`core/index_manager.py`.

FAISS is imported only with `faiss_index` (and the modules it composes), so the exact index
and `top_k` load without it.
"""

from __future__ import annotations

from memory_node.core.vectors.exact import ExactIndex, top_k

__all__ = ["ExactIndex", "top_k"]
