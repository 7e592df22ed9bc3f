"""Which pose the recorder stores when TF is missing, or when the clock jumps back: never a
place in another frame or from another timeline. The recorder runs in process, fed through its
own callbacks, so each case is exact rather than a matter of message timing; where a case
depends on how long TF has been waited for, the recorder's wait clock is a test-set one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import rclpy
from geometry_msgs.msg import TransformStamped
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.serialization import serialize_message
from rclpy.time import Time
from tf2_msgs.msg import TFMessage
from waiting import wait_until

from memory_node.core.recorder import ManualClock
from memory_node.ros.common import MESSAGE_INFO, TF_LISTENER_NODE, pose_tracker_from_params
from memory_node.ros.recorder import MemoryRecorder
from memory_node.wire.geometry import seconds_to_stamp

TF_WAIT_S = 1.0


@contextmanager
def _running_recorder(root: Path, params: list[str],
                      wall: ManualClock | None = None) -> Iterator[MemoryRecorder]:
    """A recorder on its own context. With `wall`, its TF listener is a separate node (as in
    memory-node) whose wait clock is `wall`: waits for TF end only when the test moves it."""
    from engine_support import make_engine  # noqa: PLC0415 - test helper

    engine = make_engine(root)
    ctx = rclpy.Context()
    rclpy.init(args=["--ros-args", "-p", f"tf_wait_s:={TF_WAIT_S}", "-p", "min_distance:=0.01",
                     *params], context=ctx)
    listener = None
    poses = None
    if wall is not None:
        listener = rclpy.create_node(TF_LISTENER_NODE, context=ctx)
        poses = pose_tracker_from_params(listener, odom_topic=None, wall=wall)
    rec = MemoryRecorder(engine=engine, context=ctx, poses=poses)
    try:
        yield rec
    finally:
        rec.close()
        rec.destroy_node()
        if listener is not None:
            listener.destroy_node()
        rclpy.shutdown(context=ctx)
        engine.close()


@pytest.fixture
def recorder(tmp_path, request):
    with _running_recorder(tmp_path / "mem", getattr(request, "param", [])) as rec:
        yield rec


@pytest.fixture
def wall():
    """The recorder's wait clock (monotonic seconds), moved by the test."""
    return ManualClock(time.monotonic())


@pytest.fixture
def recorder_on_wall(tmp_path, request, wall):
    """A recorder whose waits for TF run on `wall`."""
    with _running_recorder(tmp_path / "mem", getattr(request, "param", []), wall) as rec:
        yield rec


def _gate_took_all(rec: MemoryRecorder) -> bool:
    """Whether the gate thread has taken every message received so far (it is deciding or
    waiting on the last one)."""
    return rec.stats()["pending"] == 0


def _all_gated(rec: MemoryRecorder, stream: str) -> bool:
    """Whether the gate has decided every message of `stream` received so far (none held)."""
    c = rec.counters[stream]
    return _gate_took_all(rec) and c.received == c.kept + c.skipped + c.dropped + c.failed


def _odom(x: float, t: float) -> Odometry:
    m = Odometry()
    m.header.frame_id = "odom"
    m.header.stamp = seconds_to_stamp(t)
    m.pose.pose.position.x = float(x)
    m.pose.pose.orientation.w = 1.0
    return m


def _tf(parent: str, child: str, x: float, t: float) -> bytes:
    """A /tf message as it arrives on the wire (the listener reads raw bytes)."""
    ts = TransformStamped()
    ts.header.frame_id, ts.child_frame_id = parent, child
    ts.header.stamp = seconds_to_stamp(t)
    ts.transform.translation.x = float(x)
    ts.transform.rotation.w = 1.0
    return serialize_message(TFMessage(transforms=[ts]))


def _odom_rows(rec: MemoryRecorder) -> list[dict]:
    assert rec.drain(30.0)
    answer = rec.engine.ask_search(json.dumps({"stream": "odom", "k": 100,
                                               "order_by": "time"})).model_dump()
    assert answer["ok"], answer
    return answer["results"]


