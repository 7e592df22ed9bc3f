"""The on-disk cache of the vector indexes: the last persisted state (ids, slots, time/place
arrays and HNSW graphs) in `index/`, with a manifest naming the database, the change-feed
position it reflects, and the size and CRC-32 of every file. At start-up a cache whose files
all check out (and whose sampled rows agree with memory.db) is loaded and caught up from the
feed; a missing, stale, damaged or foreign one is rebuilt from memory.db, with one warning
naming the file and why. Never an outage, never a silently different answer.

Start-up reads no more than it must: the id and time/place arrays are checksummed and then
memory-mapped copy-on-write, not copied (the OS pages them in as searches touch them; the
files are written with spare rows after the data, so rows added later land in private pages
of the mapping and the files never change); of each vector file only the CRC-32 of the rows
the manifest covers is checked. HNSW graphs, the large part, are opened here and checksummed
and read by the background worker (`GraphSource`); until a graph is adopted its unrestricted
searches are exact, and a graph found damaged then is rebuilt in the background.

Layout: `index/manifest.json` names a generation directory `index/g-<pid>-<time>-<random>/`
holding the files. A writer fills a new generation directory, then replaces the manifest with
one rename; `index/.lock` (flock) makes processes sharing the directory take turns.

The cache holds no index of its own: the registry (`core/index_manager.py`) hands it what to
write and takes what it reads.
"""

from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import re
import secrets
import shutil
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

import faiss
import numpy as np

from memory_node.core.store.base import VectorFeed
from memory_node.core.store.vector_files import DIR_NAME, fsync_dir
from memory_node.core.vectors.exact import ExactIndex
from memory_node.core.vectors.faiss_index import GraphIndex
from memory_node.core.vectors.graph_persist import read_graph
from memory_node.core.vectors.hnsw_graph import Half

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (model_id, stream)
# What a persist writes of one key, taken under the registry's lock: (key, index, then its
# snapshot: ids, slots, (t, x, y), layout; then the generation of the file it maps).
KeySnapshot = tuple[Key, ExactIndex, np.ndarray, "np.ndarray | None", np.ndarray, int, object]

MANIFEST_VERSION = 5
# 2: files beside the manifest, no checksums; 2 and 3: a graph per stream (not read: one graph
# per model is built in the background instead); up to 4: vectors in the cache (the indexes
# are read from memory.db and the vector files instead; a version-4 graph is kept).
READABLE_VERSIONS = (2, 3, 4, 5)
MANIFEST = "manifest.json"
LOCK_NAME = ".lock"


