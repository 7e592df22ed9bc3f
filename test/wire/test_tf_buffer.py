"""TF buffer and geometry helpers against analytic poses.

The scene: map -> odom (static offset), odom -> base_link (robot driving a circle, 20 Hz on
/tf), base_link -> camera and base_link -> laser (static mounts), plus a second dynamic branch
in some tests. Expected poses come from 4x4 matrices built here with cos/sin, not from the
code under test. The package uses this buffer on every machine (the one TF path).
"""

from __future__ import annotations

import math
import random
import threading

import numpy as np
import pytest
from geometry_msgs.msg import TransformStamped
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_node.wire.geometry import (
    matrix_from_quaternion,
    normalize_angle,
    quaternion_angle,
    quaternion_from_euler,
    quaternion_from_matrix,
    quaternion_from_yaw,
    quaternion_multiply,
    quaternion_rotate,
    quaternion_slerp,
    seconds_to_stamp,
    seconds_to_stamp_parts,
    stamp_to_seconds,
    transform_matrix,
    yaw_from_quaternion,
)
from memory_node.wire.tf_buffer import (
    ConnectivityError,
    ExtrapolationError,
    Transform,
    TransformBuffer,
    TransformError,
    make_transform_stamped,
)

# -- the analytic scene ------------------------------------------------------------------
T0, T1, HZ = 100.0, 120.0, 20
RADIUS, OMEGA, PHASE = 2.0, 0.5, 2.5  # heading crosses +-pi near t = 110.7 and 123.3
SAGITTA = RADIUS * (OMEGA / HZ) ** 2 / 8 * 1.01  # chord vs. arc between two samples


def rot_x(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=float)


def rot_y(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=float)


def rot_z(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=float)


def homogeneous(rot: np.ndarray, trans: tuple[float, float, float]) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = rot
    out[:3, 3] = trans
    return out


MAP_ODOM = homogeneous(rot_z(0.3), (1.0, -2.0, 0.0))
BASE_CAMERA = homogeneous(rot_z(-math.pi / 2) @ rot_x(-math.pi / 2), (0.3, 0.0, 0.5))
BASE_LASER = homogeneous(rot_z(math.pi) @ rot_y(0.1), (0.1, 0.05, 0.2))


def odom_base(t: float) -> np.ndarray:
    a = OMEGA * (t - T0) + PHASE
    return homogeneous(rot_z(a + math.pi / 2), (RADIUS * math.cos(a), RADIUS * math.sin(a), 0.0))


def expected(frame_to: str, frame_from: str, t: float) -> np.ndarray:
    """T_to_from from the analytic scene (map is the root)."""
    in_map = {
        "map": np.eye(4),
        "odom": MAP_ODOM,
        "base_link": MAP_ODOM @ odom_base(t),
        "camera": MAP_ODOM @ odom_base(t) @ BASE_CAMERA,
        "laser": MAP_ODOM @ odom_base(t) @ BASE_LASER,
    }
    return np.linalg.inv(in_map[frame_to]) @ in_map[frame_from]


def ts_from_matrix(parent: str, child: str, m: np.ndarray, t: float) -> TransformStamped:
    return make_transform_stamped(parent, child, Transform.from_matrix(m), t)


def sample_times(start: float = T0, end: float = T1, hz: int = HZ) -> list[float]:
    n = round((end - start) * hz)
    return [start + i / hz for i in range(n + 1)]


def fill_scene(buf: TransformBuffer, start: float = T0, end: float = T1) -> None:
    buf.set_transform(ts_from_matrix("map", "odom", MAP_ODOM, 0.0), "test", is_static=True)
    buf.set_transform(ts_from_matrix("base_link", "camera", BASE_CAMERA, 0.0), "t", True)
    buf.set_transform(ts_from_matrix("base_link", "laser", BASE_LASER, 0.0), "t", True)
    for t in sample_times(start, end):
        buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(t), t), "test")


def assert_pose(tf: Transform, m: np.ndarray, atol: float = 1e-9) -> None:
    got = tf.as_matrix()
    assert np.allclose(got[:3, 3], m[:3, 3], rtol=0, atol=atol), (got, m)
    assert np.allclose(got[:3, :3], m[:3, :3], rtol=0, atol=max(atol, 1e-9)), (got, m)


@pytest.fixture
def scene() -> TransformBuffer:
    buf = TransformBuffer(30.0)
    fill_scene(buf)
    return buf


