"""The recorder: camera, lidar and odometry in; keyframes with a world pose out to memory.

Three stages, each on its own thread, joined by bounded queues (full → the message is dropped
and counted):
1. subscription callbacks only stamp and enqueue;
2. the gate thread resolves each message's pose — TF world ← base exactly at its stamp, waiting
   up to `tf_wait_s` for a transform that arrives after the message, else odometry at the stamp,
   else none — and keeps a keyframe when that pose moved or turned enough, so the spacing of
   stored keyframes is the spacing of their stored poses, however late TF runs;
3. the worker decodes, describes, embeds and writes the keyframes.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from memory_node.core.engine import CameraFrame, MemoryEngine
from memory_node.core.recording import KeyframeGate, PoseResolver, Timeline
from memory_node.core.types import Pose, View
from memory_node.core.views import forward_yaw, is_optical, make_view, mounted, view_range
from memory_node.ros import params
from memory_node.ros.common import (
    PoseTracker,
    declare_engine_params,
    engine_config_from_params,
    node_now,
    pose_tracker_from_params,
)
from memory_node.ros.geometry import stamp_to_seconds
from memory_node.ros.process import init_ros, print_help_if_asked, spin_nodes

STREAMS = ("camera", "lidar", "odom")


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

    from memory_node.ros.image_codec import image_to_bgr

    try:
        if kind == "compressed":
            grey = cv2.imdecode(np.frombuffer(bytes(msg.data), np.uint8),
                                cv2.IMREAD_REDUCED_GRAYSCALE_4)
            if grey is None:
                return None
        else:
            grey = cv2.cvtColor(image_to_bgr(msg), cv2.COLOR_BGR2GRAY)
        return cv2.resize(grey, (32, 24), interpolation=cv2.INTER_AREA).astype(np.float32) / 255
    except (ValueError, cv2.error):
        return None  # the worker reports undecodable frames


@dataclass
class Job:
    stream: str
    t: float
    msg: Any
    kind: str = ""
    enqueued: float = field(default_factory=time.monotonic)
    pose: Pose | None = None
    epoch: int = 0  # time jumps back seen before the message arrived
    lookup_t: float = 0.0  # the stamp TF and odometry are looked up at (see _stamp)


def _type_name(msg_type: Any) -> str:
    """'sensor_msgs/msg/Image' for the class, as the ROS graph names types."""
    module = msg_type.__module__.split(".")
    return f"{module[0]}/{module[1]}/{msg_type.__name__}"


@dataclass
class TopicWatch:
    """When a configured topic last delivered, and what was said about it."""

    topic: str
    type_name: str
    last: float = field(default_factory=time.monotonic)  # start counts as "heard"
    status: str = "recording"
    heard: bool = False
    others: tuple[str, ...] = ()  # topics of its type named in the last warning


class MemoryRecorder(Node):
    """`poses`: the process's TF listener when another node owns it (memory-node); by default
    the recorder listens to TF itself. Raises ParameterError for a parameter that cannot be
    used (before subscribing to anything)."""

    def __init__(self, node_name: str = "memory_recorder", *, engine: MemoryEngine | None = None,
                 poses: PoseTracker | None = None, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        cfg = params.declare(self, params.RECORDER_PARAMS)
        cfg.update(params.declare(self, params.POSE_PARAMS))
        declare_engine_params(self)
        params.warn_unknown(self)
        self.settings = cfg
        self.counters = {s: StreamCounters() for s in STREAMS}
        self.gates = {s: KeyframeGate(cfg["min_distance"], cfg["min_yaw"], cfg["max_interval"])
                      for s in STREAMS}
        self.gates["camera"].min_view_change = cfg["min_view_change"]
        self.gates["camera"].min_view_interval = cfg["min_view_interval"]
        self._own_engine = engine is None
        if engine is None:
            engine = MemoryEngine(engine_config_from_params(self),
                                  clock=lambda: node_now(self))
        self.engine = engine
        self.voxel = cfg["lidar_voxel"]
        self.batch_size = max(1, cfg["batch_size"])
        self.tf_wait_s = cfg["tf_wait_s"]
        self.stamp_source = cfg["stamp_source"]
        self.stamp_max_offset_s = cfg["stamp_max_offset_s"]
        self.topic_timeout_s = cfg["topic_timeout_s"]
        self._pending: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, cfg["pending_size"]))
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, cfg["queue_size"]))
        self._lock = threading.Lock()
        self.timeline = Timeline()  # epochs of the node clock: a looping bag starts a new one
        self._unstamped: set[str] = set()  # streams whose driver leaves header.stamp zero
        self._restamped: set[str] = set()  # streams stored at receipt time (stamp_source)
        cb = MutuallyExclusiveCallbackGroup()
        # TF in a group of its own: a burst of image callbacks must not hold up /tf. The
        # recorder feeds odometry to the tracker itself (it subscribes to it anyway).
        keep = (cfg["camera_frame"],) if cfg["camera_frame"] else ()
        self.poses = poses or pose_tracker_from_params(
            self, odom_topic=None, callback_group=MutuallyExclusiveCallbackGroup(),
            keep_frames=keep)
        # The newest lidar keyframe in world coordinates (t, xy): the range of camera views.
        self._last_scan: tuple[float, np.ndarray] | None = None
        try:
            self.engine.mark_recording_clock(bool(self.get_parameter("use_sim_time").value))
        except Exception as exc:  # noqa: BLE001 - only compaction's clock depends on it
            self.get_logger().warning(f"could not mark the recording clock: {exc}")
        self.resolver = PoseResolver(self.poses, self.tf_wait_s)
        reliability = (ReliabilityPolicy.RELIABLE if cfg["sensor_reliability"] == "reliable"
                       else ReliabilityPolicy.BEST_EFFORT)
        sensor_qos = QoSProfile(depth=10, reliability=reliability)
        from nav_msgs.msg import Odometry
        from sensor_msgs.msg import CompressedImage, Image, PointCloud2

        compressed = cfg["use_compressed"]
        # stream: (topic, message class, callback, QoS)
        subscriptions: dict[str, tuple[str, Any, Any, QoSProfile | int]] = {
            "camera": (cfg["compressed_topic"] if compressed else cfg["camera_topic"],
                       CompressedImage if compressed else Image,
                       lambda m: self._on_sensor("camera", m, "compressed" if compressed
                                                 else "raw"), sensor_qos),
            "lidar": (cfg["lidar_topic"], PointCloud2, lambda m: self._on_sensor("lidar", m),
                      sensor_qos),
            "odom": (cfg["odom_topic"], Odometry, self._on_odom, 50),
        }
        self.watches: dict[str, TopicWatch | None] = {}
        for stream, (topic, msg_type, callback, qos) in subscriptions.items():
            if not topic:  # an empty topic turns the stream off
                self.watches[stream] = None
                continue
            self.watches[stream] = TopicWatch(topic, _type_name(msg_type))
            self.create_subscription(msg_type, topic, callback, qos, callback_group=cb)
        self._tf_watch = TopicWatch("/tf", "tf2_msgs/msg/TFMessage")
        self.stats_pub = self.create_publisher(String, "/memory/recorder_stats", 10)
        self.create_timer(cfg["stats_period_s"], self._publish_stats)
        self.create_timer(min(1.0, self.topic_timeout_s / 2), self._watch_topics)
        self._stop = threading.Event()
        self._gate_thread = threading.Thread(target=self._gate_loop, name="memory-recorder-gate",
                                             daemon=True)
        self._worker = threading.Thread(target=self._work, name="memory-recorder-worker",
                                        daemon=True)
        self._gate_thread.start()
        self._worker.start()
        topics = ", ".join(f"{s} {w.topic}" for s, w in self.watches.items() if w) or "nothing"
        self.get_logger().info(f"recording {topics} into {engine.config.root} "
                               f"(stamps: {self.stamp_source})")

    def _count(self, stream: str, counter: str, n: int = 1) -> None:
        """Counters more than one thread adds to (drops, failures) change under the lock."""
        with self._lock:
            c = self.counters[stream]
            setattr(c, counter, getattr(c, counter) + n)

    # ---- callbacks (cheap) -------------------------------------------------------------------
    def _check_time(self) -> float:
        """Reset the gates when the node clock jumps back (a looping bag). The node clock, not
        message stamps: messages of different topics may arrive out of order."""
        now = node_now(self)
        if self.timeline.observe(now) and self.timeline.jumped_from is not None:
            self.get_logger().warning(
                f"time jumped back by {self.timeline.jumped_from - now:.1f} s: keyframe gates "
                "reset")
            for gate in self.gates.values():
                gate.reset()
        return now

    def _stamp(self, stream: str, msg: Any) -> tuple[float, float]:
        """(the time to store, the time to look TF and odometry up at).

        Stored: the header stamp (`stamp_source: header`), the node clock on arrival
        (`receipt`), or by default the header stamp unless it is further than
        `stamp_max_offset_s` from the node clock — a simulator's header time beside a wall
        /clock, a robot with a wrong RTC — then the arrival time, said once per stream, so
        observations, notes and "seconds ago" share one clock. Poses are looked up on the
        timeline TF runs on, which is the headers' as long as TF's stamps are near them.
        A driver that leaves the stamp zero gets the arrival time for both (said once).
        """
        header = stamp_to_seconds(msg.header.stamp)
        now = node_now(self)
        if header <= 0.0:
            if stream not in self._unstamped:
                self._unstamped.add(stream)
                self.get_logger().warning(f"{stream} messages carry no stamp (zero): stamped "
                                          "with the node clock on arrival")
            return now, now
        lookup = header
        latest_tf = self.poses.latest_tf_stamp
        if latest_tf is not None and abs(header - latest_tf) > self.stamp_max_offset_s:
            lookup = now  # TF runs on the node clock, these headers on another
        if self.stamp_source == "header":
            return header, lookup
        offset = header - now
        if self.stamp_source == "auto" and abs(offset) <= self.stamp_max_offset_s:
            return header, lookup
        if stream not in self._restamped:
            self._restamped.add(stream)
            why = ("stamp_source is receipt" if self.stamp_source == "receipt" else
                   f"its header stamps are {offset:+.1f} s from the node clock (more than "
                   f"stamp_max_offset_s = {self.stamp_max_offset_s:g})")
            self.get_logger().warning(
                f"{stream}: storing arrival times on the node clock, since {why}; notes and "
                "'seconds ago' use that clock too (set stamp_source: header to keep them)")
        return now, lookup

    def _on_odom(self, msg: Any) -> None:
        t, lookup = self._stamp("odom", msg)
        self.poses.on_odom(msg, lookup)
        self._on_sensor("odom", msg, stamps=(t, lookup))

    def _on_sensor(self, stream: str, msg: Any, kind: str = "",
                   stamps: tuple[float, float] | None = None) -> None:
        c = self.counters[stream]
        c.received += 1
        watch = self.watches.get(stream)
        if watch is not None:
            watch.last, watch.heard = time.monotonic(), True
        t, lookup = stamps or self._stamp(stream, msg)
        with self._lock:
            now = self._check_time()
            epoch = self.timeline.epoch_of(t, now)
        try:
            self._pending.put_nowait(Job(stream, t, msg, kind, epoch=epoch, lookup_t=lookup))
        except queue.Full:
            self._count(stream, "dropped")

    # ---- watchdog ---------------------------------------------------------------------------
    def _watch_topics(self) -> None:
        """Say when a configured topic stays silent (and what else of its type exists), and
        when TF never links the world frame to the base frame; the state goes out in the
        stats and the streams answer."""
        now = time.monotonic()
        changed = False
        for stream, watch in self.watches.items():
            if watch is None:
                continue
            if now - watch.last <= self.topic_timeout_s:
                status = "recording" if watch.heard else watch.status
            elif self.count_publishers(watch.topic) == 0:
                status = "no_publisher"
            else:
                status = "silent"
            others = () if status == "recording" else tuple(sorted(
                name for name, types in self.get_topic_names_and_types()
                if watch.type_name in types and name != watch.topic))
            if status == watch.status and others == watch.others:
                continue  # said already (a new topic of its type is said again: a late driver)
            changed = True
            watch.others = others
            if status == "recording":
                self.get_logger().info(f"{stream}: receiving {watch.topic} again")
            else:
                kind = watch.type_name.rsplit("/", 1)[-1]
                self.get_logger().warning(
                    f"no messages on {watch.topic} for {self.topic_timeout_s:g} s "
                    f"({'no publisher' if status == 'no_publisher' else 'publisher silent'}); "
                    f"{kind} topics: {', '.join(others) or 'none'}")
            watch.status = status
        tf_status = self._tf_status(now)
        if tf_status != self._tf_watch.status:
            changed = True
            poses = self.poses
            if tf_status == "recording":
                self.get_logger().info(f"TF now links {poses.world_frame} and {poses.base_frame}")
            else:
                frames = poses.buffer.frames()
                self.get_logger().warning(
                    f"no transform {poses.world_frame} <- {poses.base_frame} for "
                    f"{self.topic_timeout_s:g} s (frames on TF: "
                    f"{', '.join(f'{p}->{c}' for c, p in sorted(frames.items())) or 'none'}); "
                    "poses fall back to odometry")
            self._tf_watch.status = tf_status
        if changed:
            self._publish_stats()

    def _tf_status(self, now: float) -> str:
        if self.poses.has_world_pose():
            self._tf_watch.last, self._tf_watch.heard = now, True
            return "recording"
        if now - self._tf_watch.last <= self.topic_timeout_s:
            return self._tf_watch.status
        return "no_publisher" if self.poses.last_tf_wall is None else "silent"

    def _jobs(self, q: queue.Queue[Job | None]) -> Iterator[Job]:
        """Jobs from a stage's queue until close() (the stop flag, or None in the queue)."""
        while not self._stop.is_set():
            try:
                job = q.get(timeout=0.2)
            except queue.Empty:
                continue
            if job is None:
                return
            yield job

    # ---- gate -------------------------------------------------------------------------------
    def _gate_loop(self) -> None:
        for job in self._jobs(self._pending):
            try:
                self._gate(job)
            except Exception as exc:  # noqa: BLE001 - one bad message never stops recording
                self._count(job.stream, "failed")
                self.get_logger().warning(f"{job.stream} message at {job.t:.3f} not gated: {exc}")

    def _gate(self, job: Job) -> None:
        c = self.counters[job.stream]
        gate = self.gates[job.stream]
        job.pose = self._resolve_pose(job)
        if self._before_time_jump(job):
            # TF and odometry from before the jump are gone (or replaced by the new timeline's):
            # no pose can be told for it any more, and a guessed one would be wrong.
            self._count(job.stream, "dropped")
            self.get_logger().debug(f"{job.stream} message at {job.t:.3f} dropped: it arrived "
                                    "before the clock jumped back")
            return
        if job.pose is None:
            c.no_pose += 1
        view = (view_thumbnail(job.msg, job.kind)
                if job.stream == "camera" and gate.min_view_change else None)
        with self._lock:
            admitted = gate.admit(job.t, job.pose, view)
        if not admitted:
            c.skipped += 1
            return
        try:
            self._queue.put_nowait(job)
            c.kept += 1
        except queue.Full:
            self._count(job.stream, "dropped")

    def _resolve_pose(self, job: Job) -> Pose | None:
        """The pose to store (core.recording.PoseResolver): TF exactly at the lookup stamp,
        waiting briefly for a late transform; else TF within the tolerance; else odometry at
        the stamp; else None."""
        pose, timed_out = self.resolver.resolve(job.lookup_t, job.enqueued,
                                                lambda: self._before_time_jump(job))
        if timed_out:
            self._count(job.stream, "tf_timeouts")
        return pose

    def _before_time_jump(self, job: Job) -> bool:
        return job.epoch != self.timeline.epoch

    # ---- worker -----------------------------------------------------------------------------
    def _work(self) -> None:
        from memory_node.ros.image_codec import compressed_to_bgr, image_to_bgr
        from memory_node.ros.pointcloud import read_xyz, voxel_downsample

        for job in self._jobs(self._queue):
            jobs = [job]
            if job.stream == "camera":  # batch frames already waiting: one embed call
                while len(jobs) < self.batch_size:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._stop.set()
                        break
                    jobs.append(nxt)
            frames: list[CameraFrame] = []
            for j in jobs:
                try:
                    if j.stream == "camera":
                        img = (compressed_to_bgr(j.msg) if j.kind == "compressed"
                               else image_to_bgr(j.msg))
                        frames.append(CameraFrame(j.t, j.pose, img, view=self._camera_view(j)))
                    elif j.stream == "lidar":
                        pts = voxel_downsample(read_xyz(j.msg), self.voxel)
                        self._keep_scan(j, pts)
                        self.engine.add_lidar_scan(j.t, j.pose, pts)
                        self.counters["lidar"].stored += 1
                    else:
                        v = j.msg.twist.twist.linear
                        speed = round(math.hypot(v.x, v.y), 3)
                        self.engine.add_observation("odom", j.t, j.pose, {"speed": speed})
                        self.counters["odom"].stored += 1
                except Exception as exc:  # noqa: BLE001 - one bad message never stops recording
                    self._count(j.stream, "failed")
                    self.get_logger().warning(f"{j.stream} message at {j.t:.3f} not stored: {exc}")
            if frames:
                try:
                    self.engine.add_camera_frames(frames)
                    self.counters["camera"].stored += len(frames)
                except Exception as exc:  # noqa: BLE001
                    self._count("camera", "failed", len(frames))
                    self.get_logger().warning(f"{len(frames)} camera frame(s) not stored: {exc}")

    def _lookup(self, frame: str, stamp: float) -> Any:
        from memory_node.ros.tf_buffer import TransformError

        try:
            return self.poses.buffer.lookup(self.poses.world_frame, frame, stamp,
                                            self.poses.tolerance_s)
        except TransformError:
            return None

    def _keep_scan(self, job: Job, pts: np.ndarray) -> None:
        """The lidar keyframe's points in the world (above the floor), for view ranges."""
        frame = getattr(job.msg.header, "frame_id", "")
        tr = self._lookup(frame, job.lookup_t) if frame else None
        if tr is None or len(pts) == 0:
            return
        world = tr.apply(np.asarray(pts, np.float64))
        self._last_scan = (job.t, world[world[:, 2] > 0.05][:, :2])

    def _camera_view(self, job: Job) -> View | None:
        """What the keyframe covered: camera pose from TF (world <- camera frame) at the
        stamp, else the base pose with the configured mount; range from a lidar keyframe
        close in time, else view_max_range. None without any pose."""
        cfg = self.settings
        if cfg["camera_hfov_deg"] <= 0:
            return None
        frame = cfg["camera_frame"] or getattr(job.msg.header, "frame_id", "")
        tr = self._lookup(frame, job.lookup_t) if frame else None
        if tr is not None:
            x, y, yaw = tr.x, tr.y, forward_yaw(tr.as_matrix()[:3, :3], is_optical(frame))
        elif job.pose is not None:
            x, y, yaw = mounted(job.pose, (cfg["camera_mount_x"], cfg["camera_mount_y"],
                                           cfg["camera_mount_yaw"]))
        else:
            return None
        scan = self._last_scan
        pts = (scan[1] if scan is not None
               and abs(scan[0] - job.t) <= cfg["view_lidar_max_age_s"] else None)
        rng = view_range(pts, x, y, yaw, math.radians(cfg["camera_hfov_deg"]),
                         cfg["view_max_range"])
        return make_view(x, y, yaw, cfg["camera_hfov_deg"], rng)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for stream, c in self.counters.items():
            watch = self.watches.get(stream)
            out[stream] = c.__dict__.copy() | (
                {"status": watch.status, "topic": watch.topic} if watch
                else {"status": "not_configured", "topic": None})
        poses = self.poses
        return out | {"queue": self._queue.qsize(), "pending": self._pending.qsize(),
                      "tf": {"status": self._tf_watch.status, "topic": "/tf",
                             "world_frame": poses.world_frame, "base_frame": poses.base_frame,
                             **poses.tf_stats()}}

    def _publish_stats(self) -> None:
        self.stats_pub.publish(String(data=json.dumps(self.stats())))
        c = self.counters
        n = {s: f"{c[s].kept}/{c[s].skipped}/{c[s].dropped}" for s in ("camera", "lidar", "odom")}
        self.get_logger().debug(f"camera kept/skipped/dropped {n['camera']}, lidar {n['lidar']},"
                                f" odom {n['odom']}")

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until every received message is gated and every keyframe stored (used at
        shutdown and by tests)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(c.received <= c.skipped + c.dropped + c.stored + c.failed
                   and c.kept <= c.stored + c.failed for c in self.counters.values()):
                return True
            time.sleep(0.05)
        return False

    def close(self, drain_s: float = 2.0) -> None:
        """Store what is already in hand (for at most `drain_s`), stop the threads and log
        the counters. Bounded, so one SIGINT ends the process within seconds even right after
        a heavy replay; what did not make it is counted as dropped."""
        if not self.drain(drain_s):
            self.get_logger().warning(f"stopping with {self._pending.qsize()} message(s) and "
                                      f"{self._queue.qsize()} keyframe(s) not stored")
        self._stop.set()
        for q in (self._pending, self._queue):
            try:
                q.put_nowait(None)
            except queue.Full:
                pass
        self._gate_thread.join(timeout=2.0)
        self._worker.join(timeout=2.0)
        self.get_logger().info("recorder stopped: " + json.dumps(self.stats()))
        if self._own_engine:
            self.engine.close()


