"""Vector indexes behind one interface (`VectorIndex`), chosen by name."""

from __future__ import annotations

from memory_node.core.vectors.base import VectorIndex, top_k
from memory_node.core.vectors.exact import ExactIndex

INDEX_KINDS = ("exact", "faiss-flat", "hnsw")


def make_index(kind: str, dim: int, **options) -> VectorIndex:
    """Build an index by name; FAISS is imported only when a FAISS index is asked for."""
    if kind == "exact":
        return ExactIndex(dim, gather_max=options.get("gather_max", 20000))
    if kind == "faiss-flat":
        from memory_node.core.vectors.faiss_index import FaissFlatIndex

        return FaissFlatIndex(dim)
    if kind == "hnsw":
        from memory_node.core.vectors.faiss_index import HNSWIndex

        return HNSWIndex(dim, **options)
    raise ValueError(f"unknown index kind {kind!r}; known: {', '.join(INDEX_KINDS)}")


__all__ = ["INDEX_KINDS", "ExactIndex", "VectorIndex", "make_index", "top_k"]
