"""Compaction: consolidate without losing anything.

Sensor rows are the rows of every registered stream kind (core/streams.py): the built-in
camera, lidar and odometry and any kind registered beside them.

1. Thinning: sensor keyframes older than `retention_s` are thinned per space-time cell
   (`thin_cell_m` × `thin_cell_s`, per stream). A cell keeps the rows that answer questions:
   its newest row, the rows extreme on each numeric tag (brightest and darkest, most and
   fewest people...), rows a note refers to (`#id` in its text, or an id in its tags `ref`,
   `refs`, `frame`, `frames`, `obs`), and the first and last row of each visit to the cell (a
   run of the stream's rows in that cell, no further apart than `visit_gap_s`). The others move
   to the `archive` table (metadata, text, vector and blob files stay; `include_archived`
   searches them), and the cell's newest row counts them in its tags.
2. Folding: sensor observations that repeat the one before them (same stream, within
   `fold_window_s` and `fold_radius_m`, cosine ≥ `fold_similarity`) are archived the same way.
3. Summaries: when an LLM is configured, notes older than `summary_age_s` are summarised per
   day into new notes in the `summaries` stream. Notes themselves are never archived.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import numpy as np

from memory_node.core.config import MemoryConfig
from memory_node.core.errors import ContractError
from memory_node.core.query import ENGINE_TAGS, SaveRequest
from memory_node.core.store.base import CompactionStore
from memory_node.core.streams import sensor_stream_names
from memory_node.core.types import Observation, Pose

# (model id, stream, row id) -> the row's vector, or None when it has none.
VectorOf = Callable[[str | None, str, int | None], "np.ndarray | None"]
# Store a summary as a note: (request, stream, t, pose).
SaveSummary = Callable[[SaveRequest, str, float, "Pose | None"], Any]

log = logging.getLogger(__name__)

# Where a note names an observation: "#123" in its text, or an id in one of these tags.
NOTE_REF = re.compile(r"#(\d+)\b")
NOTE_REF_TAGS = ("ref", "refs", "frame", "frames", "obs")
KEPT_REASONS = ("cell_newest", "extreme_tag", "note_reference", "visit_first_last")

SUMMARY_PROMPT = (
    "You summarise a robot's episodic notes for its long-term memory. Write a short factual "
    "summary (at most 8 bullet points) of the notes below: who was met, where (keep x/y "
    "coordinates), what was done or promised. Do not invent anything."
)



def row_id(obs: Observation) -> int:
    """The id of a row read from the store (compaction only sees stored rows)."""
    if obs.id is None:
        raise ValueError(f"a {obs.stream} row at t={obs.t} without an id is not a stored row")
    return obs.id

# Thinning reads the store a page of this many space-time cells at a time (aligned to cell
# boundaries, so no cell or visit to one spans two pages): searches and saves take turns with
# it instead of waiting for a read of the whole history.
PAGE_CELLS = 12
# After each transaction a compaction pauses this long: the threads answering searches and
# saves get the interpreter at once instead of waiting out its switch interval.
YIELD_S = 0.001


def time_pages(store: CompactionStore, streams: list[str], cell_s: float, before_t: float
               ) -> Iterator[list[Observation]]:
    """The kept rows of `streams` older than `before_t`, in pages of whole time cells,
    oldest first; empty stretches of time are skipped."""
    t = store.next_t(streams)
    while t is not None and t < before_t:
        lo = math.floor(t / cell_s) * cell_s
        hi = min(lo + PAGE_CELLS * cell_s, before_t)
        rows = store.rows_between(streams, lo, hi)
        if rows:
            yield rows
        t = store.next_t(streams, hi)


def referenced_ids(store: CompactionStore) -> set[int]:
    """Ids of observations the notes refer to."""
    out: set[int] = set()
    for note in store.rows_of(["events", "summaries"]):
        out.update(int(m) for m in NOTE_REF.findall(note.text))
        for key in NOTE_REF_TAGS:
            v = note.tags.get(key)
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, int) and not isinstance(item, bool):
                    out.add(item)
    return out


def choose_kept(rows: list[Observation], referenced: set[int], cfg: MemoryConfig
                ) -> tuple[dict[tuple, list[Observation]], dict[int, set[str]]]:
    """(each space-time cell's rows, {row id: why it answers questions}): the frames
    thinning keeps in each cell (its newest, the extremes of each numeric tag, frames notes
    point to, the first and last of each visit to it). The disk budget removes these last."""
    cells: dict[tuple, list[Observation]] = defaultdict(list)
    ends: set[int] = set()  # first and last row of each visit to a cell
    by_stream: dict[str, list[Observation]] = defaultdict(list)
    for obs in rows:
        by_stream[obs.stream].append(obs)
    for members in by_stream.values():
        members.sort(key=lambda o: (o.t, o.id))
        run: list[Observation] = []
        run_cell = None
        for obs in members:
            cell = cell_of(obs, cfg)
            cells[cell].append(obs)
            if run and (cell != run_cell or obs.t - run[-1].t > cfg.visit_gap_s):
                ends.update((row_id(run[0]), row_id(run[-1])))
                run = []
            run.append(obs)
            run_cell = cell
        if run:
            ends.update((row_id(run[0]), row_id(run[-1])))
    reasons: dict[int, set[str]] = {}
    for members in cells.values():
        if len(members) < 2:
            reasons[row_id(members[0])] = {"cell_newest"}
            continue
        reasons.update(Compactor._keep(members, referenced, ends))
    return cells, reasons


def cell_of(obs: Observation, cfg: MemoryConfig) -> tuple:
    ct = math.floor(obs.t / cfg.thin_cell_s)
    if obs.pose is None:
        return (obs.stream, ct, None, None)
    return (obs.stream, ct, math.floor(obs.pose.x / cfg.thin_cell_m),
            math.floor(obs.pose.y / cfg.thin_cell_m))


class Compactor:
    """One compaction run. It receives what it uses (store, configuration, clock, the index
    catch-up, the vectors, the way to store a summary, the LLM settings) and never sees the
    engine."""

    def __init__(self, store: CompactionStore, config: MemoryConfig, *,
                 clock: Callable[[], float], sync: Callable[[], int], vector_of: VectorOf,
                 save_summary: SaveSummary, llm_settings: Any = "env",
                 cancelled: Callable[[], bool] = lambda: False):
        self.store = store
        self.cancelled = cancelled  # checked between pages: a shutdown ends the run there
        self.cfg = config
        self.clock = clock
        self.sync = sync
        self.vector_of = vector_of
        self.save_summary = save_summary
        self.llm_settings = llm_settings

    def now(self) -> tuple[float, str]:
        """(the time ages count from, which clock): the node clock; but a store recorded on
        simulated time (a bag replay: the recorder marks it) counts from its newest row
        (observation or note) when that is earlier, unless compact_clock is "clock": a
        replayed recording is as old as it was when recorded, not as old as the wall clock
        of whatever opens it later says."""
        now = self.clock()
        if self.cfg.compact_clock == "store" and self.store.get_meta("recorded_clock") == "sim":
            newest = self.store.newest_t(list(self.cfg.streams))
            if newest is not None and newest < now:
                return newest, "store"
        return now, "clock"

    def run(self) -> dict[str, Any]:
        self.sync()
        now, which = self.now()
        self.kept: Counter[str] = Counter({r: 0 for r in KEPT_REASONS})
        thinned = self.thin(now)
        folded = self.fold()
        # Rows are archived by now: whatever the summary step meets, the answer reports what
        # was done, with the step's own status.
        try:
            summaries = self.summarise(now) if not self.cancelled() else {
                "status": "error", "written": 0, "message": "stopped: the engine is closing"}
        except Exception as exc:  # noqa: BLE001
            log.warning("summaries stopped: %s: %.200s", type(exc).__name__, exc)
            summaries = {"status": "error", "written": 0,
                         "message": f"the summary step failed: {type(exc).__name__}"}
        self.sync()
        log.info("compaction: %d keyframes thinned (kept %s), %d near-duplicates folded, "
                 "summaries %s; ages from %.3f (%s)", thinned, dict(self.kept), folded,
                 summaries["status"], now, which)
        return {"ok": True, "thinned": thinned, "folded": folded, "summaries": summaries,
                "archived_total": self._archived_total(), "kept": dict(self.kept),
                "now": round(now, 3), "clock": which}

    def _archived_total(self) -> int:
        return self.store.archived_count()

    # ---- 1. thinning ----------------------------------------------------------------------
    def thin(self, now: float) -> int:
        cutoff = now - self.cfg.retention_s
        streams = list(sensor_stream_names())  # every registered kind (core/streams.py)
        referenced = self.referenced_ids()
        total = 0
        for rows in time_pages(self.store, streams, self.cfg.thin_cell_s, cutoff):
            if self.cancelled():
                break
            cells, reasons = choose_kept(rows, referenced, self.cfg)
            for members in cells.values():
                if len(members) < 2:
                    continue
                for o in members:
                    self.kept.update(reasons.get(row_id(o), ()))
                newest = max(members, key=lambda o: (o.t, o.id))  # it counts the archived
                total += self._merge(newest, [o for o in members if o.id not in reasons],
                                     "thinned", now)
        return total

    @staticmethod
    def _keep(members: list[Observation], referenced: set[int], ends: set[int]
              ) -> dict[int, set[str]]:
        """{row id: why it is kept} for one cell's rows."""
        reasons: dict[int, set[str]] = defaultdict(set)
        newest = max(members, key=lambda o: (o.t, o.id))
        reasons[row_id(newest)].add("cell_newest")
        numeric: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
        for o in members:
            for key, v in o.tags.items():
                if key in ENGINE_TAGS or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                numeric[key].append((float(v), o.t, row_id(o)))
        for values in numeric.values():
            if len({v for v, _, _ in values}) < 2:
                continue  # all alike: none is extreme
            top = max(values)  # ties: the newest
            low = min(values, key=lambda e: (e[0], -e[1], -e[2]))
            reasons[top[2]].add("extreme_tag")
            reasons[low[2]].add("extreme_tag")
        for o in members:
            if row_id(o) in referenced:
                reasons[row_id(o)].add("note_reference")
            if row_id(o) in ends:
                reasons[row_id(o)].add("visit_first_last")
        return reasons

    def referenced_ids(self) -> set[int]:
        """Ids of observations the notes refer to."""
        return referenced_ids(self.store)

    def _merge(self, keep: Observation, gone: list[Observation], reason: str,
               at: float | None = None) -> int:
        if not gone:
            return 0
        def kept_tags(moved: int) -> dict[str, Any]:
            tags = dict(keep.tags)
            tags["merged"] = int(tags.get("merged", 0)) + moved
            ts = [o.t for o in gone] + [keep.t] + list(tags.get("span", []))
            tags["span"] = [min(ts), max(ts)]
            return tags

        # One transaction: a crash never leaves rows archived that the kept row does not count.
        kept = row_id(keep)
        moved = self.store.archive([row_id(o) for o in gone], reason,
                                   {row_id(o): kept for o in gone}, kept_tags=(kept, kept_tags),
                                   at=at)
        time.sleep(YIELD_S)
        return moved

    # ---- 2. folding -----------------------------------------------------------------------
    def fold(self) -> int:
        start = int(self.store.get_meta("fold_checked_id") or 0)
        streams = list(sensor_stream_names())  # every registered kind (core/streams.py)
        rows = self.store.rows_of(streams, after_id=start, with_vectors=True)
        by_stream: dict[str, list[Observation]] = defaultdict(list)
        for obs in rows:
            by_stream[obs.stream].append(obs)
        total = 0
        last_id = start
        referenced = self.referenced_ids()
        for members in by_stream.values():
            members.sort(key=lambda o: (o.t, o.id))
            anchor: Observation | None = None
            anchor_vec: np.ndarray | None = None
            pending: list[Observation] = []
            for obs in members:
                if self.cancelled():  # checked again from the same row next time
                    return total
                last_id = max(last_id, row_id(obs))
                vec = self.vector_of(obs.model_id, obs.stream, obs.id)
                if (anchor is not None and vec is not None and anchor_vec is not None
                        and obs.model_id == anchor.model_id
                        and obs.t - anchor.t <= self.cfg.fold_window_s
                        and _near(anchor, obs, self.cfg.fold_radius_m)
                        and obs.id not in referenced and _same_numbers(anchor, obs)
                        and float(vec @ anchor_vec) >= self.cfg.fold_similarity):
                    pending.append(obs)
                    continue
                if anchor is not None:
                    total += self._merge(anchor, pending, "folded")
                anchor, anchor_vec, pending = obs, vec, []
            if anchor is not None:
                total += self._merge(anchor, pending, "folded")
        self.store.set_meta("fold_checked_id", str(last_id))
        return total

    # ---- 3. summaries ---------------------------------------------------------------------
    def summarise(self, now: float) -> dict[str, Any]:
        from memory_node.core.llm import ChatClient, LLMError, resolve_llm_settings

        settings = self.llm_settings
        if settings == "env":
            settings = resolve_llm_settings()
        if settings is None:
            return {"status": "unavailable", "written": 0,
                    "message": "no LLM configured (set VLM_API_KEY or OPENAI_API_KEY)"}
        done = int(self.store.get_meta("summarised_note_id") or 0)
        cutoff = now - self.cfg.summary_age_s
        notes = self.store.rows_of(["events"], after_id=done, before_t=cutoff)
        if not notes:
            return {"status": "ok", "written": 0, "message": "no notes old enough"}
        by_day: dict[str, list[Observation]] = defaultdict(list)
        for obs in notes[: self.cfg.summary_max_notes]:
            by_day[datetime.fromtimestamp(obs.t, tz=timezone.utc).strftime("%Y-%m-%d")].append(obs)
        try:
            client = ChatClient(settings, timeout=self.cfg.llm_timeout_s)
        except LLMError as exc:  # a bad base URL or key: nothing is called
            log.warning("summaries skipped: %s", exc.message)
            return {"status": "error", "written": 0, "message": exc.message}
        written = 0
        for day, group in sorted(by_day.items()):
            lines = []
            for o in group:
                where = f" at x={o.pose.x:.1f}, y={o.pose.y:.1f}" if o.pose else ""
                when = datetime.fromtimestamp(o.t, tz=timezone.utc).strftime("%H:%M")
                lines.append(f"- {when} UTC{where}: {o.text}")
            try:
                text = client.complete([
                    {"role": "system", "content": SUMMARY_PROMPT},
                    {"role": "user", "content": f"Notes of {day}:\n" + "\n".join(lines)},
                ])
            except Exception as exc:  # noqa: BLE001 - report, keep what was written
                log.warning("summary of %s failed: %s", day, exc)
                return {"status": "error", "written": written,
                        "message": f"the LLM call failed: {exc}"}
            text = (text or "").strip()
            if not text:
                return {"status": "error", "written": written, "message": "empty summary"}
            last = group[-1]
            tags = {"kind": "summary", "day": day, "notes": len(group),
                    "from_id": group[0].id, "to_id": last.id}
            try:
                self.save_summary(SaveRequest(text=text[: self.cfg.max_note_bytes], tags=tags),
                                  "summaries", last.t, last.pose)
            except ContractError as exc:  # e.g. the notes file cannot be written
                log.warning("summary of %s not stored: %s", day, exc.message)
                return {"status": "error", "written": written,
                        "message": f"the summary of {day} could not be stored: {exc.message}"}
            self.store.set_meta("summarised_note_id", str(last.id))
            written += 1
        return {"status": "ok", "written": written, "model": settings.model,
                "at": time.time()}


def _same_numbers(a: Observation, b: Observation, rel: float = 0.02) -> bool:
    """Whether two rows carry the same numeric tags with (nearly) the same values: a frame
    brighter or fuller than the one it repeats is an answer of its own, never folded."""
    def numbers(o: Observation) -> dict[str, float]:
        return {k: float(v) for k, v in o.tags.items() if k not in ENGINE_TAGS
                and isinstance(v, (int, float)) and not isinstance(v, bool)}

    na, nb = numbers(a), numbers(b)
    if set(na) != set(nb):
        return False
    return all(abs(na[k] - nb[k]) <= rel * max(1.0, abs(na[k]), abs(nb[k])) for k in na)


def _near(a: Observation, b: Observation, radius: float) -> bool:
    if a.pose is None or b.pose is None:
        return a.pose is None and b.pose is None
    return math.hypot(a.pose.x - b.pose.x, a.pose.y - b.pose.y) <= radius
