"""`memory-import BAG [BAG …] --memory-dir D`: a robot's memory from its recorded bags, offline.

The bags are read in time order (rosbags: MCAP and sqlite3) and every message goes through
the recorder's own policy (`core/recorder.py` RecorderPolicy: stamps, TF and odometry poses,
keyframe gate, camera views) and the engine's ingest, with the parameter file memory-node
takes — so the rows are the ones a live 1x recording of the same bag stores, without DDS or
real time. The policy's clock is the bag's: a message whose transform has not come yet waits
(tf_wait_s) while later messages of the bag are read, as it would live, never on a wall clock.
Kept camera frames are decoded, described and encoded on --threads threads while reading goes
on; rows are stored in bag order.

Idempotent and resumable: an admitted keyframe already stored (same stream, same stamp) is
not stored again, and an import is marked done in the store only once every message was read
and every kept row stored, so importing a bag twice adds nothing, and an interrupted import
(Ctrl-C, a killed process) or one stopped by a full disk continues where it stopped — the
gate runs again from the start (cheap: nothing is decoded before it admits a frame) and the
keyframes stored before are passed over. A full disk (or free space below disk_reserve_mb)
stops the import with exit status 3 and a summary saying how many kept rows were not stored.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from memory_node.core.camera_info import camera_info_topic
from memory_node.core.disk import DISK_FULL, DISK_RESERVE, disk_full_text, is_disk_full
from memory_node.core.front_video import FRONT_VIDEO, FrontVideoReceiver
from memory_node.core.secrets import mask_log_handlers
from memory_node.core.streams import camera_feed, sensor_stream_names, stream_kinds
from memory_node.ros.replay import ReplayError, open_reader

TF_TOPICS = ("/tf", "/tf_static")
TF_TYPE = "tf2_msgs/msg/TFMessage"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
# Key prefix of the store's meta table: one entry per finished import (bags, selection and
# settings hashed into the key), so the same import again reads nothing.
META_PREFIX = "import/"
# Dry run: messages per topic whose header stamps are checked; /tf messages read for frames.
STAMP_SAMPLE = 50
TF_SAMPLE = 2000
# A header stamp further than this from the bag's clock is reported (the recorder's auto
# stamp_source replaces such stamps by the arrival time; see stamp_max_offset_s).
CLOCK_SKEW_WARN_S = 1.0


# Exit status when kept rows were not stored (a full disk, the disk reserve, a failure).
EXIT_NOT_STORED = 3


class ImportError_(RuntimeError):  # noqa: N801 - ImportError is a builtin
    """A bag or a setting the import cannot use; the message says which and why."""


@dataclass
class StreamTopic:
    stream: str
    topic: str  # the configured topic
    types: tuple[str, ...]  # the types it may have
    kind: str = ""  # "compressed" for a CompressedImage camera
    found: bool = False  # the bag has it (with a fitting type)
    count: int = 0
    others: tuple[str, ...] = ()  # topics of a fitting type under other names


@dataclass
class Plan:
    """What the import reads: bags, their topics, the streams matched to the configuration and
    the time window."""

    bags: list[Path]
    topics: dict[str, tuple[str, int]]  # topic -> (type, count), all bags together
    start_ns: int  # the bags' first message
    end_ns: int
    streams: dict[str, StreamTopic]
    read_topics: list[str]  # sensor topics read (found and wanted)
    tf_topics: list[str]
    window: tuple[int, int]  # [from, to] bag time read (ns)
    identity: str = ""  # hashed: bags, selection, settings

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.window[1] - self.window[0]) / 1e9)


def _bag_identity(reader: Any) -> list[Any]:
    """What tells one recording from another: each file's name, time span and counts."""
    names = sorted(Path(p).name for p in reader.paths)
    counts = [[c.topic, c.msgtype, c.msgcount]
              for c in sorted(reader.connections, key=lambda c: (c.topic, c.msgtype))]
    return [names, counts, reader.start_time, reader.end_time]


