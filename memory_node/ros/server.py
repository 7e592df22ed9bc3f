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
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.lifecycle import Node as LifecycleNode
from rclpy.lifecycle import State, TransitionCallbackReturn

from memory_node.core.config import ConfigError, MemoryConfig
from memory_node.core.engine import MemoryEngine
from memory_node.core.errors import error_response
from memory_node.ros.common import (
    PoseTracker,
    declare_engine_params,
    engine_config_from_params,
    node_now,
)
from memory_node.srv import Compact, Save, Search, Streams

SERVICES = {"search": "/memory/search", "save": "/memory/save", "compact": "/memory/compact",
            "streams": "/memory/streams"}


class MemoryServer(LifecycleNode):
    def __init__(self, node_name: str = "memory_server", *, engine_factory: Callable | None = None,
                 **kwargs: Any):
        super().__init__(node_name, **kwargs)
        declare_engine_params(self)
        self.declare_parameter("world_frame", "map")
        self.declare_parameter("base_frame", "base_link")
        self.declare_parameter("odom_topic", "/odom")
        self.declare_parameter("tf_tolerance_s", 0.5)
        self.engine: MemoryEngine | None = None
        self._engine_identity: dict | None = None
        self._engine_factory = engine_factory or MemoryEngine
        self._active = False
        self._lock = threading.Lock()
        self._queries = ReentrantCallbackGroup()
        self._compaction = MutuallyExclusiveCallbackGroup()
        self._io = MutuallyExclusiveCallbackGroup()
        self.poses = PoseTracker(
            self, self.get_parameter("world_frame").value, self.get_parameter("base_frame").value,
            self.get_parameter("odom_topic").value, self.get_parameter("tf_tolerance_s").value,
            callback_group=self._io)
        # Services exist from the start so a client gets `not_active` rather than silence.
        self.create_service(Search, SERVICES["search"], self._on_search,
                            callback_group=self._queries)
        self.create_service(Save, SERVICES["save"], self._on_save, callback_group=self._queries)
        self.create_service(Streams, SERVICES["streams"], self._on_streams,
                            callback_group=self._queries)
        self.create_service(Compact, SERVICES["compact"], self._on_compact,
                            callback_group=self._compaction)
        self._persist_timer = None
        from visualization_msgs.msg import MarkerArray

        self.markers = self.create_publisher(MarkerArray, "/memory/markers", 10)

    # ---- lifecycle ----------------------------------------------------------------------
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        try:
            config = engine_config_from_params(self)
        except ConfigError as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        return self.configure_engine(config)

    def configure_engine(self, config: MemoryConfig) -> TransitionCallbackReturn:
        with self._lock:
            if self.engine is not None:
                if config.identity() == self._engine_identity:
                    self.get_logger().info("configure: same parameters, engine kept (no-op)")
                    return TransitionCallbackReturn.SUCCESS
                changed = sorted(k for k, v in config.identity().items()
                                 if self._engine_identity.get(k) != v)
                self.get_logger().error(
                    "configure refused: parameters differ from the running engine's "
                    f"({', '.join(changed)}); shut the node down to switch")
                return TransitionCallbackReturn.FAILURE
            try:
                self.engine = self._engine_factory(
                    config, clock=lambda: node_now(self), pose_provider=self.poses.current_pose)
            except Exception as exc:  # noqa: BLE001 - any failure means: not configured
                self.get_logger().error(f"configure failed: {type(exc).__name__}: {exc}")
                return TransitionCallbackReturn.FAILURE
            self._engine_identity = config.identity()
        self.get_logger().info(f"configured: memory at {config.root.resolve()}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        self._active = True
        if self._persist_timer is None and self.engine is not None:
            period = max(5.0, self.engine.config.index_persist_interval_s / 4)
            self._persist_timer = self.create_timer(period, self._maintain,
                                                    callback_group=self._compaction)
        self.get_logger().info("active: " + ", ".join(SERVICES.values()))
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        self._active = False
        self.get_logger().info("inactive: services answer not_active")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        # The engine stays open so a later configure with the same parameters is a no-op.
        self._active = False
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        self._active = False
        self.close_engine()
        return TransitionCallbackReturn.SUCCESS

    def close_engine(self) -> None:
        with self._lock:
            if self.engine is not None:
                persisted = self.engine.close()
                self.get_logger().info(
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
            eng.indexes.maybe_persist()
        except Exception as exc:  # noqa: BLE001
            self.get_logger().warning(f"index maintenance failed: {exc}")

    # ---- services -----------------------------------------------------------------------
    def _call(self, fn: Callable[[MemoryEngine], str]) -> str:
        eng = self.engine
        if not self._active or eng is None:
            return json.dumps(error_response(
                "not_active", f"memory server is not active (state: {self._state_label()})"))
        return fn(eng)

    def _state_label(self) -> str:
        try:
            return self._state_machine.current_state[1]
        except Exception:  # noqa: BLE001 - only for the message
            return "unknown"

    def _on_search(self, request: Any, response: Any) -> Any:
        response.result.data = self._call(lambda e: e.search(request.query.data))
        if self.markers.get_subscription_count() > 0:
            self._publish_markers(response.result.data)
        return response

    def _publish_markers(self, answer: str) -> None:
        """Each search's hits as spheres + labels on /memory/markers (RViz, Foxglove)."""
        from visualization_msgs.msg import Marker, MarkerArray

        try:
            results = json.loads(answer).get("results") or []
        except ValueError:
            return
        arr = MarkerArray()
        clear = Marker()
        clear.action = Marker.DELETEALL
        arr.markers.append(clear)
        stamp = self.get_clock().now().to_msg()
        for i, r in enumerate(results):
            pose = r.get("pose") or {}
            if pose.get("x") is None:
                continue
            for kind in (Marker.SPHERE, Marker.TEXT_VIEW_FACING):
                m = Marker()
                m.header.frame_id = pose.get("frame") or "map"
                m.header.stamp = stamp
                m.ns = "memory_hits" if kind == Marker.SPHERE else "memory_labels"
                m.id, m.type, m.action = i, kind, Marker.ADD
                m.pose.position.x, m.pose.position.y = float(pose["x"]), float(pose["y"])
                m.pose.position.z = 0.3 if kind == Marker.SPHERE else 0.8
                m.pose.orientation.w = 1.0
                m.scale.x = m.scale.y = m.scale.z = 0.3 if kind == Marker.SPHERE else 0.25
                m.color.r, m.color.g, m.color.b, m.color.a = 1.0, 0.4, 0.1, 0.9
                if kind == Marker.TEXT_VIEW_FACING:
                    m.color.r = m.color.g = m.color.b = 1.0
                    m.text = f"#{r.get('id')} {r.get('stream')}: {(r.get('text') or '')[:40]}"
                arr.markers.append(m)
        self.markers.publish(arr)

    def _on_save(self, request: Any, response: Any) -> Any:
        response.result.data = self._call(lambda e: e.save(request.note.data))
        return response

    def _on_compact(self, request: Any, response: Any) -> Any:
        response.result.data = self._call(lambda e: e.compact())
        return response

    def _on_streams(self, request: Any, response: Any) -> Any:
        response.result.data = self._call(lambda e: e.streams())
        return response


def spin_nodes(nodes: list, executor: Any = None, *, extra: list | None = None) -> None:
    """Spin until SIGINT, then shut down cleanly (the index is persisted on the way out).

    `extra` is a list of (executor, nodes) spun on threads of their own, e.g. the recorder on a
    single-threaded executor beside the server's multi-threaded one. Nodes are closed in
    order: extra ones first, so the recorder's last keyframes land before the engine closes.
    """
    import threading

    executor = executor or MultiThreadedExecutor(num_threads=4)
    for n in nodes:
        executor.add_node(n)
    groups = list(extra or [])
    threads = []
    for ex, ns in groups:
        for n in ns:
            ex.add_node(n)
        th = threading.Thread(target=_spin_quietly, args=(ex,), daemon=True)
        th.start()
        threads.append(th)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        for n in [n for _, ns in groups for n in ns] + list(nodes):
            closer = getattr(n, "close_engine", None) or getattr(n, "close", None)
            if closer is not None:
                try:
                    closer()
                except Exception as exc:  # noqa: BLE001
                    print(f"memory_node: error while closing {n.get_name()}: {exc}",
                          file=sys.stderr)
        for ex, ns in groups:
            ex.shutdown()
            for n in ns:
                n.destroy_node()
        for n in nodes:
            n.destroy_node()
        executor.shutdown()
        for th in threads:
            th.join(timeout=5)
        if rclpy.ok():
            rclpy.try_shutdown()


def _spin_quietly(executor: Any) -> None:
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass


def main(argv: list[str] | None = None) -> int:
    """`memory-server`: the query server alone; configured and activated unless
    `--ros-args -p autostart:=false` (then drive it with lifecycle transitions)."""
    rclpy.init(args=argv if argv is not None else sys.argv)
    node = MemoryServer()
    node.declare_parameter("autostart", True)
    if node.get_parameter("autostart").value:
        node.trigger_configure()
        if node._state_machine.current_state[1] == "inactive":
            node.trigger_activate()
    else:
        node.get_logger().info("unconfigured: waiting for lifecycle transitions "
                               "(autostart is false)")
    spin_nodes([node])
    return 0


if __name__ == "__main__":
    sys.exit(main())
