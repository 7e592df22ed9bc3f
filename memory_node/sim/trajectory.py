"""The robot's tour of the flat (ground truth) and the drifting odometry it would measure.

The tour is a fixed list of straight moves and turns in place at Go2-like walking speeds. Its
nominal length is NOMINAL_DURATION seconds; a recording of another duration replays the same
route with time stretched or squeezed, so the person's visit, the door views and the revisits
happen at the same fractions of any recording.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

NOMINAL_DURATION = 150.0
WALK_SPEED = 0.5  # m/s
TURN_RATE = 1.0  # rad/s

# Where the robot stands to look at the front door and whoever stands beside it: the camera
# is 2.35 m (far) and 1.85 m (near) from the person, with the door and the person in view.
DOOR_VIEW_FAR = (3.2, 2.75)
DOOR_VIEW_NEAR = (2.7, 2.75)
DOOR_VIEW_TARGET = (0.0, 2.6)


def wrap(a: np.ndarray | float) -> np.ndarray | float:
    """Angle(s) to (-pi, pi]."""
    if isinstance(a, np.ndarray):
        return np.pi - np.mod(np.pi - a, 2 * np.pi)
    return math.pi - (math.pi - a) % (2 * math.pi)


@dataclass(frozen=True)
class Segment:
    """One piece of the tour: a straight move, a turn in place, or a pause (nominal times)."""

    kind: str
    t0: float
    t1: float
    start: tuple[float, float, float]
    end: tuple[float, float, float]


@dataclass
class Tour:
    """Piecewise ground-truth motion in nominal time, with named moments (`marks`)."""

    segments: list[Segment] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.segments[-1].t1 if self.segments else 0.0

    def pose(self, t: np.ndarray) -> np.ndarray:
        """(N, 3) x, y, yaw at nominal times t (clamped to the tour)."""
        t = np.clip(np.asarray(t, dtype=np.float64), 0.0, self.duration)
        t0 = np.array([s.t0 for s in self.segments])
        t1 = np.array([s.t1 for s in self.segments])
        a = np.array([s.start for s in self.segments])
        b = np.array([s.end for s in self.segments])
        i = np.clip(np.searchsorted(t0, t, side="right") - 1, 0, len(self.segments) - 1)
        span = np.maximum(t1[i] - t0[i], 1e-12)
        u = np.clip((t - t0[i]) / span, 0.0, 1.0)
        x = a[i, 0] + (b[i, 0] - a[i, 0]) * u
        y = a[i, 1] + (b[i, 1] - a[i, 1]) * u
        dyaw = wrap(b[i, 2] - a[i, 2])
        yaw = wrap(a[i, 2] + dyaw * u)
        return np.stack([x, y, yaw], axis=1)

    def within(self, x: float, y: float, radius: float) -> list[tuple[float, float]]:
        """The nominal-time spans with the robot within `radius` of (x, y), joined where one
        ends as the next begins, solved from the segments themselves: a move is a straight
        line at constant speed, inside a circle over one interval of its time (between the
        roots of |start + u (end - start) - centre|^2 = radius^2; a move that only touches
        the circle is not in it); a turn or a pause stands still, in or out throughout.
        Exact, with no sampling of the path."""
        spans: list[tuple[float, float]] = []
        for s in self.segments:
            ax, ay = s.start[0] - x, s.start[1] - y
            dx, dy = s.end[0] - s.start[0], s.end[1] - s.start[1]
            a = dx * dx + dy * dy
            b = 2.0 * (ax * dx + ay * dy)
            c = ax * ax + ay * ay - radius * radius
            if a < 1e-18:  # standing still
                if c > 0:
                    continue
                lo, hi = 0.0, 1.0
            else:
                disc = b * b - 4.0 * a * c
                if disc < 0:
                    continue
                root = math.sqrt(disc)
                lo, hi = max(0.0, (-b - root) / (2 * a)), min(1.0, (-b + root) / (2 * a))
                if lo >= hi:
                    continue
            t0, t1 = s.t0 + lo * (s.t1 - s.t0), s.t0 + hi * (s.t1 - s.t0)
            if spans and t0 - spans[-1][1] <= 1e-9:
                spans[-1] = (spans[-1][0], max(spans[-1][1], t1))
            else:
                spans.append((t0, t1))
        return spans


class TourBuilder:
    """Writes a tour as commands: go to a point, face a point, wait, mark a moment."""

    def __init__(self, x: float, y: float, yaw: float) -> None:
        self.tour = Tour()
        self.x, self.y, self.yaw = x, y, yaw
        self.t = 0.0

    def _add(self, kind: str, dt: float, x: float, y: float, yaw: float) -> None:
        start = (self.x, self.y, self.yaw)
        self.tour.segments.append(Segment(kind, self.t, self.t + dt, start, (x, y, yaw)))
        self.t += dt
        self.x, self.y, self.yaw = x, y, float(wrap(yaw))

    def turn_to(self, yaw: float) -> TourBuilder:
        d = float(wrap(yaw - self.yaw))
        if abs(d) > 1e-9:
            self._add("turn", abs(d) / TURN_RATE, self.x, self.y, self.yaw + d)
        return self

    def spin(self, angle: float) -> TourBuilder:
        """Turn in place by `angle` (may exceed pi), in steps the interpolation can follow."""
        steps = max(1, math.ceil(abs(angle) / (math.pi * 0.9)))
        for _ in range(steps):
            d = angle / steps
            self._add("turn", abs(d) / TURN_RATE, self.x, self.y, self.yaw + d)
        return self

    def face(self, x: float, y: float) -> TourBuilder:
        return self.turn_to(math.atan2(y - self.y, x - self.x))

    def go(self, x: float, y: float, speed: float = WALK_SPEED) -> TourBuilder:
        dist = math.hypot(x - self.x, y - self.y)
        if dist < 1e-9:
            return self
        self.face(x, y)
        self._add("move", dist / speed, x, y, self.yaw)
        return self

    def wait(self, dt: float) -> TourBuilder:
        if dt > 0:
            self._add("wait", dt, self.x, self.y, self.yaw)
        return self

    def mark(self, name: str) -> TourBuilder:
        self.tour.marks[name] = self.t
        return self


def build_tour() -> Tour:
    """Hallway -> kitchen -> living room (window) -> the front door while someone stands there
    -> bedroom -> the window again -> the front door again (nobody there) -> back to the spot
    where it first watched the door. Padded with a final pause to NOMINAL_DURATION."""
    b = TourBuilder(2.2, 1.0, math.pi / 2)
    b.wait(0.5)
    # kitchen
    b.go(2.5, 3.8).go(2.5, 5.3).go(1.7, 6.2)
    b.face(0.3, 6.2).wait(1.5).face(0.35, 7.7).wait(1.0)
    # living room, the window
    b.go(2.7, 6.7).go(4.6, 6.7).go(6.4, 6.1).mark("window_1").face(7.3, 8.0).wait(2.0)
    b.face(9.4, 7.4).wait(0.5)
    # back to the hallway, look at the front door (the person is there)
    b.go(4.4, 4.6).go(4.2, 3.8).go(3.0, 3.8).mark("door_approach_1")
    b.go(*DOOR_VIEW_FAR).face(*DOOR_VIEW_TARGET).mark("door_view_1").wait(2.0)
    b.go(*DOOR_VIEW_NEAR, speed=0.3).wait(2.5).mark("door_view_1_end")
    # bedroom through the living room
    b.go(3.0, 3.8).go(4.3, 4.3).go(8.5, 4.5).go(8.5, 2.4)
    b.go(7.0, 2.0).mark("bedroom_look_around").spin(2 * math.pi).wait(0.5)
    # the TV, the window again, then the door again
    b.go(8.5, 2.4).go(8.5, 5.2).face(10.0, 5.2).mark("tv").wait(1.5)
    b.go(6.4, 6.1).mark("window_2").face(7.3, 8.0).wait(1.5)
    b.go(4.4, 4.6).go(4.2, 3.8).go(3.0, 3.8)
    b.go(*DOOR_VIEW_FAR).face(*DOOR_VIEW_TARGET).mark("door_view_2").wait(2.0)
    b.go(*DOOR_VIEW_NEAR, speed=0.3).wait(1.0).mark("door_view_2_end")
    if b.t < NOMINAL_DURATION:
        b.wait(NOMINAL_DURATION - b.t)
    return b.tour


@dataclass(frozen=True)
class Trajectory:
    """The tour stretched to a recording of `duration` seconds (relative time from 0)."""

    tour: Tour
    duration: float

    @property
    def scale(self) -> float:
        return self.duration / self.tour.duration

    def pose(self, t: np.ndarray) -> np.ndarray:
        return self.tour.pose(np.asarray(t) / self.scale)

    def at_mark(self, name: str) -> float:
        return self.tour.marks[name] * self.scale

    def within(self, x: float, y: float, radius: float) -> list[tuple[float, float]]:
        """`Tour.within` on this recording's clock (relative seconds)."""
        return [(a * self.scale, b * self.scale) for a, b in self.tour.within(x, y, radius)]


