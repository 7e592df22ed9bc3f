"""The recorder's policy driven offline, as a bag importer drives it: plain duck-typed messages
(the fields a bag reader's deserialized messages have), the bag's receive times as the clock,
no rclpy, no threads, no sleeping."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace as NS

import pytest
from engine_support import make_engine

from memory_node.core.recorder import RecorderPolicy


def stamp(t: float) -> NS:
    sec = math.floor(t)
    return NS(sec=sec, nanosec=round((t - sec) * 1e9))


def odom(x: float, t: float, frame: str = "odom", vx: float = 0.0, y: float = 0.0,
         yaw: float = 0.0) -> NS:
    q = NS(x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2))
    return NS(header=NS(stamp=stamp(t), frame_id=frame), child_frame_id="base_link",
              pose=NS(pose=NS(position=NS(x=x, y=y, z=0.0), orientation=q)),
              twist=NS(twist=NS(linear=NS(x=vx, y=0.0, z=0.0))))


def tf(parent: str, child: str, x: float, t: float, y: float = 0.0) -> NS:
    return NS(header=NS(stamp=stamp(t), frame_id=parent), child_frame_id=child,
              transform=NS(translation=NS(x=x, y=y, z=0.0),
                           rotation=NS(x=0.0, y=0.0, z=0.0, w=1.0)))


def rows(engine, stream: str = "odom") -> list[dict]:
    answer = engine.search_dict(json.dumps({"stream": stream, "k": 100, "order_by": "time"}))
    assert answer["ok"], answer
    return answer["results"]


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(tmp_path / "mem")
    yield eng
    eng.close()


T0 = 1_764_460_800.0


def test_a_message_waits_for_the_tf_that_comes_after_it(engine):
    """Odometry recorded a moment before its TF gets the map pose, not its odometry-frame one:
    the wait the node does on the wall clock happens on the bag's clock."""
    policy = RecorderPolicy.offline({"tf_wait_s": 2.0, "min_distance": 0.01}, engine)
    policy.on_odom(odom(0.0, T0), arrived_s=T0)
    assert policy.waiting == 1  # no TF yet, and it may still come
    policy.on_tf([tf("map", "base_link", 4.0, T0 - 0.1), tf("map", "base_link", 4.2, T0 + 0.1)],
                 arrived_s=T0 + 0.3)
    assert policy.waiting == 0
    [row] = rows(engine)
    assert (row["pose"]["frame"], row["pose"]["source"]) == ("map", "tf")
    assert row["pose"]["x"] == pytest.approx(4.1)


def test_without_tf_the_wait_runs_out_on_the_bags_clock(engine):
    """No TF at all: the first message waits tf_wait_s of bag time, then every message takes
    odometry in its own frame; flush() stores what is left."""
    policy = RecorderPolicy.offline({"tf_wait_s": 1.0, "min_distance": 0.01}, engine)
    for i in range(30):
        policy.on_odom(odom(0.1 * i, T0 + 0.1 * i), arrived_s=T0 + 0.1 * i)
    assert policy.waiting == 0  # decided once a second of bag time had passed
    policy.flush()
    got = rows(engine)
    assert len(got) == 30
    assert all((r["pose"]["frame"], r["pose"]["source"]) == ("odom", "odom") for r in got)
    assert [r["pose"]["x"] for r in got] == pytest.approx([0.1 * i for i in range(30)])
    assert policy.counters["odom"].tf_timeouts == 1  # one wait, not one per message


def test_the_keyframe_gate_and_counters_match_the_node(engine):
    """Same gate as the node: a keyframe per min_distance; the rest counted as skipped."""
    policy = RecorderPolicy.offline({"tf_wait_s": 0.0, "min_distance": 0.5,
                                     "max_interval": 100.0}, engine)
    for i in range(21):  # 2 m in 0.1 m steps
        policy.on_odom(odom(0.1 * i, T0 + 0.1 * i), arrived_s=T0 + 0.1 * i)
    policy.flush()
    c = policy.counters["odom"]
    assert (c.received, c.kept, c.skipped, c.stored) == (21, 5, 16, 5)
    assert [r["pose"]["x"] for r in rows(engine)] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])


def test_unknown_stream_and_parameters_are_refused(engine):
    from memory_node.core.config import ConfigError

    with pytest.raises(ConfigError, match="stamp_source"):
        RecorderPolicy.offline({"stamp_source": "gps"}, engine)
    policy = RecorderPolicy.offline({}, engine)
    with pytest.raises(ValueError, match="unknown stream"):
        policy.on_message("sonar", odom(0.0, T0), arrived_s=T0)
    assert rows(engine) == []


def test_the_policy_loads_without_rclpy():
    """An offline importer runs where no ROS is installed: nothing the policy imports pulls
    rclpy in."""
    import subprocess
    import sys

    code = ("import sys, memory_node.core.recorder, memory_node.core.pose_history; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('rclpy', 'rcl_interfaces', 'builtin_interfaces')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
