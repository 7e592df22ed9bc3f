"""The memory services, named once, and the one client that calls them.

`MEMORY_SERVICES` is the table the query server advertises and every client calls
(`memory-cli`, the agent's `RosClient`, the tests): each operation's verb, service name, srv
type and the request field that carries its text. `ServiceCaller` calls them from one rclpy
node and turns every way a call can fail into the contract's error JSON, never an exception,
so each client shows the same answer for the same failure:

- text a ROS String cannot carry whole: `bad_request`, nothing sent;
- the caller already closed, no server discovered within the timeout, no answer within it,
  a call that failed or came back empty: `unavailable`.

A server that is there but not active answers `not_active` itself (`ros/server.py`). Only
rclpy APIs that exist in Humble are used; rclpy is imported when a caller is built.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from memory_node.core.errors import BadRequest, ContractError, Unavailable
from memory_node.srv import Compact, Save, Search, Streams

__all__ = ["MEMORY_SERVICES", "SERVICES", "SERVICE_PREFIX", "MemoryService", "ServiceCaller",
           "ros_text_problem"]

log = logging.getLogger(__name__)

SERVICE_PREFIX = "/memory"


@dataclass(frozen=True)
class MemoryService:
    """One operation's service: `<prefix>/<verb>`, a `srv_type` whose request carries the
    text in `payload_field` (a std_msgs/String; None: no payload) and whose response carries
    the JSON answer in `result`."""

    verb: str
    srv_type: Any
    payload_field: str | None = None
    payload_name: str = ""  # what a refusal calls the payload ("search query", "note")

    def path(self, prefix: str = SERVICE_PREFIX) -> str:
        prefix = prefix.strip("/")
        return f"/{prefix}/{self.verb}" if prefix else f"/{self.verb}"

    def request(self, payload: str | None) -> Any:
        req = self.srv_type.Request()
        if self.payload_field is not None:
            getattr(req, self.payload_field).data = payload or ""
        return req


MEMORY_SERVICES: dict[str, MemoryService] = {s.verb: s for s in (
    MemoryService("search", Search, "query", "search query"),
    MemoryService("save", Save, "note", "note"),
    MemoryService("compact", Compact),
    MemoryService("streams", Streams),
)}
# verb -> service name, as the server advertises them
SERVICES: dict[str, str] = {verb: s.path() for verb, s in MEMORY_SERVICES.items()}


def refusal(error: ContractError) -> str:
    """The answer for a call the client itself refuses or gives up on."""
    return json.dumps(error.to_response(), ensure_ascii=False)


def ros_text_problem(verb: str, payload: str | None) -> str | None:
    """Why a payload cannot go out as a ROS String whole, or None: the transport cuts a String
    at its first NUL (the server would store the rest silently truncated), and cannot encode
    a lone surrogate (an undecodable byte in the command line)."""
    from memory_node.core.query import check_text

    service = MEMORY_SERVICES[verb]
    if not payload or service.payload_field is None:
        return None
    try:
        check_text(service.payload_name, payload)
    except BadRequest as exc:
        return exc.message + " (a ROS String cannot carry it; nothing was sent)"
    return None


class ServiceCaller:
    """Calls the memory services synchronously from one rclpy node.

    By default it makes its own node (`node_name`, in `context`, or rclpy's default one) and
    spins it while a call waits. Given a `node`, it calls from that one (its owner destroys
    it); `spin_in_background()` then spins it on a thread of its own, so the node's other
    subscriptions run between calls and calls may come from several threads. `prefix` is where
    the four services live; `network_hint` ends the message for a server not found (what the
    user of this client should check)."""

    def __init__(self, node_name: str = "memory_cli", context: Any = None, *,
                 node: Any = None, prefix: str = SERVICE_PREFIX, network_hint: str = ""):
        from rclpy.executors import SingleThreadedExecutor

        from memory_node.ros.common import CLIENT_QOS

        self._owns_node = node is None
        if node is None:
            import rclpy

            node = rclpy.create_node(node_name, context=context)
        self.node = node
        self.network_hint = network_hint
        self.executor = SingleThreadedExecutor(context=node.context)
        self.executor.add_node(node)
        self.clients: dict[str, Any] = {
            verb: node.create_client(s.srv_type, s.path(prefix), qos_profile=CLIENT_QOS)
            for verb, s in MEMORY_SERVICES.items()}
        self._spinner: threading.Thread | None = None
        self._closed = False

    def spin_in_background(self) -> None:
        if self._spinner is None:
            self._spinner = threading.Thread(target=self._spin, name="memory-ros-client",
                                             daemon=True)
            self._spinner.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception as exc:  # noqa: BLE001 - shutdown from another thread ends the spin
            if self.node.context.ok() and not self._closed:
                log.exception("the ROS client's executor stopped: %s", exc)

    def call(self, verb: str, payload: str | None = None, timeout: float = 10.0) -> str:
        """The service's JSON answer, or the error JSON saying why there is none."""
        refused = ros_text_problem(verb, payload)
        if refused:
            return refusal(BadRequest(refused))
        if self._closed or not self.node.context.ok():
            return refusal(Unavailable("the ROS client is shut down"))
        client = self.clients[verb]
        service = client.srv_name
        deadline = time.monotonic() + timeout
        if not client.wait_for_service(timeout_sec=timeout):
            from memory_node.ros.common import ros_network

            return refusal(Unavailable(" ".join(filter(None, (
                f"no memory server answers on {service} within {timeout:g} s (this client: "
                f"{ros_network()}); is memory-node running on the same ROS network?",
                self.network_hint)))))
        future = client.call_async(MEMORY_SERVICES[verb].request(payload))
        left = max(0.1, deadline - time.monotonic())
        if self._spinner is not None:
            done = threading.Event()
            future.add_done_callback(lambda _f: done.set())
            done.wait(left)
        else:
            self.executor.spin_until_future_complete(future, timeout_sec=left)
        if not future.done():
            client.remove_pending_request(future)
            return refusal(Unavailable(f"{service} did not answer within {timeout:g} s"))
        exc = future.exception()
        if exc is not None:
            return refusal(Unavailable(f"{service} failed: {exc}"))
        response = future.result()
        if response is None:
            return refusal(Unavailable(f"{service} gave no response"))
        return str(response.result.data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.executor.shutdown()
        if self._spinner is not None:
            self._spinner.join(5.0)
        if self._owns_node:
            self.node.destroy_node()
