"""`memory-cli`: call the memory services and print the JSON answer.

Exit status 0 when the answer has `"ok": true`, 1 when it is false or nothing answered within
the timeout, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

SERVICES = {"search": "/memory/search", "save": "/memory/save", "compact": "/memory/compact",
            "streams": "/memory/streams"}


def ros_text_problem(verb: str, payload: str | None) -> str | None:
    """Why a payload cannot go out as a ROS String whole, or None: the transport cuts a String
    at its first NUL (the server would store the rest silently truncated), and cannot encode
    a lone surrogate (an undecodable byte in the command line)."""
    from memory_node.core.errors import BadRequest
    from memory_node.core.query import check_text

    if not payload:
        return None
    try:
        check_text("search query" if verb == "search" else "note", payload)
    except BadRequest as exc:
        return exc.message + " (a ROS String cannot carry it; nothing was sent)"
    return None


class ServiceCaller:
    """A tiny rclpy node that calls one of the four services synchronously."""

    def __init__(self, node_name: str = "memory_cli", context: Any = None):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from memory_node.srv import Compact, Save, Search, Streams

        self.rclpy = rclpy
        self.node = rclpy.create_node(node_name, context=context)
        self.executor = SingleThreadedExecutor(context=self.node.context)
        self.types = {"search": Search, "save": Save, "compact": Compact, "streams": Streams}
        self.clients = {k: self.node.create_client(t, SERVICES[k]) for k, t in self.types.items()}

    def call(self, verb: str, payload: str | None = None, timeout: float = 10.0) -> str:
        import time

        refused = ros_text_problem(verb, payload)
        if refused:
            return json.dumps({"ok": False, "error": {"code": "bad_request",
                                                      "message": refused}})
        client = self.clients[verb]
        deadline = time.monotonic() + timeout
        if not client.wait_for_service(timeout_sec=timeout):
            return json.dumps({"ok": False, "error": {
                "code": "unavailable",
                "message": f"no memory server answers on {SERVICES[verb]} (waited {timeout:g} s)"}})
        req = self.types[verb].Request()
        if verb == "search":
            req.query.data = payload or ""
        elif verb == "save":
            req.note.data = payload or ""
        future = client.call_async(req)
        left = max(0.1, deadline - time.monotonic())
        self.rclpy.spin_until_future_complete(self.node, future, executor=self.executor,
                                             timeout_sec=left)
        if not future.done():
            client.remove_pending_request(future)
            return json.dumps({"ok": False, "error": {
                "code": "unavailable", "message": f"{SERVICES[verb]} did not answer within "
                f"{timeout:g} s"}})
        return future.result().result.data

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verb", choices=list(SERVICES))
    parser.add_argument("payload", nargs="?", help="search: text or JSON; save: the note")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    args, ros_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.verb in ("search", "save") and not args.payload:
        parser.error(f"{args.verb} needs a payload")
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    # No rclpy signal handler: Ctrl-C raises KeyboardInterrupt here (Python's own handler)
    # while the context stays valid for a clean close, instead of a traceback from a dead
    # context inside the wait.
    rclpy.init(args=["memory-cli", *ros_args], signal_handler_options=SignalHandlerOptions.NO)
    caller = ServiceCaller()
    try:
        answer = caller.call(args.verb, args.payload, args.timeout)
    except KeyboardInterrupt:
        return 130
    finally:
        caller.close()
        rclpy.try_shutdown()
    print(answer)
    try:
        return 0 if json.loads(answer).get("ok") else 1
    except (ValueError, AttributeError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
