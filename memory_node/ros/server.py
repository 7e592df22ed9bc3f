"""The query server: a lifecycle node serving /memory/search|save|compact|streams.

configure builds the engine (store, embedder, index) from parameters — a failure leaves the
node unconfigured with one log line saying why; configuring again with the same parameters
reuses the engine, with different ones it is refused (shut the node down to switch stores).
activate opens the services; before that they answer `not_active`. Compaction runs in its own
callback group so it never blocks searches.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.timer import Timer
from std_msgs.msg import String

from memory_node.core.config import ConfigError, MemoryConfig
from memory_node.core.contract import ErrorAnswer, ResultItem, SearchAnswer, StreamsAnswer
from memory_node.core.engine import MemoryEngine, dumps
from memory_node.core.errors import Unavailable
from memory_node.ros import params
from memory_node.ros.common import (
    MaskedLogging,
    PoseTracker,
    declare_engine_params,
    engine_config_from_params,
    node_now,
    pose_tracker_from_params,
)
from memory_node.ros.delivery import resend_until_delivered
from memory_node.ros.process import init_ros, print_help_if_asked, spin_nodes
from memory_node.ros.services import MEMORY_SERVICES, SERVICES

SERVER_USAGE = """usage: memory-server [--help] [--ros-args -p NAME:=VALUE ... --params-file FILE]

The query server alone (a lifecycle node): /memory/search, /memory/save, /memory/compact and
/memory/streams over memory_dir.

  -p memory_dir:=DIR       the store (default $AGENT_MEMORY_DIR, else ./agent_memory)
  -p autostart:=false      stay unconfigured; drive it with lifecycle transitions
  -p use_sim_time:=true    use /clock (a bag replay) for every time it reads
