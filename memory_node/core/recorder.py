"""The recorder's policy without ROS: what happens between "a message arrived" and "rows in
the store".

`RecorderPolicy` stamps each message (header, receipt or auto; zero stamps take the arrival
time), resolves its pose (TF world ← base at the stamp, waiting up to `tf_wait_s` for a late
transform, else odometry at the stamp, else none), runs the keyframe gate, and stores the
keyframes through the engine's one ingestion path (`add_stream_rows`), as payloads that
core/keyframe_payloads.py builds (camera frames with their view, lidar scans, and every other
registered stream's decoded row). Messages are duck-typed: rclpy's and a bag reader's
deserialized messages have the same fields.

Two ways to drive it, one policy:
- the ROS node (ros/recorder.py) keeps subscriptions, queues and threads and calls the three
  stages `receive` / `receive_odom` (callback), `gate` (gate thread, may wait for TF) and
  `store` (worker);
- offline (a bag importer): `RecorderPolicy.offline(settings, engine)` on a manual clock, then
  `on_tf(...)`, `on_odom(msg, arrived_s)`, `on_message(stream, msg, arrived_s)` in the bag's
  order and `flush()` at the end. A message waits for its TF until the bag's time passes its
  arrival + `tf_wait_s` — the node's wait, on the bag's clock instead of the wall's.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_node.core.disk import (
    DISK_FULL,
    DISK_RESERVE,
    STORE_ERROR,
    DiskReserve,
    NotStored,
    RateLimitedLog,
    disk_full_text,
    is_disk_full,
)
from memory_node.core.keyframe_payloads import Job, KeyframePayloads
from memory_node.core.pose_history import Logger, PoseHistory, default_logger
from memory_node.core.recorder_settings import recorder_settings
from memory_node.core.recording import KeyframeGate, PoseResolver, Timeline
from memory_node.core.streams import sensor_stream_names, stream_kind
from memory_node.core.types import View
from memory_node.wire.geometry import stamp_to_seconds

__all__ = ["Job", "ManualClock", "RecorderPolicy", "StreamCounters", "view_thumbnail"]

# A full disk or the disk reserve is logged at most once per this many seconds.
DISK_LOG_PERIOD_S = 60.0


@dataclass
class StreamCounters:
    received: int = 0
    kept: int = 0
    skipped: int = 0
    dropped: int = 0
    failed: int = 0
    stored: int = 0
    no_pose: int = 0
    tf_timeouts: int = 0  # messages whose wait for TF ran out (they took the fallback)


def view_thumbnail(msg: Any, kind: str) -> np.ndarray | None:
    """A 32x24 grey thumbnail (0..1) of an image message, for the view-change gate."""
    import cv2

    from memory_node.wire.image_codec import image_to_gray

    try:
        if kind == "video":  # core.front_video.VideoPicture: its luma plane, no conversion
            grey = msg.gray()
            if grey is None:
                return None
        elif kind == "compressed":
            grey = cv2.imdecode(np.frombuffer(bytes(msg.data), np.uint8),
                                cv2.IMREAD_REDUCED_GRAYSCALE_4)
            if grey is None:
                return None
        else:
            grey = image_to_gray(msg)
        return cv2.resize(grey, (32, 24), interpolation=cv2.INTER_AREA).astype(np.float32) / 255
    except (ValueError, cv2.error):
        return None  # storing reports undecodable frames


def _settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The recorder and pose keys of `settings` over their defaults (other keys, such as the
    engine's from the same file, are not the policy's)."""
    known = recorder_settings()
    return recorder_settings({k: v for k, v in settings.items() if k in known})