# -- geometry helpers --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("angle", "wrapped"),
    [(0.0, 0.0), (math.pi, math.pi), (-math.pi, math.pi), (3 * math.pi, math.pi),
     (4.0, 4.0 - 2 * math.pi), (-4.0, 2 * math.pi - 4.0), (7 * math.pi / 2, -math.pi / 2)],
)  # fmt: skip
def test_normalize_angle(angle: float, wrapped: float) -> None:
    assert normalize_angle(angle) == pytest.approx(wrapped, abs=1e-12)


@pytest.mark.parametrize("yaw", [0.0, 0.5, -1.0, math.pi - 1e-9, -math.pi + 1e-9, 3.0, -3.1])
def test_yaw_quaternion_round_trip(yaw: float) -> None:
    q = quaternion_from_yaw(yaw)
    assert yaw_from_quaternion(*q) == pytest.approx(yaw, abs=1e-9)
    assert np.allclose(matrix_from_quaternion(q), rot_z(yaw))


def test_euler_matches_fixed_axis_rotations() -> None:
    roll, pitch, yaw = 0.3, -0.7, 2.9
    q = quaternion_from_euler(roll, pitch, yaw)
    assert np.allclose(matrix_from_quaternion(q), rot_z(yaw) @ rot_y(pitch) @ rot_x(roll))
    assert yaw_from_quaternion(*quaternion_from_euler(0.0, 0.0, yaw)) == pytest.approx(yaw)


@pytest.mark.parametrize("seed", range(5))
def test_quaternion_matrix_round_trip(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(50):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        back = quaternion_from_matrix(matrix_from_quaternion(q))
        assert quaternion_angle(q, back) < 1e-7
        v = rng.normal(size=3)
        assert np.allclose(quaternion_rotate(q, v), matrix_from_quaternion(q) @ v)
    # the 180-degree rotations, where the naive trace formula divides by zero
    for m in (rot_x(math.pi), rot_y(math.pi), rot_z(math.pi)):
        assert np.allclose(matrix_from_quaternion(quaternion_from_matrix(m)), m)


def test_slerp_takes_the_short_way_across_pi() -> None:
    a, b = quaternion_from_yaw(math.radians(179)), quaternion_from_yaw(math.radians(-179))
    mid = quaternion_slerp(a, b, 0.5)
    assert abs(abs(yaw_from_quaternion(*mid)) - math.pi) < 1e-9
    quarter = quaternion_slerp(a, b, 0.25)
    assert yaw_from_quaternion(*quarter) == pytest.approx(math.radians(179.5))
    assert quaternion_angle(quaternion_slerp(a, b, 0.0), a) < 1e-7
    assert quaternion_angle(quaternion_slerp(a, b, 1.0), b) < 1e-7


def test_quaternion_multiply_is_rotation_composition() -> None:
    qa, qb = quaternion_from_euler(0.1, 0.2, 0.3), quaternion_from_euler(-0.4, 0.5, 2.0)
    m = matrix_from_quaternion(quaternion_multiply(qa, qb))
    assert np.allclose(m, matrix_from_quaternion(qa) @ matrix_from_quaternion(qb))


def test_stamp_conversions() -> None:
    assert seconds_to_stamp_parts(1764460812.25) == (1764460812, 250_000_000)
    assert seconds_to_stamp_parts(1.9999999999) == (2, 0)
    stamp = seconds_to_stamp(12.5)
    assert (stamp.sec, stamp.nanosec) == (12, 500_000_000)
    assert stamp_to_seconds(stamp) == 12.5
    assert stamp_to_seconds(3) == 3.0
    with pytest.raises(ValueError, match="finite"):
        seconds_to_stamp_parts(math.nan)


# -- Transform ---------------------------------------------------------------------------
def test_transform_algebra_matches_matrices() -> None:
    a = Transform.from_matrix(homogeneous(rot_z(0.4) @ rot_x(0.2), (1.0, 2.0, 3.0)))
    b = Transform.from_matrix(homogeneous(rot_y(-1.1), (-0.5, 0.25, 4.0)))
    assert np.allclose((a @ b).as_matrix(), a.as_matrix() @ b.as_matrix())
    assert np.allclose(a.inverse().as_matrix(), np.linalg.inv(a.as_matrix()))
    assert (a @ a.inverse()).isclose(Transform.identity(), atol=1e-12, angle_atol=1e-7)
    pts = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, -1.0]])
    homog = np.c_[pts, np.ones(2)] @ a.as_matrix().T
    assert np.allclose(a.apply(pts), homog[:, :3])
    assert np.allclose(transform_matrix(a.translation, a.rotation), a.as_matrix())


