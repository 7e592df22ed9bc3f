"""The one service client against an in-process query server: the server's lifecycle state as
its `not_active` answers name it (kept by its transition callbacks, checked against the
node's own lifecycle services), and the refusals every client of the services shares."""

from __future__ import annotations

import json
import os
import threading

import pytest
from lifecycle_msgs.srv import GetState
from rclpy.executors import MultiThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter

from memory_node.ros.server import MemoryServer
from memory_node.ros.services import MEMORY_SERVICES, SERVICES, ServiceCaller


@pytest.fixture
def server(ros, tmp_path):
    """A query server in the test's context, unconfigured, spun on a thread of its own."""
    from engine_support import minilm  # noqa: PLC0415 - test/core helper

    from memory_node.core.engine import MemoryEngine  # noqa: PLC0415

    ctx, _caller, _node = ros

    def engine(config, **kwargs):
        return MemoryEngine(config, text_embedder=minilm(), **kwargs)

    node = MemoryServer("lifecycle_state_server", context=ctx, engine_factory=engine,
                        parameter_overrides=[Parameter("memory_dir", Parameter.Type.STRING,
                                                       str(tmp_path / "mem"))])
    executor = MultiThreadedExecutor(num_threads=4, context=ctx)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    yield node
    executor.shutdown()
    spinner.join(5)
    if node.engine is not None:
        node.close_engine()
    node.destroy_node()


def _answer(caller, verb, payload=None):
    return json.loads(caller.call(verb, payload, 20.0))


def _reported_state(caller, name):
    """The state the node's own lifecycle service reports (what `ros2 lifecycle get` shows)."""
    client = caller.node.create_client(GetState, f"/{name}/get_state")
    try:
        assert client.wait_for_service(timeout_sec=20)
        future = client.call_async(GetState.Request())
        caller.executor.spin_until_future_complete(future, timeout_sec=20)
        return future.result().current_state.label
    finally:
        caller.node.destroy_client(client)


def test_not_active_answers_name_the_lifecycle_state_through_every_transition(ros, server):
    _ctx, caller, _node = ros
    name = server.get_name()

    def refused_in(state):
        assert server.lifecycle_state == state == _reported_state(caller, name)
        for verb in ("search", "streams"):
            out = _answer(caller, verb, "door" if verb == "search" else None)
            assert out["error"] == {"code": "not_active", "message":
                                    f"memory server is not active (state: {state})"}, out

    refused_in("unconfigured")
    assert server.trigger_configure() == TransitionCallbackReturn.SUCCESS
    refused_in("inactive")
    assert server.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert server.lifecycle_state == "active" == _reported_state(caller, name)
    assert _answer(caller, "save", "the lifecycle note")["ok"] is True
    assert server.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    refused_in("inactive")
    assert server.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    refused_in("unconfigured")

    # An activation that raises: rclpy's error processing takes the node back to
    # unconfigured, and the services say so.
    assert server.trigger_configure() == TransitionCallbackReturn.SUCCESS

    def broken_view():
        raise RuntimeError("the view could not start")

    server.start_view = broken_view
    assert server.trigger_activate() == TransitionCallbackReturn.ERROR
    refused_in("unconfigured")
    del server.start_view
    assert server.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert server.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert _answer(caller, "search", "lifecycle note")["count"] == 1

    assert server.trigger_shutdown() == TransitionCallbackReturn.SUCCESS
    refused_in("finalized")


def test_the_table_names_each_service_once_for_server_and_clients():
    assert SERVICES == {"search": "/memory/search", "save": "/memory/save",
                        "compact": "/memory/compact", "streams": "/memory/streams"}
    assert MEMORY_SERVICES["search"].path("/robot1/memory/") == "/robot1/memory/search"
    assert MEMORY_SERVICES["save"].request("a note").note.data == "a note"
    assert MEMORY_SERVICES["search"].request("door").query.data == "door"


def test_no_server_and_a_closed_caller_are_answers_not_exceptions(ros):
    ctx, _caller, _node = ros
    caller = ServiceCaller("nobody_client", context=ctx, prefix="/nobody_serves_this")
    try:
        out = json.loads(caller.call("streams", None, 0.5))
        assert out["ok"] is False and out["error"]["code"] == "unavailable"
        message = out["error"]["message"]
        assert message.startswith("no memory server answers on /nobody_serves_this/streams "
                                  "within 0.5 s (this client: ROS_DOMAIN_ID="
                                  f"{os.environ['ROS_DOMAIN_ID']}")
        assert message.endswith("is memory-node running on the same ROS network?")
        nul = json.loads(caller.call("save", "abc\x00def", 0.5))
        assert nul["error"]["code"] == "bad_request" and "NUL" in nul["error"]["message"]
    finally:
        caller.close()
    closed = json.loads(caller.call("search", "door", 0.5))
    assert closed["error"] == {"code": "unavailable", "message": "the ROS client is shut down"}
