"""End to end: the sample flat replayed (with /clock) into real nodes, questions checked against
the generator's ground truth. Run on memory-node recording a replay, and on memory-import's
store served by memory-recorder and memory-server in two processes.

Tolerances, stated once:
- the brightest keyframe is within BRIGHT_TOL_M of the window (the camera sees the window from
  the room, not from the wall itself);
- "been here" uses a radius of HERE_RADIUS_M;
- poses: POSE_TOL_M from TF, ODOM_TOL_M from odometry (replay_support);
- person frames near the door lie inside the ground-truth window, ± 1 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import anyio
import numpy as np
import pytest
from replay_support import RATE, check_poses, search, session_in
from waiting import wait_until

from memory_node.agent.ros_client import RosClient
from memory_node.agent.skills import get_skills
from memory_node.session import wait_until_settled

BRIGHT_TOL_M = 3.0
HERE_RADIUS_M = 1.0


class ClockAt:
    """/clock standing at one time, 20 times a second, while the fixture lasts: a paused
    simulation for nodes with use_sim_time."""

    def __init__(self, t: float):
        import rclpy
        from rosgraph_msgs.msg import Clock

        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("clock_at_bag_end", context=self.context)
        pub = self.node.create_publisher(Clock, "/clock", 10)
        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = int(t), int(round((t % 1) * 1e9))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(pub, msg), daemon=True)
        self.thread.start()

    def _run(self, pub, msg) -> None:
        while not self.stop.wait(0.05):
            pub.publish(msg)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture(scope="module", params=["replayed-one-process", "imported-two-process"])
def replayed(request, sample, tmp_path_factory):
    """The sample's memory, answered through the nodes' services: recorded by memory-node
    from a replay at RATE; or imported by memory-import (the rows of a live 1x recording, in
    seconds instead of a replay's minute) and served by memory-recorder + memory-server, two
    processes on the store, on a /clock standing at the bag's end."""
    tmp = tmp_path_factory.mktemp(request.param)
    imported = request.param.startswith("imported")
    clock = None
    if imported:
        done = subprocess.run([sys.executable, "-m", "memory_node.ros.bag_import",
                               str(sample.bag), "--memory-dir", str(tmp / "memory")],
                              capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        clock = ClockAt(sample.truth["epoch"] + sample.truth["duration"])
    session = session_in(tmp, two_process=imported)
    client = RosClient(use_sim_time=True, timeout_s=20.0)
    try:
        session.start()
        if imported:
            wait_until(lambda: json.loads(client.search(
                '{"stream": "camera", "after_seconds_ago": 30}'))["ok"],
                "the server's /clock", timeout=60)
        else:
            session.replay(sample.bag, RATE)
        wait_until_settled(client)
        yield session, client, sample, tmp
    finally:
        client.close()
        session.stop()
        if clock is not None:
            clock.close()


def test_every_stream_recorded_with_map_poses(replayed):
    session, client, sample, _ = replayed
    streams = {s["name"]: s for s in json.loads(client.streams())["streams"]}
    assert {"camera", "lidar", "odom"} <= set(streams)
    assert streams["camera"]["count"] >= 40 and streams["camera"]["semantic"]
    cams = search(client, stream="camera", k=100, order_by="time")
    assert sum(r["pose"]["source"] == "tf" for r in cams) >= 0.9 * len(cams)
    check_poses(sample, cams)


def test_brightest_place_is_by_the_window(replayed):
    _, client, sample, _ = replayed
    [top] = search(client, stream="camera", order_by="-brightness", k=1)
    wx, wy = sample.window
    d = float(np.hypot(top["pose"]["x"] - wx, top["pose"]["y"] - wy))
    assert d <= BRIGHT_TOL_M, (top, sample.window)
    assert top["pose"]["y"] > 5.0  # in the living room, on the window's side of the flat
    dark = search(client, stream="camera", order_by="brightness", k=1)[0]
    assert dark["tags"]["brightness"] < top["tags"]["brightness"] - 0.15


def test_been_here_before_at_revisits_not_at_unvisited_places(replayed):
    _, client, sample, _ = replayed
    for rv in sample.truth["revisits"]:
        earlier = search(client, stream="odom", near_x=rv["x"], near_y=rv["y"],
                         radius=HERE_RADIUS_M, before=rv["t"] - 10, k=3)
        assert earlier, f"no earlier visit found near {rv}"
        assert all(r["t"] <= rv["t"] - 10 for r in earlier)
    for nv in sample.truth["never_visited"]:
        assert not search(client, stream="odom", near_x=nv["x"], near_y=nv["y"],
                          radius=HERE_RADIUS_M), nv


def test_person_frames_near_the_door_in_the_right_window(replayed):
    _, client, sample, _ = replayed
    dx, dy = sample.door
    person = sample.person
    hits = search(client, stream="camera", near_x=dx, near_y=dy, radius=3.5,
                  tags={"person": True}, k=50)
    assert hits, "no person seen near the door"
    for h in hits:
        assert person["t_start"] - 1 <= h["t"] <= person["t_end"] + 1, h
    # The semantic form the agent would use finds them first, filtered to the same window.
    sem = search(client, stream="camera", semantic_query="one person standing",
                 near_x=dx, near_y=dy, radius=3.5, after=person["t_start"] - 1,
                 before=person["t_end"] + 1, k=3)
    assert sem and any(r["tags"].get("person") for r in sem)


def test_temporal_filters_exclude_what_they_must(replayed):
    _, client, _, _ = replayed
    now = client.now()
    recent = search(client, stream="camera", after_seconds_ago=30, k=100)
    old = search(client, stream="camera", before_seconds_ago=120, k=100)
    everything = search(client, stream="camera", k=100)
    assert recent and old and len(everything) > len(recent) + len(old)
    assert all(r["t"] >= now - 30 for r in recent)
    assert all(r["t"] <= now - 120 for r in old)
    window = search(client, stream="camera", after_seconds_ago=120, before_seconds_ago=30,
                    k=100)
    assert {r["id"] for r in window}.isdisjoint({r["id"] for r in recent + old})


def _mcp_ids(args: dict) -> list[int]:
    """query_memory through the official MCP client, memory-mcp --ros over stdio."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def run() -> str:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "memory_node.agent.mcp_server", "--ros"],
            env=dict(os.environ))
        async with (stdio_client(params) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            res = await session.call_tool("query_memory", args)
            assert not res.is_error, res
            return res.content[0].text

    text = anyio.run(run)
    return [int(m) for m in re.findall(r"^#(\d+) ", text, re.MULTILINE)]


def test_mcp_answers_equal_ros_answers(replayed):
    _, client, sample, _ = replayed
    dx, dy = sample.door
    queries = [
        {"stream": "camera", "semantic_query": "bright window", "k": 5},
        {"stream": "camera", "near_x": dx, "near_y": dy, "radius": 2.5, "k": 5},
        {"stream": "camera", "semantic_query": "a person", "near_x": dx, "near_y": dy,
         "radius": 3.0, "after_seconds_ago": 200, "k": 4},
    ]
    skills = {s.name: s for s in get_skills(client)}
    for q in queries:
        ros_ids = [r["id"] for r in search(client, **q)]
        assert ros_ids
        assert _mcp_ids(q) == ros_ids
        skill_ids = [int(m) for m in re.findall(r"^#(\d+) ", skills["query_memory"].call(**q),
                                                re.MULTILINE)]
        assert skill_ids == ros_ids


def test_results_identical_after_restart(replayed):
    session, client, sample, tmp = replayed
    dx, dy = sample.door
    queries = [
        {"semantic_query": "bright scene", "k": 5},
        {"stream": "camera", "near_x": dx, "near_y": dy, "radius": 2.0, "k": 10},
        {"stream": "lidar", "after": sample.truth["epoch"] + 60, "k": 5, "order_by": "time"},
        {"stream": "camera", "order_by": "-brightness", "k": 3},
    ]
    before = [search(client, **q) for q in queries]
    session.stop()
    session.start()  # same store, no replay
    after = [search(client, **q) for q in queries]
    assert after == before

