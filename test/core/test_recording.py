"""The recorder's policy without ROS and without sleeping: which pose a message gets while TF
is late, missing, mapless or cut by a clock jump, and how epochs follow a looping bag."""

from __future__ import annotations

import pytest

from memory_node.core.recording import PoseResolver, TimeJumpDetector, Timeline
from memory_node.core.types import Pose


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


class FakeTf:
    """TF as the resolver sees it: transforms by stamp, arriving at given clock times."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.arrivals: list[tuple[float, float, Pose]] = []  # (arrives at, stamp, pose)
        self.first_stamp: float | None = None
        self.links_world = True
        self.fallback = Pose(-1.0, -1.0, frame="odom", source="odom")
        self.last_tf_wall: float | None = None
        self.first_tf_wall: float | None = None
        self.latest_odom_stamp: float | None = None  # no odometry unless a test adds it

    def _arrived(self) -> list[tuple[float, float, Pose]]:
        got = [a for a in self.arrivals if a[0] <= self.clock.now]
        if got:
            self.first_tf_wall = got[0][0]
            self.last_tf_wall = got[-1][0]
        return got

    def tf_pose_exact(self, stamp_s: float):
        got = self._arrived()
        if not self.links_world:
            return None, True
        for _, stamp, pose in got:
            if stamp == stamp_s:
                return pose, True
        if got and stamp_s < got[0][1]:
            return None, False  # before the first sample: later /tf never covers it
        return None, True

    def pose_at(self, stamp_s: float):
        return self.fallback

    def has_world_pose(self) -> bool:
        return self.links_world and bool(self._arrived())

    def has_moving_world_pose(self) -> bool:
        return self.has_world_pose()


@pytest.fixture
def setup():
    clock = FakeClock()
    tf = FakeTf(clock)
    return clock, tf, PoseResolver(tf, wait_s=2.0, clock=clock, sleep=clock.sleep)


def test_a_transform_that_comes_late_is_waited_for(setup):
    clock, tf, resolver = setup
    tf.arrivals = [(99.0, 50.0, Pose(0.0, 0.0)), (100.5, 51.0, Pose(3.0, 4.0))]
    pose, timed_out = resolver.resolve(51.0, arrived=100.0)
    assert (pose.x, pose.y, timed_out) == (3.0, 4.0, False)
    assert clock.slept == pytest.approx(0.5, abs=0.02)


def test_no_tf_at_all_costs_one_wait_not_one_per_message(setup):
    clock, tf, resolver = setup
    tf.arrivals = [(50.0, 10.0, Pose(0.0, 0.0))]  # TF came once, long ago, then stopped
    pose, timed_out = resolver.resolve(20.0, arrived=clock.now)
    assert pose is tf.fallback and timed_out
    waited = clock.slept
    assert waited == pytest.approx(2.0, abs=0.02)
    for i in range(5):
        pose, timed_out = resolver.resolve(21.0 + i, arrived=clock.now)
        assert pose is tf.fallback and not timed_out
    assert clock.slept == waited  # no further waiting


def test_tf_without_the_world_frame_stops_being_waited_for(setup):
    clock, tf, resolver = setup
    tf.links_world = False  # odom -> base_link flows, map never appears
    tf.arrivals = [(100.0 + 0.1 * i, 10.0 + 0.1 * i, Pose(0.0, 0.0)) for i in range(100)]
    resolver.resolve(10.0, arrived=clock.now)  # waits out once
    before = clock.slept
    clock.now += 0.5  # TF has flowed longer than wait_s without linking map and base
    pose, timed_out = resolver.resolve(13.0, arrived=clock.now)
    assert pose is tf.fallback and not timed_out
    assert clock.slept == before


def test_a_stamp_before_the_first_transform_is_not_waited_for(setup):
    clock, tf, resolver = setup
    tf.arrivals = [(99.0, 50.0, Pose(0.0, 0.0))]
    pose, timed_out = resolver.resolve(49.9, arrived=clock.now)
    assert pose is tf.fallback and not timed_out and clock.slept == 0.0


def test_a_clock_jump_ends_the_wait(setup):
    clock, tf, resolver = setup
    tf.arrivals = [(99.0, 50.0, Pose(0.0, 0.0))]
    calls = []

    def cancelled() -> bool:
        calls.append(clock.now)
        return len(calls) > 3

    pose, timed_out = resolver.resolve(55.0, arrived=clock.now, cancelled=cancelled)
    assert not timed_out and clock.slept < 0.1


def test_one_jump_detector_with_a_threshold():
    jump = TimeJumpDetector(1.0)
    assert not any(jump.jumped_back(t) for t in (10.0, 11.0, 10.5, 12.0))  # disorder only
    assert jump.jumped_back(5.0)
    assert not jump.jumped_back(5.5)
    with pytest.raises(ValueError):
        TimeJumpDetector(-1.0)


def test_timeline_epochs_follow_a_looping_bag():
    line = Timeline()
    assert not line.observe(829.0)
    assert line.epoch_of(829.0, 829.0) == 0
    assert line.observe(800.0)  # the bag restarted
    assert line.epoch == 1 and line.jumped_from == 829.0
    # a first-pass message (stamp 829.9) delivered after the jump belongs to the old epoch
    assert line.epoch_of(829.9, 800.1) == 0
    assert line.epoch_of(800.1, 800.1) == 1
