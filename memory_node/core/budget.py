"""The disk budget: the memory directory's size on disk kept under `disk_budget_mb`.

Size is measured cheaply: the database, index, notes and vector files are stat'ed (a few
dozen files); the blob files are summed once (the first time size is asked for), then as new
rows name new ones and eviction deletes old ones. No walk of the tree per message.

Over budget, room is made in this order, oldest first within each step, until the store is
under LOW_WATER of its budget (so it does not evict at every check):
1. the blobs (JPEG keyframes, point clouds) of sensor rows compaction archived (thinned or
   folded): their rows stay, findable with `include_archived`;
2. those archived rows themselves;
3. kept sensor rows other than those compaction's thinning chooses to keep (per space-time
   cell: its newest, the extremes of each numeric tag, frames notes point to, the first and
   last of each visit to it);
4. the sensor rows compaction keeps;
5. the pose history, made coarser (twice the step each time, up to MAX_POSE_STEP_S).
Steps 2 to 4 downsample the pose history instead of dropping it: an odometry row or a
removed row that is the only pose sample in its POSE_STEP_SHARE × visit_gap_s stretch stays
as a pose sample, so visits and "where was I at 10:00" are still answered there, at that
precision. Sensor rows are those of every registered stream kind (core/streams.py), read
each time. Notes, summaries and places are never removed: when nothing else is left the
store stays over budget and says so once, at error level.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memory_node.core.compaction import YIELD_S, choose_kept, referenced_ids, time_pages
from memory_node.core.config import MemoryConfig
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.streams import sensor_stream_names

log = logging.getLogger(__name__)

MIB = 1024 * 1024
LOW_WATER = 0.9  # make room down to this share of the budget
BATCH = 256  # rows per transaction
POSE_STEP_SHARE = 1 / 3  # pose samples left at most 2/3 of visit_gap_s apart: visits hold
MAX_POSE_STEP_S = 3600.0
NOTES_TTL_S = 1.0  # how long the eviction record a search reads is cached
# An older memory.db (no incremental vacuum) up to this size is rewritten once so that freed
# pages go back to the file system; a larger one is not (VACUUM holds the write lock for the
# whole rewrite, and the recorder would wait): its free pages are reused by new rows instead,
# and count as room made.
VACUUM_MAX_BYTES = 256 * MIB


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _on_disk(st: os.stat_result) -> int:
    return st.st_blocks * 512


class DiskMeter:
    """The memory directory's size on disk, without walking the blobs per call."""

    def __init__(self, root: Path, store: SqliteObservationStore):
        self.root = Path(root)
        self.store = store
        self._lock = threading.Lock()
        self._blob_bytes = 0
        self._seen_id: int | None = None  # the newest row whose blob is counted

    def _blobs(self) -> int:
        with self._lock:
            if self._seen_id is None:  # once: every blob file there is
                self._seen_id = self.store.max_row_id()
                total = 0
                for dirpath, _dirs, files in os.walk(self.root / "blobs"):
                    for name in files:
                        try:
                            total += _on_disk(os.stat(os.path.join(dirpath, name)))
                        except FileNotFoundError:
                            pass
                self._blob_bytes = total
            for oid, ref in self.store.refs_after(self._seen_id):
                try:
                    self._blob_bytes += _on_disk(os.stat(self.root / ref))
                except FileNotFoundError:
                    pass
                self._seen_id = oid
            return self._blob_bytes

    def removed(self, nbytes: int) -> None:
        with self._lock:
            self._blob_bytes = max(0, self._blob_bytes - int(nbytes))

    def _others(self) -> int:
        """Everything but blobs/: memory.db and its log, notes, index and vector files."""
        total = 0
        stack = [self.root]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except FileNotFoundError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        if e.path != str(self.root / "blobs"):
                            stack.append(Path(e.path))
                    else:
                        total += _on_disk(e.stat(follow_symlinks=False))
                except FileNotFoundError:
                    pass
        return total

    def total(self) -> int:
        return self._blobs() + self._others()

    def free(self) -> int | None:
        try:
            return int(shutil.disk_usage(self.root).free)
        except OSError:
            return None