def test_first_message_waits_for_its_tf_however_late_the_robot_starts(recorder_on_wall,
                                                                        wall):
    """A replay (or a robot) that starts long after the recorder: its first odometry arrives a
    moment before its first TF. The message waits and gets its map pose, not its odometry-frame
    one, which a map-frame "near" query would take for a place the robot has never been."""
    recorder = recorder_on_wall
    wall.set(wall() + 100 * TF_WAIT_S)  # well after the recorder came up
    t0 = time.time()
    recorder._on_odom(_odom(0.0, t0))
    # The gate holds it for its TF (the wait clock stands still: the wait cannot run out).
    wait_until(lambda: _gate_took_all(recorder), "the gate to take the message")
    recorder.poses.on_tf(_tf("map", "base_link", 4.0, t0))
    [row] = _odom_rows(recorder)
    assert (row["pose"]["frame"], row["pose"]["source"], row["pose"]["x"]) == ("map", "tf", 4.0)


def test_odometry_in_its_own_frame_on_a_robot_without_tf(recorder):
    """No TF at all (no map): the contract's fallback, odometry, labelled with its own frame;
    and only the first message waits for TF, not each in turn."""
    t0 = time.time()
    started = time.monotonic()
    for i in range(6):
        recorder._on_odom(_odom(0.5 * i, t0 + 0.1 * i))
    rows = _odom_rows(recorder)
    waited = time.monotonic() - started
    assert [r["pose"]["x"] for r in rows] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert all((r["pose"]["frame"], r["pose"]["source"]) == ("odom", "odom") for r in rows)
    assert waited < 3 * TF_WAIT_S, f"each message waited for TF: {waited:.1f} s"


def test_no_wait_for_tf_that_cannot_come(recorder):
    """A message stamped before the first transform (a bag whose sensors start a moment before
    its TF), or inside a gap of lost /tf samples: no later /tf fills that, so the message takes
    the fallback at once (TF within the tolerance, else odometry) instead of waiting."""
    t0 = time.time()
    for i in range(5):
        recorder.poses.on_tf(_tf("map", "base_link", 1.0 + 0.1 * i, t0 + 0.05 + 0.1 * i))
    recorder._on_odom(_odom(0.0, t0))  # 50 ms before the first transform
    recorder.poses.on_tf(_tf("map", "base_link", 9.0, t0 + 3.0))  # 2.6 s of /tf lost
    recorder._on_odom(_odom(0.0, t0 + 1.5))  # inside the gap
    rows = _odom_rows(recorder)
    assert recorder.counters["odom"].tf_timeouts == 0
    assert [(r["pose"]["source"], r["pose"]["x"]) for r in rows] == [("tf", 1.0), ("odom", 0.0)]


def test_tf_without_the_map_does_not_hold_each_message(recorder_on_wall, wall):
    """A robot with odometry and odom -> base_link on /tf but no map (no SLAM running): TF keeps
    coming, yet never links map and base_link. Messages stop waiting for it after one
    `tf_wait_s` and take the odometry fallback, instead of each waiting in turn."""
    recorder = recorder_on_wall
    t0, w0 = time.time(), wall()
    for i in range(13):  # 2.5 tf_wait_s of TF and odometry at 5 Hz (of the wait clock)
        t = t0 + 0.2 * i
        wall.set(w0 + 0.2 * i)
        recorder.poses.on_tf(_tf("odom", "base_link", 0.5 * i, t))
        recorder._on_odom(_odom(0.5 * i, t))
        if wall() - w0 > TF_WAIT_S + 0.1:  # TF has flowed past tf_wait_s: no message waits
            wait_until(lambda: _all_gated(recorder, "odom"),
                       f"odometry message {i} gated without a wait for TF", timeout=10)
    rows = _odom_rows(recorder)
    assert len(rows) == 13
    assert all((r["pose"]["frame"], r["pose"]["source"]) == ("odom", "odom") for r in rows)
    assert recorder.counters["odom"].tf_timeouts <= 1  # not one wait per message


@pytest.mark.parametrize(
    ("recorder", "map_odom_x", "want_x", "want_frame"),
    [(["-p", "world_frame:=odom"], None, [0.0, 0.5, 1.0], "odom"),  # odometry is the world
     ([], 3.0, [3.0, 3.5, 4.0], "map")],  # put on the map through map -> odom
    ids=["world-frame-odom", "through-map-odom"], indirect=["recorder"])
def test_odometry_poses_in_the_world_frame(recorder, map_odom_x, want_x, want_frame):
    t0 = time.time()
    if map_odom_x is not None:
        recorder.poses.on_tf(_tf("map", "odom", map_odom_x, t0))
    for i in range(3):
        recorder._on_odom(_odom(0.5 * i, t0 + 0.1 * i))
    rows = _odom_rows(recorder)
    assert [r["pose"]["x"] for r in rows] == want_x
    assert all((r["pose"]["frame"], r["pose"]["source"]) == (want_frame, "odom") for r in rows)