def make_plan(bags: Sequence[Path], settings: dict[str, Any], *, topics: Sequence[str] | None,
              start_s: float = 0.0, duration_s: float | None = None) -> Plan:
    """Match the bags' topics to the configuration. Raises ImportError_ for a bag that cannot
    be read, a --topics entry the bags lack, or a window outside them."""
    if start_s < 0 or (duration_s is not None and duration_s <= 0):
        raise ImportError_("--start must be >= 0 and --duration > 0")
    try:
        reader = open_reader(list(bags))
    except ReplayError as exc:
        raise ImportError_(str(exc)) from None
    try:
        found: dict[str, tuple[str, int]] = {}
        for c in reader.connections:
            typ, n = found.get(c.topic, (c.msgtype, 0))
            found[c.topic] = (typ, n + c.msgcount)
        start_ns, end_ns = int(reader.start_time), int(reader.end_time)
        identity = _bag_identity(reader)
    finally:
        reader.close()
    wanted = set(topics) if topics else None
    if wanted is not None:
        missing = sorted(wanted - set(found))
        if missing:
            raise ImportError_(f"topic(s) not in the bag: {', '.join(missing)}; the bag has "
                               f"{', '.join(sorted(found))}")
    feed = camera_feed(settings)
    camera = StreamTopic("camera", feed.topic, (feed.message_type,),
                         "" if feed.kind == "raw" else feed.kind)
    streams = {"camera": camera}
    for kind in stream_kinds():  # the others as core/streams.py describes them
        if kind.name != "camera":
            streams[kind.name] = StreamTopic(
                kind.name, settings.get(kind.topic_param, kind.topic_default),
                kind.message_types)
    for st in streams.values():
        typ, n = found.get(st.topic, ("", 0))
        st.found = bool(st.topic) and typ in st.types  # an empty topic turns a stream off
        st.count = n if st.found else 0
        st.others = tuple(sorted(t for t, (ty, _) in found.items()
                                 if ty in st.types and t != st.topic))
    read = [st.topic for st in streams.values()
            if st.found and (wanted is None or st.topic in wanted)]
    info = camera_info_topic(camera.topic) if camera.kind != FRONT_VIDEO.kind else ""
    if (camera.topic in read and found.get(info, ("",))[0] == CAMERA_INFO
            and (wanted is None or info in wanted)):
        read.append(info)  # the driver's calibration: the views' field of view
    tf = [t for t in TF_TOPICS if found.get(t, ("",))[0] == TF_TYPE
          and (wanted is None or t in wanted)]
    begin = start_ns + int(start_s * 1e9)
    if begin > end_ns:
        raise ImportError_(f"--start {start_s:g} s is past the end of the bags "
                           f"({(end_ns - start_ns) / 1e9:.1f} s)")
    stop = end_ns if duration_s is None else min(end_ns, begin + int(duration_s * 1e9))
    selection = {"topics": sorted(wanted) if wanted else None, "window": [begin, stop],
                 "settings": {k: settings[k] for k in sorted(settings)}}
    digest = hashlib.sha256(json.dumps([identity, selection], sort_keys=True,
                                       default=str).encode()).hexdigest()[:24]
    return Plan([Path(b) for b in bags], found, start_ns, end_ns, streams, read, tf,
                (begin, stop), digest)


# ---- dry run --------------------------------------------------------------------------------
def header_seconds(msg: Any) -> float:
    stamp = msg.header.stamp
    return float(stamp.sec) + float(stamp.nanosec) * 1e-9