def spare_rows(n: int) -> int:
    """Rows of room written (as a sparse hole: no disk blocks) after an array's data, so that
    rows added after the next start do not force a copy of the mapped arrays."""
    return max(1024, n // 8)


def row_meta(t: float | None, x: float | None, y: float | None) -> tuple[float, float, float]:
    """(t, x, y) for in-memory pre-filtering; NaN where the row has no pose."""
    if t is None:
        raise TypeError("a vector row without a time")
    return (float(t), np.nan if x is None else float(x), np.nan if y is None else float(y))



def _file_base(key: Key) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{key[0]}__{key[1]}")


# A model's graph: its links, node ids, (since the codes are no longer saved) an empty copy
# of its storage and (since graphs calibrate themselves) the ids held out of it and the
# last real queries: `<model>.graph.hnsw`, `.graph_ids.npy`, `.quantizer`, `.held.npy`,
# `.asked.npy`. Caches of earlier releases lack the last ones.
GRAPH_PARTS = ("hnsw", "graph_ids.npy", "quantizer", "held.npy", "asked.npy")


def _graph_base(model_id: str) -> str:
    """The files of a model's graph are `<base>.<part>` for each of GRAPH_PARTS."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model_id}.graph")

class IndexCache:
    """The cache in `index_dir` of the indexes over `feed`: read at start-up, checked against
    memory.db, written. `new_index(dim)` makes an empty exact index with the registry's
    settings."""

    def __init__(self, index_dir: Path, feed: VectorFeed,
                 new_index: Callable[[int], ExactIndex]):
        self.dir, self.feed, self._new = index_dir, feed, new_index
        # key -> (file generation, rows, CRC-32 of those rows): what the last persist recorded
        self._crc: dict[Key, tuple[int, int, int]] = {}

    # ---- reading ----------------------------------------------------------------------------
    def load(self, key_from_db: Callable[[Key], ExactIndex | None],
             attach: Callable[[dict[Key, ExactIndex]], dict[str, GraphIndex]],
             vectors_of: Callable[[list[int]], dict[int, np.ndarray]]
             ) -> tuple[int, dict[str, GraphSource]] | None:
        """Read the cache (the caller holds its shared lock): every key's index, handed to
        `attach` (which makes them the registry's and returns the model graphs covering
        them), and the cached graphs, opened for the background to read (`vectors_of`: the
        vectors of rows archived since). Returns (the feed position the cache reflects, the
        graphs to read), None when there is no cache; raises CacheDamaged when it is not
        usable. `key_from_db` builds a key's index from memory.db instead, where the cached
        one is older than its vector file or does not check out."""
        d = self.dir
        manifest_path = d / MANIFEST
        if not manifest_path.exists():
            return None
        manifest = _read_manifest(manifest_path)
        if manifest.get("db_uuid") != self.feed.get_meta("db_uuid"):
            raise CacheDamaged(MANIFEST, "it belongs to another memory.db")
        seq = int(manifest["seq"])
        if seq > self.feed.max_vector_seq():
            raise CacheDamaged(MANIFEST, "it is newer than memory.db")
        gen = d / manifest.get("dir", ".")
        states = self.feed.vector_file_states()
        if manifest.get("version", 0) < 5:
            log.info("index cache of an earlier release (vectors in the cache): indexes read "
                     "from memory.db and %s/, cached graphs kept", DIR_NAME)
            loaded = {key: key_from_db(key) for key in states}
        else:
            loaded = {(e["model_id"], e["stream"]): self._load_entry(gen, e, states, key_from_db)
                      for e in manifest["keys"]}
        graphs = attach({key: idx for key, idx in loaded.items() if idx is not None})
        sources: dict[str, GraphSource] = {}
        try:
            for entry in manifest.get("graphs", []):
                graph = graphs.get(entry["model_id"])
                if graph is None:
                    raise CacheDamaged(MANIFEST, f"a graph of {entry['model_id']}, which has "
                                                 "no vectors in it")
                base, files = entry["file"], entry.get("files") or {}
                # Opened now, under the cache lock (a writer may replace the files once it is
                # released), and read by the background worker.
                # A graph saved without its codes has a quantizer file beside it.
                parts = GRAPH_PARTS[:2] + tuple(p for p in GRAPH_PARTS[2:] if p in files)
                sources[entry["model_id"]] = GraphSource(
                    graph, {part: gen / f"{base}.{part}" for part in parts},
                    {part: files.get(part) for part in parts}, vectors_of)
        except BaseException:
            for src in sources.values():
                src.close()
            raise
        if manifest.get("version", 0) < 4 and any(e.get("hnsw") for e in manifest["keys"]):
            log.info("index cache of an earlier release (a graph per stream): one graph per "
                     "model is built in the background")
        return seq, sources

    def _load_entry(self, gen: Path, entry: dict, states: dict[Key, tuple[int, int, int]],
                    key_from_db: Callable[[Key], ExactIndex | None]) -> ExactIndex | None:
        """One key's cached index: ids, slots and (t, x, y) checked against the manifest and
        memory-mapped, over its vector file, whose rows the manifest covers are checksummed.
        A file compaction has rewritten since, or one that fails its checksum, is read from
        memory.db instead (which finds and unindexes damaged rows)."""
        key: Key = (entry["model_id"], entry["stream"])
        files, base = entry.get("files") or {}, entry["file"]
        for part in ("ids.npy", "slots.npy", "meta.npy"):
            _check_file(gen, f"{base}.{part}", files.get(part))
        ids, n_ids = _np_map(gen, f"{base}.ids.npy")
        slots, n_slots = _np_map(gen, f"{base}.slots.npy")
        meta, n_meta = _np_map(gen, f"{base}.meta.npy")
        n, dim = int(entry["n"]), int(entry["dim"])
        if (n_ids, n_slots, n_meta) != (n, n, n) or ids.shape[1:] != () \
                or slots.shape[1:] != () or meta.shape[1:] != (3,):
            raise CacheDamaged(f"{base}.*.npy", "shapes do not match the manifest")
        if ids.dtype != np.int64 or slots.dtype != np.int64 or meta.dtype != np.float64:
            raise CacheDamaged(f"{base}.*.npy", "types do not match the manifest")
        if n and not _unique_positive(ids[:n]):
            raise CacheDamaged(f"{base}.ids.npy", "its ids are not unique positive ids")
        vec = entry.get("vectors") or {}
        state = states.get(key)
        if state is None or state[0] != vec.get("gen") or state[1] != dim:
            return key_from_db(key)  # compaction wrote a new generation since
        rows = int(vec.get("rows", -1))
        if not 0 <= rows <= state[2] or (n and (slots[:n].min() < 0
                                                or slots[:n].max() >= rows)):
            raise CacheDamaged(f"{base}.slots.npy", "slots outside the vector file")
        path = self.feed.files.path(key[0], key[1], state[0])
        try:
            crc = _crc_prefix(path, rows * 4 * dim)
            vmap = self.feed.files.map(key[0], key[1], state[0], dim, rows)
        except (OSError, ValueError):
            crc = None
        if crc is None or f"{crc:08x}" != vec.get("crc32"):
            return key_from_db(key)  # checks every row: damaged ones are unindexed
        self._crc[key] = (state[0], rows, crc)
        idx = self._new(dim)
        idx.use_file(vmap.array, state[0], ids, slots, meta, n)
        return idx

    # ---- checking -------------------------------------------------------------------------
    def verify_sample(self, indexes: dict[Key, ExactIndex], seq: int,
                      contains: Callable[[str | None, str, int | None], bool],
                      per_key: int = 32) -> CacheDamaged | None:
        """Compare a sample of cached rows with memory.db, both ways: each sampled cached
        row must be that row of memory.db (same key, slot, time and place, and its bytes in
        the vector file must have the checksum memory.db keeps), and sampled rows of the
        feed that still have a vector must be cached. Cheap (a few hundred key reads).
        `indexes`, `seq`, `contains`: the registry's, the caller holding its lock."""
        rng = np.random.default_rng()
        for key, idx in indexes.items():
            ids, slots, meta = idx.ids(), idx.slots(), idx.meta()
            if not len(ids) or slots is None:
                continue
            pos = np.unique(np.concatenate([[0, len(ids) - 1],
                                            rng.integers(0, len(ids), per_key)]))
            rows = self.feed.vector_places(ids[pos].tolist())
            storage, base = idx.storage(), _file_base(key)
            for oid, slot, m in zip(ids[pos].tolist(), slots[pos].tolist(), meta[pos],
                                    strict=True):
                row = rows.get(oid)
                if row is None or (row[1], row[0]) != key:
                    return CacheDamaged(base + ".ids.npy",
                                        f"row {oid} is not a {key[1]} vector in memory.db")
                _stream, _model, t, x, y, gen, db_slot, crc = row
                if gen != idx.source:
                    continue  # compaction rewrote the file since: sync moves the index
                if db_slot != slot:
                    return CacheDamaged(base + ".slots.npy",
                                        f"the slot of row {oid} differs from memory.db's")
                if zlib.crc32(storage[slot]) != crc:
                    name = self.feed.files.path(key[0], key[1], gen).name
                    return CacheDamaged(f"../{DIR_NAME}/{name}",
                                        f"row {oid} differs from its checksum in memory.db")
                if not np.array_equal(np.asarray(row_meta(t, x, y)), m, equal_nan=True):
                    return CacheDamaged(base + ".meta.npy",
                                        f"time or place of row {oid} differs from memory.db's")
        if seq:
            seqs = np.unique(rng.integers(1, seq + 1, 64)).tolist()
            added = self.feed.added_ids_at(seqs)
            for oid, (stream, model_id, *_rest) in self.feed.vector_places(added).items():
                if not contains(model_id, stream, oid):
                    return CacheDamaged(MANIFEST, f"row {oid} of memory.db is not cached")
        return None

    # ---- writing ----------------------------------------------------------------------------
    def write(self, seq: int, snap: list[KeySnapshot],
              graphs: list[tuple[str, GraphIndex, GraphSource | None]],
              lock_timeout_s: float) -> bool:
        """Write the cache so that a crash or a kill at any moment leaves the previous cache
        or the new one, never a mix: the files go into a directory of their own (a name no
        other process uses), then the manifest naming it replaces the old one in one rename.
        Processes sharing the directory take turns (a file lock). Returns True when the cache
        was written, False when another process held the lock for `lock_timeout_s`; raises
        OSError when it cannot be written (the previous cache then stays as it was).
        `snap`, `graphs`: what to write, taken under the registry's lock at `seq`."""
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        lock = CacheLock(d, shared=False, timeout_s=lock_timeout_s)
        if not lock.acquire():
            log.warning("index cache not written: another process kept %s locked for %.0f s",
                        d, lock_timeout_s)
            return False
        gen: Path | None = None
        try:
            gen_name = f"g-{os.getpid()}-{time.time_ns():x}-{secrets.token_hex(3)}"
            gen = d / gen_name
            gen.mkdir()
            keys, graph_entries = [], []
            for key, idx, ids, slots, meta, _layout, source in snap:
                assert slots is not None  # the engine's indexes are over vector files
                base = _file_base(key)
                files = {}
                for part, arr in (("ids.npy", ids), ("slots.npy", slots), ("meta.npy", meta)):
                    files[part] = _write_npy(gen / f"{base}.{part}", arr)
                rows = int(slots.max()) + 1 if len(slots) else 0
                keys.append({"model_id": key[0], "stream": key[1], "file": base,
                             "n": len(ids), "dim": idx.dim, "files": files,
                             "vectors": self._vectors_entry(key, source, idx.dim, rows)})
            for model_id, graph, src in graphs:
                base = _graph_base(model_id)
                graph_files = _save_graph(graph, gen, base)
                if graph_files is None and src is not None:
                    # Still being read: the cached files go on as they are (or, read meanwhile,
                    # the graph is written).
                    graph_files = src.carry(gen, base) or _save_graph(graph, gen, base)
                if graph_files is not None:
                    graph_entries.append({"model_id": model_id, "file": base, "dim": graph.dim,
                                          "files": graph_files})
            fsync_dir(gen)
            body = {"version": MANIFEST_VERSION, "db_uuid": self.feed.get_meta("db_uuid"),
                    "seq": seq, "dir": gen_name, "keys": keys, "graphs": graph_entries,
                    "written": time.time()}
            body["checksum"] = _body_sum(body)
            tmp = d / f"{MANIFEST}.{gen_name}.tmp"
            with open(tmp, "w") as fh:
                fh.write(json.dumps(body, indent=1))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, d / MANIFEST)
            fsync_dir(d)
            self._remove_unreferenced(d, gen_name)
            for key, idx, ids, _s, _m, layout, _src in snap:
                self._rebase(idx, gen, _file_base(key), len(ids), layout)
        except BaseException:
            # A write that failed part-way (a full disk): its files go, and their space with
            # them, unless the manifest already names them.
            if gen is not None and not _names(d / MANIFEST, gen.name):
                shutil.rmtree(gen, ignore_errors=True)
                (d / f"{MANIFEST}.{gen.name}.tmp").unlink(missing_ok=True)
            raise
        finally:
            lock.release()
        return True

    def _vectors_entry(self, key: Key, gen: object, dim: int, rows: int) -> dict | None:
        """The manifest's record of the vector file rows [0, rows) the cache relies on: its
        generation and their CRC-32 (carried on from the last persist: only new rows are
        read). None when the file is gone (compaction replaced it: the next start reads the
        key from memory.db)."""
        if not isinstance(gen, int):
            return None
        prev = self._crc.get(key)
        start, crc = (prev[1], prev[2]) if prev and prev[0] == gen and prev[1] <= rows \
            else (0, 0)
        try:
            crc = _crc_prefix(self.feed.files.path(key[0], key[1], gen), rows * 4 * dim,
                              start * 4 * dim, crc)
        except (OSError, ValueError):  # gone, or cut short: the next start checks its rows
            return None
        self._crc[key] = (gen, rows, crc)
        return {"gen": gen, "rows": rows, "crc32": f"{crc:08x}"}

    @staticmethod
    def _rebase(idx: ExactIndex, gen: Path, base: str, n: int, layout: int) -> None:
        """Map the arrays just written in place of the index's ids, slots and (t, x, y): rows
        added since the start move from private memory to pages the OS can drop, and the
        files of the generation mapped before (deleted now) free their disk space."""
        try:
            ids, slots, meta = (_np_map(gen, f"{base}.{part}")[0]
                                for part in ("ids.npy", "slots.npy", "meta.npy"))
        except CacheDamaged as exc:  # just written by us under the lock: not expected
            log.warning("index cache file %s not mapped after writing it (%s)", exc.file,
                        exc.why)
            return
        idx.rebase_rows(ids, slots, meta, n, layout)

    @staticmethod
    def _remove_unreferenced(d: Path, keep: str) -> None:
        """Under the lock nobody else writes: what the manifest does not name is left over
        from an earlier cache, an interrupted write, or the layout before version 3."""
        for p in d.iterdir():
            if p.name in (MANIFEST, LOCK_NAME, keep):
                continue
            if p.is_dir() and p.name.startswith("g-"):
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_file() and (p.name.startswith(MANIFEST + ".") or p.suffix in (
                    ".npy", ".hnsw", ".tmp")):
                p.unlink(missing_ok=True)
        for stale in (d.with_name(d.name + ".new"), d.with_name(d.name + ".old")):
            if stale.is_dir():  # what releases before version 3 left behind
                shutil.rmtree(stale, ignore_errors=True)


