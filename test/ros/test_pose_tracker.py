"""The pose tracker's odometry fallback: the pose at a message's stamp, in the world frame."""

from __future__ import annotations

import math

import pytest
import rclpy
from geometry_msgs.msg import TransformStamped
from nav_msgs.msg import Odometry

from memory_node.core.recorder import ManualClock
from memory_node.ros.common import PoseTracker
from memory_node.wire.geometry import quaternion_from_yaw, seconds_to_stamp

# The tracker's clock in these tests: set by each test, so ages are exact and nothing sleeps.
T_NOW = 1_764_460_900.0


@pytest.fixture
def tracker():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("test_pose_tracker", context=ctx)
    clock = ManualClock(T_NOW)
    yield PoseTracker(node, "map", "base_link", None, tolerance_s=0.5, max_gap_s=1.0,
                      clock=clock, wall=clock)
    node.destroy_node()
    rclpy.shutdown(context=ctx)


def _odom(x, y, yaw, t):
    m = Odometry()
    m.header.frame_id = "odom"
    m.header.stamp = seconds_to_stamp(t)
    m.pose.pose.position.x, m.pose.pose.position.y = float(x), float(y)
    q = quaternion_from_yaw(yaw)
    o = m.pose.pose.orientation
    o.x, o.y, o.z, o.w = q
    return m


def _map_odom(x, y, t):
    ts = TransformStamped()
    ts.header.frame_id, ts.child_frame_id = "map", "odom"
    ts.header.stamp = seconds_to_stamp(t)
    ts.transform.translation.x, ts.transform.translation.y = float(x), float(y)
    ts.transform.rotation.w = 1.0
    return ts


def test_odometry_at_the_stamp_not_the_latest(tracker):
    for i in range(11):  # 1 m/s along +x, 10 Hz, turning from 0 to 1 rad
        tracker.on_odom(_odom(0.1 * i, 0.0, 0.1 * i, 100.0 + 0.1 * i))
    p = tracker.odom_at(100.25)
    assert p.source == "odom_interpolated" and p.frame == "odom"
    assert p.x == pytest.approx(0.25) and p.yaw == pytest.approx(0.25)
    assert tracker.odom_pose_at(100.25) == p  # no map -> odom known: odometry's own frame
    assert tracker.odom_at(101.3).x == pytest.approx(1.0)  # just newer: the latest
    assert tracker.odom_at(None).x == pytest.approx(1.0)
    assert tracker.odom_at(99.7).x == pytest.approx(0.0)  # just older: the oldest
    # Beyond the tolerance the history says nothing: odometry stopped, or another timeline.
    assert tracker.odom_at(101.6) is None and tracker.odom_at(99.4) is None


def test_odometry_put_in_the_world_through_map_odom_at_the_stamp(tracker):
    for i in range(11):
        tracker.on_odom(_odom(0.1 * i, 0.0, 0.0, 100.0 + 0.1 * i))
    tracker.buffer.set_transform(_map_odom(1.0, 2.0, 100.0), "tf", False)
    tracker.buffer.set_transform(_map_odom(5.0, 2.0, 101.0), "tf", False)  # relocalised
    early = tracker.odom_pose_at(100.25)
    assert (early.frame, early.source) == ("map", "odom_interpolated")
    assert early.x == pytest.approx(0.25 + 1.0 + 0.25 * 4.0) and early.y == pytest.approx(2.0)
    assert tracker.pose_at(100.25) == early  # no map -> base_link TF: odometry it is


def test_no_pose_invented_across_an_odometry_gap_and_bad_samples_ignored(tracker):
    tracker.on_odom(_odom(0.0, 0.0, 0.0, 100.0))
    tracker.on_odom(_odom(10.0, 0.0, 0.0, 105.0))  # 5 s of lost odometry
    assert tracker.odom_at(101.0).x == 0.0 and tracker.odom_at(104.5).x == 10.0
    tracker.on_odom(_odom(math.nan, 0.0, 0.0, 105.1))
    tracker.on_odom(_odom(7.0, 0.0, 0.0, 104.9))  # out of order
    assert tracker.odom_at(None).x == 10.0
    tracker.on_odom(_odom(-3.0, 0.0, 0.0, 10.0))  # time jumped back: history starts over
    assert tracker.odom_at(10.2).x == -3.0
    assert tracker.odom_at(104.0) is None  # a stamp of the old timeline: nothing known


