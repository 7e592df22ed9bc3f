"""`RosClient` against the real query server (`python -m memory_node.ros.server`).

Answers through the ROS services are identical to in-process answers on the same memory
directory; the pose comes from TF; a missing server is an `unavailable` answer, and
`memory-mcp --ros` serves the same tools over MCP.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_support import NO_LLM_ENV, REPO, PoseBox, make_engine, seed_dir, stdio_session, text_of
from ros_helpers import Process, spawn, stop
from waiting import wait_until

from memory_node.agent.client import EngineClient
from memory_node.agent.ros_client import RosClient
from memory_node.agent.skills import get_skills
from memory_node.core.types import Pose

T = 1796000000.0  # one fixed "now" for the ages in both answers
ROBOT = Pose(1.2, -0.4, yaw=math.pi / 2)


class TfPublisher:
    """A node of its own context latching map -> base_link on /tf_static, as a robot's
    static broadcaster would."""

    def __init__(self, pose: Pose):
        import rclpy
        from rclpy.context import Context
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from tf2_msgs.msg import TFMessage

        from memory_node.wire.tf_buffer import Transform, make_transform_stamped

        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("test_tf_publisher", context=self.context)
        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.pub = self.node.create_publisher(TFMessage, "/tf_static", qos)
        ts = make_transform_stamped("map", "base_link",
                                    Transform.from_xyz_yaw(pose.x, pose.y, pose.yaw), time.time())
        self.pub.publish(TFMessage(transforms=[ts]))

    def close(self) -> None:
        self.node.destroy_node()
        self.context.try_shutdown()


class Setup:
    def __init__(self, root: Path, ids: dict[str, int], server: Process, ros: RosClient,
                 local: EngineClient):
        self.root, self.ids, self.server, self.ros, self.local = root, ids, server, ros, local

    def both(self, name: str, **kwargs: Any) -> tuple[str, str]:
        ros = {s.name: s for s in get_skills(self.ros, clock=lambda: T)}[name].call(**kwargs)
        local = {s.name: s for s in get_skills(self.local, clock=lambda: T)}[name].call(**kwargs)
        return ros, local


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("rosmem")
    ids = seed_dir(root)
    tf = TfPublisher(ROBOT)
    server = spawn([sys.executable, "-m", "memory_node.ros.server", "--ros-args",
                    "-p", f"memory_dir:={root}"], env=NO_LLM_ENV, cwd=REPO)
    ros = local_engine = None
    try:
        server.wait_for_line(r"active: ", timeout=60)
        ros = RosClient(timeout_s=15.0)
        wait_until(ros.current_pose, "the pose from /tf_static")
        wait_until(lambda: json.loads(ros.search('{"near_here": true}'))["ok"],
                   "the server's pose from /tf_static")
        local_engine = make_engine(root, pose=PoseBox(ROBOT))
        yield Setup(root, ids, server, ros, EngineClient(local_engine))
    finally:
        if ros is not None:
            ros.close()
        if local_engine is not None:
            local_engine.close()
        stop(server)
        tf.close()


def test_pose_comes_from_tf(setup):
    pose = setup.ros.current_pose()
    assert (pose.x, pose.y, pose.frame, pose.source) == (1.2, -0.4, "map", "tf")
    assert math.isclose(pose.yaw, math.pi / 2, abs_tol=1e-9)


def test_raw_answers_equal_in_process_answers(setup):
    def strip(answer: str) -> dict:
        out = json.loads(answer)
        out.pop("took_ms", None)
        return out

    for q in ('{"stream": "camera", "semantic_query": "a person", "k": 2}',
              '{"stream": "camera", "near_x": 6.0, "near_y": 4.0, "radius": 1.0}',
              "the kitchen", '{"stream": "nowhere"}', '{"radius": -1}'):
        assert strip(setup.ros.search(q)) == strip(setup.local.search(q)), q
    assert strip(setup.ros.streams()) == strip(setup.local.streams())


def test_the_servers_reply_is_the_engines_json_and_its_markers_draw_it(setup):
    """The server answers a search with the JSON `engine.search` gives (byte for byte but
    for the time it took) and draws the same answer's hits on /memory/markers."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from visualization_msgs.msg import Marker, MarkerArray

    query = '{"stream": "camera", "semantic_query": "a person", "k": 2}'
    ctx = Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("test_marker_listener", context=ctx)
    got: list[Any] = []
    node.create_subscription(MarkerArray, "/memory/markers", got.append, 10)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)

    def reply_with_markers() -> str | None:
        """A search's reply once the server draws it (it draws for a subscriber it knows)."""
        got.clear()
        reply = setup.ros.search(query)
        deadline = time.monotonic() + 2.0
        while not got and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        return reply if got else None

    try:
        reply = wait_until(reply_with_markers, "markers drawn for a search", timeout=60)
    finally:
        executor.shutdown()
        node.destroy_node()
        ctx.try_shutdown()
    took = re.compile(r',\s*"took_ms":\s*[0-9.e+-]+')
    assert took.sub("", reply) == took.sub("", setup.local.engine.search(query))
    results = json.loads(reply)["results"]
    assert [r["id"] for r in results] == [setup.ids["door"], setup.ids["hall"]]
    [clear, *drawn] = got[-1].markers
    assert clear.action == Marker.DELETEALL
    spheres = [m for m in drawn if m.type == Marker.SPHERE]
    labels = [m for m in drawn if m.type == Marker.TEXT_VIEW_FACING]
    assert [(m.pose.position.x, m.pose.position.y, m.header.frame_id) for m in spheres] == [
        (r["pose"]["x"], r["pose"]["y"], r["pose"]["frame"]) for r in results]
    assert [m.text for m in labels] == [
        f"#{r['id']} camera: {r['text'][:40]}" for r in results]


