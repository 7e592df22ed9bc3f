"""Quaternion, yaw, matrix and stamp helpers shared by the TF buffer and the recorder.

Plain numpy and math, no ROS imports: the recorder and the tests use these on message fields
(duck-typed) and on numbers alike. Quaternions are (x, y, z, w), the ROS order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "hamilton",
    "matrix_from_quaternion",
    "normalize_angle",
    "quaternion_angle",
    "quaternion_conjugate",
    "quaternion_from_euler",
    "quaternion_from_matrix",
    "quaternion_from_yaw",
    "quaternion_multiply",
    "quaternion_normalize",
    "quaternion_rotate",
    "quaternion_slerp",
    "seconds_to_stamp",
    "seconds_to_stamp_parts",
    "slerp_unit",
    "stamp_to_seconds",
    "transform_matrix",
    "yaw_from_quaternion",
]

QuaternionLike = Sequence[float] | np.ndarray
_TWO_PI = 2.0 * math.pi


def normalize_angle(angle: float) -> float:
    """Wrap an angle to (-pi, pi], so headings compare and subtract without 2*pi surprises."""
    wrapped = math.fmod(angle + math.pi, _TWO_PI)
    if wrapped <= 0.0:
        wrapped += _TWO_PI
    return wrapped - math.pi



def yaw_from_quaternion(x: float, y: float, z: float, w: float) -> float:
    """Heading (rotation about z) of a quaternion; roll and pitch are ignored, as a planar
    robot's pose needs only this."""
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def quaternion_from_yaw(yaw: float) -> tuple[float, float, float, float]:
    """Pure rotation about z by `yaw` radians."""
    half = 0.5 * yaw
    return (0.0, 0.0, math.sin(half), math.cos(half))


def quaternion_from_euler(roll: float, pitch: float, yaw: float) -> tuple[float, ...]:
    """Quaternion for fixed-axis roll (x), pitch (y), yaw (z), applied in that order (ROS RPY)."""
    cr, sr = math.cos(0.5 * roll), math.sin(0.5 * roll)
    cp, sp = math.cos(0.5 * pitch), math.sin(0.5 * pitch)
    cy, sy = math.cos(0.5 * yaw), math.sin(0.5 * yaw)
    return (
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
        cr * cp * cy + sr * sp * sy,
    )


def quaternion_normalize(q: QuaternionLike) -> np.ndarray:
    """Unit quaternion as float64; a zero or non-finite one is an error, not a silent identity,
    because it means a malformed message."""
    arr = np.asarray(q, dtype=np.float64).reshape(4)
    norm = float(np.sqrt(arr @ arr))
    if not math.isfinite(norm) or norm < 1e-12:
        raise ValueError(f"invalid quaternion {arr.tolist()} (norm {norm})")
    return arr / norm


