"""`RosClient`: the agent's memory client over the query server's ROS services.

It owns one small rclpy node (in its own rclpy context, so a host that uses rclpy itself is not
disturbed), spun on a background thread. It calls `/memory/search|save|compact|streams` with a
timeout, and keeps the robot's current pose the way the query server does (`PoseTracker`:
`/tf` and `/tf_static` through the package's own TF buffer, installed tf2_ros or not, with
the latest odometry as fallback), so the pose line the agent sees is the pose its notes get. A
server that is not there, not active or too slow gives
`{"ok": false, "error": {"code": "unavailable", ...}}`, never an exception, so the skills turn
it into a readable tool error.

This is the only module of the agent layer that imports rclpy, and only when a `RosClient` is
built: the in-process path (`EngineClient`) runs without ROS. Only rclpy APIs that exist in
Humble are used.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from memory_node.agent.client import MemoryClient, error_json
from memory_node.core.config import DEFAULT_STREAMS
from memory_node.core.errors import BadRequest
from memory_node.core.query import check_text
from memory_node.core.types import Pose

__all__ = ["RosClient"]

log = logging.getLogger("memory_node.agent.ros")


def _unsendable(what: str, text: str) -> str | None:
    """A `bad_request` answer for text a ROS String cannot carry whole (the transport cuts it
    at the first NUL, and cannot encode a lone surrogate), else None."""
    try:
        check_text(what, text)
    except BadRequest as exc:
        return error_json("bad_request",
                          exc.message + " (a ROS String cannot carry it; nothing was sent)")
    return None


class RosClient(MemoryClient):
    """Memory over ROS 2 services, pose from TF.

    Node parameters (set by the keyword arguments, or by ROS arguments in `args`, e.g.
    `["--ros-args", "-p", "use_sim_time:=true"]`): `world_frame` (default "map"),
    `base_frame` ("base_link"), `odom_topic` ("/odom"; empty: no odometry fallback),
    `service_timeout_s` (5.0) and ROS's own `use_sim_time`. `service_prefix` is where the
    four services live.
    """

    def __init__(
        self,
        *,
        node_name: str = "memory_agent_client",
        namespace: str = "",
        service_prefix: str = "/memory",
        world_frame: str | None = None,
        base_frame: str | None = None,
        odom_topic: str | None = None,
        timeout_s: float | None = None,
        use_sim_time: bool | None = None,
        args: Sequence[str] | None = None,
        default_streams: Sequence[str] = DEFAULT_STREAMS,
    ) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter import Parameter

        from memory_node.ros.common import CLIENT_QOS, PoseTracker
        from memory_node.srv import Compact, Save, Search, Streams

        self._default_streams = tuple(default_streams)
        self._context = Context()
        rclpy.init(args=list(args) if args is not None else None, context=self._context)
        given = {"world_frame": world_frame, "base_frame": base_frame, "odom_topic": odom_topic,
                 "service_timeout_s": None if timeout_s is None else float(timeout_s),
                 "use_sim_time": use_sim_time}
        overrides = [Parameter(k, value=v) for k, v in given.items() if v is not None]
        self._closed = False
        try:
            self.node = rclpy.create_node(node_name, namespace=namespace,
                                          context=self._context,
                                          parameter_overrides=overrides)
            node = self.node
            self.world_frame = str(node.declare_parameter("world_frame", "map").value)
            self.base_frame = str(node.declare_parameter("base_frame", "base_link").value)
            odom = str(node.declare_parameter("odom_topic", "/odom").value)
            self.timeout_s = float(node.declare_parameter("service_timeout_s", 5.0).value)

            prefix = "/" + service_prefix.strip("/") if service_prefix.strip("/") else ""
            self._types = {"search": Search, "save": Save, "compact": Compact,
                           "streams": Streams}
            self._clients: dict[str, Any] = {name: node.create_client(srv, f"{prefix}/{name}",
                                                      qos_profile=CLIENT_QOS)
                             for name, srv in self._types.items()}
            # Same subscriptions and QoS as the nodes (docs/design.md: /tf_static
            # TRANSIENT_LOCAL, reliable, depth 1).
            self.poses = PoseTracker(node, self.world_frame, self.base_frame, odom or None)
            self._executor = SingleThreadedExecutor(context=self._context)
            self._executor.add_node(node)
        except Exception:
            self._context.try_shutdown()  # a bad parameter must not leave a context behind
            raise
        self._spinner = threading.Thread(target=self._spin, name="memory-ros-client",
                                         daemon=True)
        self._spinner.start()

    # ---- ROS plumbing ------------------------------------------------------------------------
    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception as exc:  # noqa: BLE001 - shutdown from another thread ends the spin
            if self._context.ok():
                log.exception("the ROS client's executor stopped: %s", exc)

    def _call(self, name: str, request: Any) -> str:
        """One service call; every way it can fail is an `unavailable` answer."""
        client = self._clients[name]
        service = client.srv_name
        if self._closed or not self._context.ok():
            return error_json("unavailable", "the ROS client is shut down")
        deadline = time.monotonic() + self.timeout_s
        if not client.wait_for_service(timeout_sec=self.timeout_s):
            from memory_node.ros.common import NETWORK_HINT, ros_network

            return error_json("unavailable",
                              f"no memory server answers on {service} within "
                              f"{self.timeout_s:g} s (this client: {ros_network()}); is "
                              f"memory-node running on the same ROS network? {NETWORK_HINT}")
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(max(0.0, deadline - time.monotonic())):
            client.remove_pending_request(future)
            return error_json("unavailable",
                              f"{service} did not answer within {self.timeout_s:g} s")
        exc = future.exception()
        if exc is not None:
            return error_json("unavailable", f"{service} failed: {exc}")
        response = future.result()
        if response is None:
            return error_json("unavailable", f"{service} gave no response")
        return str(response.result.data)

    # ---- MemoryClient --------------------------------------------------------------------------
    def search(self, query: str) -> str:
        from std_msgs.msg import String

        refused = _unsendable("search query", query)
        if refused:
            return refused
        return self._call("search", self._types["search"].Request(query=String(data=query)))

    def save(self, note: str) -> str:
        from std_msgs.msg import String

        refused = _unsendable("note", note)
        if refused:
            return refused
        return self._call("save", self._types["save"].Request(note=String(data=note)))

    def compact(self) -> str:
        return self._call("compact", self._types["compact"].Request())

    def streams(self) -> str:
        return self._call("streams", self._types["streams"].Request())

    def current_pose(self) -> Pose | None:
        """world_frame <- base_frame at the latest time TF has, else the latest odometry
        (source "odom"), else None."""
        return self.poses.current_pose()

    def now(self) -> float:
        """The node's ROS clock (simulated time under use_sim_time); the wall clock until a
        simulated clock has started."""
        t = self.node.get_clock().now().nanoseconds * 1e-9
        return t if t > 0 else time.time()

    @property
    def default_streams(self) -> Sequence[str]:
        return self._default_streams

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown()
        self.node.destroy_node()
        self._context.try_shutdown()
        self._spinner.join(5.0)

    def __enter__(self) -> RosClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
