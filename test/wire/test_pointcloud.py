"""PointCloud2 decoding, building and voxel downsampling.

Layouts are built two ways: with `make_cloud`, and by hand (numpy structured arrays and
PointField lists written here), so a bug shared by builder and decoder cannot hide. Where
sensor_msgs_py is importable (a robot's ROS install), the cases it handles are also decoded
with it and compared; it is left out only where it is known to differ: it ignores row_step
padding and keeps inf values.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import numpy as np
import pytest
from sensor_msgs.msg import PointCloud2, PointField

from memory_node.wire.geometry import stamp_to_seconds
from memory_node.wire.pointcloud import (
    POINTFIELD_DTYPES,
    make_cloud,
    read_fields,
    read_xyz,
    voxel_downsample,
)

Decoder = Callable[[PointCloud2, Sequence[str]], np.ndarray]


def decode_ours(msg: PointCloud2, names: Sequence[str]) -> np.ndarray:
    return read_fields(msg, names)


def decode_reference(msg: PointCloud2, names: Sequence[str]) -> np.ndarray:
    from sensor_msgs_py import point_cloud2

    points = point_cloud2.read_points_list(msg, field_names=list(names), skip_nans=True)
    return np.array([tuple(p) for p in points], dtype=np.float64).reshape(-1, len(names))


def _decoders() -> dict[str, Decoder]:
    found: dict[str, Decoder] = {"memory_node": decode_ours}
    try:
        import sensor_msgs_py.point_cloud2  # noqa: F401
    except ImportError:
        return found
    found["sensor_msgs_py"] = decode_reference
    return found


DECODERS = _decoders()  # built at import: only what exists here, nothing skipped


def hand_cloud(
    records: np.ndarray,
    fields: list[tuple[str, int, int]],
    *,
    height: int = 1,
    row_padding: int = 0,
    big_endian: bool = False,
) -> PointCloud2:
    """A cloud from a structured array whose layout the caller chose, fields as
    (name, offset, datatype)."""
    point_step = records.dtype.itemsize
    width = records.size // height
    rows = records.reshape(height, width)
    data = b"".join(row.tobytes() + b"\x55" * row_padding for row in rows)
    msg = PointCloud2()
    msg.header.frame_id = "lidar"
    msg.height, msg.width = height, width
    msg.fields = [PointField(name=n, offset=o, datatype=d, count=1) for n, o, d in fields]
    msg.is_bigendian = big_endian
    msg.point_step = point_step
    msg.row_step = width * point_step + row_padding
    msg.data = array.array("B", data)
    msg.is_dense = False
    return msg


# -- cases every decoder must agree on ---------------------------------------------------
def case_float32_xyz() -> tuple[PointCloud2, tuple[str, ...], np.ndarray]:
    pts = np.random.default_rng(1).uniform(-20, 20, size=(500, 3)).astype(np.float32)
    return make_cloud(pts, "lidar", 12.5), ("x", "y", "z"), pts.astype(np.float64)


def case_float64_intensity() -> tuple[PointCloud2, tuple[str, ...], np.ndarray]:
    pts = np.random.default_rng(2).uniform(-5, 5, size=(300, 4))
    pts[:, 3] = np.abs(pts[:, 3]) * 50
    msg = make_cloud(pts, "lidar", 1.0, ("x", "y", "z", "intensity"), dtype=np.float64)
    return msg, ("x", "y", "z", "intensity"), pts


def case_big_endian() -> tuple[PointCloud2, tuple[str, ...], np.ndarray]:
    pts = np.random.default_rng(3).uniform(-3, 3, size=(64, 3)).astype(np.float32)
    msg = make_cloud(pts, "lidar", 2.0, big_endian=True, point_padding=4)
    return msg, ("x", "y", "z"), pts.astype(np.float64)


def case_scrambled_offsets() -> tuple[PointCloud2, tuple[str, ...], np.ndarray]:
    # intensity first, then a ring byte, xyz as float64 at odd places, padding at the end
    layout = np.dtype(
        {
            "names": ["intensity", "ring", "z", "x", "y"],
            "formats": ["<u2", "u1", "<f8", "<f8", "<f8"],
            "offsets": [0, 2, 3, 11, 19],
            "itemsize": 32,
        }
    )
    rng = np.random.default_rng(4)
    rec = np.zeros(40, dtype=layout)
    for name in ("x", "y", "z"):
        rec[name] = rng.uniform(-9, 9, 40)
    rec["intensity"] = rng.integers(0, 60000, 40)
    rec["ring"] = np.arange(40) % 16
    fields = [("y", 19, 8), ("intensity", 0, 4), ("x", 11, 8), ("ring", 2, 2), ("z", 3, 8)]
    expected = np.stack([rec["x"], rec["y"], rec["z"], rec["intensity"]], axis=1)
    return hand_cloud(rec, fields), ("x", "y", "z", "intensity"), expected


def case_organized_with_nans() -> tuple[PointCloud2, tuple[str, ...], np.ndarray]:
    grid = np.random.default_rng(5).uniform(-4, 4, size=(4, 6, 3)).astype(np.float32)
    grid[0, 0] = np.nan
    grid[2, 3, 1] = np.nan
    grid[3, :, 2] = np.nan
    msg = make_cloud(grid, "camera_depth", 3.0)
    flat = grid.reshape(-1, 3).astype(np.float64)
    return msg, ("x", "y", "z"), flat[np.isfinite(flat).all(axis=1)]


def case_empty() -> tuple[PointCloud2, tuple[str, ...], np.ndarray]:
    return make_cloud(np.zeros((0, 3)), "lidar", 4.0), ("x", "y", "z"), np.zeros((0, 3))


SHARED_CASES = {
    "float32_xyz": case_float32_xyz,
    "float64_intensity": case_float64_intensity,
    "big_endian": case_big_endian,
    "scrambled_offsets": case_scrambled_offsets,
    "organized_with_nans": case_organized_with_nans,
    "empty": case_empty,
}


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("case", SHARED_CASES)
def test_decoders_agree_with_expected(decoder: str, case: str) -> None:
    msg, names, expected = SHARED_CASES[case]()  # a fresh message: some decoders swap in place
    got = DECODERS[decoder](msg, names)
    assert got.shape == expected.shape
    assert np.array_equal(got, expected)


# -- our decoder in detail ---------------------------------------------------------------
def test_read_xyz_is_float32_and_row_major() -> None:
    msg, _, expected = case_organized_with_nans()
    xyz = read_xyz(msg)
    assert xyz.dtype == np.float32 and xyz.shape == (len(expected), 3)
    assert np.array_equal(xyz, expected.astype(np.float32))
    everything = read_xyz(msg, skip_nans=False)
    assert everything.shape == (24, 3)
    assert np.isnan(everything[0]).all() and np.isnan(everything[-6:, 2]).all()


@pytest.mark.parametrize(
    ("datatype", "big_endian"), list(itertools.product(POINTFIELD_DTYPES, [0, 1]))
)
def test_every_datatype_and_byte_order(datatype: int, big_endian: int) -> None:
    scalar = np.dtype(POINTFIELD_DTYPES[datatype])
    values = np.arange(-6, 6) if scalar.kind in "if" else np.arange(0, 12)
    pts = np.stack([values, values[::-1], values * 0 + 3], axis=1)
    msg = make_cloud(pts, "lidar", 0.0, dtype=scalar, big_endian=bool(big_endian))
    assert [f.datatype for f in msg.fields] == [datatype] * 3
    assert np.array_equal(read_xyz(msg), pts.astype(np.float32))
    # the same by hand, with the byte order applied by numpy, not by make_cloud
    order = ">" if big_endian else "<"
    layout = np.dtype(
        {"names": list("xyz"), "formats": [scalar.newbyteorder(order)] * 3,
         "offsets": [0, 8, 16], "itemsize": 27}
    )  # fmt: skip
    rec = np.zeros(len(pts), dtype=layout)
    for i, name in enumerate("xyz"):
        rec[name] = pts[:, i]
    fields = [("x", 0, datatype), ("y", 8, datatype), ("z", 16, datatype)]
    hand = hand_cloud(rec, fields, big_endian=bool(big_endian))
    assert np.array_equal(read_xyz(hand), pts.astype(np.float32))


def test_padded_rows() -> None:
    grid = np.random.default_rng(6).uniform(-2, 2, size=(5, 7, 3))
    msg = make_cloud(grid, "lidar", 0.0, dtype=np.float64, point_padding=3, row_padding=13)
    assert msg.row_step == 7 * msg.point_step + 13 and msg.point_step == 27
    assert np.array_equal(read_fields(msg, ("x", "y", "z")), grid.reshape(-1, 3))
    # the same by hand, padding bytes not zero
    rec = np.zeros(35, dtype=np.dtype([("x", "<f4"), ("pad", "V4"), ("y", "<f4"), ("z", "<f4")]))
    for i, name in enumerate("xyz"):
        rec[name] = grid.reshape(-1, 3)[:, i]
    hand = hand_cloud(rec, [("x", 0, 7), ("y", 8, 7), ("z", 12, 7)], height=5, row_padding=9)
    assert np.array_equal(read_xyz(hand), grid.reshape(-1, 3).astype(np.float32))
    # the last row's padding may be missing from the data
    short = hand_cloud(rec, [("x", 0, 7), ("y", 8, 7), ("z", 12, 7)], height=5, row_padding=9)
    short.data = short.data[:-9]
    assert read_xyz(short).shape == (35, 3)


def test_inf_points_are_skipped() -> None:
    pts = np.array([[1, 2, 3], [np.inf, 0, 0], [0, -np.inf, 0], [4, 5, 6]], dtype=np.float32)
    msg = make_cloud(pts, "lidar", 0.0)
    assert not msg.is_dense
    assert np.array_equal(read_xyz(msg), pts[[0, 3]])
    # float64 values beyond float32's range become inf in read_xyz and are dropped too
    big = make_cloud([[1e300, 0, 0], [1, 1, 1]], "lidar", 0.0, dtype=np.float64)
    assert np.array_equal(read_xyz(big), np.array([[1, 1, 1]], dtype=np.float32))


def test_read_fields_selects_and_filters() -> None:
    pts = np.array([[0, 0, 0, 5.0], [1, 1, 1, np.nan], [2, 2, 2, 7.0]])
    msg = make_cloud(pts, "lidar", 0.0, ("x", "y", "z", "intensity"))
    assert np.array_equal(read_fields(msg, ["intensity"]), [[5.0], [7.0]])
    assert read_xyz(msg).shape == (3, 3)  # xyz alone: the NaN intensity does not matter
    both = read_fields(msg, ("intensity", "x"), skip_nans=False)
    assert np.array_equal(both[[0, 2]], [[5.0, 0.0], [7.0, 2.0]])


def test_array_field_reads_its_first_element() -> None:
    rec = np.zeros(3, dtype=np.dtype([("xyz", "<f4", (3,)), ("rgb", "<u4")]))
    rec["xyz"] = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    msg = hand_cloud(rec, [("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6)])
    assert np.array_equal(read_xyz(msg), rec["xyz"])
    msg.fields = [PointField(name="xyz", offset=0, datatype=7, count=3)]
    assert np.array_equal(read_fields(msg, ["xyz"]), [[1.0], [4.0], [7.0]])


def test_data_as_bytes_list_or_ndarray() -> None:
    # rosbags hands over plain dataclasses whose data is an ndarray; others give bytes
    pts = np.arange(12, dtype=np.float32).reshape(4, 3)
    msg = make_cloud(pts, "lidar", 0.0)
    raw = bytes(msg.data)
    layout = {f: getattr(msg, f) for f in ("height", "width", "fields", "is_bigendian")}
    layout.update(point_step=msg.point_step, row_step=msg.row_step)
    for data in (raw, list(raw), np.frombuffer(raw, dtype=np.uint8), bytearray(raw)):
        plain = SimpleNamespace(**layout, data=data)
        assert np.array_equal(read_xyz(plain), pts)


def test_empty_clouds() -> None:
    assert read_xyz(PointCloud2()).shape == (0, 3)
    msg, _, _ = case_empty()
    assert (msg.width, msg.height, len(msg.data)) == (0, 1, 0)
    assert read_xyz(msg).shape == (0, 3) and read_xyz(msg).dtype == np.float32
    assert read_fields(msg, ("x", "intensity")).shape == (0, 2)


# -- malformed clouds --------------------------------------------------------------------
def malformed_truncated() -> PointCloud2:
    msg = make_cloud(np.ones((10, 3)), "lidar", 0.0)
    msg.data = msg.data[:-5]
    return msg


def malformed_missing_z() -> PointCloud2:
    return make_cloud(np.ones((10, 2)), "lidar", 0.0, ("x", "y"))


def malformed_datatype() -> PointCloud2:
    msg = make_cloud(np.ones((10, 3)), "lidar", 0.0)
    msg.fields[1].datatype = 9
    return msg


def malformed_offset() -> PointCloud2:
    msg = make_cloud(np.ones((10, 3)), "lidar", 0.0)
    msg.fields[2].offset = 10
    return msg


def malformed_row_step() -> PointCloud2:
    msg = make_cloud(np.ones((2, 5, 3)), "lidar", 0.0)
    msg.row_step = msg.point_step * 4
    return msg


def malformed_point_step() -> PointCloud2:
    msg = make_cloud(np.ones((10, 3)), "lidar", 0.0)
    msg.point_step = 0
    return msg


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (malformed_truncated, r"data has 115 bytes.*need 120"),
        (malformed_missing_z, r"no field 'z' \(fields: x, y\)"),
        (malformed_datatype, r"field 'y' has unsupported datatype 9"),
        (malformed_offset, r"field 'z' \(offset 10, 4 bytes\) does not fit in point_step 12"),
        (malformed_row_step, r"row_step 48 is shorter than width 5 x point_step 12"),
        (malformed_point_step, r"point_step must be > 0"),
    ],
)
def test_malformed_clouds_raise_value_error(build: Callable[[], PointCloud2], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_xyz(build())


def test_unrelated_bad_field_does_not_matter() -> None:
    msg = make_cloud(np.ones((4, 4)), "lidar", 0.0, ("x", "y", "z", "weird"))
    msg.fields[3].datatype = 42
    assert read_xyz(msg).shape == (4, 3)
    with pytest.raises(ValueError, match="'weird' has unsupported datatype 42"):
        read_fields(msg, ["weird"])


# -- builder -----------------------------------------------------------------------------
def test_make_cloud_header_and_layout() -> None:
    msg = make_cloud(np.zeros((3, 4)), "velodyne", 7.25, ("x", "y", "z", ("ring", np.uint16)))
    assert msg.header.frame_id == "velodyne" and stamp_to_seconds(msg.header.stamp) == 7.25
    assert [(f.name, f.offset, f.datatype, f.count) for f in msg.fields] == [
        ("x", 0, PointField.FLOAT32, 1),
        ("y", 4, PointField.FLOAT32, 1),
        ("z", 8, PointField.FLOAT32, 1),
        ("ring", 12, PointField.UINT16, 1),
    ]
    assert (msg.point_step, msg.row_step, msg.height, msg.width) == (14, 42, 1, 3)
    assert msg.is_dense and not msg.is_bigendian
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        make_cloud(np.zeros((3, 4)), "lidar", 0.0)
    with pytest.raises(ValueError, match="no PointField datatype"):
        make_cloud(np.zeros((3, 3)), "lidar", 0.0, dtype=np.int64)


def test_large_cloud_round_trip() -> None:
    pts = np.random.default_rng(8).normal(scale=10, size=(100_000, 3)).astype(np.float32)
    assert np.array_equal(read_xyz(make_cloud(pts, "lidar", 0.0)), pts)


# -- voxel downsampling ------------------------------------------------------------------
def brute_force_voxels(points: np.ndarray, voxel: float) -> dict[tuple[int, ...], np.ndarray]:
    cells: dict[tuple[int, ...], list[np.ndarray]] = {}
    for p in points:
        key = tuple(int(k) for k in np.floor(p[:3] / voxel))
        cells.setdefault(key, []).append(p)
    return {k: np.mean(v, axis=0) for k, v in cells.items()}


def test_voxel_downsample_known_cells() -> None:
    pts = np.array(
        [
            [0.01, 0.01, 0.01],
            [0.09, 0.05, 0.03],  # same voxel as the first
            [0.11, 0.0, 0.0],  # next voxel in x
            [-0.01, 0.0, 0.0],  # negative side: voxel -1, not 0
            [-0.09, 0.0, 0.0],
        ],
        dtype=np.float32,
    )
    out = voxel_downsample(pts, 0.1)
    assert out.dtype == np.float32 and out.shape == (3, 3)
    want = np.array([[-0.05, 0, 0], [0.05, 0.03, 0.02], [0.11, 0, 0]], dtype=np.float32)
    assert np.allclose(out, want, atol=1e-7)


@pytest.mark.parametrize("voxel", [0.05, 0.3, 2.0])
def test_voxel_downsample_matches_brute_force(voxel: float) -> None:
    rng = np.random.default_rng(9)
    pts = np.c_[rng.uniform(-3, 3, size=(3000, 3)), rng.uniform(0, 100, 3000)]
    out = voxel_downsample(pts, voxel)
    want = brute_force_voxels(pts, voxel)
    assert out.shape == (len(want), 4)
    for row in out:
        # each centroid lies in its own voxel, and equals the brute-force mean there
        key = tuple(int(k) for k in np.floor(row[:3] / voxel))
        assert np.allclose(row, want[key], atol=1e-9)
    assert len({tuple(np.floor(r[:3] / voxel)) for r in out}) == len(out)


def test_voxel_downsample_edges() -> None:
    assert voxel_downsample(np.zeros((0, 3), np.float32)).shape == (0, 3)
    pts = np.array([[0.0, 0.0, 0.0], [np.nan, 0, 0], [0.02, 0.0, 0.0]])
    assert np.allclose(voxel_downsample(pts, 0.1), [[0.01, 0.0, 0.0]])
    assert voxel_downsample(np.array([[1, 2, 3]]), 1.0).dtype == np.float64
    with pytest.raises(ValueError, match="voxel size"):
        voxel_downsample(pts, 0.0)
    with pytest.raises(ValueError, match="shape"):
        voxel_downsample(np.zeros((4, 2)), 0.1)