class ManualClock:
    """A clock set by its owner (an importer sets it to each message's bag time)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        self.now = float(now)


class RecorderPolicy:
    """The recorder between arrival and storage (see the module docstring).

    `settings`: the recorder and pose parameters (core.recorder_settings; missing keys take
    their defaults). `engine`: anything with `add_stream_rows` and `prepare_stream_row`
    (core.engine.MemoryEngine). `poses`: the pose history the node's TF
    listener feeds; its `wall` bounds waits for TF. `clock`: the node clock (default the
    pose history's).
    """

    def __init__(self, settings: Mapping[str, Any], engine: Any, poses: PoseHistory, *,
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] = time.sleep, logger: Logger | None = None):
        cfg = _settings(settings)
        self.settings = cfg
        self.engine = engine
        self.poses = poses
        self.clock = clock or poses.clock
        self.wall = poses.wall
        self.log = logger or default_logger(__name__)
        # Every stream registered when the policy is made (core/streams.py).
        self.streams = sensor_stream_names()
        self.counters = {s: StreamCounters() for s in self.streams}
        self.gates = {s: KeyframeGate(cfg["min_distance"], cfg["min_yaw"], cfg["max_interval"])
                      for s in self.streams}
        self.gates["camera"].min_view_change = cfg["min_view_change"]
        self.gates["camera"].min_view_interval = cfg["min_view_interval"]
        self.batch_size = max(1, cfg["batch_size"])
        self.tf_wait_s = cfg["tf_wait_s"]
        self.stamp_source = cfg["stamp_source"]
        self.stamp_max_offset_s = cfg["stamp_max_offset_s"]
        self.lock = threading.Lock()
        self.timeline = Timeline()  # epochs of the node clock: a looping bag starts a new one
        self._unstamped: set[str] = set()  # streams whose driver leaves header.stamp zero
        self._restamped: set[str] = set()  # streams stored at receipt time (stamp_source)
        self.resolver = PoseResolver(poses, self.tf_wait_s, clock=self.wall, sleep=sleep,
                                     node_clock=self.clock,
                                     jump_threshold_s=self.timeline.detector.threshold_s)
        self._unposed_said: set[str] = set()  # streams warned about rows without a pose
        # recent odometry samples (stamp, x, y, frame): speed when the twist is empty
        self._odom_track: deque[tuple[float, float, float, str]] = deque(maxlen=64)
        # What each kept job becomes before it is stored (views, scans, registered rows).
        self.payloads = KeyframePayloads(cfg, poses, self.log)
        # offline driving (on_message / flush): messages waiting for their pose, in order
        self._waiting: deque[Job] = deque()
        self.manual_clock: ManualClock | None = None
        # Offline: given, it takes the keyframes the gate kept (in order) instead of `store`
        # here — an importer that passes over rows stored before and stores on its own thread.
        self.on_kept: Callable[[list[Job]], None] | None = None
        # Keyframes not stored, by reason (a full disk, the disk reserve, another failure);
        # a full disk or the reserve is said once a minute at most, not once per row.
        self.not_stored = NotStored()
        self.disk_full_hint = "; recording goes on and stores again when space returns"
        # One limit per process: the engine's, which its saves and searches use too.
        self.disk_log = getattr(engine, "disk_log", None) or RateLimitedLog(
            self.log.warning, DISK_LOG_PERIOD_S)
        config = getattr(engine, "config", None)
        self.reserve = DiskReserve(getattr(config, "root", "."),
                                   float(getattr(config, "disk_reserve_mb", 0.0) or 0.0))

    @classmethod
    def offline(cls, settings: Mapping[str, Any], engine: Any,
                logger: Logger | None = None) -> RecorderPolicy:
        """A policy and its pose history on one manual clock that `on_*`'s `arrived_s` sets
        (a bag's receive times): node clock and wait clock are both the bag's."""
        cfg = _settings(settings)
        clock = ManualClock()
        keep = (cfg["camera_frame"],) if cfg["camera_frame"] else ()
        poses = PoseHistory(cfg["world_frame"], cfg["base_frame"], cfg["tf_tolerance_s"],
                            clock=clock, wall=clock, cache_s=cfg["tf_cache_s"],
                            max_gap_s=cfg["tf_max_gap_s"], max_pose_age_s=cfg["max_pose_age_s"],
                            keep_frames=keep, logger=logger)
        policy = cls(cfg, engine, poses, sleep=lambda _s: None, logger=logger)
        policy.manual_clock = clock
        return policy

    def count(self, stream: str, counter: str, n: int = 1) -> None:
        """Counters more than one thread adds to (drops, failures) change under the lock."""
        with self.lock:
            c = self.counters[stream]
            setattr(c, counter, getattr(c, counter) + n)

    # ---- stage 1: arrival (cheap) -----------------------------------------------------------
    def check_time(self) -> float:
        """Reset the gates when the node clock jumps back (a looping bag). The node clock, not
        message stamps: messages of different topics may arrive out of order."""
        now = self.clock()
        if self.timeline.observe(now) and self.timeline.jumped_from is not None:
            self.log.warning(f"time jumped back by {self.timeline.jumped_from - now:.1f} s: "
                             "keyframe gates reset")
            for gate in self.gates.values():
                gate.reset()
        return now

    def stamp(self, stream: str, msg: Any,
              arrived: float | None = None) -> tuple[float, float]:
        """(the time to store, the time to look TF and odometry up at). `arrived`: when the
        message arrived, on the node clock (default now; never later than now): when the
        middleware received it, not when a busy process reached its callback.

        Stored: the header stamp (`stamp_source: header`), the node clock on arrival
        (`receipt`), or by default the header stamp unless it is further than
        `stamp_max_offset_s` from the node clock — a simulator's header time beside a wall
        /clock, a robot with a wrong RTC — then the arrival time, said once per stream, so
        observations, notes and "seconds ago" share one clock. Poses are looked up on the
        timeline TF runs on, which is the headers' as long as TF's stamps are near them.
        A driver that leaves the stamp zero gets the arrival time for both (said once).
        """
        header = stamp_to_seconds(msg.header.stamp)
        now = self.clock()
        if arrived is not None:
            now = min(now, arrived)
        if header <= 0.0:
            if stream not in self._unstamped:
                self._unstamped.add(stream)
                self.log.warning(f"{stream} messages carry no stamp (zero): stamped with the "
                                 "node clock on arrival")
            return now, now
        t = header
        offset = header - now
        if self.stamp_source == "receipt" or (self.stamp_source == "auto"
                                              and abs(offset) > self.stamp_max_offset_s):
            t = now
            if stream not in self._restamped:
                self._restamped.add(stream)
                why = ("stamp_source is receipt" if self.stamp_source == "receipt" else
                       f"its header stamps are {offset:+.1f} s from the node clock (more than "
                       f"stamp_max_offset_s = {self.stamp_max_offset_s:g})")
                self.log.warning(
                    f"{stream}: storing arrival times on the node clock, since {why}; notes "
                    "and 'seconds ago' use that clock too (set stamp_source: header to keep "
                    "them)")
        # Poses are looked up on the timeline the poses run on: TF's, else odometry's. Headers
        # near it are looked up as stamped; headers on another clock at the arrival time.
        # With neither to compare with, at the time stored.
        reference = self.poses.latest_tf_stamp
        if reference is None and stream != "odom":
            reference = self.poses.latest_odom_stamp
        if reference is None:
            return t, t
        return t, (header if abs(header - reference) <= self.stamp_max_offset_s else now)

    def receive(self, stream: str, msg: Any, kind: str = "",
                stamps: tuple[float, float] | None = None,
                arrived: float | None = None) -> Job:
        """A message arrived (now, or at `arrived` on the node clock): count it, stamp it,
        note its epoch."""
        self.counters[stream].received += 1
        t, lookup = stamps or self.stamp(stream, msg, arrived)
        with self.lock:
            now = self.check_time()
            epoch = self.timeline.epoch_of(t, now)
        return Job(stream, t, msg, kind, enqueued=self.wall(), epoch=epoch, lookup_t=lookup)

    def receive_odom(self, msg: Any, arrived: float | None = None) -> Job:
        """An odometry message: into the pose history at its lookup stamp, then a job."""
        t, lookup = self.stamp("odom", msg, arrived)
        self.poses.on_odom(msg, lookup)
        job = self.receive("odom", msg, stamps=(t, lookup))
        speed = self._speed(msg, lookup)
        if speed is not None:
            job.tags["speed"] = speed
        return job

    # Successive odometry poses at least this far apart in time give the speed.
    SPEED_SPAN_S = 0.2
    SPEED_MAX_SPAN_S = 2.0

    def _speed(self, msg: Any, stamp: float) -> float | None:
        """The planar speed: the twist's when it says anything, else from successive poses
        (drivers that fill the pose only leave the twist zero); None when neither tells it
        (a first sample, a gap) — never a false 0."""
        twist = getattr(getattr(getattr(msg, "twist", None), "twist", None), "linear", None)
        p = msg.pose.pose.position
        frame = getattr(msg.header, "frame_id", "") or "odom"
        x, y = float(p.x), float(p.y)
        track = self._odom_track
        if track and (stamp < track[-1][0] or track[-1][3] != frame):
            track.clear()  # time went back, or another frame: start over
        track.append((stamp, x, y, frame))
        if twist is not None and (twist.x or twist.y or twist.z):
            return round(math.hypot(twist.x, twist.y), 3)
        for t0, x0, y0, _ in reversed(track):
            span = stamp - t0
            if span >= self.SPEED_SPAN_S:
                if span > self.SPEED_MAX_SPAN_S:
                    return None
                return round(math.hypot(x - x0, y - y0) / span, 3)
        return None

    # ---- stage 2: pose and keyframe gate ----------------------------------------------------
    def before_time_jump(self, job: Job) -> bool:
        return job.epoch != self.timeline.epoch

    def gate(self, job: Job, wait: bool = True) -> bool | None:
        """Resolve the job's pose and run its stream's gate: True to store it as a keyframe,
        False when skipped or dropped. `wait=False` never waits for TF: None when the pose is
        not decided yet (ask again after more TF or a later clock)."""
        cancelled = lambda: self.before_time_jump(job)  # noqa: E731
        if wait:
            pose, timed_out = self.resolver.resolve(job.lookup_t, job.enqueued, cancelled)
        else:
            decided, pose, timed_out = self.resolver.try_resolve(job.lookup_t, job.enqueued,
                                                                 cancelled)
            if not decided:
                return None
        if timed_out:
            self.count(job.stream, "tf_timeouts")
        job.pose = pose
        return self._admit(job)

    def _admit(self, job: Job) -> bool:
        c = self.counters[job.stream]
        gate = self.gates[job.stream]
        if self.before_time_jump(job):
            # TF and odometry from before the jump are gone (or replaced by the new timeline's):
            # no pose can be told for it any more, and a guessed one would be wrong.
            self.count(job.stream, "dropped")
            self.log.debug(f"{job.stream} message at {job.t:.3f} dropped: it arrived before "
                           "the clock jumped back")
            return False
        if job.pose is None:
            c.no_pose += 1
            if c.no_pose >= self.UNPOSED_WARN_AFTER:
                self.warn_unposed(job.stream, job.lookup_t)
        # The thumbnail only when the gate needs it (see KeyframeGate): no decode for a frame
        # that the pose and the clock already turn down.
        view = ((lambda: view_thumbnail(job.msg, job.kind))
                if job.stream == "camera" and gate.min_view_change else None)
        with self.lock:
            admitted = gate.admit(job.t, job.pose, view) if self._gated(job.stream) else True
        if not admitted:
            c.skipped += 1
            return False
        c.kept += 1
        return True

    def _gated(self, stream: str) -> bool:
        return stream_kind(stream).gated

    # A stream with this many rows stored without a pose is said (once) with the reason.
    UNPOSED_WARN_AFTER = 10

    def warn_unposed(self, stream: str, lookup_t: float | None = None) -> None:
        """One warning per stream whose rows are stored without a pose: how many, and why."""
        c = self.counters[stream]
        if stream in self._unposed_said or c.no_pose == 0:
            return
        self._unposed_said.add(stream)
        p = self.poses
        tf_t, odom_t = p.latest_tf_stamp, p.latest_odom_stamp
        at = f" (looked up at {lookup_t:.2f})" if lookup_t is not None else ""
        if p.has_world_pose():
            why = (f"TF {p.world_frame} <- {p.base_frame} has no transform within "
                   f"tf_tolerance_s = {p.tolerance_s:g} s of their stamps{at}; newest TF "
                   f"stamp {tf_t if tf_t is not None else 'none'}")
        elif odom_t is not None:
            why = (f"no TF links {p.world_frame} and {p.base_frame}, and odometry does not "
                   f"cover their stamps{at}: newest odometry stamp {odom_t:.2f} (a sensor "
                   "clock on another time base? see stamp_source)")
        else:
            why = (f"no TF links {p.world_frame} and {p.base_frame} and no odometry arrived "
                   f"(odom_topic {self.settings['odom_topic'] or 'not set'})")
        self.log.warning(f"{stream}: {c.no_pose} of {c.received} rows so far stored without a "
                         f"pose: {why}")

    def unkeep(self, job: Job) -> None:
        """A keyframe its caller could not take (a full queue): counted dropped, not kept."""
        with self.lock:
            self.counters[job.stream].kept -= 1
            self.counters[job.stream].dropped += 1

    # ---- stage 3: storage -------------------------------------------------------------------
    def prepare(self, job: Job) -> None:
        """Build and prepare a kept job's payload ahead of `store` (which still stores in
        order) where its kind does work worth doing early (a camera frame's decode,
        description and JPEG): any thread, several at once. A failure is kept for `store` to
        count where the row would have been stored."""
        if job.payload is not None:
            return
        try:
            if not stream_kind(job.stream).rows.prepares:
                return
            payload = self.payloads.early(job)
            if payload is not None:
                self.engine.prepare_stream_row(job.stream, payload)
                job.payload = payload
        except Exception as exc:  # noqa: BLE001 - counted by store()
            job.failure = exc

    def _not_stored(self, stream: str, exc: BaseException | None, n: int = 1,
                    what: str = "") -> None:
        """`n` kept rows of `stream` not stored: counted as failed and by reason; a full disk
        and the reserve are said once a minute at most, other failures each time."""
        self.count(stream, "failed", n)
        if exc is None:
            self.not_stored.add(DISK_RESERVE, n)
            free = self.reserve.free.bytes()
            self.disk_log(DISK_RESERVE, "disk reserve: sensor rows are not stored while less "
                          f"than disk_reserve_mb = {self.reserve.reserve_bytes / 2**20:g} MB "
                          f"is free on {self.reserve.free.path} ("
                          f"{(free or 0) / 2**20:.1f} MB free); notes still are", n,
                          say=self.log.warning)
        elif is_disk_full(exc, self.reserve.free.path):
            self.not_stored.add(DISK_FULL, n)
            self.disk_log(DISK_FULL, f"disk full: kept rows are not stored "
                          f"({disk_full_text(exc)} on {self.reserve.free.path})"
                          f"{self.disk_full_hint}", n, say=self.log.warning)
        else:
            self.not_stored.add(STORE_ERROR, n)
            self.log.warning(f"{what or stream + ' message'} not stored: {exc}")

    def _stored_again(self) -> None:
        """A row was stored: a full disk or the reserve said before is said to be over."""
        for key in (DISK_FULL, DISK_RESERVE):
            if self.disk_log.active(key):
                self.disk_log.recovered(key, "storing rows again (space is free again)",
                                        say=self.log.info)

    def store(self, jobs: Sequence[Job]) -> None:
        """Build each kept job's payload in order and store it the way its stream kind says
        (core/streams.py): kinds stored in batches (camera frames: one embed call) in one call
        per stream, the others one call per row. One bad message is counted and logged, never
        raised. Below the disk reserve the jobs are counted as not stored (`not_stored`), not
        written."""
        if jobs and self.reserve.reached():
            for j in jobs:
                self._not_stored(j.stream, None)
            return
        batches: dict[str, list[Any]] = {}
        for j in jobs:
            try:
                if j.failure is not None:
                    raise j.failure
                payload = self.payloads.build(j)
                if stream_kind(j.stream).rows.batched:
                    batches.setdefault(j.stream, []).append(payload)
                    continue
                self.engine.add_stream_rows(j.stream, [payload])
                self.counters[j.stream].stored += 1
                self._stored_again()
            except Exception as exc:  # noqa: BLE001 - one bad message never stops recording
                self._not_stored(j.stream, exc, what=f"{j.stream} message at {j.t:.3f}")
        for stream, payloads in batches.items():
            try:
                self.engine.add_stream_rows(stream, payloads)
                self.counters[stream].stored += len(payloads)
                self._stored_again()
            except Exception as exc:  # noqa: BLE001
                self._not_stored(stream, exc, len(payloads),
                                 what=f"{len(payloads)} {stream} row(s)")

    def camera_view(self, job: Job) -> View | None:
        """What a camera keyframe covered (core/keyframe_payloads.py)."""
        return self.payloads.camera_view(job)

    def on_camera_info(self, msg: Any) -> None:
        """The driver's CameraInfo: its field of view for the views from now on."""
        self.payloads.on_camera_info(msg)

    @property
    def camera_hfov_deg(self) -> float:
        return self.payloads.camera_hfov_deg

    # ---- offline driving --------------------------------------------------------------------
    def _arrive(self, arrived_s: float | None) -> None:
        if arrived_s is None:
            return
        if self.manual_clock is None:
            raise ValueError("arrived_s needs a policy made with RecorderPolicy.offline")
        self.manual_clock.set(arrived_s)

    def on_tf(self, data: bytes | Iterable[Any], is_static: bool = False,
              arrived_s: float | None = None) -> None:
        """A /tf or /tf_static message (serialized bytes or its transforms); messages that
        waited for it are decided."""
        self._arrive(arrived_s)
        self.poses.on_tf(data, is_static)
        self._step()

    def on_odom(self, msg: Any, arrived_s: float | None = None) -> None:
        """An odometry message (pose history and the odom stream)."""
        self._arrive(arrived_s)
        self._waiting.append(self.receive_odom(msg))
        self._step()

    def on_message(self, stream: str, msg: Any, arrived_s: float | None = None,
                   kind: str = "raw") -> None:
        """A camera ("camera"; `kind` "raw" Image, "compressed" or "video", a decoded
        core.front_video.VideoPicture), lidar ("lidar") or registered stream's message;
        "odom" goes to `on_odom`."""
        if stream == "odom":
            self.on_odom(msg, arrived_s)
            return
        if stream not in self.streams:
            raise ValueError(f"unknown stream {stream!r} (one of {', '.join(self.streams)})")
        self._arrive(arrived_s)
        self._waiting.append(self.receive(stream, msg, kind if stream == "camera" else ""))
        self._step()

    def _step(self, final: bool = False) -> None:
        """Gate the waiting messages in arrival order as far as their poses are decided
        (`final`: all of them, TF will not come any more), storing the keyframes."""
        kept: list[Job] = []
        while self._waiting:
            job = self._waiting[0]
            if final:
                job.enqueued = -math.inf  # every wait has run out
            admitted = self.gate(job, wait=False)
            if admitted is None:
                break
            self._waiting.popleft()
            if admitted:
                kept.append(job)
        if self.on_kept is not None:
            if kept:
                self.on_kept(kept)
            return
        for i in range(0, len(kept), self.batch_size):  # as the node's worker batches
            self.store(kept[i:i + self.batch_size])

    def flush(self) -> None:
        """The end of the input: decide and store every waiting message (and say which
        streams have rows without a pose)."""
        self._step(final=True)
        for stream in self.streams:
            self.warn_unposed(stream)

    @property
    def waiting(self) -> int:
        """Messages waiting for their pose (offline driving)."""
        return len(self._waiting)