def test_transform_views_and_messages() -> None:
    tf = Transform.from_xyz_yaw(1.5, -2.0, 3.0, z=0.25)
    assert (tf.x, tf.y, tf.z) == (1.5, -2.0, 0.25)
    assert tf.yaw == pytest.approx(3.0)
    assert Transform.from_msg(tf.to_msg()).isclose(tf)
    ts = make_transform_stamped("map", "base_link", tf, 42.5)
    assert (ts.header.frame_id, ts.child_frame_id) == ("map", "base_link")
    assert stamp_to_seconds(ts.header.stamp) == 42.5
    assert Transform.from_msg(ts).isclose(tf)
    with pytest.raises(ValueError, match="invalid quaternion"):
        Transform((0, 0, 0), (0, 0, 0, 0))
    with pytest.raises(TypeError):
        Transform.from_msg(object())


def test_transform_is_immutable() -> None:
    tf = Transform.from_xyz_yaw(1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="read-only"):
        tf.translation[0] = 5.0


# -- lookups on the circle ---------------------------------------------------------------
def test_lookup_at_samples_is_exact(scene: TransformBuffer) -> None:
    for t in sample_times()[::37]:
        assert_pose(scene.lookup("map", "base_link", t), expected("map", "base_link", t))
        assert_pose(scene.lookup("odom", "base_link", t), expected("odom", "base_link", t))
        assert_pose(scene.lookup("map", "camera", t), expected("map", "camera", t))


def test_lookup_between_samples_interpolates(scene: TransformBuffer) -> None:
    for t in sample_times()[:-1:41]:
        mid = t + 0.5 / HZ
        got = scene.lookup("odom", "base_link", mid)
        # translation: exactly the chord midpoint; rotation: exactly the mid heading
        chord = 0.5 * (odom_base(t)[:3, 3] + odom_base(t + 1 / HZ)[:3, 3])
        assert np.allclose(got.translation, chord, atol=1e-12)
        assert np.allclose(got.as_matrix()[:3, :3], odom_base(mid)[:3, :3], atol=1e-9)
        # and the arc itself within the chord's sagitta
        assert_pose(scene.lookup("map", "camera", mid), expected("map", "camera", mid), SAGITTA)


def test_interpolated_heading_across_the_wrap(scene: TransformBuffer) -> None:
    # heading a + pi/2 passes pi (mod 2 pi) when OMEGA * (t - T0) + PHASE = 5 pi / 2
    t_wrap = T0 + (2.5 * math.pi - PHASE) / OMEGA
    k = math.floor((t_wrap - T0) * HZ)
    before, after = T0 + k / HZ, T0 + (k + 1) / HZ
    assert scene.lookup("odom", "base_link", before).yaw > 3.0
    assert scene.lookup("odom", "base_link", after).yaw < -3.0
    for frac in (0.1, 0.5, 0.9):
        t = before + frac / HZ
        want = normalize_angle(OMEGA * (t - T0) + PHASE + math.pi / 2)
        got = scene.lookup("odom", "base_link", t).yaw
        assert abs(normalize_angle(got - want)) < 1e-9
        assert abs(got) > 3.0  # never swung through 0


def test_inverse_lookups(scene: TransformBuffer) -> None:
    for t in (T0 + 1.234, T0 + 10.7, T1 - 0.01):
        forward = scene.lookup("map", "base_link", t)
        backward = scene.lookup("base_link", "map", t)
        assert_pose(backward, expected("base_link", "map", t), SAGITTA * 3)
        assert backward.isclose(forward.inverse(), atol=1e-9, angle_atol=1e-7)
        assert_pose(scene.lookup("camera", "odom", t), expected("camera", "odom", t), SAGITTA * 3)


def test_two_branches_meet_below_the_root(scene: TransformBuffer) -> None:
    # camera and laser meet at base_link: only static edges, so any stamp answers, even
    # one far outside the odom -> base_link data
    want = expected("camera", "laser", T0)
    for t in (0.0, T0 + 3.3, T1 + 1000.0, 1.0):
        assert_pose(scene.lookup("camera", "laser", t), want)
    assert_pose(scene.lookup("laser", "camera", 5.0), np.linalg.inv(want))