class DiskBudget:
    """Measures the store and, over budget, removes what the module docstring lists."""

    def __init__(self, store: SqliteObservationStore, config: MemoryConfig,
                 cancelled: Callable[[], bool] = lambda: False):
        self.store = store
        self.cfg = config
        self.root = config.root
        self.meter = DiskMeter(config.root, store)
        self.cancelled = cancelled
        self.budget_bytes = int(config.disk_budget_mb * MIB) if config.disk_budget_mb > 0 else None
        self.base_step = config.visit_gap_s * POSE_STEP_SHARE
        self._said_full = False
        self._record: tuple[float, dict[str, tuple[int, float]], dict[str, Any]] | None = None
        self._run_lock = threading.Lock()

    @property
    def sensors(self) -> list[str]:
        """The streams whose rows may be removed: every registered sensor stream kind
        (core/streams.py), read when asked so a kind registered later counts too."""
        return list(sensor_stream_names())

    # ---- what searches and streams read ---------------------------------------------------
    def evicted(self) -> dict[str, tuple[int, float]]:
        """{stream: (rows removed, newest time removed)}, cached for NOTES_TTL_S."""
        return self._read_record()[0]

    def pose_step(self) -> tuple[float, float | None]:
        """(the coarsest pose step the budget left, up to which time; None: none coarser
        than the base step)."""
        meta = self._read_record()[1]
        step = float(meta.get("pose_step_s", self.base_step))
        until = meta.get("pose_step_until")
        return step, (float(until) if until is not None else None)

    def _read_record(self) -> tuple[dict[str, tuple[int, float]], dict[str, Any]]:
        now = time.monotonic()
        if self._record is None or now - self._record[0] > NOTES_TTL_S:
            self._record = (now, self.store.evicted_counts(), self.store.meta_items("pose_step"))
        return self._record[1], self._record[2]

    def search_notes(self, streams: Sequence[str] | None, t_min: float | None) -> list[str]:
        """Notes for a search whose window reaches into time the budget removed rows of."""
        out = []
        for stream, (n, upto) in sorted(self.evicted().items()):
            if n <= 0 or (streams is not None and stream not in streams):
                continue
            if t_min is None or t_min <= upto:
                out.append(f"{n} {stream} rows up to {_clock(upto)} were removed by the disk "
                           "budget (disk_budget_mb): this answer cannot include them")
        return out

    def visit_notes(self, t_min: float | None) -> tuple[list[str], float | None]:
        """(notes for visits whose window reaches into downsampled pose history, the gap
        threshold to use there when the pose history is coarser than visit_gap_s allows)."""
        evicted = self.evicted()
        sensors = sensor_stream_names()
        upto = max((u for s, (n, u) in evicted.items() if n > 0 and s in sensors),
                   default=None)
        if upto is None or (t_min is not None and t_min > upto):
            return [], None
        step, coarse_until = self.pose_step()
        if coarse_until is None or (t_min is not None and t_min > coarse_until):
            step, until = self.base_step, upto
        else:
            until = coarse_until
        gap = 2 * step if 2 * step > self.cfg.visit_gap_s else None
        return [f"the pose history up to {_clock(until)} was downsampled by the disk budget "
                f"to about one sample per {step:g} s: visit times there are precise to about "
                f"{step:g} s"], gap

    def streams_fields(self) -> tuple[dict[str, Any], dict[str, int], dict[str, float]]:
        """(the top-level disk fields, {stream: rows evicted}, {stream: oldest time})."""
        disk = {"disk_bytes": self.meter.total(), "disk_budget_bytes": self.budget_bytes,
                "disk_free_bytes": self.meter.free()}
        self._record = None
        evicted = {s: n for s, (n, _t) in self.evicted().items()}
        return disk, evicted, self.store.oldest_times()

    # ---- making room --------------------------------------------------------------------
    def enforce(self) -> dict[str, Any]:
        """Bring the store under its budget if it is over; what was done."""
        if self.budget_bytes is None:
            return {"status": "no_budget"}
        with self._run_lock:
            return self._enforce(self.budget_bytes)

    def _enforce(self, budget: int) -> dict[str, Any]:
        self.meter.removed(self.store.finish_pending_blobs(self.root))
        before = self.meter.total()
        report: dict[str, Any] = {"status": "under", "disk_bytes_before": before,
                                  "blobs_removed": 0, "rows_removed": 0}
        if before <= budget:
            report["disk_bytes"] = before
            self._said_full = False
            return report
        t0 = time.perf_counter()
        if self.store.free_pages()[0] != 2:
            size = (self.root / "memory.db").stat().st_size
            if size <= VACUUM_MAX_BYTES and self.store.vacuum_into_incremental():
                log.info("memory.db rewritten once (VACUUM) so that the pages the disk "
                         "budget frees go back to the file system")
        target = budget * LOW_WATER
        total = self._used()
        steps: list[Callable[[dict[str, Any]], Iterator[None]]] = [
            self._archived_blobs, self._archived_rows, self._unkept_rows, self._kept_rows,
            self._coarser_poses]
        for step in steps:
            if total <= target:
                break
            for _ in step(report):
                time.sleep(YIELD_S)  # searches and saves go first
                self.store.reclaim()
                total = self._used()
                if total <= target or self.cancelled():
                    break
            if self.cancelled():
                break
        self.store.reclaim()
        total = self._used()
        self._record = None
        report.update(disk_bytes=total, took_s=round(time.perf_counter() - t0, 3),
                      status="under" if total <= budget else "over")
        if total > budget and not self.cancelled():
            if not self._said_full:
                log.error("the memory store is %d bytes, over its disk budget of %d bytes, "
                          "and only notes, summaries, places and the coarsest pose history "
                          "are left: nothing more is removed (raise disk_budget_mb or free "
                          "the disk)", total, budget)
                self._said_full = True
        else:
            self._said_full = False
        log.info("disk budget: %d -> %d bytes (budget %d): %d blobs and %d rows removed in "
                 "%.2f s", before, total, budget, report["blobs_removed"],
                 report["rows_removed"], report["took_s"])
        return report

    def _used(self) -> int:
        """The size on disk, less the free pages of a memory.db that cannot give them back
        (no incremental vacuum): new rows reuse those before the file grows."""
        mode, free, page = self.store.free_pages()
        return self.meter.total() - (free * page if mode != 2 else 0)

    def _archived_blobs(self, report: dict[str, Any]) -> Iterator[None]:
        while found := self.store.archived_with_blobs(self.sensors, BATCH):
            self.store.drop_archived_blobs([oid for oid, _t, _r in found])
            self.meter.removed(self.store.finish_pending_blobs(self.root))
            report["blobs_removed"] += len(found)
            yield

    def _archived_rows(self, report: dict[str, Any]) -> Iterator[None]:
        while found := self.store.archived_rows(self.sensors, BATCH):
            victims = [("archive", oid, t, has_pose, stream)
                       for oid, stream, t, has_pose in found]
            yield from self._evict(victims, report)

    def _unkept_rows(self, report: dict[str, Any]) -> Iterator[None]:
        yield from self._live_rows(report, kept_too=False)

    def _kept_rows(self, report: dict[str, Any]) -> Iterator[None]:
        yield from self._live_rows(report, kept_too=True)

    def _live_rows(self, report: dict[str, Any], kept_too: bool) -> Iterator[None]:
        referenced = referenced_ids(self.store)
        for rows in time_pages(self.store, self.sensors, self.cfg.thin_cell_s, math.inf):
            _cells, kept = choose_kept(rows, referenced, self.cfg)
            victims = [("observations", o.id, o.t, o.pose is not None, o.stream)
                       for o in rows if o.id is not None and (kept_too or o.id not in kept)]
            if victims:
                yield from self._evict(victims, report)

    def _evict(self, victims: list[tuple[str, int, float, bool, str]],
               report: dict[str, Any]) -> Iterator[None]:
        keep = self._pose_keepers(victims, self.base_step)
        # Odometry rows that stay the pose history stay as they are.
        victims = [v for v in victims if not (v[0] == "observations" and v[4] == "odom"
                                              and v[1] in keep)]
        for start in range(0, len(victims), BATCH):
            chunk = victims[start:start + BATCH]
            self.store.evict([(v[0], v[1]) for v in chunk], keep, at=time.time())
            self.meter.removed(self.store.finish_pending_blobs(self.root))
            report["rows_removed"] += len(chunk)
            yield

    def _pose_keepers(self, victims: list[tuple[str, int, float, bool, str]],
                      step: float) -> set[int]:
        """The victims that stay as pose samples: the first of each `step` stretch that no
        other row's pose covers."""
        posed = sorted((v for v in victims if v[3]), key=lambda v: (v[2], v[1]))
        if not posed:
            return set()
        lo = math.floor(posed[0][2] / step) * step
        hi = (math.floor(posed[-1][2] / step) + 1) * step
        covered = self.store.pose_buckets(lo, hi, step, {v[1] for v in victims})
        keep: set[int] = set()
        for v in posed:
            b = math.floor(v[2] / step)
            if b not in covered:
                covered.add(b)
                keep.add(v[1])
        return keep

    def _coarser_poses(self, report: dict[str, Any]) -> Iterator[None]:
        step, _until = self.pose_step()
        odom = ["odom"] if "odom" in self.sensors else []
        while step * 2 <= MAX_POSE_STEP_S:
            step *= 2
            newest, last_bucket, after = None, None, -math.inf
            while page := self.store.pose_samples(odom, after, 4096):
                drop = []
                for table, oid, ts in page:
                    b = math.floor(ts / step)
                    if b == last_bucket:
                        drop.append((table, oid))
                    last_bucket = b
                after = newest = page[-1][2]
                for start in range(0, len(drop), BATCH):
                    self.store.evict(drop[start:start + BATCH], set(), at=time.time())
                    report["rows_removed"] += len(drop[start:start + BATCH])
            if newest is not None:
                self.store.set_meta("pose_step_s", repr(step))
                self.store.set_meta("pose_step_until", repr(newest))
            self._record = None
            yield
