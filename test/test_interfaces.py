"""The generated ROS 2 types: importable from a bare process, right fields, and usable between
two processes (a service call crosses DDS, so type support and type hashes must agree).

The server below is a test fixture of the generated types, not memory_node's query server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# No LD_LIBRARY_PATH, no PYTHONPATH, no bootstrap marker: "works in any process".
_BARE_ENV_DROP = ("LD_LIBRARY_PATH", "PYTHONPATH", "_ROS_WHEELS_BOOTSTRAP_COMPLETE")

_IMPORT_CHECK = textwrap.dedent(
    """
    import json
    from memory_node.srv import Compact, Save, Search, Streams
    from tf2_msgs.msg import TFMessage

    def fields(cls):
        return cls.get_fields_and_field_types()

    print(json.dumps({
        "search": [fields(Search.Request), fields(Search.Response)],
        "save": [fields(Save.Request), fields(Save.Response)],
        "compact": [fields(Compact.Request), fields(Compact.Response)],
        "streams": [fields(Streams.Request), fields(Streams.Response)],
        "tf": fields(TFMessage),
        "defaults": [Search.Request().query.data, Search.Response().result.data,
                     Save.Request().note.data],
    }))
    """
)

_SERVER = textwrap.dedent(
    """
    import json, os, sys
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from memory_node.srv import Search, Streams

    def search(request, response):
        response.result.data = json.dumps({"ok": True, "echo": request.query.data})
        return response

    def streams(request, response):
        response.result.data = json.dumps({"ok": True, "streams": [], "pid": os.getpid()})
        return response

    rclpy.init()
    node = rclpy.create_node("interface_fixture_server")
    node.create_service(Search, sys.argv[1] + "/search", search)
    node.create_service(Streams, sys.argv[1] + "/streams", streams)
    print("READY", os.getpid(), flush=True)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    print("STOPPED", flush=True)
    """
)


def test_types_import_in_a_bare_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _BARE_ENV_DROP}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK],
        cwd=tmp_path,  # not the checkout: the installed package must provide the types
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    string = {"result": "std_msgs/String"}
    assert got["search"] == [{"query": "std_msgs/String"}, string]
    assert got["save"] == [{"note": "std_msgs/String"}, string]
    assert got["compact"] == [{}, string]
    assert got["streams"] == [{}, string]
    assert got["tf"] == {"transforms": "sequence<geometry_msgs/TransformStamped>"}
    assert got["defaults"] == ["", "", ""]


def test_tf_message_type_hash_matches_kilted():
    """A real robot's /tf only matches subscribers whose type hash is the distro's."""
    typesys = pytest.importorskip("rosbags.typesys")
    rclpy = pytest.importorskip("rclpy")
    from rclpy.context import Context
    from rclpy.signals import SignalHandlerOptions
    from tf2_msgs.msg import TFMessage

    expected = typesys.get_typestore(typesys.Stores.ROS2_KILTED).hash_rihs01(
        "tf2_msgs/msg/TFMessage"
    )
    context = Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = rclpy.create_node("tf_hash_probe", context=context)
        node.create_publisher(TFMessage, "/tf_hash_probe", 1)
        info = node.get_publishers_info_by_topic("/tf_hash_probe")
        if not hasattr(info[0], "topic_type_hash"):
            pytest.skip("this ROS 2 distro has no type hashes (Humble)")
        assert str(info[0].topic_type_hash) == expected
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_service_round_trip_between_processes(tmp_path, ros_process):
    rclpy = pytest.importorskip("rclpy")
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from memory_node.srv import Search, Streams

    script = tmp_path / "interface_fixture_server.py"
    script.write_text(_SERVER)
    prefix = f"/interface_fixture_{os.getpid()}"
    server = ros_process([str(script), prefix], cwd=tmp_path)
    ready = server.wait_for_line(r"^READY (\d+)$", timeout=60)
    # The wheels' bootstrapper re-executes Python in place: the pid we hold is the server's.
    assert int(ready.group(1)) == server.pid

    context = Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    executor = SingleThreadedExecutor(context=context)
    node = rclpy.create_node("interface_fixture_client", context=context)
    executor.add_node(node)
    try:

        def call(srv_type, name, request):
            client = node.create_client(srv_type, f"{prefix}/{name}")
            assert client.wait_for_service(timeout_sec=30), f"{name}: no server\n{server.output}"
            future = client.call_async(request)
            executor.spin_until_future_complete(future, timeout_sec=15)
            assert future.done(), f"{name}: no answer\n{server.output}"
            return json.loads(future.result().result.data)

        request = Search.Request()
        request.query.data = json.dumps({"semantic_query": "red door", "k": 3})
        answer = call(Search, "search", request)
        assert answer == {"ok": True, "echo": request.query.data}

        answer = call(Streams, "streams", Streams.Request())
        assert answer["ok"] is True and answer["pid"] == server.pid != os.getpid()
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=context)

    # SIGINT stops an rclpy process cleanly (the fixture's kill is only the fallback).
    from ros_helpers import stop

    assert stop(server, timeout=15) == 0, server.output
    assert "STOPPED" in server.output