def test_two_dynamic_branches() -> None:
    buf = TransformBuffer(30.0)
    fill_scene(buf)

    # a pan joint under base_link, published at 10 Hz and ending earlier than odom
    def pan(t: float) -> np.ndarray:
        return homogeneous(rot_z(math.sin(t)), (0.0, 0.0, 0.4))

    for i in range(0, 151):
        t = T0 + i / 10
        buf.set_transform(ts_from_matrix("base_link", "pan", pan(t), t), "test")
    t = T0 + 7.05
    want = np.linalg.inv(BASE_LASER) @ homogeneous(rot_z(math.sin(T0 + 7.0)), (0, 0, 0.4))
    got = buf.lookup("laser", "pan", T0 + 7.0)
    assert_pose(got, want)
    # between samples the pan angle is slerped: mid-angle of the two neighbours
    mid = buf.lookup("base_link", "pan", t)
    assert mid.yaw == pytest.approx(0.5 * (math.sin(T0 + 7.0) + math.sin(T0 + 7.1)), abs=1e-9)
    # stamp 0: latest time both dynamic edges have, i.e. the pan's last sample (T0 + 15)
    assert_pose(
        buf.lookup("map", "pan", 0.0), expected("map", "base_link", T0 + 15.0) @ pan(T0 + 15.0)
    )
    with pytest.raises(ExtrapolationError):
        buf.lookup("map", "pan", T0 + 16.0)

    # a person tracked in odom at 5 Hz until T0 + 12: the two branches meet at odom, and
    # stamp 0 takes the older of the two branches' newest data
    def person(t: float) -> np.ndarray:
        return homogeneous(rot_z(-t), (3.0 - 0.1 * t, 1.0, 0.0))

    for i in range(0, 61):
        t = T0 + i / 5
        buf.set_transform(ts_from_matrix("odom", "person", person(t), t), "test")
    t = T0 + 12.0
    want = np.linalg.inv(odom_base(t) @ pan(t)) @ person(t)
    assert_pose(buf.lookup("pan", "person", 0.0), want)
    assert_pose(buf.lookup("person", "pan", 0.0), np.linalg.inv(want))


def test_stamp_zero_means_latest(scene: TransformBuffer) -> None:
    assert_pose(scene.lookup("map", "base_link", 0.0), expected("map", "base_link", T1))
    assert_pose(scene.lookup("camera", "map"), expected("camera", "map", T1))


def test_static_only_chain_at_any_stamp() -> None:
    buf = TransformBuffer(10.0)
    buf.set_transform(ts_from_matrix("map", "odom", MAP_ODOM, 5.0), "t", is_static=True)
    buf.set_transform(ts_from_matrix("odom", "dock", BASE_LASER, 9.0), "t", is_static=True)
    want = MAP_ODOM @ BASE_LASER
    for t in (0.0, 1.0, 5.0, 1e9):
        assert_pose(buf.lookup("map", "dock", t), want)
        assert buf.can_transform("dock", "map", t)
    # a newer static message for the same child replaces the old one
    buf.set_transform(ts_from_matrix("odom", "dock", BASE_CAMERA, 1.0), "t", is_static=True)
    assert_pose(buf.lookup("map", "dock", 3.0), MAP_ODOM @ BASE_CAMERA)


def test_same_frame_is_identity(scene: TransformBuffer) -> None:
    assert scene.lookup("base_link", "base_link", T0 + 1).isclose(Transform.identity())


# -- errors ------------------------------------------------------------------------------
def test_extrapolation_without_tolerance(scene: TransformBuffer) -> None:
    with pytest.raises(ExtrapolationError):
        scene.lookup("map", "base_link", T1 + 0.3)
    with pytest.raises(ExtrapolationError):
        scene.lookup("base_link", "map", T0 - 0.3)
    assert not scene.can_transform("map", "base_link", T1 + 0.3)
    assert isinstance(ExtrapolationError("x"), LookupError)


def test_extrapolation_within_tolerance_holds_the_nearest_sample(scene: TransformBuffer) -> None:
    got = scene.lookup("map", "base_link", T1 + 0.3, tolerance_s=0.5)
    assert_pose(got, expected("map", "base_link", T1), 1e-6)
    got = scene.lookup("map", "base_link", T0 - 0.3, tolerance_s=0.5)
    assert_pose(got, expected("map", "base_link", T0), 1e-6)
    assert scene.can_transform("map", "base_link", T1 + 0.3, tolerance_s=0.5)
    with pytest.raises(ExtrapolationError):
        scene.lookup("map", "base_link", T1 + 0.6, tolerance_s=0.5)
    with pytest.raises(ExtrapolationError):
        scene.lookup("map", "base_link", T0 - 0.6, tolerance_s=0.5)