@pytest.mark.parametrize("name, kwargs", [
    ("list_memory_streams", {}),
    ("query_memory", {"stream": "camera", "semantic_query": "a person"}),
    ("query_memory", {"stream": "camera", "after_seconds_ago": 3600}),
    ("query_memory", {"stream": "lidar", "near_x": 1.0, "near_y": -0.5, "radius": 0.5}),
    ("query_agent_memory", {"semantic_query": "who asked for water", "k": 1}),
    ("query_memory", {"stream": "kitchen"}),
    ("query_memory", {"stream": "camera", "radius": -1.0}),
    ("query_memory", {"stream": "camera", "k": "five"}),
    ("where_am_i", {}),
])
def test_skill_answers_are_identical_over_ros(setup, name, kwargs):
    ros, local = setup.both(name, **kwargs)
    assert ros == local
    assert ros  # and not empty


def test_remember_over_ros_is_seen_in_process_with_the_tf_pose(setup):
    skills = {s.name: s for s in get_skills(setup.ros)}
    answer = skills["remember"].call(note="Gina parked the cart by the lift.")
    m = re.fullmatch(r"Remembered as #(\d+) at .*, at x=1\.20 y=-0\.40\.", answer)
    assert m, answer
    ros, local = setup.both("query_agent_memory", semantic_query="cart by the lift", k=1)
    assert ros == local and ros.startswith(f"#{m[1]} events ")


def test_mcp_server_over_ros(setup):
    async def check() -> None:
        async with stdio_session("--ros", "--timeout", "15") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert "- camera: 2 observations, semantic search" in \
                tools["query_memory"].description
            r = await s.call_tool("query_memory", {"stream": "camera",
                                                   "semantic_query": "a person", "k": 1})
            assert not r.is_error and text_of(r).startswith(f"#{setup.ids['door']} camera ")
            r = await s.call_tool("query_memory", {"stream": "camera", "radius": 0})
            assert r.is_error and "'radius' must be > 0, got 0 (bad_request)" in text_of(r)
            # The server's own client learns the pose once /tf_static reaches it.
            deadline = time.monotonic() + 30
            r = await s.call_tool("where_am_i", {})
            while text_of(r).startswith("[Current pose: unknown]") and \
                    time.monotonic() < deadline:
                await anyio.sleep(0.2)
                r = await s.call_tool("where_am_i", {})
            assert not r.is_error and text_of(r).startswith(
                "[Current pose: x=1.20, y=-0.40, heading=90°, frame=map]\nBeen within 2 m of "
                "here before")

    anyio.run(check)


def test_no_server_is_an_unavailable_answer_not_an_exception():
    with RosClient(service_prefix="/nobody_serves_this", timeout_s=0.5) as client:
        for answer in (client.search("x"), client.save("x"), client.compact(),
                       client.streams()):
            out = json.loads(answer)
            assert out["ok"] is False and out["error"]["code"] == "unavailable"
            message = out["error"]["message"]
            assert "no memory server answers on /nobody_serves_this/" in message
            # says which network it looked on, and how an MCP client passes it
            assert f"ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']}" in message
            assert "ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST" in message
            assert '"env"' in message
        result = {s.name: s for s in get_skills(client)}["query_memory"].run(stream="camera")
        assert result.is_error and result.message.endswith("(unavailable)")
        desc = {s.name: s for s in get_skills(client)}["query_memory"].description
        assert "Streams (configured; the live list is unavailable now): camera" in desc
    closed = json.loads(client.search("x"))
    assert closed["error"] == {"code": "unavailable", "message": "the ROS client is shut down"}


@pytest.mark.parametrize("text", ["abc\x00def", "\ud800 door"])
def test_text_ros_cannot_carry_is_refused_before_sending(text):
    """ROS cuts a String at NUL ("abc\\x00def" would be stored as "abc" with ok: true) and
    cannot encode a lone surrogate: the client refuses both itself, at once."""
    with RosClient(service_prefix="/nobody_serves_this", timeout_s=3.0) as client:
        for call in (client.search, client.save):
            t0 = time.monotonic()
            out = json.loads(call(text))
            assert time.monotonic() - t0 < 1.0
            assert out["ok"] is False and out["error"]["code"] == "bad_request"
            assert ("NUL" if "\x00" in text else "UTF-8") in out["error"]["message"]
        json_note = json.loads(client.save('{"note": "abc\x00def"}'))
        assert json_note["error"]["code"] == "bad_request"