RECORDER_USAGE = """usage: memory-recorder [--help]
                       [--ros-args -p NAME:=VALUE ... --params-file FILE]

Records camera, lidar and odometry keyframes with TF world poses into memory_dir; a
memory-server in another process answers queries on the same directory.

  -p memory_dir:=DIR          the store (default $AGENT_MEMORY_DIR, else ./agent_memory)
  -p lidar_topic:=/points     any parameter of config/memory.yaml's memory_recorder section
  -p use_sim_time:=true       use /clock (a bag replay)
"""


def main(argv: list[str] | None = None) -> int:
    """`memory-recorder`: the recorder alone, writing to `memory_dir` (the server, in another
    process, picks its rows up through SQLite)."""
    argv = list(sys.argv if argv is None else argv)
    if print_help_if_asked(argv, RECORDER_USAGE):
        return 0
    stop = init_ros("memory-recorder", argv, nodes=["memory_recorder"])
    try:
        node = MemoryRecorder()
    except params.ParameterError as exc:
        print(f"memory-recorder: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    except Exception as exc:  # noqa: BLE001
        print(f"memory-recorder: could not start: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 1
    # One thread for the callbacks: they are cheap (stamp, gate, enqueue) and the work runs on
    # the worker; a multi-threaded executor spent most of its time in its own bookkeeping.
    from rclpy.executors import SingleThreadedExecutor

    spin_nodes([node], stop, SingleThreadedExecutor())
    return 0


if __name__ == "__main__":
    sys.exit(main())