def test_extrapolation_error_says_how_far() -> None:
    buf = TransformBuffer(30.0)
    fill_scene(buf)
    with pytest.raises(ExtrapolationError, match=r"future by 0\.600 s") as info:
        buf.lookup("map", "camera", T1 + 0.6, tolerance_s=0.5)
    assert info.value.by_s == pytest.approx(0.6)
    assert info.value.direction == "future"
    assert info.value.frame == "base_link"
    assert "odom" in str(info.value) and f"{T1:.3f}" in str(info.value)
    with pytest.raises(ExtrapolationError, match=r"past by 2\.000 s"):
        buf.lookup("camera", "map", T0 - 2.0)


def test_unknown_and_disconnected_frames(scene: TransformBuffer) -> None:
    with pytest.raises(ConnectivityError):
        scene.lookup("map", "nowhere", T0 + 1)
    with pytest.raises(ConnectivityError):
        scene.lookup("nowhere", "map", 0.0)
    scene.set_transform(ts_from_matrix("world", "island", MAP_ODOM, T0), "t", is_static=True)
    with pytest.raises(ConnectivityError):
        scene.lookup("map", "island", T0 + 1)
    with pytest.raises(ConnectivityError):
        scene.lookup("camera", "island", 0.0)
    assert not scene.can_transform("island", "base_link", T0 + 1)
    assert issubclass(ConnectivityError, LookupError)


def test_connectivity_error_names_the_frames() -> None:
    buf = TransformBuffer(30.0)
    fill_scene(buf)
    buf.set_transform(ts_from_matrix("world", "island", MAP_ODOM, T0), "t", is_static=True)
    with pytest.raises(ConnectivityError, match="'nowhere' does not exist"):
        buf.lookup("map", "nowhere", T0)
    with pytest.raises(ConnectivityError, match="'world' and 'map'"):
        buf.lookup("island", "camera", T0 + 1)


# -- cache and time ----------------------------------------------------------------------
def test_cache_window_prunes_old_samples() -> None:
    buf = TransformBuffer(2.0)
    fill_scene(buf, T0, T0 + 10.0)
    t = T0 + 8.5
    assert_pose(buf.lookup("map", "base_link", t), expected("map", "base_link", t), SAGITTA)
    with pytest.raises(ExtrapolationError):
        buf.lookup("map", "base_link", T0 + 7.5)
    with pytest.raises(ExtrapolationError):
        buf.lookup("map", "base_link", T0 + 1.0)


def test_clear_keeps_static_edges(scene: TransformBuffer) -> None:
    scene.clear()
    with pytest.raises(TransformError):
        scene.lookup("map", "base_link", T0 + 1)
    assert_pose(scene.lookup("camera", "laser", 0.0), expected("camera", "laser", T0))
    assert_pose(scene.lookup("map", "odom", 3.0), MAP_ODOM)


def test_clear_on_backwards_time_jump(scene: TransformBuffer) -> None:
    assert not scene.on_time(T1)
    assert not scene.on_time(T1 + 0.5)
    assert not scene.on_time(T1 - 0.2)  # jitter under the threshold: kept
    assert scene.can_transform("map", "base_link", T0 + 5)
    assert scene.on_time(T0 - 50.0)  # the bag restarted
    with pytest.raises(TransformError):
        scene.lookup("map", "base_link", T0 + 5)
    # statics survive, and the restarted bag's transforms are taken
    for t in sample_times(T0 - 50.0, T0 - 48.0):
        scene.set_transform(ts_from_matrix("odom", "base_link", odom_base(t), t), "bag")
    t = T0 - 49.0
    assert_pose(scene.lookup("map", "camera", t), expected("map", "camera", t))
    assert not scene.on_time(T0 - 48.0)


def test_sim_time_restart_without_threshold() -> None:
    buf = TransformBuffer(10.0, jump_threshold_s=0.0)
    fill_scene(buf, T0, T0 + 2)
    assert not buf.on_time(T0 + 2)
    assert buf.on_time(T0 + 1.9)
    assert "base_link" not in buf.frames()  # still known, as the mounts' parent
    assert buf.frames() == {"odom": "map", "camera": "base_link", "laser": "base_link"}
    assert buf.has_frame("base_link") and not buf.has_frame("nowhere")


def test_old_data_is_rejected_until_time_jump_is_seen() -> None:
    buf = TransformBuffer(5.0)
    fill_scene(buf, T0, T0 + 10)
    stale = ts_from_matrix("odom", "base_link", odom_base(T0), T0)
    assert not buf.set_transform(stale)
    assert buf.rejected == 1 and "older than the cache window" in (buf.last_rejection or "")
    buf.on_time(T0 + 10)
    buf.on_time(T0)
    assert buf.set_transform(stale)