@dataclass(frozen=True)
class OdometryTrack:
    """What the robot's leg odometry reports at each tick, in its `odom` frame."""

    t: np.ndarray  # (N,) relative seconds
    truth: np.ndarray  # (N, 3) ground-truth map pose of base_link
    odom: np.ndarray  # (N, 3) odom-frame pose of base_link (drifts)
    twist: np.ndarray  # (N, 3) measured body-frame vx, vy, wz
    map_to_odom: np.ndarray  # (N, 3) correction that makes map->base_link the truth


def compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SE(2) a * b for (N, 3) or (3,) poses."""
    a = np.atleast_2d(a)
    b = np.atleast_2d(b)
    c, s = np.cos(a[:, 2]), np.sin(a[:, 2])
    return np.stack(
        [
            a[:, 0] + c * b[:, 0] - s * b[:, 1],
            a[:, 1] + s * b[:, 0] + c * b[:, 1],
            wrap(a[:, 2] + b[:, 2]),
        ],
        axis=1,
    )


def invert(a: np.ndarray) -> np.ndarray:
    """SE(2) inverse of (N, 3) poses."""
    a = np.atleast_2d(a)
    c, s = np.cos(a[:, 2]), np.sin(a[:, 2])
    return np.stack([-c * a[:, 0] - s * a[:, 1], s * a[:, 0] - c * a[:, 1], wrap(-a[:, 2])], axis=1)


class Motion(Protocol):
    """What odometry is simulated from: poses over `duration` seconds."""

    @property
    def duration(self) -> float: ...

    def pose(self, t: np.ndarray) -> np.ndarray: ...


def simulate_odometry(
    traj: Motion, rate_hz: float, seed: int, substeps: int = 10
) -> OdometryTrack:
    """Integrate noisy body-frame increments of the true motion (seeded).

    A per-run scale error on distance and on turning, a small gyro bias and per-step noise:
    the odom pose wanders away from the truth by amounts that grow with time, as a legged
    robot's does. The odom frame starts at the robot's first pose.
    """
    rng = np.random.default_rng([seed, 1])
    n_ticks = int(math.floor(traj.duration * rate_hz + 1e-9)) + 1
    dt = 1.0 / rate_hz / substeps
    tf = np.arange((n_ticks - 1) * substeps + 1) * dt
    truth = traj.pose(tf)
    inc = compose(invert(truth[:-1]), truth[1:])  # body-frame increments
    dist_scale = 1.0 + rng.choice([-1.0, 1.0]) * rng.uniform(0.02, 0.05)
    turn_scale = 1.0 + rng.choice([-1.0, 1.0]) * rng.uniform(0.01, 0.03)
    gyro_bias = rng.choice([-1.0, 1.0]) * rng.uniform(0.001, 0.003)  # rad/s
    moving = (np.abs(inc[:, 0]) + np.abs(inc[:, 2])) > 1e-9
    meas = inc.copy()
    meas[:, 0] *= dist_scale
    meas[:, 1] = inc[:, 1] * dist_scale + 0.02 * np.abs(inc[:, 0]) * rng.normal(size=len(inc))
    meas[:, 0] += 0.01 * np.abs(inc[:, 0]) * rng.normal(size=len(inc))
    meas[:, 2] = inc[:, 2] * turn_scale + gyro_bias * dt * moving
    meas[:, 2] += 0.002 * np.abs(inc[:, 2]) * rng.normal(size=len(inc))
    # integrate: heading first, then positions with the heading at each step's start
    yaw = np.concatenate([[0.0], np.cumsum(meas[:, 2])])
    c, s = np.cos(yaw[:-1]), np.sin(yaw[:-1])
    x = np.concatenate([[0.0], np.cumsum(c * meas[:, 0] - s * meas[:, 1])])
    y = np.concatenate([[0.0], np.cumsum(s * meas[:, 0] + c * meas[:, 1])])
    odom_fine = np.stack([x, y, wrap(yaw)], axis=1)
    idx = np.arange(n_ticks) * substeps
    odom = odom_fine[idx]
    truth_t = truth[idx]
    # measured twist: mean body-frame velocity over the substeps before each tick
    vel = np.zeros((n_ticks, 3))
    if n_ticks > 1:
        per_tick = meas.reshape(n_ticks - 1, substeps, 3).sum(axis=1) / (substeps * dt)
        vel[1:] = per_tick
    map_to_odom = compose(truth_t, invert(odom))
    return OdometryTrack(tf[idx], truth_t, odom, vel, map_to_odom)