def _stamp_problems(reader: Any, plan: Plan) -> list[str]:
    """Zero header stamps and header stamps far from the bag clock, from a sample of each
    sensor topic's messages."""
    problems = []
    for st in plan.streams.values():
        if st.topic not in plan.read_topics or st.kind == FRONT_VIDEO.kind:
            continue  # the front video has no header: stamped on receipt
        conns = [c for c in reader.connections if c.topic == st.topic]
        zero = n = 0
        offsets = []
        for conn, t_ns, raw in reader.messages(connections=conns):
            msg = reader.deserialize(raw, conn.msgtype)
            if not hasattr(msg, "header"):
                break  # stamped on receipt
            h = header_seconds(msg)
            n += 1
            if h <= 0.0:
                zero += 1
            else:
                offsets.append(h - t_ns / 1e9)
            if n >= STAMP_SAMPLE:
                break
        if zero:
            problems.append(f"{st.topic}: {zero} of the first {n} messages have a zero stamp "
                            "(stored at their recording time)")
        if offsets:
            median = sorted(offsets)[len(offsets) // 2]
            if abs(median) > CLOCK_SKEW_WARN_S:
                problems.append(f"{st.topic}: header stamps are {median:+.1f} s from the bag's "
                                "clock (a clock far from the header stamps)")
    return problems


def _tf_frames(reader: Any, plan: Plan) -> dict[str, str]:
    """child -> parent of every edge on /tf_static and the first TF_SAMPLE /tf messages."""
    from memory_node.wire.tf_wire import TfWireError, parse_tf_message

    frames: dict[str, str] = {}
    for topic in plan.tf_topics:
        conns = [c for c in reader.connections if c.topic == topic]
        for n, (_c, _t, raw) in enumerate(reader.messages(connections=conns)):
            if n >= TF_SAMPLE:
                break
            try:
                for e in parse_tf_message(raw):
                    frames[e.child.removeprefix("/")] = e.parent.removeprefix("/")
            except TfWireError:
                continue
    return frames


def _chain(frames: dict[str, str], start: str, goal: str) -> list[str] | None:
    """The frames from `start` up to `goal` (child -> parent), or None when not linked."""
    chain, frame = [start], start
    while frame != goal:
        if frame not in frames or len(chain) > 64:
            return None
        frame = frames[frame]
        chain.append(frame)
    return chain


def dry_run(plan: Plan, settings: dict[str, Any], out: TextIO) -> None:
    """Say what would be recorded, from the bags' metadata and a sample of their messages."""
    reader = open_reader(plan.bags)
    try:
        names = ", ".join(str(b) for b in plan.bags)
        total = sum(n for _t, n in plan.topics.values())
        out.write(f"bags: {names}: {(plan.end_ns - plan.start_ns) / 1e9:.1f} s, "
                  f"{total} messages on {len(plan.topics)} topics\n")
        for st in plan.streams.values():
            kind = st.types[0].rsplit("/", 1)[-1]
            if not st.topic:
                out.write(f"  {st.stream:7s} off (no topic configured)\n")
            elif st.topic in plan.read_topics:
                out.write(f"  {st.stream:7s} {st.topic} ({kind}): {st.count} messages, "
                          "recorded\n")
            elif st.found:
                out.write(f"  {st.stream:7s} {st.topic} ({kind}): {st.count} messages, left "
                          "out by --topics\n")
            else:
                others = ", ".join(st.others) or "none"
                out.write(f"  {st.stream:7s} no {st.topic}; {kind} topics: {others}\n")
        frames = _tf_frames(reader, plan)
        world, base = settings["world_frame"], settings["base_frame"]
        if not plan.tf_topics:
            out.write("  TF: no /tf or /tf_static in the bags; poses from odometry\n")
        else:
            edges = ", ".join(f"{p}->{c}" for c, p in sorted(frames.items())) or "none"
            chain = _chain(frames, base, world)
            link = (f"{world} <- {base} connected ({' <- '.join(reversed(chain))})" if chain
                    else f"{world} <- {base} NOT connected: poses fall back to odometry")
            out.write(f"  TF: frames {edges}\n  TF: {link}\n")
        problems = _stamp_problems(reader, plan)
        for p in problems:
            out.write(f"  stamps: {p}\n")
        if not problems:
            out.write("  stamps: no zero stamps; header stamps agree with the bag clock\n")
    finally:
        reader.close()


# ---- progress -------------------------------------------------------------------------------
class Progress:
    """A tqdm bar on a terminal (bag time, rate x real time, ETA, rows per stream); otherwise
    a plain line every `every_s` seconds of wall time."""

    def __init__(self, total_s: float, out: TextIO, *, tty: bool | None = None,
                 every_s: float = 5.0):
        self.total_s, self.out, self.every_s = total_s, out, every_s
        self.tty = out.isatty() if tty is None else tty
        self.t0 = time.monotonic()
        self._last = self.t0
        self.bar: Any = None
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:  # not installed (a robot's own Python): plain lines
                self.tty = False
                return
            self.bar = tqdm(total=round(total_s, 1), unit="s", unit_scale=False, file=out,
                            dynamic_ncols=True, leave=True, desc="import",
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s"
                                       " bag [{elapsed}<{remaining}]{postfix}")

    def update(self, done_s: float, rows: dict[str, int]) -> None:
        done_s = min(max(done_s, 0.0), self.total_s)
        now = time.monotonic()
        wall = max(now - self.t0, 1e-9)
        rate = done_s / wall
        rows_text = " ".join(f"{s} {n}" for s, n in rows.items())
        if self.bar is not None:
            if now - self._last >= 0.1 or done_s >= self.total_s:
                self.bar.n = round(done_s, 1)
                self.bar.set_postfix_str(f"{rate:.1f}x real time, rows: {rows_text}")
                self._last = now
            return
        if now - self._last >= self.every_s:
            eta = (self.total_s - done_s) / rate if rate > 0 else float("inf")
            self.out.write(f"import: {done_s:.1f}/{self.total_s:.1f} s of bag, "
                           f"{rate:.1f}x real time, ETA {eta:.0f} s, rows: {rows_text}\n")
            self.out.flush()
            self._last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---- the import -----------------------------------------------------------------------------
@dataclass
class Outcome:
    """What an import did; `summary()` is the command's last line."""

    messages: int = 0  # messages read (sensor and TF)
    bag_s: float = 0.0  # bag time covered
    wall_s: float = 0.0
    counters: dict[str, Any] = field(default_factory=dict)  # stream -> StreamCounters
    resumed: dict[str, int] = field(default_factory=dict)  # keyframes found stored already
    sources: dict[str, int] = field(default_factory=dict)  # pose source -> keyframes
    tf: dict[str, Any] = field(default_factory=dict)
    tf_problems: list[str] = field(default_factory=list)
    already: bool = False  # the same import had finished before: nothing read
    interrupted: bool = False
    streams: list[str] = field(default_factory=list)
    # Kept rows not stored, by reason (disk_full, disk_reserve, error); `stopped` says why
    # reading stopped early ("disk_full" or "disk_reserve"), `disk` the message about it.
    not_stored: dict[str, int] = field(default_factory=dict)
    stopped: str = ""
    disk: str = ""

    @property
    def complete(self) -> bool:
        """Every message read and every kept row stored: the import may be marked done."""
        return not (self.interrupted or self.stopped or sum(self.not_stored.values()))
    extra: dict[str, dict[str, int]] = field(default_factory=dict)  # a stream's own counters

    @property
    def speed(self) -> float:
        return self.bag_s / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> str:
        if self.already:
            return ("memory-import: already imported (the same bags, selection and settings); "
                    "nothing added")
        parts = []
        for s in self.streams:
            c = self.counters[s]
            ratio = c.kept / c.received if c.received else 0.0
            again = self.resumed.get(s, 0)
            skipped = self.extra.get(s, {}).get("skipped_until_keyframe", 0)
            parts.append(f"{s} {c.stored} rows ({c.kept}/{c.received} kept, {ratio:.1%}"
                         + (f", {again} stored before" if again else "")
                         + (f", {skipped} skipped until a keyframe" if skipped else "") + ")")
        sources = ", ".join(f"{k} {v}" for k, v in sorted(self.sources.items())) or "none"
        problems = "; ".join(self.tf_problems) or "none"
        head = ("memory-import: interrupted" if self.interrupted else
                f"memory-import: stopped, {self.stopped.replace('_', ' ')}" if self.stopped
                else "memory-import: done" if self.complete else "memory-import: incomplete")
        line = (f"{head}: {self.messages} messages, {self.bag_s:.1f} s of bag in "
                f"{self.wall_s:.1f} s ({self.speed:.1f}x real time); "
                f"{'; '.join(parts) or 'no sensor streams'}; pose sources: {sources}; "
                f"TF problems: {problems}")
        missing = sum(self.not_stored.values())
        if missing or self.stopped:
            why = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in
                            sorted(self.not_stored.items()) if n) or "none"
            disk = self.stopped or any(self.not_stored.get(r) for r in (DISK_FULL,
                                                                         DISK_RESERVE))
            line += (f"; NOT STORED: {missing} kept rows ({why})"
                     + (f", the bag read only up to {self.bag_s:.1f} s" if self.stopped else "")
                     + (f": {self.disk}" if self.disk else "")
                     + ("; run the same command again once there is space: it stores only "
                        "what is missing" if disk else
                        "; the warnings above say why; the same command again tries only "
                        "those"))
        return line

    def as_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "bag_s": round(self.bag_s, 3),
                "wall_s": round(self.wall_s, 3), "speed": round(self.speed, 2),
                "streams": {s: dict(vars(self.counters[s])) | self.extra.get(s, {})
                            for s in self.streams},
                "resumed": self.resumed, "pose_sources": self.sources, "tf": self.tf,
                "tf_problems": self.tf_problems, "already": self.already,
                "interrupted": self.interrupted, "not_stored": self.not_stored,
                "stopped": self.stopped}