# ---- cache files ------------------------------------------------------------------------------
class GraphSource:
    """A cached graph's files, opened at start-up and read in the background: checksummed,
    read and handed to its index (which encodes its nodes' vectors again when the graph was
    saved without them). Until then a persist carries the files over unchanged (with the
    checksums the manifest had), so a restart does not lose a graph it never read."""

    def __init__(self, idx: GraphIndex, paths: dict[str, Path],
                 sums: dict[str, dict | None] | None,
                 vectors_of: Callable[[list[int]], dict[int, np.ndarray]] | None = None):
        self.idx, self.sums, self.vectors_of = idx, sums, vectors_of
        self.paths = dict(paths)
        self.files: dict[str, IO[bytes]] = {}
        self.error: str | None = None
        self._lock = threading.Lock()
        for part, path in self.paths.items():
            try:
                self.files[part] = open(path, "rb")  # noqa: SIM115 - closed by close()
            except FileNotFoundError:
                self.error = f"{path.name}: missing"
                break
            except OSError as exc:
                self.error = f"{path.name}: {exc}"
                break

    def load(self, cancelled: Callable[[], bool]) -> str | None:
        """Checksum, read and adopt the graph; why it could not be (None when it was)."""
        if self.error is not None:
            return self.error
        with self._lock:
            if len(self.files) != len(self.paths):
                return "closed before it was read"
            if self.sums is not None:
                for part, fh in self.files.items():
                    want = self.sums.get(part)
                    try:
                        _check_open_file(fh, self.paths[part].name, want)
                    except CacheDamaged as exc:
                        return f"{exc.file}: {exc.why}"
                    if cancelled():
                        return None
            try:
                fh = self.files["hnsw"]
                fh.seek(0)

                def read(size: int, fh: IO[bytes] = fh) -> bytes:
                    if cancelled():  # stop a long read when the engine closes
                        raise InterruptedError("graph work stopped")
                    return fh.read(size)

                quantizer = None
                if "quantizer" in self.files:  # saved without its codes
                    graph = read_graph(read, os.fstat(fh.fileno()).st_size, fh.tell)
                    fh = self.files["quantizer"]
                    fh.seek(0)
                    quantizer = faiss.read_index(faiss.PyCallbackIOReader(  # type: ignore[attr-defined]
                        lambda size, fh=fh: fh.read(size)))
                else:  # an earlier release's graph with its codes
                    # Not in faiss's generated stubs: a reader over a Python callable.
                    graph = cast(Half, faiss.read_index(
                        faiss.PyCallbackIOReader(read)))  # type: ignore[attr-defined]
                fh = self.files["graph_ids.npy"]
                fh.seek(0)
                ids = np.load(fh, allow_pickle=False)
                held = asked = None
                if "held.npy" in self.files:
                    fh = self.files["held.npy"]
                    fh.seek(0)
                    held = np.load(fh, allow_pickle=False)
                if "asked.npy" in self.files:
                    fh = self.files["asked.npy"]
                    fh.seek(0)
                    asked = np.load(fh, allow_pickle=False)
            except Exception as exc:  # noqa: BLE001 - unreadable means "rebuild"
                return f"{self.paths['hnsw'].name}: not readable ({type(exc).__name__})"
        if cancelled():
            return None
        if not self.idx.use_graph(graph, ids, quantizer, self.vectors_of, cancelled, held,
                                  asked):
            return None if cancelled() else "built with other settings, or damaged"
        return None

    def carry(self, gen: Path, base: str) -> dict[str, dict] | None:
        """Put the files into generation `gen` as `base`.*: a hard link when the original is
        still in place, else a copy of the open file. Their manifest entries, or None (not
        carried: a version-2 cache has no checksums to carry, or the files are gone)."""
        if self.sums is None or self.error is not None:
            return None
        with self._lock:
            if len(self.files) != len(self.paths):
                return None
            out: dict[str, dict] = {}
            for part, fh in self.files.items():
                want = self.sums.get(part)
                if want is None:
                    return None
                dst = gen / f"{base}.{part}"
                try:
                    st, own = os.stat(self.paths[part]), os.fstat(fh.fileno())
                    same = (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)
                except OSError:
                    same = False
                try:
                    if same:
                        os.link(self.paths[part], dst)
                    else:  # replaced or deleted by another process: copy what we opened
                        shutil.copyfile(f"/proc/self/fd/{fh.fileno()}", dst)
                        _file_sum(dst, fsync=True)
                except OSError:
                    return None
                out[part] = dict(want)
            return out

    def close(self) -> None:
        with self._lock:
            for fh in self.files.values():
                fh.close()
            self.files = {}