"""

# A recorder publishes its stats every few seconds (and at once when a topic's state
# changes); older than this, nothing is said about recording.
RECORDER_STATS_MAX_AGE_S = 30.0
# A request slower than this is logged: clients give up after a few seconds.
SLOW_REQUEST_S = 5.0

A = TypeVar("A")  # an answer model

class MemoryServer(MaskedLogging, LifecycleNode):
    """`poses`: the process's TF listener when another node owns it (memory-node); by default
    the server listens to TF itself. `advertise=False` leaves the services to `advertise()`,
    so a process can check every node's parameters before any service appears. Raises
    ParameterError for a parameter that cannot be used."""

    def __init__(self, node_name: str = "memory_server", *, engine_factory: Callable | None = None,
                 poses: PoseTracker | None = None, advertise: bool = True, **kwargs: Any):
        super().__init__(node_name, **kwargs)
        declare_engine_params(self)
        self.settings = params.declare(self, params.SERVER_PARAMS)
        self.settings.update(params.declare(self, params.POSE_PARAMS))
        params.warn_unknown(self)
        self.engine: MemoryEngine | None = None
        self._engine_identity: dict | None = None
        self._engine_factory = engine_factory or MemoryEngine
        self._active = False
        # The primary lifecycle state, kept by the transition callbacks below: rclpy has no
        # public getter for it (Humble to Kilted), only the lifecycle services.
        self._lifecycle_state = "unconfigured"
        self._lock = threading.Lock()
        self._admission = threading.Lock()
        self._in_flight = 0
        self.refused = 0  # requests answered `unavailable` because too many were waiting
        self._queries = ReentrantCallbackGroup()
        self._compaction = MutuallyExclusiveCallbackGroup()
        self.poses = poses or pose_tracker_from_params(
            self, callback_group=MutuallyExclusiveCallbackGroup())
        self._persist_timer: Timer | None = None
        self._view: Any = None  # the memory view's server (view_port), while active
        self._memory_services: list = []
        from visualization_msgs.msg import MarkerArray

        self.markers = self.create_publisher(MarkerArray, "/memory/markers", 10)
        # The recorder's state (in this process or another): which sensor streams are
        # recording, silent, or have no publisher; added to the streams answer.
        self._recorder_stats: tuple[float, dict] | None = None
        self.create_subscription(String, "/memory/recorder_stats", self._on_recorder_stats, 10,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        if advertise:
            self.advertise()

    def advertise(self) -> None:
        """Open the services; before activation they answer `not_active` rather than
        nothing. Deep request queues: a burst of requests waits in the middleware rather than
        being overwritten there (the default depth lost most of a burst of saves:
        bench/results/NOTES.md, finding 19)."""
        if self._memory_services:
            return
        qos = QoSProfile(depth=int(self.settings["service_queue_depth"]),
                         reliability=ReliabilityPolicy.RELIABLE,
                         history=HistoryPolicy.KEEP_LAST)
        handlers = {"search": (self._on_search, self._queries),
                    "save": (self._on_save, self._queries),
                    "streams": (self._on_streams, self._queries),
                    "compact": (self._on_compact, self._compaction)}
        for verb, (handler, group) in handlers.items():
            service = MEMORY_SERVICES[verb]
            self._memory_services.append(self.create_service(
                service.srv_type, service.path(), handler, qos_profile=qos,
                callback_group=group))
        # The lifecycle services too: a manager's first change_state meets the same race.
        for srv in self.services:
            resend_until_delivered(srv, self.get_logger(),
                                   float(self.settings["answer_resend_s"]))

    def executor_threads(self) -> int:
        """Threads for the executor: one per request allowed to wait, plus spare ones that
        take and refuse what is beyond that bound (so every request gets an answer)."""
        return min(256, int(self.settings["max_pending_requests"]) + 4)

    def _open_engine(self, config: MemoryConfig) -> Any:
        """The local engine over memory_dir, or (backend fleet) the same contract served from
        the fleet's PostgreSQL store."""
        kwargs: dict[str, Any] = {"clock": self.engine_clock, "pose_provider": self.current_pose}
        if self.settings["backend"] != "fleet":
            return self._engine_factory(config, **kwargs)
        from memory_node.fleet.engine import open_engine

        p = self.settings
        return open_engine(config, fleet_url=p["fleet_url"] or None,
                           robot_id=p["robot_id"] or None, map_id=p["map_id"] or None, **kwargs)

    def current_pose(self) -> Any:
        """The listener's newest pose, aged on this node's clock: the clock the engine stamps
        notes with (under simulated time the listener's own clock can trail it)."""
        now = node_now(self)
        return self.poses.current_pose(now if now > 0.0 else None)

    def engine_clock(self) -> float:
        """The node clock for the engine. Under use_sim_time it reads 0 until the first
        /clock: wait `clock_wait_s` for one, then refuse rather than stamp a note 1970."""
        now = node_now(self)
        if now > 0.0:
            return now
        deadline = time.monotonic() + float(self.settings["clock_wait_s"])
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now = node_now(self)
            if now > 0.0:
                return now
        raise Unavailable("no /clock yet: use_sim_time is on and nothing publishes /clock "
                          "(start the replay or simulator, or run without --use-sim-time)")

    # ---- lifecycle ----------------------------------------------------------------------
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        try:
            config = engine_config_from_params(self)
        except (ConfigError, params.ParameterError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        result = self.configure_engine(config)
        if result == TransitionCallbackReturn.SUCCESS:
            self._lifecycle_state = "inactive"
        return result

    def configure_engine(self, config: MemoryConfig) -> TransitionCallbackReturn:
        with self._lock:
            if self.engine is not None:
                if config.identity() == self._engine_identity:
                    self.get_logger().info("configure: same parameters, engine kept (no-op)")
                    return TransitionCallbackReturn.SUCCESS
                running = self._engine_identity or {}
                changed = sorted(k for k, v in config.identity().items() if running.get(k) != v)
                self.get_logger().error(
                    "configure refused: parameters differ from the running engine's "
                    f"({', '.join(changed)}); shut the node down to switch")
                return TransitionCallbackReturn.FAILURE
            try:
                self.engine = self._open_engine(config)
            except Exception as exc:  # noqa: BLE001 - any failure means: not configured
                self.get_logger().error(f"configure failed: {type(exc).__name__}: {exc}")
                return TransitionCallbackReturn.FAILURE
            self._engine_identity = config.identity()
        self.get_logger().info(f"configured: {self.engine.serves}")
        return TransitionCallbackReturn.SUCCESS

    @property
    def lifecycle_state(self) -> str:
        """The node's primary lifecycle state: "unconfigured", "inactive", "active" or
        "finalized"."""
        return self._lifecycle_state

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self._active = True
        self._lifecycle_state = "active"
        if self._persist_timer is None and self.engine is not None:
            period = max(5.0, self.engine.config.index_persist_interval_s / 4)
            self._persist_timer = self.create_timer(period, self._maintain,
                                                    callback_group=self._compaction)
        self.get_logger().info("active: " + ", ".join(SERVICES.values()))
        self.start_view()
        return TransitionCallbackReturn.SUCCESS

    def start_view(self) -> None:
        """The memory view on 127.0.0.1:view_port over this node's engine (0: none). A port
        that cannot be had is logged; the services stay up."""
        port = int(self.settings["view_port"])
        if port <= 0 or self._view is not None or self.engine is None:
            return
        from memory_node.agent.client import EngineClient
        from memory_node.view.server import ViewBackend, ViewServer
        from memory_node.view.store_reader import StoreReader

        local = self.settings["backend"] != "fleet"
        backend = ViewBackend(EngineClient(self.engine),
                              StoreReader(self.engine.config.root) if local else None,
                              where=self.engine.serves)
        try:
            self._view = ViewServer(backend, "127.0.0.1", port).start()
        except (OSError, TimeoutError) as exc:
            self.get_logger().error(f"memory view not served: {exc}")
            return
        self.get_logger().info(f"memory view on {self._view.url}")

    def stop_view(self) -> None:
        if self._view is not None:
            self._view.stop()
            self._view = None

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        self._active = False
        self._lifecycle_state = "inactive"
        self.stop_view()
        self.get_logger().info("inactive: services answer not_active")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        # The engine stays open so a later configure with the same parameters is a no-op.
        self._active = False
        self._lifecycle_state = "unconfigured"
        self.stop_view()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self._active = False
        self._lifecycle_state = "finalized"
        self.stop_view()
        self.close_engine()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: State) -> TransitionCallbackReturn:
        """A transition callback raised: rclpy moves the node to unconfigured (finalized if
        this fails), and the services stop answering."""
        self._active = False
        self.stop_view()
        result = super().on_error(state)
        self._lifecycle_state = ("unconfigured" if result == TransitionCallbackReturn.SUCCESS
                                 else "finalized")
        return result

    def close_engine(self) -> None:
        with self._lock:
            if self.engine is not None:
                persisted = self.engine.close()
                fleet = self.settings["backend"] == "fleet"  # a connection; no index cache
                self.get_logger().info(
                    "fleet store connection closed" if fleet else
                    "memory closed (index persisted)" if persisted else
                    "memory closed (index cache not written: the next start catches up "
                    "from memory.db)")
            self.engine = None

    def _maintain(self) -> None:
        eng = self.engine
        if eng is None:
            return
        try:
            eng.sync()  # pick up the recorder's rows even when nobody searches
            if eng.indexes is not None:  # the fleet engine has no local index to persist
                eng.indexes.maybe_persist()
        except Exception as exc:  # noqa: BLE001
            self.get_logger().warning(f"index maintenance failed: {exc}")

    # ---- services -----------------------------------------------------------------------
    def _call(self, fn: Callable[[MemoryEngine], A]) -> A | ErrorAnswer:
        """One request's answer model (the engine's `ask_*`), or the refusal: not active,
        or too many requests waiting."""
        eng = self.engine
        if not self._active or eng is None:
            return ErrorAnswer.of(
                "not_active", f"memory server is not active (state: {self._lifecycle_state})")
        limit = int(self.settings["max_pending_requests"])
        with self._admission:
            if self._in_flight >= limit:
                self.refused += 1
                return ErrorAnswer.of(
                    "unavailable", f"busy: {limit} requests are already waiting "
                    "(max_pending_requests); try again shortly")
            self._in_flight += 1
        start = time.monotonic()
        try:
            return fn(eng)
        finally:
            took = time.monotonic() - start
            with self._admission:
                self._in_flight -= 1
            if took > SLOW_REQUEST_S:
                self.get_logger().warning(f"a request took {took:.1f} s "
                                          f"({self._in_flight} others in flight)")

    def _on_search(self, request: Any, response: Any) -> Any:
        # The model draws the markers; its JSON (what engine.search answers) is the reply.
        answer = self._call(lambda e: e.ask_search(request.query.data))
        response.result.data = dumps(answer)
        if isinstance(answer, SearchAnswer) and self.markers.get_subscription_count() > 0:
            self._publish_markers(answer.results)
        return response

    def _publish_markers(self, results: list[ResultItem]) -> None:
        """Each search's hits as spheres + labels on /memory/markers (RViz, Foxglove)."""
        from visualization_msgs.msg import Marker, MarkerArray

        arr = MarkerArray()
        clear = Marker()
        clear.action = Marker.DELETEALL
        arr.markers.append(clear)
        stamp = self.get_clock().now().to_msg()
        for i, r in enumerate(results):
            pose = r.pose
            if pose.x is None or pose.y is None:
                continue
            for kind in (Marker.SPHERE, Marker.TEXT_VIEW_FACING):
                m = Marker()
                m.header.frame_id = pose.frame or "map"
                m.header.stamp = stamp
                m.ns = "memory_hits" if kind == Marker.SPHERE else "memory_labels"
                m.id, m.type, m.action = i, kind, Marker.ADD
                m.pose.position.x, m.pose.position.y = float(pose.x), float(pose.y)
                m.pose.position.z = 0.3 if kind == Marker.SPHERE else 0.8
                m.pose.orientation.w = 1.0
                m.scale.x = m.scale.y = m.scale.z = 0.3 if kind == Marker.SPHERE else 0.25
                m.color.r, m.color.g, m.color.b, m.color.a = 1.0, 0.4, 0.1, 0.9
                if kind == Marker.TEXT_VIEW_FACING:
                    m.color.r = m.color.g = m.color.b = 1.0
                    m.text = f"#{r.id} {r.stream}: {(r.text or '')[:40]}"
                arr.markers.append(m)
        self.markers.publish(arr)

    def _on_save(self, request: Any, response: Any) -> Any:
        response.result.data = dumps(self._call(lambda e: e.ask_save(request.note.data)))
        return response

    def _on_compact(self, request: Any, response: Any) -> Any:
        response.result.data = dumps(self._call(lambda e: e.ask_compact()))
        return response

    def _on_recorder_stats(self, msg: Any) -> None:
        try:
            stats = json.loads(msg.data)
        except ValueError:
            return
        if isinstance(stats, dict):
            self._recorder_stats = (time.monotonic(), stats)

    def recorder_status(self) -> dict[str, dict] | None:
        """Per sensor stream {"status", "topic"} (and a video camera's
        "skipped_until_keyframe") from the recorder's latest stats, or None
        when no recorder has reported lately."""
        if self._recorder_stats is None:
            return None
        received, stats = self._recorder_stats
        if time.monotonic() - received > RECORDER_STATS_MAX_AGE_S:
            return None
        return {name: {"status": entry["status"], "topic": entry.get("topic")}
                # a video source joined mid-GOP (core/front_video.py)
                | ({"skipped_until_keyframe": entry["skipped_until_keyframe"]}
                   if "skipped_until_keyframe" in entry else {})
                for name, entry in stats.items()
                if isinstance(entry, dict) and "status" in entry}

    def _on_streams(self, request: Any, response: Any) -> Any:
        answer = self._call(lambda e: e.ask_streams())
        response.result.data = with_recorder_status(answer, self.recorder_status())
        return response