class _Stop:
    """SIGINT/SIGTERM ask the import to stop after the message in hand (what is stored stays
    stored; the next run continues from there)."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handlers, stop never requested
                pass
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _existing_keyframes(engine: Any, plan: Plan) -> set[tuple[str, float]]:
    """(stream, t) of the rows already stored in the bags' time span (a margin either side
    covers stamps that differ from the recording times): keyframes an earlier run stored."""
    margin = 3600.0
    lo, hi = plan.start_ns / 1e9 - margin, plan.end_ns / 1e9 + margin
    names = sensor_stream_names()
    rows = engine.store.rows(f"stream IN ({', '.join('?' * len(names))}) AND t BETWEEN ? AND ?",
                             (*names, lo, hi))
    return {(r.stream, r.t) for r in rows}


# Kept keyframes handed to the storing thread at once (one embedding batch for the camera
# frames among them), or fewer once they span STORE_SPAN_S of bag time: the storing thread
# looks the camera's view up in TF at their stamps, so it stays well inside tf_cache_s.
STORE_BATCH = 16
STORE_SPAN_S = 5.0


class _Storer:
    """Stores kept keyframes on a thread of its own, in order, while the reader reads and
    gates on. Camera keyframes are decoded, described and encoded on `threads` threads as
    soon as they are handed over (`prepare`; OpenCV releases the GIL), so describing the
    next batch overlaps embedding and storing this one. At most a few batches wait, so the
    store is never far behind the bag."""

    def __init__(self, store: Any, prepare: Any, threads: int = 1) -> None:
        import queue
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self._store, self._prepare = store, prepare
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="memory-import-describe")
        self._queue: queue.Queue[tuple[list[Any], list[Any]] | None] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="memory-import-store",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, prepared = item
            try:
                for future in prepared:
                    future.result()  # prepare() keeps its own failures on the job
                self._store(batch)
            except BaseException as exc:  # noqa: BLE001 - reported by the reader's thread
                self.error = exc

    def put(self, batch: list[Any]) -> None:
        self._queue.put((batch, [self._pool.submit(self._prepare, job) for job in batch]))
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Wait until everything handed over is stored."""
        self._queue.put(None)
        self._thread.join()
        self._pool.shutdown(wait=True)
        if self.error is not None:
            raise self.error


