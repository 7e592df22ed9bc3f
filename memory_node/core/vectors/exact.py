"""Exact index over a contiguous numpy matrix: the reference the graph is checked against, and
the scorer of filtered candidate sets; `top_k`, the ranking order every search shares.

Each row may carry (t, x, y): the time and place filters of a search then run as numpy masks
over these columns, with no round trip to SQLite, before the masked rows are scored.

Rows live in one of two kinds of storage. In-memory (the default): the index owns a matrix and
copies added vectors into it. Over a vector file (`use_file`): the matrix is a read-only map
of the store's file and each row is a slot in it; adds only record slots, removals only drop
them, so the vectors are never copied (the engine's indexes work this way).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from memory_node.core.types import RowFilter


def in_disc(x: np.ndarray, y: np.ndarray, near: tuple[float, float], radius: float
            ) -> np.ndarray:
    """Mask of the points in the closed disc: `(x-nx)² + (y-ny)² <= r²` in float64, the
    expression the SQL compilers and RowFilter.matches evaluate (NaN, no pose, is never in)."""
    dx = x - near[0]
    dy = y - near[1]
    return dx * dx + dy * dy <= radius * radius


def row_mask(filt: RowFilter, meta: np.ndarray) -> np.ndarray:
    """The numpy compiler of a RowFilter over (t, x, y) columns: its time window and its disc
    (the fields an index can decide; streams are chosen per index, the rest is SQL's), as a
    mask. `ExactIndex.filter_positions` selects the same rows by a binary search in time."""
    meta = np.asarray(meta, np.float64).reshape(-1, 3)
    keep = np.ones(len(meta), bool)
    if filt.t_min is not None:
        keep &= meta[:, 0] >= filt.t_min
    if filt.t_max is not None:
        keep &= meta[:, 0] <= filt.t_max
    if filt.near is not None:
        keep &= in_disc(meta[:, 1], meta[:, 2], filt.near, filt.radius)
    return keep


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best by (score desc, id desc): the one ordering every search shares (this index,
    the graph's re-scored candidates, the planner's merge), so ties break by id, newest first."""
    if len(ids) == 0 or k <= 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    if len(ids) > max(k, 64):  # (a few dozen: sorted whole, faster than partitioned)
        # Partition on score, keeping every id tied with the k-th score so ties break by id.
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        keep = np.nonzero(scores >= kth)[0]
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((-ids, -scores))[:k]
    return ids[order], scores[order]


class ExactIndex:
    """Brute-force inner product over L2-normalised float32 vectors (scores are cosine
    similarities). Small candidate sets are gathered and scored; large ones are scored by one
    matrix-vector product over everything, then masked (cheaper than a gather)."""

    def __init__(self, dim: int, gather_max: int = 20000):
        self.dim = int(dim)
        self.gather_max = gather_max
        self._ids = np.empty(0, np.int64)
        self._vecs = np.empty((0, dim), np.float32)
        self._meta = np.empty((0, 3), np.float64)  # t, x, y
        # Time order, whatever the insert order: positions of rows [0, _tn) sorted by t (rows
        # with no time left out), with their times; rows from _tn on are merged in lazily.
        self._tpos = np.empty(0, np.int64)
        self._tval = np.empty(0, np.float64)
        self._tk = 0  # entries used in _tpos/_tval
        self._tn = 0  # rows covered
        self.scanned = 0  # rows whose time or place the last filter compared (diagnostics)
        self._n = 0
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        self._ids_increasing = True  # ids strictly increase with position: no sort needed
        self.layout = 0  # changes whenever a row changes position (a removal)
        # Over a vector file: row i's vector is _vecs[_slots[i]]; _ident while _slots[:n]
        # is 0..n-1 (no gap: the storage's first n rows are the index's, read directly).
        self._slots: np.ndarray | None = None
        self._ident = True
        self._slots_sorted = True
        self.source: object = None  # what the storage is (the file's generation)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._n

    def ids(self) -> np.ndarray:
        return self._ids[: self._n].copy()

    def vectors(self) -> np.ndarray | SlotRows:
        """Rows [0, n) as an array or, over a file with gaps, a view gathering on slicing."""
        with self._lock:
            if self._slots is None or self._ident:
                return self._vecs[: self._n]
            return SlotRows(self._vecs, self._slots[: self._n].copy())

    def slots(self) -> np.ndarray | None:
        """Each row's slot in the vector file (None: in-memory storage)."""
        with self._lock:
            return None if self._slots is None else self._slots[: self._n].copy()

    def storage(self) -> np.ndarray:
        """The matrix rows are read from (over a file: its map, every slot)."""
        return self._vecs

    def vectors_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whether each id is here, the vectors of those that are), as one view."""
        with self._lock:
            pos = self.find(ids)
            hit = pos >= 0
            return hit, np.array(self._rows(pos[hit]))

    def vectors_at(self, positions: np.ndarray) -> np.ndarray:
        """The vectors of the rows at `positions` (from `find`), as a new array."""
        with self._lock:
            return np.array(self._rows(positions))

    def _rows(self, positions: np.ndarray | slice) -> np.ndarray:
        """The vectors at row positions (a gather)."""
        if self._slots is None or self._ident:
            return self._vecs[: self._n][positions]
        return self._vecs[self._slots[: self._n][positions]]

    def _all_scores(self, q: np.ndarray) -> np.ndarray:
        """Inner products of every row, in row order: one product over the storage."""
        n = self._n
        if self._slots is None or self._ident:
            return self._vecs[:n] @ q
        if not n:
            return np.empty(0, np.float32)
        slots = self._slots[:n]
        return (self._vecs[: int(slots.max()) + 1] @ q)[slots]

    # ---- over a vector file --------------------------------------------------------------------
    def use_file(self, vectors: np.ndarray, source: object, ids: np.ndarray | None = None,
                 slots: np.ndarray | None = None, meta: np.ndarray | None = None,
                 n: int | None = None) -> None:
        """Score from `vectors` (a map of the store's vector file, `source` naming it): rows
        [0, n) of `ids`, `slots` and `meta` become the index (the arrays are used, not copied:
        memory-mapped cache files with spare rows after n). An empty index without them."""
        if vectors.ndim != 2 or vectors.shape[1] != self.dim or vectors.dtype != np.float32:
            raise ValueError(f"vector storage {vectors.shape} does not fit dimension {self.dim}")
        with self._lock:
            if len(self):
                raise ValueError("use_file() needs an empty index")
            if ids is None:
                ids, slots, meta, n = (np.empty(0, np.int64), np.empty(0, np.int64),
                                       np.empty((0, 3), np.float64), 0)
            assert slots is not None and meta is not None and n is not None
            cap = min(len(ids), len(slots), len(meta))
            if not 0 <= n <= cap or ids.dtype != np.int64 or slots.dtype != np.int64 \
                    or meta.dtype != np.float64 or meta.shape[1:] != (3,):
                raise ValueError("use_file(): arrays of the wrong type or too short")
            if n and (slots[:n].min() < 0 or slots[:n].max() >= len(vectors)):
                raise ValueError("use_file(): a slot outside the vector file")
            self._vecs, self.source = vectors, source
            self._ids, self._slots, self._meta = ids[:cap], slots[:cap], meta[:cap]
            self._n = n
            self._sorted = None
            self._ids_increasing = bool(n < 2 or (np.diff(ids[:n]) > 0).all())
            self._slots_sorted = bool(n < 2 or (np.diff(slots[:n]) > 0).all())
            self._ident = _identity(slots[:n], self._slots_sorted)
            self.layout += 1

    def grow_file(self, vectors: np.ndarray, source: object) -> None:
        """A longer map of the same file (it grew): the same rows at the same slots."""
        with self._lock:
            if self._slots is None or source != self.source or len(vectors) < len(self._vecs):
                raise ValueError("grow_file(): not a longer map of this index's file")
            self._vecs = vectors

    def move_to_file(self, vectors: np.ndarray, source: object, ids: np.ndarray,
                     slots: np.ndarray) -> np.ndarray:
        """Another file holds the rows now (compaction wrote a new generation): `slots` are
        the new slots of `ids`. Rows of the index missing from `ids` are dropped (their
        removal is on its way in the change feed); returns their ids."""
        ids = np.asarray(ids, np.int64)
        slots = np.asarray(slots, np.int64)
        with self._lock:
            if self._slots is None:
                raise ValueError("move_to_file(): not an index over a vector file")
            order = np.argsort(ids, kind="stable")
            sid, sslot = ids[order], slots[order]
            at = np.searchsorted(sid, self._ids[: self._n])
            at[at >= len(sid)] = 0
            found = (sid[at] == self._ids[: self._n]) if len(sid) else \
                np.zeros(self._n, bool)
            gone = self._ids[: self._n][~found].copy()
            if len(gone):
                self.remove(gone)  # keeps the others in order: `at` of the rest still holds
            new_slots = sslot[at[found]] if len(sid) else np.empty(0, np.int64)
            if len(new_slots) and new_slots.max() >= len(vectors):
                raise ValueError("move_to_file(): a slot outside the vector file")
            self._slots = np.concatenate([new_slots, np.empty(max(1024, len(new_slots) // 8),
                                                              np.int64)])
            self._vecs, self.source = vectors, source
            n = len(new_slots)
            self._slots_sorted = bool(n < 2 or (np.diff(new_slots) > 0).all())
            self._ident = _identity(new_slots, self._slots_sorted)
            self.layout += 1
            return gone

    def meta(self) -> np.ndarray:
        return self._meta[: self._n]

    def attach(self, ids: np.ndarray, vectors: np.ndarray, meta: np.ndarray, n: int) -> None:
        """Use the given arrays as storage, without copying: rows [0, n) are the index, rows
        from n on are room for later adds. Meant for memory-mapped cache files (a copy-on-write
        mapping with spare rows after the data): the OS pages the vectors in as searches touch
        them, and rows added later go to private pages of the mapping, never to the file."""
        if len(self):
            raise ValueError("attach() needs an empty index")
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vector dimension {vectors.shape} != index dimension {self.dim}")
        cap = min(len(ids), len(vectors), len(meta))
        if not 0 <= n <= cap or ids.dtype != np.int64 or vectors.dtype != np.float32 \
                or meta.dtype != np.float64 or meta.shape[1:] != (3,):
            raise ValueError("attach(): arrays of the wrong type or too short")
        with self._lock:
            self._ids, self._vecs, self._meta = ids[:cap], vectors[:cap], meta[:cap]
            self._n = n
            self._sorted = None
            self._ids_increasing = bool(n < 2 or (np.diff(ids[:n]) > 0).all())
            self.layout += 1

    def rebase(self, ids: np.ndarray, vectors: np.ndarray, meta: np.ndarray, n: int,
               layout: int) -> bool:
        """Move storage onto arrays whose rows [0, n) hold this index's rows [0, n) as they
        were at `layout` (a cache file just written from them, mapped): rows added since are
        copied over. Frees the copies (or the mapping of an older file, whose disk space the
        OS then reclaims). False, and nothing changed, when rows moved since or do not fit."""
        with self._lock:
            cap = min(len(ids), len(vectors), len(meta))
            if layout != self.layout or self._n < n or self._n > cap:
                return False
            m = self._n
            ids[n:m], vectors[n:m], meta[n:m] = self._ids[n:m], self._vecs[n:m], self._meta[n:m]
            self._ids, self._vecs, self._meta = ids[:cap], vectors[:cap], meta[:cap]
            return True

    def rebase_rows(self, ids: np.ndarray, slots: np.ndarray, meta: np.ndarray, n: int,
                    layout: int) -> bool:
        """`rebase` over a vector file: ids, slots and meta move onto the arrays given (the
        cache files just written), the vectors stay where they are."""
        with self._lock:
            cap = min(len(ids), len(slots), len(meta))
            if self._slots is None or layout != self.layout or self._n < n or self._n > cap:
                return False
            m = self._n
            ids[n:m], slots[n:m], meta[n:m] = self._ids[n:m], self._slots[n:m], self._meta[n:m]
            self._ids, self._slots, self._meta = ids[:cap], slots[:cap], meta[:cap]
            return True

    def snapshot(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int]:
        """(ids, slots, meta, layout) as one view (slots None for in-memory storage): rows
        below their length are never written again (adds go after them; a removal makes new
        arrays and a new layout)."""
        with self._lock:
            return self.ids(), self.slots(), self.meta(), self.layout

    def _check(self, ids: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ids as int64, vectors as contiguous float32 rows; a wrong dimension is refused
        before anything is stored."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), -1)
        if vectors.shape[1] != self.dim:
            raise ValueError(f"vector dimension {vectors.shape[1]} != index dimension {self.dim}")
        return ids, vectors

    def add(self, ids: np.ndarray, vectors: np.ndarray | None, meta: np.ndarray | None = None,
            slots: np.ndarray | None = None) -> None:
        """Add rows. Over a vector file pass their `slots` (vectors may be None: the file
        holds them); in memory pass the vectors."""
        if self._slots is not None:
            self._add_slots(ids, slots, meta)
            return
        if vectors is None:
            raise ValueError("an in-memory index needs the vectors")
        ids, vectors = self._check(ids, vectors)
        if len(ids) == 0:
            return
        if meta is None:
            meta = np.full((len(ids), 3), np.nan)
        meta = np.asarray(meta, np.float64).reshape(len(ids), 3)
        with self._lock:
            need = self._n + len(ids)
            if need > len(self._ids):
                cap = max(need, 2 * len(self._ids), 1024)
                new_ids = np.empty(cap, np.int64)
                new_vecs = np.empty((cap, self.dim), np.float32)
                new_meta = np.empty((cap, 3), np.float64)
                new_ids[: self._n] = self._ids[: self._n]
                new_vecs[: self._n] = self._vecs[: self._n]
                new_meta[: self._n] = self._meta[: self._n]
                self._ids, self._vecs, self._meta = new_ids, new_vecs, new_meta
            if self._ids_increasing and (
                    (len(ids) > 1 and (np.diff(ids) <= 0).any())
                    or (self._n and ids[0] <= self._ids[self._n - 1])):
                self._ids_increasing = False
            self._ids[self._n : need] = ids
            self._vecs[self._n : need] = vectors
            self._meta[self._n : need] = meta
            self._n = need
            self._sorted = None

    def _add_slots(self, ids: np.ndarray, slots: np.ndarray | None,
                   meta: np.ndarray | None) -> None:
        if slots is None:
            raise ValueError("an index over a vector file adds rows by slot")
        ids = np.asarray(ids, np.int64).reshape(-1)
        slots = np.asarray(slots, np.int64).reshape(-1)
        if len(ids) != len(slots):
            raise ValueError("ids and slots differ in length")
        if len(ids) == 0:
            return
        meta = (np.full((len(ids), 3), np.nan) if meta is None
                else np.asarray(meta, np.float64).reshape(len(ids), 3))
        with self._lock:
            assert self._slots is not None
            if slots.min() < 0 or slots.max() >= len(self._vecs):
                raise ValueError("a slot outside the mapped vector file (map it again first)")
            n, need = self._n, self._n + len(ids)
            if need > min(len(self._ids), len(self._slots), len(self._meta)):
                cap = max(need, 2 * n, 1024)
                self._ids = np.concatenate([self._ids[:n], np.empty(cap - n, np.int64)])
                self._slots = np.concatenate([self._slots[:n], np.empty(cap - n, np.int64)])
                self._meta = np.concatenate([self._meta[:n], np.empty((cap - n, 3))])
            if self._ids_increasing and ((len(ids) > 1 and (np.diff(ids) <= 0).any())
                                         or (n and ids[0] <= self._ids[n - 1])):
                self._ids_increasing = False
            if self._slots_sorted and ((len(slots) > 1 and (np.diff(slots) <= 0).any())
                                       or (n and slots[0] <= self._slots[n - 1])):
                self._slots_sorted = False
            self._ident = bool(self._ident and self._slots_sorted
                               and slots[0] == n and slots[-1] == need - 1)
            self._ids[n:need], self._slots[n:need], self._meta[n:need] = ids, slots, meta
            self._n = need
            self._sorted = None

    def remove(self, ids: np.ndarray) -> int:
        ids = np.asarray(ids, np.int64).reshape(-1)
        with self._lock:
            keep = ~np.isin(self._ids[: self._n], ids)
            removed = int(self._n - keep.sum())
            if removed:
                self._cover_times(self._n)
                self._ids = self._ids[: self._n][keep].copy()
                if self._slots is None:
                    self._vecs = self._vecs[: self._n][keep].copy()
                else:  # the file keeps the vectors: only the slots go
                    self._slots = self._slots[: self._n][keep].copy()
                    self._ident = _identity(self._slots, self._slots_sorted)
                self._meta = self._meta[: self._n][keep].copy()
                new_pos = np.cumsum(keep) - 1  # old position -> new position
                tpos = self._tpos[: self._tk]
                alive = keep[tpos]
                self._tpos = new_pos[tpos[alive]]
                self._tval = self._tval[: self._tk][alive]
                self._tk = self._tn = len(self._tpos)
                self._n = len(self._ids)
                self.layout += 1
                self._sorted = None
                ids_now = self._ids[: self._n]
                self._ids_increasing = bool((np.diff(ids_now) > 0).all())
            return removed

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of the given ids (ids not in the index are dropped)."""
        found = self.find(ids)
        return found[found >= 0]

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row position of each id, -1 where it is not in the index."""
        ids = np.asarray(ids, np.int64)
        with self._lock:
            if self._ids_increasing:  # the usual case (ids grow): no sort after each add
                sorted_ids, order = self._ids[: self._n], None
            else:
                if self._sorted is None:
                    order = np.argsort(self._ids[: self._n], kind="stable")
                    self._sorted = (self._ids[: self._n][order], order)
                sorted_ids, order = self._sorted
        if len(sorted_ids) == 0:
            return np.full(len(ids), -1, np.int64)
        idx = np.searchsorted(sorted_ids, ids)
        idx[idx >= len(sorted_ids)] = 0
        hit = sorted_ids[idx] == ids
        pos = idx if order is None else order[idx]
        return np.where(hit, pos, -1)

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        with self._lock:
            return self._ids[: self._n][positions]

    def score_ids(self, ids: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, inner products) of the given ids that are in the index, in one consistent
        view (a concurrent removal cannot shift positions in between)."""
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            pos = self.positions(ids)
            return self._ids[: self._n][pos], self._rows(pos) @ q

    def get(self, ids: np.ndarray) -> np.ndarray:
        with self._lock:
            return np.array(self._rows(self.positions(np.asarray(ids, np.int64))))

    def _cover_times(self, n: int) -> None:
        """Bring the time order up to row n: rows that arrived in time order are appended;
        others (a replayed older bag, notes with past stamps) merged in, O(rows) once."""
        if self._tn >= n:
            return
        new = np.arange(self._tn, n)
        t = self._meta[self._tn:n, 0]
        ok = ~np.isnan(t)
        new, t = new[ok], t[ok]
        order = np.argsort(t, kind="stable")
        new, t = new[order], t[order]
        k = self._tk
        if len(t) and k and t[0] < self._tval[k - 1]:  # out of order: one merge
            at = np.searchsorted(self._tval[:k], t, side="right")
            self._tpos = np.insert(self._tpos[:k], at, new)
            self._tval = np.insert(self._tval[:k], at, t)
        else:
            if k + len(t) > len(self._tpos):
                cap = max(k + len(t), 2 * len(self._tpos), 1024)
                self._tpos = np.resize(self._tpos, cap)
                self._tval = np.resize(self._tval, cap)
            self._tpos[k:k + len(t)] = new
            self._tval[k:k + len(t)] = t
        self._tk = k + len(t)
        self._tn = n

    def filter_positions(self, t_min: float | None = None, t_max: float | None = None,
                         near: tuple[float, float] | None = None, radius: float = 0.0
                         ) -> np.ndarray:
        """Positions of rows with t_min <= t <= t_max and (x-nx)² + (y-ny)² <= r² — the same
        comparisons, in float64, as the SQL filters, so both select the same rows (`row_mask`
        as positions). A time window is a binary search in the time order, whatever order
        rows arrived in."""
        with self._lock:
            n = self._n
            if t_min is None and t_max is None:
                pos = np.arange(n)
            else:
                self._cover_times(n)
                tval = self._tval[: self._tk]
                lo = 0 if t_min is None else int(np.searchsorted(tval, t_min, side="left"))
                hi = self._tk if t_max is None else int(np.searchsorted(tval, t_max,
                                                                        side="right"))
                pos = self._tpos[lo:max(lo, hi)]
                if len(pos) == n:  # every row passes: storage order (the fast path below)
                    pos = np.arange(n)
            self.scanned = len(pos)
            if near is not None:
                xy = self._meta[pos, 1:] if len(pos) < n else self._meta[:n, 1:]
                pos = pos[in_disc(xy[:, 0], xy[:, 1], near, radius)]
            return pos

    def search_positions(self, query: np.ndarray, k: int, positions: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k among the rows at `positions` (from `filter_positions`), exactly."""
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            ids_all = self._ids[: self._n]
            if len(positions) <= self.gather_max:
                return top_k(ids_all[positions], self._rows(positions) @ q, k)
            return top_k(ids_all[positions], self._all_scores(q)[positions], k)

    def search_range(self, query: np.ndarray, k: int, lo: int, hi: int
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k among rows at positions [lo, hi), exactly: one product over those rows
        (no gather when they lie in order in the storage)."""
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            hi = min(hi, self._n)
            lo = min(max(lo, 0), hi)
            return top_k(self._ids[lo:hi], self._rows(slice(lo, hi)) @ q, k)

    def search(
        self, query: np.ndarray, k: int, candidates: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (ids, scores); with `candidates`, only those ids are ranked."""
        q = np.asarray(query, np.float32).reshape(-1)
        with self._lock:
            ids_all = self._ids[: self._n]
            if candidates is None:
                return top_k(ids_all, self._all_scores(q), k)
            pos = self.positions(np.asarray(candidates, np.int64))
            if len(pos) <= self.gather_max:
                return top_k(ids_all[pos], self._rows(pos) @ q, k)
            return top_k(ids_all[pos], self._all_scores(q)[pos], k)


def _identity(slots: np.ndarray, increasing: bool) -> bool:
    """Whether `slots` (increasing or not) are exactly 0..n-1: rows read without a gather."""
    n = len(slots)
    return bool(n == 0 or (increasing and slots[0] == 0 and int(slots[-1]) == n - 1))


class SlotRows:
    """Rows of a vector file at given slots, gathered when sliced (a graph build reads an
    index's rows in chunks without copying them all at once)."""

    def __init__(self, storage: np.ndarray, slots: np.ndarray):
        self.storage, self.slots = storage, slots
        self.shape = (len(slots), storage.shape[1])

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        return self.storage[self.slots[key]]