def with_recorder_status(answer: StreamsAnswer | ErrorAnswer,
                         status: dict[str, dict] | None) -> str:
    """The streams answer's JSON with each recorded stream's `status` and `topic`, and a
    `recorder` object naming every sensor stream's state (also those with no rows yet: "my
    camera memory is not recording")."""
    if not status or not isinstance(answer, StreamsAnswer):
        return dumps(answer)
    out = answer.model_dump()
    for entry in out.get("streams", []):
        if entry.get("name") in status:
            entry.update(status[entry["name"]])
    out["recorder"] = status
    return dumps(out)


def main(argv: list[str] | None = None) -> int:
    """`memory-server`: the query server alone; configured and activated unless
    `--ros-args -p autostart:=false` (then drive it with lifecycle transitions)."""
    argv = list(sys.argv if argv is None else argv)
    if print_help_if_asked(argv, SERVER_USAGE):
        return 0
    stop = init_ros("memory-server", argv, nodes=["memory_server"])
    try:
        node = MemoryServer(advertise=False)
    except params.ParameterError as exc:
        print(f"memory-server: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    node.advertise()
    if node.settings["autostart"]:
        node.trigger_configure()
        if node.lifecycle_state == "inactive":
            node.trigger_activate()
    else:
        node.get_logger().info("unconfigured: waiting for lifecycle transitions "
                               "(autostart is false)")
    spin_nodes([node], stop, MultiThreadedExecutor(num_threads=node.executor_threads()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
