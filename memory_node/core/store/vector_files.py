"""Vector files: the float32 embeddings of memory.db's rows, held once on disk.

One raw file per (embedding model, stream) and generation, `vectors/<name>.<gen>.f32`: row
`slot` is bytes [slot * 4 * dim, (slot + 1) * 4 * dim). memory.db names each vector's slot
(with a CRC-32 of its bytes) and each file's generation, dimension and committed row count.

Why files and not SQLite blobs: the indexes memory-map these files and score straight from
them, so the vectors are on disk once (not in memory.db and again in the index cache) and
the OS pages them in as searches touch them.

Durability: rows are written after the committed ones and fsynced *before* the SQLite
transaction naming their slots commits (the store does both under SQLite's write lock, so
writers from several processes take turns). A crash in between leaves bytes past the
committed count that nothing names; the next writer writes over them. Files are grown as
sparse holes (no disk blocks until written), so rows land in place and a mapping only has
to be renewed when the file grows. Rows are never rewritten: compaction writes the live rows
into the next generation, and the transaction that switches to it also moves the slots.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

SUFFIX = ".f32"
DIR_NAME = "vectors"


def file_name(model_id: str, stream: str, gen: int) -> str:
    """A readable, collision-free name: sanitised model and stream plus a hash of both."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model_id}__{stream}")[:80]
    tag = zlib.crc32(f"{model_id}\0{stream}".encode())
    return f"{safe}-{tag:08x}.{int(gen)}{SUFFIX}"


def row_crcs(vecs: np.ndarray) -> list[int]:
    """CRC-32 of each row's bytes (what memory.db keeps to tell a damaged row)."""
    vecs = np.ascontiguousarray(vecs, np.float32)
    return [zlib.crc32(row) for row in vecs]


def grown_capacity(rows: int) -> int:
    """Rows of room a file is grown to (a hole): an eighth more, at least 1024."""
    return rows + max(1024, rows // 8)


class VectorMap:
    """A read-only shared mapping of one vector file: `array` is (capacity, dim) float32.

    Rows written later inside the capacity show up in the mapping; rows past it need a new
    map. Arrays taken from it stay valid (the mapping lives while any of them does), also
    after the file is replaced or deleted."""

    def __init__(self, path: Path, dim: int, gen: int):
        self.path, self.dim, self.gen = path, int(dim), int(gen)
        row = 4 * self.dim
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self.capacity = size // row
            if self.capacity:
                mm = mmap.mmap(fh.fileno(), self.capacity * row, access=mmap.ACCESS_READ)
                self.array = np.frombuffer(mm, np.float32).reshape(self.capacity, self.dim)
            else:
                self.array = np.empty((0, self.dim), np.float32)


class VectorFiles:
    """The `vectors/` directory of a store: appends (the writer's side, called inside the
    store's write transaction) and shared read-only maps (the indexes' side)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._fds: dict[Path, int] = {}
        self._maps: dict[tuple[str, str], VectorMap] = {}
        self._lock = threading.Lock()

    def path(self, model_id: str, stream: str, gen: int) -> Path:
        return self.root / file_name(model_id, stream, gen)

    # ---- writes ------------------------------------------------------------------------------
    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = self._fds[path] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        return fd

    def append(self, path: Path, committed: int, vecs: np.ndarray) -> None:
        """Write `vecs` as rows [committed, committed + n) and fsync them. Bytes left past
        `committed` by a transaction that never committed are written over."""
        vecs = np.ascontiguousarray(vecs, np.float32)
        row = vecs.shape[1] * 4
        need = committed + len(vecs)
        with self._lock:
            fd = self._fd(path)
            if os.fstat(fd).st_size < need * row:
                os.ftruncate(fd, grown_capacity(need) * row)
            data, off = memoryview(vecs.tobytes()), committed * row
            while len(data):
                done = os.pwrite(fd, data, off)
                data, off = data[done:], off + done
            os.fdatasync(fd)

    def write_generation(self, path: Path, chunks: Iterable[np.ndarray]) -> None:
        """A new generation's file from scratch (compaction, migration), fsynced."""
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                for chunk in chunks:
                    fh.write(np.ascontiguousarray(chunk, np.float32).tobytes())
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(self.root)

    def forget(self, path: Path) -> None:
        """Close the write handle of a file about to be deleted."""
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is not None:
                os.close(fd)

    # ---- reads ------------------------------------------------------------------------------
    def map(self, model_id: str, stream: str, gen: int, dim: int, rows: int) -> VectorMap:
        """A map of the file covering at least `rows` committed rows (renewed when the file
        grew past the last one). FileNotFoundError when the generation is gone (replaced by
        compaction since it was named); ValueError when the file is shorter than `rows`."""
        key = (model_id, stream)
        with self._lock:
            cur = self._maps.get(key)
            if cur is not None and cur.gen == gen and cur.dim == dim and cur.capacity >= rows:
                return cur
            vm = VectorMap(self.path(model_id, stream, gen), dim, gen)
            if vm.capacity < rows:
                raise ValueError(f"{vm.path.name} holds {vm.capacity} rows where memory.db "
                                 f"names {rows}")
            self._maps[key] = vm
            return vm

    def read(self, model_id: str, stream: str, gen: int, dim: int,
             slots: list[int]) -> np.ndarray:
        """Rows at `slots` as a new (n, dim) array (a few rows: pread, no mapping)."""
        row = 4 * int(dim)
        out = np.empty((len(slots), dim), np.float32)
        with open(self.path(model_id, stream, gen), "rb") as fh:
            fd = fh.fileno()
            for i, slot in enumerate(slots):
                got = os.pread(fd, row, int(slot) * row)
                if len(got) != row:
                    raise ValueError(f"{fh.name}: row {slot} is past the end of the file")
                out[i] = np.frombuffer(got, np.float32)
        return out

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds, self._maps = {}, {}


def fsync_dir(d: Path) -> None:
    """Make a directory's entries durable (a file created or renamed in it); best effort."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
