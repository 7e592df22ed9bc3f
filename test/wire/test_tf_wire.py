"""Reading /tf from its CDR bytes gives exactly what rclpy's deserializer gives, in both byte
orders, and drops only edges below the base frame."""

from __future__ import annotations

import random
import struct

import pytest
from geometry_msgs.msg import TransformStamped
from rclpy.serialization import deserialize_message, serialize_message
from tf2_msgs.msg import TFMessage

from memory_node.wire.tf_wire import TfEdgeFilter, TfWireError, parse_tf_message


def random_message(rng: random.Random, n: int) -> TFMessage:
    msg = TFMessage()
    for i in range(n):
        ts = TransformStamped()
        ts.header.stamp.sec = rng.randint(0, 2**31 - 1)
        ts.header.stamp.nanosec = rng.randint(0, 999_999_999)
        # odd lengths exercise the 4- and 8-byte alignment after each string
        ts.header.frame_id = "p" * rng.randint(0, 9) + str(i)
        ts.child_frame_id = "c" * rng.randint(0, 7) + "é" + str(i)
        t, r = ts.transform.translation, ts.transform.rotation
        t.x, t.y, t.z = (rng.uniform(-50, 50) for _ in range(3))
        r.x, r.y, r.z, r.w = (rng.uniform(-1, 1) for _ in range(4))
        msg.transforms.append(ts)
    return msg


def big_endian(msg: TFMessage) -> bytes:
    """The same message encoded big-endian (CDR_BE), as a big-endian host would send it."""
    out = bytearray(b"\x00\x00\x00\x00")

    def align(n):
        while (len(out) - 4) % n:
            out.append(0)

    def string(s):
        data = s.encode() + b"\x00"
        align(4)
        out.extend(struct.pack(">I", len(data)) + data)

    align(4)
    out.extend(struct.pack(">I", len(msg.transforms)))
    for ts in msg.transforms:
        align(4)
        out.extend(struct.pack(">iI", ts.header.stamp.sec, ts.header.stamp.nanosec))
        string(ts.header.frame_id)
        string(ts.child_frame_id)
        align(8)
        t, r = ts.transform.translation, ts.transform.rotation
        out.extend(struct.pack(">7d", t.x, t.y, t.z, r.x, r.y, r.z, r.w))
    return bytes(out)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 23])
@pytest.mark.parametrize("order", ["little", "big"])
def test_matches_rclpy(n, order):
    msg = random_message(random.Random(n), n)
    data = serialize_message(msg) if order == "little" else big_endian(msg)
    reference = deserialize_message(serialize_message(msg), TFMessage).transforms
    got = parse_tf_message(data)
    assert len(got) == n
    for w, ts in zip(got, reference, strict=True):
        assert (w.parent, w.child) == (ts.header.frame_id, ts.child_frame_id)
        assert w.stamp == pytest.approx(ts.header.stamp.sec + ts.header.stamp.nanosec * 1e-9)
        t, r = ts.transform.translation, ts.transform.rotation
        assert w.translation == (t.x, t.y, t.z)
        assert w.rotation == (r.x, r.y, r.z, r.w)


def test_filter_keeps_the_world_chain_and_drops_joints():
    keep = TfEdgeFilter("base_link", keep=["camera_link"])
    edges = [("map", "odom"), ("odom", "base_link"), ("base_link", "FL_hip"),
             ("FL_hip", "FL_thigh"), ("FL_thigh", "FL_foot"), ("base_link", "camera_link"),
             ("map", "odom")]
    assert [keep(p, c) for p, c in edges] == [True, True, False, False, False, True, True]
    assert keep.dropped == 3


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x00\x00", b"\x00\x07\x00\x00\x01\x00\x00\x00",
                                  b"\x00\x01\x00\x00\x05\x00\x00\x00\x01\x00"])
def test_malformed_bytes_raise_a_wire_error(data):
    with pytest.raises(TfWireError):
        parse_tf_message(data)


def test_truncated_message_raises():
    data = serialize_message(random_message(random.Random(1), 3))
    for cut in (len(data) - 1, len(data) - 30, 20):
        with pytest.raises(TfWireError):
            parse_tf_message(data[:cut])
