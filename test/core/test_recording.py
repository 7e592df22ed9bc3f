"""The recorder's policy without ROS and without sleeping: which pose a message gets while TF
is late, missing, mapless or cut by a clock jump, and how epochs follow a looping bag."""

from __future__ import annotations

import pytest

from memory_node.core.recording import PoseResolver, Timeline
from memory_node.core.types import Pose
from memory_node.wire.time_jump import TimeJumpDetector


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

    latest_tf_stamp: float | None = None  # only the node-clock tests give one

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


class LaggingTf(FakeTf):
    """TF read by a node whose /clock lags the recorder's: until wall time `caught_up_at` its
    buffer holds the last pass (stamps up to 830), after it the new pass's first seconds."""

    def __init__(self, clock: FakeClock, caught_up_at: float) -> None:
        super().__init__(clock)
        self.caught_up_at = caught_up_at

    @property
    def latest_tf_stamp(self) -> float:
        return 830.0 if self.clock.now < self.caught_up_at else 801.7

    def tf_pose_exact(self, stamp_s: float):
        if self.clock.now < self.caught_up_at:
            return None, False  # before the old pass's data: "past", never coming
        return Pose(5.05, 0.0), True


def test_tf_still_on_the_timeline_the_clock_jumped_back_from_is_waited_for():
    """The recorder's clock jumped back to 801.6; TF's reader has not seen the jump yet, so a
    frame stamped 801.52 is refused by the old buffer. It waits for TF to catch up instead of
    being stored without a pose."""
    clock = FakeClock()
    tf = LaggingTf(clock, caught_up_at=100.3)
    resolver = PoseResolver(tf, wait_s=2.0, clock=clock, sleep=clock.sleep,
                            node_clock=lambda: 801.6)
    pose, timed_out = resolver.resolve(801.52, arrived=clock.now)
    assert (pose.x, timed_out) == (5.05, False)
    assert clock.slept == pytest.approx(0.3, abs=0.02)


def test_tf_ahead_of_the_node_clock_for_good_costs_one_wait():
    """TF stamped 5 s ahead of the node clock (another machine's clock) and frames looked up
    on the node clock: one wait finds that out; later frames do not wait, until the node
    clock jumps back again."""
    clock = FakeClock()
    node = FakeClock()
    node.now = 500.0
    tf = FakeTf(clock)
    tf.latest_tf_stamp = 505.0
    tf.arrivals = [(99.0, 499.0, Pose(1.0, 0.0))]
    resolver = PoseResolver(tf, wait_s=2.0, clock=clock, sleep=clock.sleep,
                            node_clock=node)
    pose, timed_out = resolver.resolve(499.0, arrived=clock.now)
    assert pose.x == 1.0 and clock.slept == pytest.approx(2.0, abs=0.02)
    for _ in range(5):
        node.now += 0.1
        tf.latest_tf_stamp += 0.1
        resolver.resolve(499.0, arrived=clock.now)
    assert clock.slept == pytest.approx(2.0, abs=0.02)
    node.now, tf.latest_tf_stamp = 450.0, 460.0  # a jump back: waits are armed again
    resolver.resolve(449.0, arrived=clock.now)
    assert clock.slept == pytest.approx(4.0, abs=0.04)


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
