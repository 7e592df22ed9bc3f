"""The recorder: camera, lidar and odometry in; keyframes with a world pose out to memory.

Three stages, each on its own thread, joined by bounded queues (full → the message is dropped
and counted):
1. subscription callbacks only stamp and enqueue;
2. the gate thread resolves each message's pose — TF world ← base exactly at its stamp, waiting
   up to `tf_wait_s` for a transform that arrives after the message, else odometry at the stamp,
   else none — and keeps a keyframe when that pose moved or turned enough, so the spacing of
   stored keyframes is the spacing of their stored poses, however late TF runs;
3. the worker decodes, describes, embeds and writes the keyframes.

The policy of each stage (stamps, poses, gates, storage) is core.recorder.RecorderPolicy,
which an offline importer drives too; this node adds subscriptions, queues, threads, the
topic watchdog and the stats topic.
"""

from __future__ import annotations

import functools
import json
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from memory_node.core.camera_info import camera_info_topic
from memory_node.core.engine import MemoryEngine
from memory_node.core.front_video import FRONT_VIDEO, FrontVideoReceiver
from memory_node.core.recorder import Job, RecorderPolicy
from memory_node.core.recorder_settings import with_robot_prefix
from memory_node.core.streams import camera_feed, stream_kinds, stream_topic_params
from memory_node.ros import params
from memory_node.ros.common import (
    MaskedLogging,
    PoseTracker,
    declare_engine_params,
    engine_config_from_params,
    node_now,
    pose_tracker_from_params,
    with_receipt,
)
from memory_node.ros.process import init_ros, print_help_if_asked, spin_nodes


def _type_name(msg_type: Any) -> str:
    """'sensor_msgs/msg/Image' for the class, as the ROS graph names types."""
    module = msg_type.__module__.split(".")
    return f"{module[0]}/{module[1]}/{msg_type.__name__}"


# The queue depth of a stream subscribed reliably (odometry: the pose fallback's history).
RELIABLE_DEPTH = 50


def message_class(type_name: str) -> Any:
    """The rclpy message class of 'sensor_msgs/msg/Range' (a registered stream's type), or
    ParameterError saying which package to install."""
    import importlib

    package, _, name = type_name.replace("/msg/", "/").partition("/")
    try:
        return getattr(importlib.import_module(f"{package}.msg"), name)
    except (ImportError, AttributeError):
        raise params.ParameterError(f"message type {type_name} is not importable: is its "
                                    "package installed and sourced?") from None


def front_video_type() -> Any:
    """unitree_go's Go2FrontVideoData class, or ParameterError saying how to get it."""
    try:
        from unitree_go.msg import Go2FrontVideoData
    except ImportError:
        raise params.ParameterError(
            "front_video_topic is set but unitree_go/msg/Go2FrontVideoData is not importable: "
            "source unitree_ros2's workspace, or build memory_node where setup.py generates "
            "it (MEMORY_NODE_UNITREE_GO=build)") from None
    return Go2FrontVideoData


def front_video_receiver(cfg: dict[str, Any], policy: RecorderPolicy,
                         warn: Any) -> FrontVideoReceiver | None:
    """The front-video decoder when `front_video_topic` is set, else None."""
    if not cfg[FRONT_VIDEO.topic_param]:
        return None
    return FrontVideoReceiver(cfg["front_video_resolution"], policy.count, warn)


@dataclass
class TopicWatch:
    """When a configured topic last delivered, and what was said about it."""

    topic: str
    type_name: str
    last: float = field(default_factory=time.monotonic)  # start counts as "heard"
    status: str = "recording"
    heard: bool = False
    others: tuple[str, ...] = ()  # topics of its type named in the last warning