def test_a_short_loop_read_before_its_clock_jump_keeps_the_new_pass_only() -> None:
    """A 5 s loop inside the cache window: the second pass's first second is read before the
    clock jumps back. After the jump the buffer holds that second and nothing of the first
    pass beyond it (the first pass's samples at later stamps would pose the robot wrongly)."""
    buf = TransformBuffer(10.0)
    fill_scene(buf, T0, T0 + 5)
    buf.on_time(T0 + 5)
    for t in sample_times(T0, T0 + 1):  # pass 2, before the clock
        assert buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(t), t), "bag")
    assert buf.on_time(T0 + 1)
    assert buf.restored == len(sample_times(T0, T0 + 1))
    t = T0 + 0.5
    assert_pose(buf.lookup("map", "camera", t), expected("map", "camera", t))
    with pytest.raises(ExtrapolationError):
        buf.lookup("map", "base_link", T0 + 4)


def test_a_stale_publisher_without_a_jump_changes_nothing() -> None:
    """Samples far behind an edge's newest are held only for a jump that may come: without
    one they are refused as before, and what is held stays bounded."""
    buf = TransformBuffer(5.0)
    fill_scene(buf, T0, T0 + 10)
    for i in range(3000):
        stale = ts_from_matrix("odom", "base_link", odom_base(T0), T0 + i * 1e-4)
        assert not buf.set_transform(stale, "stale")
    assert buf.rejections == {"older_than_cache": 3000}
    assert not buf.on_time(T0 + 10)
    t = T0 + 9.5
    assert_pose(buf.lookup("map", "camera", t), expected("map", "camera", t))
    assert buf.on_time(T0 + 2)  # a real jump back: the held samples it reaches stay
    assert 0 < buf.restored <= 1000

# -- our buffer's own input checks -------------------------------------------------------
def test_malformed_edges_are_rejected_and_counted_by_reason() -> None:
    buf = TransformBuffer()
    ok = ts_from_matrix("map", "odom", MAP_ODOM, 1.0)
    assert buf.set_transform(ok, is_static=True)
    cases = [
        ts_from_matrix("", "a", MAP_ODOM, 1.0),
        ts_from_matrix("a", "a", MAP_ODOM, 1.0),
    ]
    bad = ts_from_matrix("a", "b", MAP_ODOM, 1.0)
    bad.transform.translation.x = math.nan
    cases.append(bad)
    zero = ts_from_matrix("a", "c", MAP_ODOM, 1.0)
    zero.transform.rotation.w = 0.0
    zero.transform.rotation.z = 0.0
    cases.append(zero)
    for ts in cases:
        assert not buf.set_transform(ts, authority="test")
    assert buf.rejected == len(cases)
    assert buf.rejections == {"empty_frame": 1, "self_transform": 1, "non_finite": 1,
                              "malformed": 1}
    assert buf.frames() == {"odom": "map"}
    assert buf.kind_changes == 0
    assert buf.set_transforms([ok, ts_from_matrix("odom", "base_link", MAP_ODOM, 1.0)]) == 2


# -- a frame changing kind: the newest wins, as in tf2 -----------------------------------
def go2_statics(buf: TransformBuffer) -> None:
    """go2_ros2_sdk's URDF: fixed joints map -> odom and odom -> base_link, latched as
    identities on /tf_static by robot_state_publisher, before the driver publishes."""
    ident = homogeneous(np.eye(3), (0.0, 0.0, 0.0))
    buf.set_transform(ts_from_matrix("map", "odom", ident, 0.0), "robot_state_publisher", True)
    buf.set_transform(ts_from_matrix("odom", "base_link", ident, 0.0), "robot_state_publisher",
                      True)
    buf.set_transform(ts_from_matrix("base_link", "Head_upper",
                                     homogeneous(np.eye(3), (0.285, 0.0, 0.01)), 0.0),
                      "robot_state_publisher", True)