class CacheDamaged(Exception):
    """A cache file that cannot be trusted: `file` (relative to index/) and why."""

    def __init__(self, file: str, why: str):
        super().__init__(f"{file}: {why}")
        self.file, self.why = file, why


class CacheLock:
    """An advisory lock on index/ shared by every process using the directory: exclusive to
    write, shared to read. The kernel drops it when its holder dies (even by SIGKILL)."""

    def __init__(self, d: Path, shared: bool, timeout_s: float = 30.0):
        self.path = d / LOCK_NAME
        self.shared, self.timeout_s = shared, timeout_s
        self._fd: int | None = None

    def acquire(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            if self.shared:  # a read-only store: nobody can be writing the cache either
                return True
            raise
        mode = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, mode)
                self._fd = fd
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.02)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __enter__(self) -> CacheLock:
        if not self.acquire():
            raise CacheDamaged(LOCK_NAME, f"another process kept it locked {self.timeout_s:.0f} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _body_sum(body: dict) -> str:
    rest = {k: v for k, v in body.items() if k != "checksum"}
    return f"{zlib.crc32(json.dumps(rest, sort_keys=True).encode()):08x}"


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CacheDamaged(MANIFEST, f"not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise CacheDamaged(MANIFEST, "not a JSON object")
    version = manifest.get("version")
    if version not in READABLE_VERSIONS:
        raise CacheDamaged(MANIFEST, f"version {version!r} is not one this release reads")
    if version >= 3 and manifest.get("checksum") != _body_sum(manifest):
        raise CacheDamaged(MANIFEST, "its checksum does not match its content")
    return manifest


def _crc(fh: IO[bytes], size: int | None = None, start: int = 0, crc: int = 0
         ) -> tuple[int, int]:
    """(bytes read up to, CRC-32) of an open file: bytes [start, size) (to the end when
    `size` is None) continuing `crc`, that of bytes [0, start). Read through one reused
    buffer: the page cache, not this process, holds what was read (about 2.4 GB/s here: 0.6 s
    for 1M rows' vectors). pread: the file position is left alone. ValueError when the
    file ends before `size`."""
    done, fd = start, fh.fileno()
    buf = bytearray(1 << 23)
    view = memoryview(buf)
    while size is None or done < size:
        want = len(buf) if size is None else min(len(buf), size - done)
        got = os.preadv(fd, [view[:want]], done)
        if got <= 0:
            if size is not None:
                raise ValueError(f"{fh.name} is shorter than {size} bytes")
            break
        crc = zlib.crc32(view[:got], crc)
        done += got
    return done, crc


def _crc_prefix(path: Path, size: int, start: int = 0, crc: int = 0) -> int:
    """CRC-32 of bytes [0, size) of a file, continuing `crc` (that of bytes [0, start))."""
    with open(path, "rb") as fh:
        return _crc(fh, size, start, crc)[1]


def _save_graph(graph: GraphIndex, gen: Path, base: str) -> dict[str, dict] | None:
    """Write a graph's files into `gen` as `base`.*; their manifest entries, or None when
    the graph has not been built."""
    if not graph.save_graph(gen / f"{base}.hnsw"):
        return None
    return {part: _file_sum(gen / f"{base}.{part}", fsync=True) for part in GRAPH_PARTS}


def _file_sum(path: Path, fsync: bool = False) -> dict:
    """Size and CRC-32 of a file (spare rows included: a hole reads as zeros, fast)."""
    with open(path, "rb") as fh:
        size, crc = _crc(fh)
        if fsync:
            os.fsync(fh.fileno())
    return {"size": size, "crc32": f"{crc:08x}"}


def _check_file(gen: Path, name: str, want: dict | None) -> None:
    path = gen / name
    if not path.is_file():
        if want is None:
            raise CacheDamaged(name, "the manifest lists no checksum for it")
        raise CacheDamaged(name, "missing")
    with open(path, "rb") as fh:
        _check_open_file(fh, name, want)


def _check_open_file(fh: IO[bytes], name: str, want: dict | None) -> None:
    if want is None:
        raise CacheDamaged(name, "the manifest lists no checksum for it")
    size = os.fstat(fh.fileno()).st_size
    if size != want.get("size"):
        raise CacheDamaged(name, f"{size} bytes where the manifest says {want.get('size')}")
    if f"{_crc(fh)[1]:08x}" != want.get("crc32"):
        raise CacheDamaged(name, "its checksum differs from the manifest's (damaged or "
                                 "replaced)")


def _unique_positive(ids: np.ndarray) -> bool:
    """Whether every id is positive and none repeats. Ids are nearly always stored in
    increasing order: one comparison pass then (np.unique takes 0.6 s per 350k ids here)."""
    if ids.min() <= 0:
        return False
    if (np.diff(ids) > 0).all():
        return True
    s = np.sort(ids)
    return bool((s[1:] != s[:-1]).all())


def _np_map(gen: Path, name: str) -> tuple[np.ndarray, int]:
    """A copy-on-write memory map of an .npy file: (an array over every row the file has room
    for, the number of rows its header holds). Writes to the array stay in this process."""
    try:
        with open(gen / name, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"npy version {version}")
            if fortran or dtype.hasobject or not shape:
                raise ValueError("not a C-ordered array of numbers")
            offset, size = fh.tell(), os.fstat(fh.fileno()).st_size
            row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            if row <= 0 or size < offset + shape[0] * row:
                raise ValueError("shorter than its header says")
            cap = (size - offset) // row
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise CacheDamaged(name, "missing") from None
    except Exception as exc:  # noqa: BLE001 - truncated or not an .npy file
        raise CacheDamaged(name, f"not a readable array ({type(exc).__name__})") from None
    count = cap * (row // dtype.itemsize)
    arr = np.frombuffer(mm, dtype, count=count, offset=offset).reshape((cap, *shape[1:]))
    return arr, int(shape[0])


def _write_npy(path: Path, arr: np.ndarray) -> dict:
    """Write `arr` as .npy followed by `spare_rows` of room (a hole: no disk blocks until
    written, and nothing ever writes it: rows added after a start go to private pages)."""
    arr = np.ascontiguousarray(arr)
    with open(path, "wb") as fh:
        np.save(fh, arr, allow_pickle=False)
        if arr.ndim:
            row = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
            fh.truncate(fh.tell() + spare_rows(len(arr)) * row)
        fh.flush()
        os.fsync(fh.fileno())
    return _file_sum(path)


def _names(manifest: Path, gen_name: str) -> bool:
    """Whether the manifest names the generation directory `gen_name`."""
    try:
        return bool(json.loads(manifest.read_text()).get("dir") == gen_name)
    except (OSError, ValueError, AttributeError):
        return False