def test_unstamped_messages_are_stamped_on_arrival(recorder):
    """A driver that leaves header.stamp zero: the row is filed at its arrival on the node
    clock and posed by TF at that time, not in 1970 nor by whatever TF came last."""
    t0 = time.time()
    recorder.poses.on_tf(_tf("map", "base_link", 1.0, t0 - 0.4))
    recorder.poses.on_tf(_tf("map", "base_link", 1.8, t0 + 0.4))  # 1 m/s along x
    recorder._on_odom(_odom(0.0, 0.0))
    [row] = _odom_rows(recorder)
    assert row["t"] == pytest.approx(t0, abs=0.3)
    assert row["pose"]["source"] == "tf"
    assert row["pose"]["x"] == pytest.approx(1.4 + (row["t"] - t0), abs=1e-3)


@pytest.mark.parametrize("recorder_on_wall", [["-p", "use_sim_time:=true"]], indirect=True)
def test_messages_from_before_a_time_jump_are_not_given_the_new_timeline_poses(
        recorder_on_wall):
    """A bag that loops: a message of the first pass, whether still waiting for its TF when the
    clock jumps back or delivered just after the jump, must not take a pose from the second pass
    (the first pass's TF and odometry are gone). It is dropped and counted; the second pass
    records with its own poses."""
    recorder = recorder_on_wall  # the wait clock stands still: the wait cannot run out

    def clock_at(seconds: float) -> None:
        """/clock as both nodes hear it: the recorder and its TF listener."""
        for node in (recorder.poses.node, recorder):
            node.get_clock().set_ros_time_override(Time(seconds=seconds))
    clock_at(829.6)
    recorder.poses.on_tf(_tf("map", "base_link", 5.0, 829.0))
    recorder.poses.on_tf(_tf("map", "base_link", 5.5, 829.5))
    recorder._on_odom(_odom(0.0, 829.9))  # its TF has not come yet: the gate waits for it
    wait_until(lambda: _gate_took_all(recorder), "the gate to take the message")
    clock_at(800.0)  # the bag starts over
    recorder.poses.on_tf(_tf("map", "base_link", 1.0, 800.0))
    recorder.poses.on_tf(_tf("map", "base_link", 1.2, 800.2))
    recorder._on_odom(_odom(0.0, 829.95))  # first pass, delivered after the jump
    recorder._on_odom(_odom(0.0, 800.1))
    rows = _odom_rows(recorder)
    assert recorder.counters["odom"].dropped == 2
    assert [(r["t"], r["pose"]["source"]) for r in rows] == [(pytest.approx(800.1), "tf")]
    assert rows[0]["pose"]["x"] == pytest.approx(1.1)


@pytest.mark.parametrize(("recorder", "found"), [([], True), (["-p", "stamp_source:=header"],
                                                              False)],
                         ids=["auto", "header"], indirect=["recorder"])
def test_simulator_header_times_beside_a_wall_clock_share_one_timeline(recorder, found):
    """A recording like a Nav2 simulation: header stamps ~930 s (simulator time), the node
    clock at wall time. By default (auto) rows are stored at their arrival on the node clock,
    posed through TF on the headers' timeline, so "the last 10 minutes" finds them, on the map.
    With stamp_source: header they keep their stamps, 56 years ago."""
    sim0 = 928.0
    recorder.poses.on_tf(_tf("map", "odom", 2.0, sim0))
    for i in range(6):
        t = sim0 + 0.5 * i
        recorder.poses.on_tf(_tf("map", "odom", 2.0, t))
        recorder.poses.on_tf(_tf("odom", "base_link", 0.6 * i, t))
        recorder._on_odom(_odom(0.6 * i, t))
    assert recorder.drain(30.0)
    now = time.time()
    answer = recorder.engine.ask_search(json.dumps({"stream": "odom", "after_seconds_ago": 600,
                                                    "k": 100, "order_by": "time"})).model_dump()
    assert answer["ok"], answer
    rows = answer["results"]
    if not found:
        assert rows == []
        return
    assert [r["pose"]["x"] for r in rows] == [2.0 + 0.6 * i for i in range(len(rows))]
    assert len(rows) >= 5  # keyframes every 0.5 m of travel (min_distance 0.01 here)
    assert all((r["pose"]["frame"], r["pose"]["source"]) == ("map", "tf") for r in rows)
    assert all(now - 60 < r["t"] <= now for r in rows)


def _tf_static(parent: str, child: str) -> bytes:
    return _tf(parent, child, 0.0, 0.0)


