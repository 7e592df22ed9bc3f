"""sensor_msgs/PointCloud2 decoding and building with numpy alone.

pip has no sensor_msgs_py, so the recorder decodes clouds itself. The decoder honours the whole
layout a driver may publish: any PointField datatype (INT8..FLOAT64), fields at any offset,
padding inside a point (point_step) and at the end of a row (row_step), organized clouds
(height > 1) and big-endian data. Only the requested fields are interpreted, so an exotic
extra field cannot break reading x, y, z. Messages are duck-typed; nothing imports rclpy, and
the builder imports sensor_msgs only when called.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from memory_node.wire.geometry import seconds_to_stamp

__all__ = [
    "POINTFIELD_DTYPES",
    "make_cloud",
    "read_fields",
    "read_xyz",
    "voxel_downsample",
]

# PointField datatype constants (sensor_msgs/PointField) -> numpy scalar type.
POINTFIELD_DTYPES: dict[int, type[np.generic]] = {
    1: np.int8,  # INT8
    2: np.uint8,  # UINT8
    3: np.int16,  # INT16
    4: np.uint16,  # UINT16
    5: np.int32,  # INT32
    6: np.uint32,  # UINT32
    7: np.float32,  # FLOAT32
    8: np.float64,  # FLOAT64
}
_DATATYPE_OF: dict[np.dtype, int] = {np.dtype(t): code for code, t in POINTFIELD_DTYPES.items()}

PADDING_BYTE = 0xAA  # what make_cloud writes into padding: visible if a decoder reads it


def _as_buffer(data: Any) -> Any:
    """Something numpy can wrap without copying: bytes, array.array('B') and ndarrays are;
    a plain list of ints (rare) is converted."""
    if isinstance(data, (bytes, bytearray, memoryview, array.array)):
        return data
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    return np.asarray(data, dtype=np.uint8)


def _buffer_len(buf: Any) -> int:
    if isinstance(buf, np.ndarray):
        return int(buf.nbytes)
    return len(memoryview(buf).cast("B"))


def _field_view(msg: Any, names: Sequence[str]) -> np.ndarray:
    """(height, width) structured view of the requested fields over msg.data (no copy)."""
    height, width = int(msg.height), int(msg.width)
    point_step, row_step = int(msg.point_step), int(msg.row_step)
    fields: dict[str, Any] = {}
    for field in msg.fields:
        fields.setdefault(str(field.name), field)  # the first of duplicate names wins
    order: Literal["<", ">"] = ">" if bool(msg.is_bigendian) else "<"
    formats, offsets = [], []
    for name in names:
        field = fields.get(name)
        if field is None:
            raise ValueError(
                f"point cloud has no field '{name}' (fields: {', '.join(fields) or 'none'})"
            )
        scalar = POINTFIELD_DTYPES.get(int(field.datatype))
        if scalar is None:
            raise ValueError(
                f"point cloud field '{name}' has unsupported datatype {int(field.datatype)} "
                f"(supported: 1..8, INT8..FLOAT64)"
            )
        count = max(1, int(field.count))
        dt = np.dtype(scalar).newbyteorder(order)
        offset = int(field.offset)
        if offset + dt.itemsize * count > point_step:
            raise ValueError(
                f"point cloud field '{name}' (offset {offset}, {dt.itemsize * count} bytes) "
                f"does not fit in point_step {point_step}"
            )
        formats.append(dt)  # only the first element of an array field (count > 1) is read
        offsets.append(offset)
    if row_step < width * point_step:
        raise ValueError(
            f"point cloud row_step {row_step} is shorter than width {width} x point_step "
            f"{point_step} = {width * point_step}"
        )
    buf = _as_buffer(msg.data)
    needed = (height - 1) * row_step + width * point_step
    have = _buffer_len(buf)
    if have < needed:
        raise ValueError(
            f"point cloud data has {have} bytes, but {height} rows x {width} points "
            f"(point_step {point_step}, row_step {row_step}) need {needed}"
        )
    dtype = np.dtype(
        {"names": list(names), "formats": formats, "offsets": offsets, "itemsize": point_step}
    )
    return np.ndarray(
        shape=(height, width), dtype=dtype, buffer=buf, strides=(row_step, point_step)
    )


def read_fields(msg: Any, names: Sequence[str], skip_nans: bool = True) -> np.ndarray:
    """Values of the named fields, (N, len(names)) float64, points in row-major order.

    With skip_nans, points where any requested field is NaN or inf are dropped (what a lidar
    publishes for "no return"). Raises ValueError for a malformed cloud or a missing field."""
    unique = list(dict.fromkeys(str(n) for n in names))
    if not unique:
        raise ValueError("read_fields needs at least one field name")
    if int(msg.height) * int(msg.width) == 0:
        return np.empty((0, len(names)), dtype=np.float64)
    if int(msg.point_step) <= 0:
        raise ValueError(f"point cloud point_step must be > 0, got {int(msg.point_step)}")
    view = _field_view(msg, unique)
    columns = {}
    for name in unique:
        values = view[name]
        columns[name] = values.reshape(-1).astype(np.float64)
    out = np.stack([columns[str(n)] for n in names], axis=1)
    if skip_nans:
        out = out[np.isfinite(out).all(axis=1)]
    return out


def read_xyz(msg: Any, skip_nans: bool = True) -> np.ndarray:
    """Point coordinates, (N, 3) float32, non-finite points dropped unless skip_nans=False."""
    with np.errstate(over="ignore"):
        xyz = read_fields(msg, ("x", "y", "z"), skip_nans=False).astype(np.float32)
    if skip_nans:
        xyz = xyz[np.isfinite(xyz).all(axis=1)]  # after the cast: float64 beyond float32 range
    return xyz


def voxel_downsample(points: np.ndarray, voxel: float = 0.1) -> np.ndarray:
    """One point per occupied voxel: the centroid of the points in it.

    Keys are the first three columns; extra columns (intensity, ...) are averaged alongside.
    Non-finite rows are dropped first. Output is ordered by voxel index (deterministic) and
    keeps the input's float dtype (float32 stays float32; sums are done in float64)."""
    if not voxel > 0.0:
        raise ValueError(f"voxel size must be > 0, got {voxel}")
    pts = np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] < 3:
        raise ValueError(f"points must have shape (N, >=3), got {pts.shape}")
    out_dtype = pts.dtype if np.issubdtype(pts.dtype, np.floating) else np.dtype(np.float64)
    work = pts.astype(np.float64)
    work = work[np.isfinite(work).all(axis=1)]
    if work.shape[0] == 0:
        return np.empty((0, pts.shape[1]), dtype=out_dtype)
    keys = np.floor(work[:, :3] / voxel).astype(np.int64)
    keys -= keys.min(axis=0)
    spans = keys.max(axis=0) + 1
    if float(spans[0]) * float(spans[1]) * float(spans[2]) < 2.0**62:
        # One integer per voxel, ordered as the (x, y, z) rows are: a 1-D unique is several
        # times faster than np.unique(axis=0), which sorts rows as structured records.
        packed = (keys[:, 0] * spans[1] + keys[:, 1]) * spans[2] + keys[:, 2]
        _, inverse, counts = np.unique(packed, return_inverse=True, return_counts=True)
    else:  # a cloud spanning more voxels than an int64 counts
        _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    sums = np.stack([np.bincount(inverse, weights=work[:, c], minlength=counts.shape[0])
                     for c in range(work.shape[1])], axis=1)
    return (sums / counts[:, None]).astype(out_dtype)


