"""A `GraphIndex`'s graph on disk and back (`GraphPersistence`), the expensive part to
rebuild.

The graph is saved as its links, its node ids and an empty copy of its storage (the 8-bit
quantizer's trained ranges): the codes are the float vectors quantized, which the vector
files hold already, so they are encoded again when the graph is read (the same bytes: the
same ranges, the same vectors). That keeps a code a row off the disk.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

import faiss
import numpy as np

from memory_node.core.vectors import calibrate as cal
from memory_node.core.vectors.graph_state import GraphState
from memory_node.core.vectors.hnsw_graph import (
    GRAPH_HALVES,
    SQ_TYPE,
    Graph,
    Half,
    Halves,
    halves_of,
    hnsw_of,
    project,
    projection_of,
)

# The vectors of rows the parts no longer hold (archived), by id, where still kept.
MissingVectors = Callable[[list[int]], dict[int, np.ndarray]]
# What precedes a half's links in a graph file when it walks projections: its projection
# (faiss would write an IndexPreTransform's graph with its codes, so the two go apart).
_PROJECTION_TAG = b"MNpj"
ENCODE_CHUNK = 4096  # node vectors encoded at a time when a graph is read


class GraphPersistence:
    """Writes and reads the live graph of `state`."""

    def __init__(self, state: GraphState):
        self.state = state

    def save(self, path: Path) -> bool:
        """Write `path` (the links), `.graph_ids.npy` (node ids, tombstones included),
        `.quantizer` (the storage, empty), `.held.npy` (ids held out of the graph for its
        calibration) and `.asked.npy` (the last real queries, which it is measured on too:
        a restart keeps what users ask). False when no graph is built."""
        st = self.state
        with st.lock:
            if st.graph is None:
                return False
            with st.glock:
                tmp = path.with_suffix(path.suffix + ".tmp")
                with open(tmp, "wb") as fh:
                    write_graph(st.graph, fh.write)
                quantizer = _empty_storage(hnsw_of(halves_of(st.graph)[0]))
                graph_ids = st.node_ids.copy()
            held = st.held.copy()
            asked = np.asarray(list(st.recent), np.float32).reshape(-1, st.dim)
        faiss.write_index(quantizer, str(path.with_suffix(".quantizer")))
        np.save(path.with_suffix(".asked.npy"), asked)
        np.save(path.with_suffix(".graph_ids.npy"), graph_ids)
        np.save(path.with_suffix(".held.npy"), held)
        tmp.replace(path)
        return True

    def load(self, path: Path, vectors_of: MissingVectors | None = None) -> bool:
        """Adopt a saved graph built with the same settings (see `use`). False (and no
        change) otherwise."""
        try:
            quantizer = None
            if path.with_suffix(".quantizer").exists():
                with open(path, "rb") as fh:
                    graph = read_graph(fh.read, os.fstat(fh.fileno()).st_size, fh.tell)
                quantizer = faiss.read_index(str(path.with_suffix(".quantizer")))
            else:  # saved with its codes (an earlier release)
                graph = cast(Half, faiss.read_index(str(path)))  # of its concrete class
            ids = np.load(path.with_suffix(".graph_ids.npy"))
            held_path = path.with_suffix(".held.npy")
            held = np.load(held_path) if held_path.exists() else None
            asked_path = path.with_suffix(".asked.npy")
            asked = np.load(asked_path) if asked_path.exists() else None
        except Exception:  # noqa: BLE001 - a corrupt cache file just means "rebuild"
            return False
        return self.use(graph, ids, quantizer, vectors_of, held=held, asked=asked)

    def matches(self, graph: Graph) -> bool:
        """Whether a loaded graph was built with these settings (halves included)."""
        st = self.state
        kind = faiss.IndexHNSWSQ if st.storage == "sq8" else faiss.IndexHNSWFlat
        halves = halves_of(graph)
        return len(halves) == st.halves and all(
            isinstance(g, kind) and h.d == st.dim
            and g.d in (st.graph_dims, st.dim)  # whole vectors: a projection's fallback
            and g.hnsw.nb_neighbors(1) == st.m  # type: ignore[attr-defined]
            and g.hnsw.efConstruction == st.ef_construction
            for h, g in ((h, hnsw_of(h)) for h in halves))

    def use(self, graph: Graph, ids: np.ndarray, quantizer: faiss.Index | None = None,
            vectors_of: MissingVectors | None = None,
            cancelled: Callable[[], bool] = lambda: False,
            held: np.ndarray | None = None, asked: np.ndarray | None = None) -> bool:
        """Adopt a graph read elsewhere (node i holds id ids[i]) if it was built with these
        settings; False (and no change) otherwise. A graph read without its storage gets
        `quantizer` (empty, trained) filled with its nodes' vectors: from the parts, then
        `vectors_of(ids)` for nodes removed since (their vectors, where still kept), zeros
        for the rest (tombstones: searches skip them, walks still pass through). `held`: ids
        the graph was built without, to keep out of it (its calibration queries); `asked`:
        the last real queries it had seen, measured on again."""
        st = self.state
        if not self.matches(graph):  # other settings (or an older release): rebuild
            return False
        halves = halves_of(graph)
        if (graph.ntotal != len(ids) or ids.dtype != np.int64 or ids.ndim != 1
                or any(h.ntotal != len(ids[s::len(halves)]) for s, h in enumerate(halves))):
            return False
        if quantizer is not None:
            if not _storage_fits(hnsw_of(halves[0]), quantizer) or quantizer.ntotal != 0:
                return False
            if not self._encode(halves, ids, quantizer, vectors_of, cancelled):
                return False
        elif any(g.storage is None or not _storage_fits(g, g.storage)
                 for g in map(hnsw_of, halves)):
            return False  # (codes of another quantizer: an earlier release)
        if held is not None and (held.dtype != np.int64 or held.ndim != 1):
            held = None
        st.adopt(graph, ids, held=held)
        if (asked is not None and asked.dtype == np.float32 and asked.ndim == 2
                and asked.shape[1] == st.dim and np.isfinite(asked).all()):
            with st.lock:
                st.recent.extend(asked[-cal.RECENT_QUERIES:])
        return True

    def _encode(self, halves: tuple[Half, ...], ids: np.ndarray, quantizer: faiss.Index,
                vectors_of: MissingVectors | None, cancelled: Callable[[], bool]) -> bool:
        """Give each half a storage of its own nodes' codes (node p is node p // 2 of half
        p % 2), encoded with the saved ranges; False if cancelled meanwhile."""
        storages = [quantizer] + [faiss.clone_index(quantizer) for _ in halves[1:]]
        for s, (half, storage) in enumerate(zip(halves, storages, strict=True)):
            own = ids[s::len(halves)]
            # Room for every code at once: growing the codes chunk by chunk reallocates
            # them, and the copies left behind stay in this process.
            storage.codes.resize(len(own) * storage.code_size)  # type: ignore[attr-defined]
            for start in range(0, len(own), ENCODE_CHUNK):
                if cancelled():
                    return False
                storage.add(project(half, self.node_vectors(own[start:start + ENCODE_CHUNK],
                                                            vectors_of)))
            hnsw = hnsw_of(half)
            hnsw.storage = storage
            hnsw.own_fields = True
            storage.this.disown()  # type: ignore[attr-defined]  # the graph frees it now
        _trim_heap()
        return True

    def node_vectors(self, ids: np.ndarray, vectors_of: MissingVectors | None) -> np.ndarray:
        """Float vectors of graph nodes, in node order."""
        st = self.state
        out = np.zeros((len(ids), st.dim), np.float32)
        found = np.zeros(len(ids), bool)
        with st.lock:
            parts = list(st.parts.values())
        for part in parts:
            hit, vecs = part.vectors_of(ids)
            new = hit & ~found
            if new.any():
                out[new] = vecs[new[hit]]
                found |= new
        if vectors_of is not None and not found.all():
            missing = ids[~found]
            kept = vectors_of(np.unique(missing).tolist())
            for j in np.nonzero(~found)[0]:
                vec = kept.get(int(ids[j]))
                if vec is not None and vec.shape == (st.dim,):
                    out[j] = vec
        return out


def write_graph(graph: Graph, write: Callable[[bytes], object]) -> None:
    """A graph's links (not its codes: see the module's docstring), its halves one after
    the other, each after its projection, if any."""
    writer = faiss.PyCallbackIOWriter(write)  # type: ignore[attr-defined]
    for h in halves_of(graph):
        pca = projection_of(h)
        if pca is not None:
            write(_PROJECTION_TAG)
            faiss.write_VectorTransform(pca, writer)
        faiss.write_index(hnsw_of(h), writer, faiss.IO_FLAG_SKIP_STORAGE)


def read_graph(read: Callable[[int], bytes], size: int, tell: Callable[[], int]) -> Graph:
    """A graph written by `write_graph` (without its codes) from a file of `size` bytes: one
    graph, or halves when a second follows the first."""
    ahead = bytearray()  # read to look for a projection, not yet handed to faiss

    def next_bytes(n: int) -> bytes:
        out = bytes(ahead[:n])
        del ahead[:n]
        return out + read(n - len(out)) if len(out) < n else out

    reader = faiss.PyCallbackIOReader(next_bytes)  # type: ignore[attr-defined]

    def half() -> Half:
        ahead.extend(read(len(_PROJECTION_TAG)))
        if bytes(ahead) != _PROJECTION_TAG:
            return cast(faiss.IndexHNSW, faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE))
        ahead.clear()
        pca = faiss.read_VectorTransform(reader)
        return faiss.IndexPreTransform(pca, faiss.read_index(reader, faiss.IO_FLAG_SKIP_STORAGE))

    halves = [half()]
    while tell() - len(ahead) < size and len(halves) < max(GRAPH_HALVES):
        halves.append(half())
    return Halves(tuple(halves)) if len(halves) > 1 else halves[0]


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps the chunks a re-encode freed as this
    process's memory otherwise: bench/results/NOTES.md, finding 19). A no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _empty_storage(graph: faiss.Index) -> faiss.Index:
    """An empty storage index like the graph's: the quantizer's trained ranges, no codes."""
    storage = faiss.downcast_index(graph.storage)  # type: ignore[attr-defined]
    if isinstance(storage, faiss.IndexScalarQuantizer):
        empty = faiss.IndexScalarQuantizer(storage.d, storage.sq.qtype, storage.metric_type)
        empty.sq.trained = storage.sq.trained
        empty.is_trained = True
        return empty
    return faiss.IndexFlat(storage.d, storage.metric_type)


def _storage_fits(graph: faiss.Index, storage: faiss.Index) -> bool:
    """Whether a storage read beside a graph is the kind the graph was built with (8-bit
    codes: of `SQ_TYPE`; earlier releases' per-dimension ranges mean a rebuild)."""
    kind = faiss.IndexScalarQuantizer if isinstance(graph, faiss.IndexHNSWSQ) else faiss.IndexFlat
    storage = faiss.downcast_index(storage)
    return (isinstance(storage, kind) and storage.d == graph.d and storage.is_trained
            and (not isinstance(storage, faiss.IndexScalarQuantizer)
                 or storage.sq.qtype == SQ_TYPE))
