"""The pose history without ROS, fed as the Go2 drivers feed it: go2_ros2_sdk's URDF identities
on /tf_static first, then the driver's odometry (and SLAM's map -> odom) on /tf."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest

from memory_node.core.pose_history import ClockRate, Freshness, PoseHistory

T0 = 1_764_460_800.0


class Log:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, m: str) -> None:
        self.lines.append(("info", m))

    def warning(self, m: str) -> None:
        self.lines.append(("warning", m))

    def debug(self, m: str) -> None:
        self.lines.append(("debug", m))

    def warnings(self) -> list[str]:
        return [m for level, m in self.lines if level == "warning"]


def tf(parent: str, child: str, t: float, x: float = 0.0, y: float = 0.0,
       yaw: float = 0.0) -> NS:
    sec = math.floor(t)
    return NS(header=NS(stamp=NS(sec=sec, nanosec=round((t - sec) * 1e9)), frame_id=parent),
              child_frame_id=child,
              transform=NS(translation=NS(x=x, y=y, z=0.0),
                           rotation=NS(x=0.0, y=0.0, z=math.sin(yaw / 2), w=math.cos(yaw / 2))))


URDF_STATICS = [tf("map", "odom", 0.0), tf("odom", "base_link", 0.0),
                tf("base_link", "Head_upper", 0.0, x=0.285)]


@pytest.fixture
def history():
    clock = NS(now=T0)
    log = Log()
    h = PoseHistory("map", "base_link", 0.5, clock=lambda: clock.now, wall=lambda: clock.now,
                    logger=log)
    h.clock_box, h.logged = clock, log  # type: ignore[attr-defined]
    return h


def test_driver_odometry_wins_over_the_urdf_identity_and_is_said_once(history):
    history.on_tf(URDF_STATICS, is_static=True)
    for i in range(20):  # the driver at ~17 Hz, 0.5 m/s along x
        t = T0 + i / 17
        history.clock_box.now = t
        history.on_tf([tf("odom", "base_link", t, x=0.5 * i / 17)])
    pose = history.tf_pose_at(T0 + 10 / 17)
    assert (pose.x, pose.frame, pose.source) == (pytest.approx(0.5 * 10 / 17), "map", "tf")
    stats = history.tf_stats()
    assert stats["tf_kind_changes"] == 1 and stats["tf_edges"] == 20
    assert stats["tf_rejected"] == {}
    [warning] = history.logged.warnings()
    assert "'base_link'" in warning and "/tf " in warning and "/tf_static" in warning
    assert "dynamic" in warning and "static" in warning


def test_with_slam_both_dynamic_edges_compose(history):
    history.on_tf(URDF_STATICS, is_static=True)
    for i in range(50):  # SLAM at 50 Hz: map -> odom drifts along y; the driver at ~17 Hz
        t = T0 + 0.02 * i
        history.clock_box.now = t
        edges = [tf("map", "odom", t, y=0.01 * i)]
        if i % 3 == 0:
            edges.append(tf("odom", "base_link", t, x=0.5 * 0.02 * i))
        history.on_tf(edges)
    pose = history.tf_pose_at(T0 + 0.6)
    assert pose.x == pytest.approx(0.3) and pose.y == pytest.approx(0.3)
    assert history.tf_stats()["tf_kind_changes"] == 2
    assert len(history.logged.warnings()) == 2  # one per frame: odom and base_link


def test_rejections_are_counted_by_reason(history):
    history.on_tf([tf("", "a", T0), tf("b", "b", T0), tf("odom", "base_link", T0)])
    history.on_tf(b"\x00\x01\x00\x00\xff\xff\xff\x7f")  # bytes that are no TFMessage
    history.clock_box.now = T0 + 100
    history.on_tf([tf("odom", "base_link", T0 + 100)])
    history.on_tf([tf("odom", "base_link", T0 + 1)])  # older than the cache window
    assert history.tf_stats()["tf_rejected"] == {"empty_frame": 1, "self_transform": 1,
                                                 "older_than_cache": 1,
                                                 "malformed_message": 1}


def test_a_looping_bag_read_before_its_clock_jump_keeps_its_first_poses(history):
    """A bag played twice: the second pass's first /tf messages are read while the node clock
    still stands at the end of the first (/tf and /clock are separate topics). The jump back
    keeps them, so a camera frame stamped in that first second is posed from TF; one stamped
    in the first pass's last seconds is not posed from the old pass."""
    history.on_tf([tf("map", "odom", 0.0)], is_static=True)
    for i in range(301):  # pass 1: 30 s at 10 Hz, 0.1 m/s along x
        t = T0 + i / 10
        history.clock_box.now = t
        history.on_tf([tf("odom", "base_link", t, x=0.1 * (t - T0))])
    for i in range(16):  # pass 2's first 1.5 s, read before the clock says so
        t = T0 + i / 10
        history.on_tf([tf("odom", "base_link", t, x=5.0 + 0.1 * (t - T0))])
    assert history.tf_pose_exact(T0 + 0.52)[0] is None  # refused: older than the cache
    history.clock_box.now = T0 + 1.5  # /clock jumps back
    history.on_tf([tf("odom", "base_link", T0 + 1.6, x=5.16)])
    pose, _ = history.tf_pose_exact(T0 + 0.52)
    assert pose is not None and pose.frame == "map"
    assert pose.x == pytest.approx(5.052)
    assert history.tf_pose_exact(T0 + 25.0) == (None, True)  # the old pass is gone
    assert history.latest_tf_stamp == pytest.approx(T0 + 1.6)
    said = [m for m in history.logged.warnings() if "time jumped back" in m]
    assert said == ["time jumped back: TF buffer cleared, keeping the 16 transform(s) of the "
                    "new timeline read before its clock"]