def hamilton(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float, float]:
    """Hamilton product a*b of (x, y, z, w) quaternions as plain floats (no arrays: a TF
    lookup composes thousands per second)."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return (aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz)


def quaternion_multiply(a: QuaternionLike, b: QuaternionLike) -> np.ndarray:
    """Hamilton product a*b: rotating by b first, then by a."""
    return np.array(hamilton([float(v) for v in a], [float(v) for v in b]), dtype=np.float64)


def quaternion_conjugate(q: QuaternionLike) -> np.ndarray:
    """Inverse of a unit quaternion."""
    x, y, z, w = (float(v) for v in q)
    return np.array([-x, -y, -z, w], dtype=np.float64)


def quaternion_rotate(q: QuaternionLike, v: Sequence[float] | np.ndarray) -> np.ndarray:
    """Rotate vector(s) v (shape (3,) or (N, 3)) by unit quaternion q."""
    vec = np.asarray(v, dtype=np.float64)
    return vec @ matrix_from_quaternion(q).T


def slerp_unit(a: Sequence[float], b: Sequence[float],
               t: float) -> tuple[float, float, float, float]:
    """Spherical interpolation of unit quaternions as plain floats, along the shorter arc (so
    yaw 179° -> -179° passes through 180°, not through 0°); not renormalised. The angle comes
    from atan2 of |a-b| and |a+b|, accurate even for the tiny steps between 20 Hz samples,
    where acos(dot) or a normalized lerp would drift."""
    if a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3] < 0.0:
        b = [-v for v in b]
    half = math.atan2(math.sqrt(sum((p - q) ** 2 for p, q in zip(a, b, strict=True))),
                      math.sqrt(sum((p + q) ** 2 for p, q in zip(a, b, strict=True))))
    theta = 2.0 * half  # angle between a and b on the 4-sphere
    if theta < 1e-12:
        return a[0], a[1], a[2], a[3]
    sin_theta = math.sin(theta)
    wa, wb = math.sin((1.0 - t) * theta) / sin_theta, math.sin(t * theta) / sin_theta
    return (wa * a[0] + wb * b[0], wa * a[1] + wb * b[1], wa * a[2] + wb * b[2],
            wa * a[3] + wb * b[3])


def quaternion_slerp(q0: QuaternionLike, q1: QuaternionLike, t: float) -> np.ndarray:
    """Spherical interpolation along the shorter arc (see `slerp_unit`), of any non-zero
    quaternions; a unit quaternion."""
    out = np.array(slerp_unit(quaternion_normalize(q0).tolist(),
                              quaternion_normalize(q1).tolist(), t), dtype=np.float64)
    return out / math.sqrt(float(out @ out))


def quaternion_angle(q0: QuaternionLike, q1: QuaternionLike) -> float:
    """Rotation angle (radians, in [0, pi]) between two orientations; sign-agnostic (q == -q)."""
    a = quaternion_normalize(q0)
    b = quaternion_normalize(q1)
    return 2.0 * math.acos(min(1.0, abs(float(a @ b))))


def matrix_from_quaternion(q: QuaternionLike) -> np.ndarray:
    """3x3 rotation matrix of a unit quaternion."""
    x, y, z, w = (float(v) for v in q)
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz = x * y, x * z, y * z
    wx, wy, wz = w * x, w * y, w * z
    return np.array(
        [
            [1.0 - 2.0 * (yy + zz), 2.0 * (xy - wz), 2.0 * (xz + wy)],
            [2.0 * (xy + wz), 1.0 - 2.0 * (xx + zz), 2.0 * (yz - wx)],
            [2.0 * (xz - wy), 2.0 * (yz + wx), 1.0 - 2.0 * (xx + yy)],
        ],
        dtype=np.float64,
    )


def quaternion_from_matrix(m: np.ndarray) -> np.ndarray:
    """Unit quaternion (x, y, z, w) with w >= 0 from a 3x3 (or the rotation part of a 4x4)
    matrix; Shepperd's method, stable for every rotation."""
    r = np.asarray(m, dtype=np.float64)[:3, :3]
    trace = r[0, 0] + r[1, 1] + r[2, 2]
    if trace > 0.0:
        s = 2.0 * math.sqrt(trace + 1.0)
        q = [(r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s, 0.25 * s]
    elif r[0, 0] > r[1, 1] and r[0, 0] > r[2, 2]:
        s = 2.0 * math.sqrt(1.0 + r[0, 0] - r[1, 1] - r[2, 2])
        q = [0.25 * s, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s, (r[2, 1] - r[1, 2]) / s]
    elif r[1, 1] > r[2, 2]:
        s = 2.0 * math.sqrt(1.0 + r[1, 1] - r[0, 0] - r[2, 2])
        q = [(r[0, 1] + r[1, 0]) / s, 0.25 * s, (r[1, 2] + r[2, 1]) / s, (r[0, 2] - r[2, 0]) / s]
    else:
        s = 2.0 * math.sqrt(1.0 + r[2, 2] - r[0, 0] - r[1, 1])
        q = [(r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, 0.25 * s, (r[1, 0] - r[0, 1]) / s]
    out = quaternion_normalize(q)
    return -out if out[3] < 0.0 else out


def transform_matrix(translation: Sequence[float] | np.ndarray, q: QuaternionLike) -> np.ndarray:
    """4x4 homogeneous matrix from a translation and a unit quaternion."""
    out = np.eye(4, dtype=np.float64)
    out[:3, :3] = matrix_from_quaternion(q)
    out[:3, 3] = np.asarray(translation, dtype=np.float64).reshape(3)
    return out


def stamp_to_seconds(stamp: Any) -> float:
    """Seconds (float) of a builtin_interfaces/Time-like object (`sec`, `nanosec`), an
    rclpy Time (`nanoseconds`), or a number."""
    if isinstance(stamp, (int, float)):
        return float(stamp)
    if hasattr(stamp, "sec"):
        return float(stamp.sec) + float(stamp.nanosec) * 1e-9
    if hasattr(stamp, "nanoseconds"):
        return float(stamp.nanoseconds) * 1e-9
    raise TypeError(f"not a time stamp: {stamp!r}")


def seconds_to_stamp_parts(seconds: float) -> tuple[int, int]:
    """(sec, nanosec) of a time in seconds, nanosec always in [0, 1e9)."""
    if not math.isfinite(seconds):
        raise ValueError(f"stamp must be finite, got {seconds}")
    # Split before scaling: seconds * 1e9 would lose the nanoseconds of a wall-clock stamp.
    sec = math.floor(seconds)
    nanosec = round((seconds - sec) * 1e9)
    if nanosec >= 1_000_000_000:
        sec, nanosec = sec + 1, nanosec - 1_000_000_000
    return int(sec), int(nanosec)


def seconds_to_stamp(seconds: float) -> Any:
    """builtin_interfaces/Time for a time in seconds (imported lazily: message builders only)."""
    from builtin_interfaces.msg import Time

    sec, nanosec = seconds_to_stamp_parts(seconds)
    return Time(sec=sec, nanosec=nanosec)