# -- the pose for "now": read from /tf bytes, with its age ---------------------------------
def _tf_bytes(*edges):
    """A serialized /tf message of (parent, child, x, stamp) edges, as a raw subscription
    delivers it."""
    from rclpy.serialization import serialize_message
    from tf2_msgs.msg import TFMessage

    msg = TFMessage()
    for parent, child, x, t in edges:
        ts = TransformStamped()
        ts.header.frame_id, ts.child_frame_id = parent, child
        ts.header.stamp = seconds_to_stamp(t)
        ts.transform.translation.x = float(x)
        ts.transform.rotation.w = 1.0
        msg.transforms.append(ts)
    return serialize_message(msg)


def _joints(t, n=20):
    """A robot_state_publisher's worth of joint edges below base_link."""
    edges = [("base_link", "hip_0", 0.1, t)]
    edges += [(f"hip_{i}", f"hip_{i + 1}", 0.01 * i, t) for i in range(n - 1)]
    return edges


def test_current_pose_is_fresh_and_joint_edges_cost_nothing(tracker):
    now = tracker.clock()
    for i in range(50):
        t = now - 0.5 + 0.01 * i
        tracker.on_tf(_tf_bytes(("map", "odom", 1.0, t), ("odom", "base_link", 2.2, t),
                                *_joints(t)))
    pose = tracker.current_pose()
    assert pose.x == pytest.approx(3.2) and pose.source == "tf"
    assert pose.age_s is not None and pose.age_s < 0.2 and not pose.stale
    assert pose.to_dict()["age_s"] == pytest.approx(pose.age_s, abs=1e-3)
    stats = tracker.tf_stats()
    assert stats["tf_messages"] == 50
    assert stats["tf_edges"] == 100  # map->odom and odom->base_link only
    assert stats["tf_filtered"] == 50 * 20  # every joint edge dropped unread
    assert not tracker.buffer.has_frame("hip_3")


def test_pose_goes_stale_when_tf_stops(tracker):
    now = tracker.clock()
    tracker.on_tf(_tf_bytes(("map", "base_link", 1.0, now)))
    tracker.clock.set(now + 0.4)  # within max_pose_age_s (0.5)
    assert not tracker.current_pose().stale
    tracker.clock.set(now + 0.7)  # past it, no TF since
    pose = tracker.current_pose()
    assert pose.stale and pose.age_s == pytest.approx(0.7)
    assert pose.to_dict()["stale"] is True


def test_a_listener_that_falls_behind_reports_the_lag(tracker):
    """Stamps that arrive ever later than sent (a backlog) show as age; a constant offset (a
    publisher whose clock differs from ours) does not make every pose stale."""
    now = tracker.clock()
    skew = 100.0  # the publisher's clock runs 100 s behind ours
    tracker.on_tf(_tf_bytes(("map", "base_link", 1.0, now - skew)))
    assert tracker.current_pose().age_s == pytest.approx(0.0, abs=1e-6)  # skew alone is not age
    tracker.clock.set(now + 1.0)
    # the next sample was sent 50 ms after the first but reaches us a second later: a backlog
    tracker.on_tf(_tf_bytes(("map", "base_link", 1.2, now - skew + 0.05)))
    pose = tracker.current_pose()
    assert pose.x == pytest.approx(1.2)
    assert pose.stale and pose.age_s == pytest.approx(0.95)


def test_malformed_tf_bytes_are_counted_not_raised(tracker):
    tracker.on_tf(b"\x00\x01\x00\x00\xff\xff\xff\x7f")
    tracker.on_tf(b"garbage")
    assert tracker.tf_stats()["tf_malformed"] == 2
    assert tracker.current_pose() is None