def _messages(reader: Any, plan: Plan) -> Iterator[tuple[str, int, bytes, str]]:
    """(topic, bag time ns, CDR bytes, type) in time order: /tf_static from the bags' start
    (static transforms recorded before --start still hold), everything else in the window."""
    begin, stop = plan.window
    static = [c for c in reader.connections if c.topic == "/tf_static"
              and "/tf_static" in plan.tf_topics]
    if static and begin > plan.start_ns:
        for conn, t_ns, raw in reader.messages(connections=static, stop=begin):
            yield conn.topic, t_ns, raw, conn.msgtype
    topics = set(plan.read_topics) | set(plan.tf_topics)
    conns = [c for c in reader.connections if c.topic in topics]
    # rosbags' stop is exclusive; the window's end is the last message's time, included.
    for conn, t_ns, raw in reader.messages(connections=conns, start=begin, stop=stop + 1):
        yield conn.topic, t_ns, raw, conn.msgtype


def plan_streams(plan: Plan) -> list[str]:
    """The built-in streams, then the registered kinds the plan matched."""
    builtin = [k.name for k in stream_kinds() if k.builtin]
    return [*builtin, *(s for s in plan.streams if s not in builtin)]


class Importer:
    """Reads the plan's bags through the recorder's policy (`RecorderPolicy.offline`: the
    node's stamps, pose resolution and gate, its TF waits on the bag's clock) into `engine`;
    the keyframes it keeps go to a storing thread, less those an earlier run stored.
    `run()` returns the Outcome."""

    def __init__(self, plan: Plan, settings: dict[str, Any], engine: Any, *,
                 progress: Progress | None = None, stop: _Stop | None = None,
                 logger: Any = None, threads: int = 1):
        from memory_node.core.recorder import RecorderPolicy

        self.plan, self.engine, self.progress, self.stop = plan, engine, progress, stop
        self.threads = threads
        self.policy = RecorderPolicy.offline(settings, engine, logger=logger)
        self.policy.on_kept = self._on_kept
        self.policy.disk_full_hint = ""  # the summary says what happens next
        camera = plan.streams["camera"]
        self.front_video = (FrontVideoReceiver(settings["front_video_resolution"],
                                               self.policy.count, self.policy.log.warning)
                            if camera.kind == FRONT_VIDEO.kind else None)
        self.stream_of = {st.topic: st for st in plan.streams.values()
                          if st.topic in plan.read_topics}
        self.existing = _existing_keyframes(engine, plan)
        self.outcome = Outcome(streams=[s for s in plan.streams if plan.streams[s].topic
                                        in plan.read_topics])
        self.outcome.resumed = dict.fromkeys(self.outcome.streams, 0)
        self._kept: list[Any] = []
        self._storer: _Storer | None = None

    def run(self) -> Outcome:
        policy, out = self.policy, self.outcome
        t0 = time.monotonic()
        reader = open_reader(self.plan.bags)
        last_ns = self.plan.window[0]
        self._storer = _Storer(policy.store, policy.prepare, self.threads)
        try:
            for topic, t_ns, raw, msgtype in _messages(reader, self.plan):
                if self.stop is not None and self.stop.requested:
                    out.interrupted = True
                    break
                stopped = self._disk_stop()
                if stopped:
                    out.stopped = stopped
                    break
                out.messages += 1
                self._dispatch(reader, topic, t_ns / 1e9, raw, msgtype)
                last_ns = max(last_ns, t_ns)
                if self.progress is not None:
                    self.progress.update((last_ns - self.plan.window[0]) / 1e9, self._rows())
        except KeyboardInterrupt:
            out.interrupted = True
        except Exception as exc:  # noqa: BLE001 - a truncated/corrupt chunk mid-way
            # Every message read is decided and stored (finally): no more TF will come.
            raise ImportError_(f"the bag is unreadable after {out.messages} messages: "
                               f"{exc}") from None
        finally:
            reader.close()
            try:
                if not (out.interrupted or out.stopped):
                    policy.flush()  # the end of the bags: TF will not come any more
                self._store(final=True)
            finally:
                self._storer.close()
        out.bag_s = (last_ns - self.plan.window[0]) / 1e9
        out.wall_s = time.monotonic() - t0
        out.counters = {s: policy.counters[s] for s in plan_streams(self.plan)}
        self._disk_outcome()
        if self.front_video is not None:
            out.extra["camera"] = self.front_video.stats()
        out.tf = dict(policy.poses.tf_stats())
        out.tf_problems = self._tf_problems()
        if self.progress is not None:
            self.progress.update(out.bag_s, self._rows())
        return out

    def _dispatch(self, reader: Any, topic: str, now: float, raw: Any, msgtype: str) -> None:
        """One message of the bags to the recorder policy, as the live node hands it over."""
        policy = self.policy
        if topic in TF_TOPICS:
            policy.on_tf(raw, topic == "/tf_static", arrived_s=now)
            return
        if msgtype == CAMERA_INFO:
            policy.on_camera_info(reader.deserialize(raw, msgtype))
            return
        st = self.stream_of[topic]
        msg = reader.deserialize(raw, msgtype)
        if self.front_video is not None and st.kind == FRONT_VIDEO.kind:
            msg = self.front_video.picture(msg)  # every access unit, in order
            if msg is None:
                return  # counted (skipped until a keyframe, or failed)
        policy.on_message(st.stream, msg, arrived_s=now, kind=st.kind or "raw")

    def _disk_outcome(self) -> None:
        """What the outcome says of rows not stored and of a stop for a full disk."""
        policy, out = self.policy, self.outcome
        out.not_stored = policy.not_stored.snapshot()
        if not out.stopped:
            out.stopped = self._disk_stop()
        if out.stopped == DISK_FULL:
            out.disk = f"the filesystem of {self.engine.config.root} is full"
        elif out.stopped == DISK_RESERVE:
            free = policy.reserve.free.bytes() or 0
            out.disk = (f"less than disk_reserve_mb = "
                        f"{policy.reserve.reserve_bytes / 2**20:g} MB free on the filesystem "
                        f"of {self.engine.config.root} ({free / 2**20:.1f} MB)")

    def _disk_stop(self) -> str:
        """"disk_full" or "disk_reserve" once a kept row could not be stored for that reason
        (reading on would only decode rows that cannot be stored), else ""."""
        counts = self.policy.not_stored.snapshot()
        for reason in (DISK_FULL, DISK_RESERVE):
            if counts.get(reason):
                return reason
        return ""

    def _rows(self) -> dict[str, int]:
        return {s: self.policy.counters[s].stored + self.outcome.resumed.get(s, 0)
                for s in self.outcome.streams}

    def _on_kept(self, jobs: list[Any]) -> None:
        """Keyframes the gate kept, in order: counted by pose source; those an earlier run
        stored are passed over, the rest handed to the storing thread in batches."""
        out = self.outcome
        for job in jobs:
            source = job.pose.source if job.pose is not None else "none"
            out.sources[source] = out.sources.get(source, 0) + 1
            if (job.stream, job.t) in self.existing:
                out.resumed[job.stream] += 1
            else:
                self._kept.append(job)
        self._store(final=False)

    def _store(self, final: bool) -> None:
        kept = self._kept
        if kept and (final or len(kept) >= STORE_BATCH
                     or kept[-1].t - kept[0].t >= STORE_SPAN_S):
            self._kept = []
            assert self._storer is not None
            self._storer.put(kept)

    def _tf_problems(self) -> list[str]:
        problems = []
        out, poses = self.outcome, self.policy.poses
        timeouts = {s: out.counters[s].tf_timeouts for s in out.streams
                    if out.counters[s].tf_timeouts}
        if timeouts:
            problems.append("no transform at the stamp of " + ", ".join(
                f"{n} {s}" for s, n in timeouts.items()) + " message(s) (odometry or TF "
                "within the tolerance used)")
        no_pose = {s: out.counters[s].no_pose for s in out.streams if out.counters[s].no_pose}
        if no_pose:
            problems.append("no pose for " + ", ".join(f"{n} {s}" for s, n in no_pose.items()))
        if not self.plan.tf_topics:
            problems.append("no TF in the bags")
        elif not poses.has_world_pose():
            problems.append(f"TF never linked {poses.world_frame} <- {poses.base_frame}")
        malformed = out.tf.get("tf_malformed", 0)
        if malformed:
            problems.append(f"{malformed} malformed TF message(s)")
        return problems


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-import", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 when every message was read and every kept row stored (the "
               "last line is the summary), 1 when a bag is unreadable part-way (what was read "
               "is stored), 2 for a bag or setting that cannot be used (nothing stored), 3 "
               "when kept rows were not stored (a full disk, or free space below "
               "disk_reserve_mb: the import stops there; the summary says how many and why), "
               "130 when interrupted. After 3 or 130, run the same command again: it stores "
               "only what is missing.")
    parser.add_argument("bags", nargs="+", type=Path, metavar="BAG",
                        help="rosbag2 directories or .mcap/.db3 files, read as one recording "
                        "in time order")
    parser.add_argument("--memory-dir", type=Path, help="the store to import into (required "
                        "unless --dry-run)")
    parser.add_argument("--config", help="memory-node's parameter YAML: a path, or a name in "
                        "the package's config directory such as go2.yaml (default: memory.yaml)")
    parser.add_argument("--start", type=float, default=0.0, metavar="S",
                        help="seconds into the bags to start at (static TF before it is kept)")
    parser.add_argument("--duration", type=float, metavar="D", help="seconds of bag to import")
    parser.add_argument("--topics", nargs="+", metavar="T",
                        help="only these topics (name /tf and /tf_static too for TF poses)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be recorded (topics, TF, stamps); store nothing")
    parser.add_argument("--threads", type=int, metavar="N", default=available_cpus(),
                        help="threads that describe and encode kept camera frames at once "
                        "(default: the CPUs this process may use, %(default)s here; the live "
                        "recorder uses 1)")
    return parser


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> int:
    import logging

    from memory_node.core import param_file
    from memory_node.core.config import ConfigError
    from memory_node.core.parameters import ParameterError

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    err = sys.stderr
    if not args.dry_run and args.memory_dir is None:
        print("memory-import: --memory-dir is required (or --dry-run)", file=err)
        return 2
    if args.threads < 1:
        print(f"memory-import: --threads must be at least 1, got {args.threads}", file=err)
        return 2
    config = param_file.resolve_config(args.config or "memory.yaml")
    if config is None and args.config:
        print(f"memory-import: config file {args.config} does not exist (neither as a path "
              "nor in the package's config directory)", file=err)
        return 2
    overrides = {"memory_dir": str(args.memory_dir)} if args.memory_dir else {}
    try:
        settings, engine_config, unknown = param_file.load(config, overrides)
        plan = make_plan(args.bags, settings, topics=args.topics, start_s=args.start,
                         duration_s=args.duration)
    except (ParameterError, ConfigError, ImportError_) as exc:
        print(f"memory-import: {exc}", file=err)
        return 2
    for key in unknown:
        print(f"memory-import: unknown parameter {key} in {config} (ignored)", file=err)
    if args.dry_run:
        dry_run(plan, settings, sys.stdout)
        return 0
    for st in plan.streams.values():
        if st.topic and not st.found:
            kind = st.types[0].rsplit("/", 1)[-1]
            print(f"memory-import: {st.stream}: no {st.topic} in the bags; {kind} topics: "
                  f"{', '.join(st.others) or 'none'}", file=err)
    if not plan.read_topics:
        print("memory-import: none of the configured topics is in the bags; nothing to "
              "import (see --dry-run)", file=err)
        return 2
    logging.basicConfig(level=logging.WARNING, format="memory-import: %(message)s")
    mask_log_handlers()
    from memory_node.core.engine import MemoryEngine
    from memory_node.core.recorder import ManualClock

    clock = ManualClock(plan.window[0] / 1e9)
    try:
        engine = MemoryEngine(engine_config, clock=clock)
    except Exception as exc:  # noqa: BLE001 - a model or a directory that cannot be used
        if is_disk_full(exc, engine_config.root):
            print(f"memory-import: disk full: cannot open the memory at {engine_config.root} "
                  f"({disk_full_text(exc)}); nothing stored", file=err)
            return EXIT_NOT_STORED
        print(f"memory-import: cannot open the memory at {engine_config.root}: {exc}", file=err)
        return 2
    summary = ""
    try:
        code, summary = _import(plan, settings, engine, err, threads=args.threads)
    except Exception as exc:
        if not is_disk_full(exc, engine_config.root):
            raise
        code = EXIT_NOT_STORED
        summary = (f"memory-import: disk full: {disk_full_text(exc)} on {engine_config.root}; "
                   "run the same command again once there is space")
    finally:
        engine.close()  # before the summary, which stays the last line
    if summary:
        print(summary, flush=True)
    return code