def make_cloud(
    points: np.ndarray,
    frame_id: str = "",
    stamp: Any = 0.0,
    fields: Sequence[str | tuple[str, Any]] = ("x", "y", "z"),
    *,
    dtype: Any = np.float32,
    big_endian: bool = False,
    point_padding: int = 0,
    row_padding: int = 0,
) -> Any:
    """sensor_msgs/PointCloud2 from an (N, k) or organized (H, W, k) array, k = len(fields).

    A field is a name (stored as `dtype`) or a (name, dtype) pair; fields are packed in order,
    then `point_padding` bytes end each point and `row_padding` bytes end each row (drivers
    pad both). `stamp` is seconds or a builtin_interfaces/Time. For tests and the sample bag.
    """
    from sensor_msgs.msg import PointCloud2, PointField

    specs: list[tuple[str, np.dtype]] = []
    for spec in fields:
        name, dt = (spec, dtype) if isinstance(spec, str) else spec
        dt = np.dtype(dt)
        if dt not in _DATATYPE_OF:
            raise ValueError(f"field '{name}': no PointField datatype for numpy dtype {dt}")
        specs.append((name, dt))
    arr = np.asarray(points, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr.reshape(1, *arr.shape)
    if arr.ndim != 3 or arr.shape[2] != len(specs):
        raise ValueError(
            f"points must be (N, {len(specs)}) or (H, W, {len(specs)}), got {np.shape(points)}"
        )
    height, width = int(arr.shape[0]), int(arr.shape[1])
    if width == 0:
        height = 1
    order: Literal["<", ">"] = ">" if big_endian else "<"
    offsets, offset = [], 0
    for _, dt in specs:
        offsets.append(offset)
        offset += dt.itemsize
    point_step = offset + int(point_padding)
    row_step = width * point_step + int(row_padding)

    layout = np.dtype(
        {
            "names": [name for name, _ in specs],
            "formats": [dt.newbyteorder(order) for _, dt in specs],
            "offsets": offsets,
            "itemsize": point_step,
        }
    )
    raw = np.full((height, row_step), PADDING_BYTE, dtype=np.uint8)
    cells = raw[:, : width * point_step].view(layout)  # (height, width) structured, in place
    for i, (name, dt) in enumerate(specs):
        cells[name] = arr[:, :, i].astype(dt) if arr.size else 0

    msg = PointCloud2()
    msg.header.frame_id = frame_id
    msg.header.stamp = stamp if hasattr(stamp, "sec") else seconds_to_stamp(float(stamp))
    msg.height, msg.width = height, width
    msg.fields = [
        PointField(name=name, offset=off, datatype=_DATATYPE_OF[dt], count=1)
        for (name, dt), off in zip(specs, offsets, strict=True)
    ]
    msg.is_bigendian = bool(big_endian)
    msg.point_step = point_step
    msg.row_step = row_step
    msg.data = array.array("B", raw.tobytes())
    msg.is_dense = bool(np.isfinite(arr).all())
    return msg