def test_go2_ros2_sdk_tf_topology_poses_rows_and_reports_the_kind_change(recorder):
    """go2_ros2_sdk: robot_state_publisher latches map -> odom and odom -> base_link as
    identities on /tf_static, the driver then publishes odom -> base_link on /tf. Rows get
    the driver's poses (not all (0, 0)), and /memory/recorder_stats says a frame changed kind."""
    recorder.poses.on_tf_static(_tf_static("map", "odom"))
    recorder.poses.on_tf_static(_tf_static("odom", "base_link"))
    t0 = time.time()
    for i in range(4):
        recorder.poses.on_tf(_tf("odom", "base_link", 0.5 * i, t0 + 0.1 * i))
        recorder._on_odom(_odom(0.5 * i, t0 + 0.1 * i))
    rows = _odom_rows(recorder)
    assert [(r["pose"]["x"], r["pose"]["frame"], r["pose"]["source"]) for r in rows] == [
        (0.5 * i, "map", "tf") for i in range(4)]
    tf_stats = recorder.stats()["tf"]
    assert tf_stats["tf_kind_changes"] == 1 and tf_stats["tf_rejected"] == {}
    json.dumps(recorder.stats())  # what goes out on /memory/recorder_stats


def _lidar_rows(rec: MemoryRecorder) -> list[dict]:
    assert rec.drain(30.0)
    answer = rec.engine.ask_search(json.dumps({"stream": "lidar", "k": 100,
                                               "order_by": "time"})).model_dump()
    assert answer["ok"], answer
    return answer["results"]


@pytest.mark.parametrize("recorder", [["-p", "lidar_topic:=/utlidar/cloud"]], indirect=True)
def test_a_lidar_clock_an_hour_off_without_tf_is_posed_by_odometry_at_arrival(recorder):
    """Issue 28's second case: no TF, odometry stamped on arrival, a lidar whose clock is an
    hour off. Its rows are stored at arrival time and posed from odometry at that time (they
    were all stored without a pose, and nothing said so)."""
    import numpy as np

    from memory_node.wire.pointcloud import make_cloud

    t0 = time.time()
    for i in range(12):
        t = time.time()  # odometry stamped on arrival
        recorder._on_odom(_odom(0.1 * i, t))
        if i % 3 == 2:
            recorder._on_sensor("lidar", make_cloud(np.array([[1.0, 0.0, 0.2]]),
                                                    "utlidar_lidar", t - 3600.0))
    rows = _lidar_rows(recorder)
    assert len(rows) == 4 and recorder.counters["lidar"].no_pose == 0
    assert all(r["pose"]["frame"] == "odom" and r["pose"]["source"].startswith("odom")
               for r in rows)
    assert all(abs(r["t"] - t0) < 30 for r in rows)  # the node clock, not an hour ago


def test_unstamped_odometry_that_waited_in_the_queue_is_stored_at_its_arrival(recorder):
    """A driver that leaves stamps zero (unitree_ros2's odometry): its messages are stamped on
    arrival. A busy process reaches them late; they are stored when the middleware received
    them, not when their callback ran (1.5 s later: each row would have been stored 1.5 s of
    travel away from where the robot was at its time)."""
    assert MESSAGE_INFO  # every distro tested here hands callbacks their MessageInfo
    topic = recorder.settings["odom_topic"]
    driver = rclpy.create_node("unstamped_driver", context=recorder.context)
    try:
        pub = driver.create_publisher(Odometry, topic, 10)
        wait_until(lambda: pub.get_subscription_count() > 0, "the recorder subscribed",
                   timeout=10.0)
        sent = []
        for i in range(5):  # the recorder does not spin: each waits in its queue
            sent.append(time.time())
            pub.publish(_odom(float(i), 0.0))
            time.sleep(0.2)
        time.sleep(1.5)
        spun = time.time()
        executor = SingleThreadedExecutor(context=recorder.context)
        executor.add_node(recorder)
        deadline = time.monotonic() + 10.0
        while recorder.counters["odom"].received < 5 and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        executor.remove_node(recorder)
        executor.shutdown()
    finally:
        driver.destroy_node()
    rows = _odom_rows(recorder)
    assert [r["pose"]["x"] for r in rows] == [0.0, 1.0, 2.0, 3.0, 4.0], rows
    late = [r["t"] - s for r, s in zip(rows, sent, strict=True)]
    assert all(-0.05 < d < 0.15 for d in late), (late, spun - sent[-1])