class MemoryRecorder(MaskedLogging, Node):
    """`poses`: the process's TF listener when another node owns it (memory-node); by default
    the recorder listens to TF itself. Raises ParameterError for a parameter that cannot be
    used (before subscribing to anything)."""

    def __init__(self, node_name: str = "memory_recorder", *, engine: MemoryEngine | None = None,
                 poses: PoseTracker | None = None, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        cfg = params.declare(self, params.RECORDER_PARAMS)
        cfg.update(params.declare(self, params.POSE_PARAMS))
        # Registered (not built-in) stream kinds: each one's topic parameter (core/streams.py).
        cfg.update(params.declare(self, stream_topic_params()))
        cfg = with_robot_prefix(cfg)
        declare_engine_params(self)
        params.warn_unknown(self)
        self.settings = cfg
        self._own_engine = engine is None
        if engine is None:
            engine = MemoryEngine(engine_config_from_params(self),
                                  clock=lambda: node_now(self))
        self.engine = engine
        self.topic_timeout_s = cfg["topic_timeout_s"]
        self._pending: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, cfg["pending_size"]))
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, cfg["queue_size"]))
        cb = MutuallyExclusiveCallbackGroup()
        # TF in a group of its own: a burst of image callbacks must not hold up /tf. The
        # recorder feeds odometry to the tracker itself (it subscribes to it anyway).
        keep = (cfg["camera_frame"],) if cfg["camera_frame"] else ()
        self.poses = poses or pose_tracker_from_params(
            self, odom_topic=None, callback_group=MutuallyExclusiveCallbackGroup(),
            keep_frames=keep)
        self.policy = RecorderPolicy(cfg, engine, self.poses, clock=lambda: node_now(self),
                                     logger=self.get_logger())
        self.counters = self.policy.counters
        self.batch_size = self.policy.batch_size
        self.stamp_source = self.policy.stamp_source
        try:
            self.engine.mark_recording_clock(bool(self.get_parameter("use_sim_time").value))
        except Exception as exc:  # noqa: BLE001 - only compaction's clock depends on it
            self.get_logger().warning(f"could not mark the recording clock: {exc}")
        reliability = (ReliabilityPolicy.RELIABLE if cfg["sensor_reliability"] == "reliable"
                       else ReliabilityPolicy.BEST_EFFORT)
        sensor_qos = QoSProfile(depth=10, reliability=reliability)
        # stream: (topic, message class, callback, QoS)
        subscriptions: dict[str, tuple[str, Any, Any, QoSProfile | int]] = {}
        # The camera's source (core/streams.py's camera_feed): Image, CompressedImage or the
        # Go2's front video (unitree_ros2), decoded here on arrival.
        feed = camera_feed(cfg)
        self.front_video = front_video_receiver(cfg, self.policy, self.get_logger().warning)
        if self.front_video is not None:
            subscriptions["camera"] = (feed.topic, front_video_type(),
                                       with_receipt(self._on_front_video), sensor_qos)
        else:
            subscriptions["camera"] = (
                feed.topic, message_class(feed.message_type),
                with_receipt(lambda m, r: self._on_sensor("camera", m, r, feed.kind)),
                sensor_qos)
        # Every other stream as core/streams.py describes it (odometry also feeds the poses).
        for kind in stream_kinds():
            if kind.name == "camera":
                continue
            on_message = (self._on_odom if kind.name == "odom"
                          else functools.partial(self._on_sensor, kind.name))
            subscriptions[kind.name] = (
                cfg[kind.topic_param], message_class(kind.message_types[0]),
                with_receipt(on_message),
                sensor_qos if kind.qos == "sensor" else RELIABLE_DEPTH)
        self.watches: dict[str, TopicWatch | None] = {}
        for stream, (topic, msg_type, callback, qos) in subscriptions.items():
            if not topic:  # an empty topic turns the stream off
                self.watches[stream] = None
                continue
            self.watches[stream] = TopicWatch(topic, _type_name(msg_type))
            self.create_subscription(msg_type, topic, callback, qos, callback_group=cb)
        camera_topic = subscriptions["camera"][0]
        if camera_topic and self.front_video is None:
            # The driver's calibration, where it publishes one: the views' field of view.
            from sensor_msgs.msg import CameraInfo

            self.create_subscription(CameraInfo, camera_info_topic(camera_topic),
                                     self.policy.on_camera_info, sensor_qos,
                                     callback_group=cb)
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
        self.policy.count(stream, counter, n)

    # ---- callbacks (cheap) -------------------------------------------------------------------
    # Each takes when the middleware received the message (system-clock seconds, or None): a
    # message with no usable stamp is stored at its arrival, not when a busy executor got to it.
    def _on_odom(self, msg: Any, received_s: float | None = None) -> None:
        self._enqueue(self.policy.receive_odom(msg, self._arrival(received_s)))

    def _on_sensor(self, stream: str, msg: Any, received_s: float | None = None,
                   kind: str = "") -> None:
        self._enqueue(self.policy.receive(stream, msg, kind,
                                          arrived=self._arrival(received_s)))

    def _on_front_video(self, msg: Any, received_s: float | None = None) -> None:
        """Every access unit is decoded here, in arrival order (the decoder needs each one);
        what becomes a job is a picture not yet converted to pixels, stamped (the video
        carries no stamps) with its access unit's receipt time where the middleware gives one,
        so the decoding adds nothing to it."""
        assert self.front_video is not None
        picture = self.front_video.picture(msg)
        if picture is None:
            watch = self.watches.get("camera")
            if watch is not None:
                watch.last, watch.heard = time.monotonic(), True
            return
        self._on_sensor("camera", picture, received_s, FRONT_VIDEO.kind)

    def _arrival(self, received_s: float | None) -> float | None:
        """The node clock when the middleware received a message (None: take now). On the
        system clock that is the receipt time itself. Under simulated time it is not known:
        /clock reaches the node as late as the message does, so the callback's time stays."""
        return None if getattr(self.get_clock(), "ros_time_is_active", False) else received_s

    def _enqueue(self, job: Job) -> None:
        watch = self.watches.get(job.stream)
        if watch is not None:
            watch.last, watch.heard = time.monotonic(), True
        try:
            self._pending.put_nowait(job)
        except queue.Full:
            self._count(job.stream, "dropped")

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
                if self.policy.gate(job):
                    try:
                        self._queue.put_nowait(job)
                    except queue.Full:
                        self.policy.unkeep(job)
            except Exception as exc:  # noqa: BLE001 - one bad message never stops recording
                self._count(job.stream, "failed")
                self.get_logger().warning(f"{job.stream} message at {job.t:.3f} not gated: {exc}")

    # ---- worker -----------------------------------------------------------------------------
    def _work(self) -> None:
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
            self.policy.store(jobs)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for stream, c in self.counters.items():
            watch = self.watches.get(stream)
            out[stream] = c.__dict__.copy() | (
                {"status": watch.status, "topic": watch.topic} if watch
                else {"status": "not_configured", "topic": None})
        if self.front_video is not None:
            out["camera"] |= self.front_video.stats()
        poses = self.poses
        return out | {"queue": self._queue.qsize(), "pending": self._pending.qsize(),
                      # kept rows not stored, by reason: disk_full, disk_reserve, error
                      "not_stored": self.policy.not_stored.snapshot(),
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
        for stream in self.counters:
            self.policy.warn_unposed(stream)
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
