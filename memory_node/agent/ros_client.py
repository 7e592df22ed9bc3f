"""`RosClient`: the agent's memory client over the query server's ROS services.

It owns one small rclpy node (in its own rclpy context, so a host that uses rclpy itself is not
disturbed), spun on a background thread. It calls `/memory/search|save|compact|streams` with a
timeout, and keeps the robot's current pose the way the query server does (`PoseTracker`:
`/tf` and `/tf_static` through the package's own TF buffer, installed tf2_ros or not, with
the latest odometry as fallback), so the pose line the agent sees is the pose its notes get. A
server that is not there or too slow gives
`{"ok": false, "error": {"code": "unavailable", ...}}` (one that is not active answers
`not_active` itself), never an exception, so the skills turn it into a readable tool error.

The calls and every refusal are `ServiceCaller`'s (`ros/services.py`, the same client
`memory-cli` uses); this class adds the node's parameters, the pose and the clock. This is the
only module of the agent layer that imports rclpy, and only when a `RosClient` is built: the
in-process path (`EngineClient`) runs without ROS. Only rclpy APIs that exist in Humble are
used.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from memory_node.agent.client import MemoryClient
from memory_node.core.config import DEFAULT_STREAMS
from memory_node.core.types import Pose

__all__ = ["RosClient"]


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
        from rclpy.parameter import Parameter

        from memory_node.ros.common import NETWORK_HINT, PoseTracker
        from memory_node.ros.services import ServiceCaller

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

            # The services from this node, its executor spun on a thread of the caller's.
            self._caller = ServiceCaller(node=node, prefix=service_prefix,
                                         network_hint=NETWORK_HINT)
            # Same subscriptions and QoS as the nodes (docs/design.md: /tf_static
            # TRANSIENT_LOCAL, reliable, depth 1).
            self.poses = PoseTracker(node, self.world_frame, self.base_frame, odom or None)
        except Exception:
            self._context.try_shutdown()  # a bad parameter must not leave a context behind
            raise
        self._caller.spin_in_background()

    # ---- MemoryClient --------------------------------------------------------------------------
    def search(self, query: str) -> str:
        return self._caller.call("search", query, self.timeout_s)

    def save(self, note: str) -> str:
        return self._caller.call("save", note, self.timeout_s)

    def compact(self) -> str:
        return self._caller.call("compact", None, self.timeout_s)

    def streams(self) -> str:
        return self._caller.call("streams", None, self.timeout_s)

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
        self._caller.close()
        self.node.destroy_node()
        self._context.try_shutdown()

    def __enter__(self) -> RosClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