def test_tf_before_the_first_clock_does_not_make_poses_stale():
    """use_sim_time: a simulator's /tf that arrives before its first /clock (node clock 0)
    must not count as 1.7e9 s of delay, which left every pose for "now" stale (and near_here
    unavailable) for the next 30 s of simulated time."""
    from rclpy.parameter import Parameter
    from rclpy.serialization import serialize_message
    from rclpy.time import Time
    from tf2_msgs.msg import TFMessage

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("test_pose_tracker_sim", context=ctx, parameter_overrides=[
        Parameter("use_sim_time", Parameter.Type.BOOL, True)])
    try:
        tracker = PoseTracker(node, "map", "base_link", None)
        clock = node.get_clock()

        def tf_at(t):  # the robot at (3, -1): map -> odom (1, 2), odom -> base (2, -3)
            base = _map_odom(2.0, -3.0, t)
            base.header.frame_id, base.child_frame_id = "odom", "base_link"
            return serialize_message(TFMessage(transforms=[_map_odom(1.0, 2.0, t), base]))

        t0 = 1_764_460_900.0
        assert node.get_clock().now().nanoseconds == 0  # no /clock yet
        tracker.on_tf(tf_at(t0))
        for i in range(1, 21):  # then /clock and /tf together at 20 Hz
            t = t0 + 0.05 * i
            clock.set_ros_time_override(Time(nanoseconds=int(t * 1e9)))
            tracker.on_tf(tf_at(t))
        pose = tracker.current_pose()
        assert pose.x == pytest.approx(3.0) and pose.y == pytest.approx(-1.0)
        assert pose.age_s < 0.1 and not pose.stale, pose
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def test_a_transform_stamped_just_ahead_of_the_clock_adds_no_age():
    """Under simulated time /clock updates at 50 Hz, so a /tf sample can be stamped a moment
    ahead of the node clock; that lead is not an offset to add to every later age."""
    from memory_node.core.pose_history import Freshness

    fresh = Freshness()
    t0 = 1000.0
    fresh.seen("base_link", t0, t0 - 0.2)  # stamped 0.2 s ahead of the clock
    for i in range(1, 40):  # then steady 20 Hz samples, each received when stamped
        fresh.seen("base_link", t0 + 0.05 * i, t0 + 0.05 * i)
    assert fresh.age("base_link", t0 + 0.05 * 39) == pytest.approx(0.0, abs=1e-9)


def test_tf_that_waited_in_a_busy_listeners_queue_shows_its_wait_as_age():
    """A listener that is behind from its very first /tf message (a process busy from the
    start) used to learn that wait as a clock offset and report an old pose as fresh: the
    middleware's receipt time now shows the wait as age, and the pose is stale."""
    import time

    from rclpy.executors import SingleThreadedExecutor
    from tf2_msgs.msg import TFMessage

    from memory_node.ros.common import MESSAGE_INFO

    assert MESSAGE_INFO  # every rclpy the tests run on (Kilted, Jazzy) passes MessageInfo
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("test_pose_tracker_queue", context=ctx)
    robot = rclpy.create_node("test_pose_tracker_robot", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    try:
        tracker = PoseTracker(node, "map", "base_link", None)
        executor.add_node(node)
        pub = robot.create_publisher(TFMessage, "/tf", 100)
        deadline = time.monotonic() + 10.0
        while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(8):  # 0.8 s of /tf at 10 Hz, stamped when sent, none read yet
            ts = _map_odom(1.0 + i, 0.0, time.time())
            ts.child_frame_id = "base_link"
            pub.publish(TFMessage(transforms=[ts]))
            time.sleep(0.1)
        executor.spin_once(timeout_sec=5.0)  # the listener reads its first, 0.8 s old
        pose = tracker.current_pose()
        assert pose is not None and pose.x == pytest.approx(1.0), pose
        assert pose.stale and 0.6 < pose.age_s < 5.0, pose
        for _ in range(7):  # then catches up: the newest is fresh again
            executor.spin_once(timeout_sec=5.0)
        assert tracker.tf_messages == 8
        pose = tracker.current_pose()
        assert pose.x == pytest.approx(8.0) and not pose.stale, pose
    finally:
        executor.shutdown()
        robot.destroy_node()
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def test_the_server_ages_poses_on_its_own_clock_not_on_a_held_up_listeners():
    """Under simulated time each node steps its clock from /clock on its own executor: when
    the TF listener's thread is held up, its clock stops with its newest /tf, and by that clock
    an old pose looks new. The server stamps notes on its own clock and ages poses on it too."""
    from rclpy.parameter import Parameter
    from rclpy.time import Time

    from memory_node.ros.server import MemoryServer

    sim = [Parameter("use_sim_time", Parameter.Type.BOOL, True)]
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    listener = rclpy.create_node("test_listener_held_up", context=ctx, parameter_overrides=sim)
    server = None
    try:
        tracker = PoseTracker(listener, "map", "base_link", None)
        server = MemoryServer(context=ctx, poses=tracker, parameter_overrides=sim,
                              advertise=False)
        t0 = T_NOW
        listener.get_clock().set_ros_time_override(Time(nanoseconds=int(t0 * 1e9)))
        tracker.on_tf(_tf_bytes(("map", "base_link", 1.0, t0)))
        server.get_clock().set_ros_time_override(Time(nanoseconds=int((t0 + 0.8) * 1e9)))
        assert not tracker.current_pose().stale  # by the listener's stopped clock: new
        pose = server.current_pose()
        assert pose.x == pytest.approx(1.0)
        assert pose.stale and pose.age_s == pytest.approx(0.8, abs=1e-6), pose
    finally:
        if server is not None:
            server.destroy_node()
        listener.destroy_node()
        rclpy.shutdown(context=ctx)