def test_a_queue_already_behind_at_its_first_sample_shows_as_age():
    """A busy host whose /tf queue is 0.8 s behind from the first sample on: with the wait the
    middleware measured, that is age (a stale pose), not a clock offset learnt once and
    subtracted from every later age; a publisher on another clock, read at once, is not."""
    t0 = 1000.0
    behind, skewed = Freshness(), Freshness()
    for i in range(40):  # 2 s of 20 Hz samples
        now = t0 + 0.05 * i
        behind.seen("base_link", now - 0.8, now, queued_s=0.8)
        skewed.seen("base_link", now - 100.0, now)  # stamps 100 s behind ours, no queue wait
    now = t0 + 0.05 * 39
    assert behind.age("base_link", now) == pytest.approx(0.8)
    assert skewed.age("base_link", now) == pytest.approx(0.0, abs=1e-9)


def test_clock_rate_reads_a_replays_speed_and_starts_over_after_a_jump_back():
    rate = ClockRate()
    assert rate.update(10.0, 0.0) == 1.0  # no /clock yet: the wall clock's own rate
    for i in range(31):  # 3 s of wall time, a replay at 2x under simulated time
        rate.update(10.0 + 0.1 * i, 500.0 + 0.2 * i)
    assert rate.rate == pytest.approx(2.0)
    rate.update(13.1, 100.0)  # the replay looped: the span starts again, the rate is kept
    assert rate.rate == pytest.approx(2.0)
    for i in range(1, 12):  # then paused
        rate.update(13.1 + 0.1 * i, 100.0)
    assert rate.rate == pytest.approx(0.0)


def test_a_queue_wait_in_wall_seconds_counts_at_the_clocks_rate(history):
    """A replay at 2x under simulated time: a /tf message that waited 0.4 wall seconds in the
    listener's queue is 0.8 s of node-clock age."""
    box = history.clock_box
    wall = {"t": 100.0}
    history.wall = lambda: wall["t"]
    for i in range(40):  # 2 s of wall time, 4 s of node clock; each message waited 0.4 s
        wall["t"] += 0.05
        box.now += 0.1
        history.on_tf([tf("map", "base_link", box.now - 0.8, x=float(i))],
                      queued_wall_s=0.4)
    pose = history.current_pose()
    assert pose.x == pytest.approx(39.0)
    assert pose.stale and pose.age_s == pytest.approx(0.8), pose


def test_tf_read_late_after_a_replay_ends_does_not_age_the_pose(history):
    """A replay at 2x into a listener that falls behind in its last second: the replay ends,
    its clock stands at the last message's time, and the listener then reads the /tf messages
    left in its queue. Each waited up to a wall second, but the node clock did not run on
    through that wait (the replay had ended), so the wait is no age and no clock offset: the
    robot's pose stays fresh while the clock stands, however long, and goes stale only once
    the clock runs on without TF. (A wait converted at the replay's 2x rate was learnt as a
    -2 s offset, and every pose after it was 2 s old.)"""
    box = history.clock_box
    wall = {"t": 100.0}
    history.wall = lambda: wall["t"]
    for _ in range(400):  # 10 s of 40 Hz /tf at 2x (5 wall seconds), each read on time
        wall["t"] += 0.0125
        box.now += 0.025
        history.on_tf([tf("map", "base_link", box.now, x=1.0)])
    late = []
    for _ in range(40):  # the last wall second: the listener is held up, /clock still moves
        wall["t"] += 0.0125
        box.now += 0.025
        late.append((box.now, wall["t"]))
    end = box.now  # the replay's last /clock
    wall["t"] += 1.0  # the listener is still held up for a second after the replay's end
    for stamp, received in late:  # read after the end, each after its wait in the queue
        wall["t"] += 0.002
        history.on_tf([tf("map", "base_link", stamp, x=2.0)],
                      queued_wall_s=wall["t"] - received)
    pose = history.current_pose(end)
    assert pose.x == pytest.approx(2.0)
    assert not pose.stale and pose.age_s == pytest.approx(0.0, abs=0.05), pose
    wall["t"] += 60.0  # a minute later, the replay still finished: the clock stands still
    pose = history.current_pose(end)
    assert not pose.stale and pose.age_s == pytest.approx(0.0, abs=0.05), pose
    # A robot whose TF stops on a running clock still goes stale.
    pose = history.current_pose(end + 0.8)
    assert pose.stale and pose.age_s == pytest.approx(0.8, abs=0.05), pose