def _import(plan: Plan, settings: dict[str, Any], engine: Any, err: TextIO, *,
            threads: int = 1) -> tuple[int, str]:
    """(exit status, the summary line to print last)."""
    key = META_PREFIX + plan.identity
    if engine.store.get_meta(key) is not None:
        return 0, Outcome(already=True).summary()
    engine.mark_recording_clock(True)  # the rows are on the bags' clock, as a replay's
    progress = Progress(plan.duration_s, err)
    with _Stop() as stop:
        importer = Importer(plan, settings, engine, progress=progress, stop=stop,
                            threads=threads)
        try:
            outcome = importer.run()
        except (ImportError_, ReplayError) as exc:
            print(f"memory-import: {exc}", file=err)
            return 1, ""
        finally:
            progress.close()
    if outcome.complete:  # only then: an import again must store what this one missed
        try:
            engine.store.set_meta(key, json.dumps(outcome.as_dict()))
        except Exception as exc:
            if not is_disk_full(exc, engine.config.root):
                raise
            # Every row is stored; an import again passes over them all and marks it then.
            print(f"memory-import: disk full: the import is not marked done "
                  f"({disk_full_text(exc)})", file=err)
    if outcome.interrupted:
        return 130, outcome.summary()
    return (0 if outcome.complete else EXIT_NOT_STORED), outcome.summary()


if __name__ == "__main__":
    sys.exit(main())