def test_the_drivers_dynamic_odometry_replaces_a_static_identity() -> None:
    """Without SLAM: the driver's odom -> base_link on /tf replaces the URDF's latched
    identity; map -> odom stays the static identity, so map poses are odometry's."""
    changes = []
    buf = TransformBuffer()
    buf.on_kind_change = lambda frame, change: changes.append((frame, change))
    go2_statics(buf)
    for i in range(10):
        assert buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(T0 + 0.1 * i),
                                                T0 + 0.1 * i), "go2_driver_node")
    assert_pose(buf.lookup("map", "base_link", T0 + 0.5), odom_base(T0 + 0.5))
    # the head, a static child of the now dynamic base, follows it
    head = buf.lookup("map", "Head_upper", T0 + 0.5)
    assert_pose(head, odom_base(T0 + 0.5) @ homogeneous(np.eye(3), (0.285, 0.0, 0.01)))
    assert buf.rejected == 0 and buf.kind_changes == 1
    assert changes == [("base_link", ("static", "odom", "robot_state_publisher", "dynamic",
                                      "odom", "go2_driver_node"))]


def test_slam_map_odom_replaces_the_static_identity_too() -> None:
    """With slam_toolbox: map -> odom (50 Hz, drifting) on /tf replaces the identity as well,
    and map poses compose both dynamic edges at the stamp."""
    buf = TransformBuffer()
    go2_statics(buf)
    for i in range(60):
        t = T0 + 0.02 * i
        drift = homogeneous(rot_z(0.01 * i), (0.02 * i, -0.01 * i, 0.0))
        buf.set_transform(ts_from_matrix("map", "odom", drift, t), "slam_toolbox")
        if i % 3 == 0:
            buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(t), t), "driver")
    t = T0 + 0.6
    expected = homogeneous(rot_z(0.3), (0.6, -0.3, 0.0)) @ odom_base(t)
    assert_pose(buf.lookup("map", "base_link", t), expected)
    assert buf.kind_changes == 2 and buf.rejected == 0
    assert set(buf.kind_changed) == {"odom", "base_link"}


def test_a_late_static_replaces_the_dynamic_frame_until_the_next_dynamic_sample() -> None:
    """A latched /tf_static arriving after the driver started (a late subscriber) wins for
    its frame, as in tf2, and the next dynamic sample wins back; each change is counted, the
    report is made once per frame."""
    changes = []
    buf = TransformBuffer()
    buf.on_kind_change = lambda frame, change: changes.append(frame)
    buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(T0), T0), "driver")
    ident = homogeneous(np.eye(3), (0.0, 0.0, 0.0))
    buf.set_transform(ts_from_matrix("odom", "base_link", ident, 0.0), "rsp", True)
    assert_pose(buf.lookup("odom", "base_link", T0), ident)
    buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(T0 + 0.1), T0 + 0.1),
                      "driver")
    assert_pose(buf.lookup("odom", "base_link", T0 + 0.1), odom_base(T0 + 0.1))
    assert buf.kind_changes == 2 and changes == ["base_link"]


def test_leading_slash_and_loops() -> None:
    buf = TransformBuffer()
    buf.set_transform(ts_from_matrix("/map", "/odom", MAP_ODOM, 0.0), is_static=True)
    assert_pose(buf.lookup("map", "/odom", 1.0), MAP_ODOM)
    buf.set_transform(ts_from_matrix("b", "a", MAP_ODOM, 0.0), is_static=True)
    buf.set_transform(ts_from_matrix("a", "b", MAP_ODOM, 0.0), is_static=True)
    with pytest.raises(ConnectivityError, match="loop"):
        buf.lookup("map", "a", 1.0)


def test_reparented_frame_uses_the_earlier_sample() -> None:
    buf = TransformBuffer()
    buf.set_transform(ts_from_matrix("map", "odom", MAP_ODOM, 0.0), is_static=True)
    buf.set_transform(ts_from_matrix("map", "base_link", odom_base(T0), T0))
    buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(T0 + 1), T0 + 1))
    assert_pose(buf.lookup("map", "base_link", T0 + 0.5), odom_base(T0))
    assert_pose(buf.lookup("map", "base_link", T0 + 1), MAP_ODOM @ odom_base(T0 + 1))


def test_frames_follow_every_change_of_the_tree() -> None:
    """frames() is cached between changes: a new frame, a re-parented one (also by a sample
    older than the newest, which leaves the newest parent), a kind change and clear() show."""
    buf = TransformBuffer()
    buf.set_transform(ts_from_matrix("map", "odom", MAP_ODOM, 0.0), is_static=True)
    buf.set_transform(ts_from_matrix("map", "base_link", odom_base(T0), T0))
    assert buf.frames() == {"odom": "map", "base_link": "map"}
    buf.frames()["base_link"] = "elsewhere"  # a caller's copy, not the cache
    buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(T0 + 1), T0 + 1))
    assert buf.frames() == {"odom": "map", "base_link": "odom"}
    buf.set_transform(ts_from_matrix("map", "base_link", odom_base(T0 + 0.5), T0 + 0.5))
    assert buf.frames()["base_link"] == "odom"  # the newest sample's parent still
    buf.set_transform(ts_from_matrix("base_link", "odom", odom_base(T0), T0 + 2))
    assert buf.frames()["odom"] == "base_link" and buf.is_dynamic("odom")
    buf.clear()
    assert buf.frames() == {}


def test_cache_time_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cache_time_s"):
        TransformBuffer(cache_time_s=0.0)


# -- volume, threads and properties ------------------------------------------------------
def test_ten_thousand_lookups_stay_correct(scene: TransformBuffer) -> None:
    rng = random.Random(7)
    frames = ["map", "odom", "base_link", "camera", "laser"]
    checked = 0
    for i in range(10_000):
        a, b = rng.choice(frames), rng.choice(frames)
        t = rng.uniform(T0, T1)
        tf = scene.lookup(a, b, t)
        if i % 200 == 0:
            assert_pose(tf, expected(a, b, t), SAGITTA * 3)
            checked += 1
    assert checked == 50


def test_concurrent_feeding_and_lookups() -> None:
    buf = TransformBuffer(5.0)
    fill_scene(buf, T0, T0 + 1)
    errors: list[BaseException] = []
    done = threading.Event()

    def feed() -> None:
        for t in sample_times(T0 + 1, T0 + 20)[1:]:
            buf.set_transform(ts_from_matrix("odom", "base_link", odom_base(t), t))
        done.set()

    def read() -> None:
        try:
            while not done.is_set():
                tf = buf.lookup("odom", "base_link", 0.0)
                assert math.hypot(tf.x, tf.y) == pytest.approx(RADIUS, abs=1e-9)
                buf.lookup("map", "camera", 0.0)
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    writer = threading.Thread(target=feed)
    for th in (*readers, writer):
        th.start()
    for th in (writer, *readers):
        th.join()
    assert not errors
    assert_pose(buf.lookup("map", "base_link"), expected("map", "base_link", T0 + 20))


FRAMES = ["map", "odom", "base_link", "camera", "laser"]


_PROPERTY_BUFFERS: list[TransformBuffer] = []


def property_buffer() -> TransformBuffer:
    """One filled scene, shared by the examples (each re-sets the laser mount)."""
    if not _PROPERTY_BUFFERS:
        buf = TransformBuffer(30.0)
        fill_scene(buf, T0, T1)
        _PROPERTY_BUFFERS.append(buf)
    return _PROPERTY_BUFFERS[0]


@settings(max_examples=150, deadline=None)
@given(
    a=st.sampled_from(FRAMES),
    b=st.sampled_from(FRAMES),
    c=st.sampled_from(FRAMES),
    t=st.floats(T0, T1, allow_nan=False),
    mount=st.tuples(*[st.floats(-3.0, 3.0, allow_nan=False)] * 6),
)
def test_lookups_compose(a: str, b: str, c: str, t: float, mount: tuple[float, ...]) -> None:
    buf = property_buffer()
    x, y, z, roll, pitch, yaw = mount
    laser = Transform((x, y, z), quaternion_from_euler(roll, pitch, yaw))
    buf.set_transform(make_transform_stamped("base_link", "laser", laser, 0.0), "h", True)
    ab, bc, ac = buf.lookup(a, b, t), buf.lookup(b, c, t), buf.lookup(a, c, t)
    assert (ab @ bc).isclose(ac, atol=1e-9, angle_atol=1e-6)
    assert buf.lookup(b, a, t).isclose(ab.inverse(), atol=1e-9, angle_atol=1e-6)


def test_max_gap_refuses_to_interpolate_across_lost_samples() -> None:
    """With max_gap_s set, a lookup between samples further apart than that raises instead of
    inventing a pose; lookups next to real samples still interpolate."""
    buf = TransformBuffer(60.0)
    buf.max_gap_s = 1.0
    for t in [0.0, 0.1, 0.2, 3.0, 3.1]:
        buf.set_transform(make_transform_stamped("map", "base_link",
                                                 Transform.from_xyz_yaw(t, 0.0, 0.0), t))
    assert buf.lookup("map", "base_link", 0.15).x == pytest.approx(0.15)
    assert buf.lookup("map", "base_link", 3.05).x == pytest.approx(3.05)
    with pytest.raises(ExtrapolationError, match="gap"):
        buf.lookup("map", "base_link", 1.5)
    buf.max_gap_s = None
    assert buf.lookup("map", "base_link", 1.5).x == pytest.approx(1.5)
