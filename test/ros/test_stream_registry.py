"""A sensor stream defined in the tests alone (a range finder's sensor_msgs/Range, in
test/stream_support.py), registered in core/streams.py and recorded twice without touching the
recorder: live, through the ROS recorder node's own subscription, and by memory-import from a
bag this test writes. Both give stored rows with the decoder's tags and text and the pose the
recorder resolved."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
import rclpy
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message
from sensor_msgs.msg import Range
from stream_support import RANGE
from waiting import wait_until

from memory_node.core.streams import StreamKind, register_stream, stream_kind, unregister_stream
from memory_node.wire.geometry import seconds_to_stamp

T0 = 1_764_460_800.0


def _odom(x: float, t: float) -> Odometry:
    m = Odometry()
    m.header.frame_id = "odom"
    m.header.stamp = seconds_to_stamp(t)
    m.child_frame_id = "base_link"
    m.pose.pose.position.x = float(x)
    m.pose.pose.orientation.w = 1.0
    return m


def _range(metres: float, t: float) -> Range:
    m = Range()
    m.header.frame_id = "range_link"
    m.header.stamp = seconds_to_stamp(t)
    m.min_range, m.max_range, m.range = 0.05, 4.0, float(metres)
    return m


def _range_rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return [tuple(r) for r in con.execute(
            "SELECT t, x, pose_source, tags, text FROM observations WHERE stream = 'range' "
            "ORDER BY t")]


def test_registry_refuses_a_second_kind_of_one_name_and_unknown_names(range_stream):
    with pytest.raises(ValueError, match="already registered"):
        register_stream(RANGE)
    with pytest.raises(ValueError, match="built in"):
        unregister_stream("camera")
    with pytest.raises(KeyError, match="range"):
        stream_kind("sonar")  # the error names the registered kinds
    with pytest.raises(ValueError, match="to_row"):
        StreamKind("sonar", ("sensor_msgs/msg/Range",), "sonar_topic", "/sonar")


def test_a_registered_stream_is_recorded_live_by_the_recorder_node(range_stream, tmp_path):
    from engine_support import make_engine

    from memory_node.ros.recorder import MemoryRecorder

    engine = make_engine(tmp_path / "mem")
    ctx = rclpy.Context()
    rclpy.init(args=["--ros-args", "-p", "tf_wait_s:=0.2", "-p", "min_distance:=0.01",
                     "-p", "range_topic:=/front_range"], context=ctx)
    rec = MemoryRecorder(engine=engine, context=ctx)
    pub_node = rclpy.create_node("range_driver", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(rec)
    executor.add_node(pub_node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        assert rec.watches["range"] is not None and rec.watches["range"].topic == "/front_range"
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
        odom_pub = pub_node.create_publisher(Odometry, "/odom", 50)
        range_pub = pub_node.create_publisher(Range, "/front_range", qos)
        wait_until(lambda: rec.count_publishers("/front_range") and rec.count_publishers("/odom"),
                   "the driver's publishers", timeout=10)
        t0 = time.time()
        for i in range(6):  # the robot's path first: each reading's pose is known on arrival
            odom_pub.publish(_odom(0.5 * i, t0 + 0.1 * i))
        wait_until(lambda: rec.counters["odom"].received == 6, "the odometry", timeout=10)
        for i in range(6):
            range_pub.publish(_range(1.0 + 0.25 * i, t0 + 0.1 * i))
            time.sleep(0.02)
        wait_until(lambda: rec.counters["range"].received == 6, "the readings", timeout=10)
        assert rec.drain(30.0)
        got = _range_rows(tmp_path / "mem" / "memory.db")
        assert rec.counters["range"].stored == 6
    finally:
        executor.shutdown()
        rec.close()
        rec.destroy_node()
        pub_node.destroy_node()
        rclpy.shutdown(context=ctx)
        spinner.join(5)
        engine.close()
    assert [(x, source) for _t, x, source, _tags, _text in got] == \
        [(pytest.approx(0.5 * i), "odom") for i in range(6)]
    assert [text for *_, text in got] == [f"obstacle {1.0 + 0.25 * i:.2f} m ahead"
                                          for i in range(6)]
    assert all('"range_m"' in tags for *_, tags, _text in got)


def _write_bag(path: Path) -> None:
    """Odometry and range readings (on /front_range), 10 Hz for 3 s, in an MCAP bag."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_KILTED)
    writer = Writer(path, version=Writer.VERSION_LATEST, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    try:
        odom = writer.add_connection("/odom", "nav_msgs/msg/Odometry", typestore=ts)
        rng = writer.add_connection("/front_range", "sensor_msgs/msg/Range", typestore=ts)
        for i in range(30):
            t = T0 + 0.1 * i
            writer.write(odom, int(t * 1e9), serialize_message(_odom(0.1 * i, t)))
            writer.write(rng, int((t + 0.01) * 1e9),
                         serialize_message(_range(2.0, t + 0.01)))
    finally:
        writer.close()


def test_a_registered_stream_is_imported_from_a_bag(range_stream, tmp_path, capsys):
    from memory_node.ros import bag_import

    _write_bag(tmp_path / "bag")
    memory = tmp_path / "memory"
    config = tmp_path / "robot.yaml"  # the new stream's topic parameter, set as any other
    config.write_text("memory_recorder:\n  ros__parameters:\n    range_topic: /front_range\n")
    code = bag_import.main([str(tmp_path / "bag"), "--memory-dir", str(memory),
                            "--config", str(config), "--threads", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "unknown parameter" not in out.err
    assert "range" in out.out.splitlines()[-1]  # the summary counts the new stream
    got = _range_rows(memory / "memory.db")
    # the keyframe gate thins it as any sensor stream; each row kept is posed
    assert got, out
    assert all(source in ("odom", "odom_interpolated") for _t, _x, source, *_ in got), got
    assert all(text == "obstacle 2.00 m ahead" for *_, text in got)
    for t, x, *_ in got:  # the odometry pose at the reading's stamp
        assert x == pytest.approx((t - T0) * 1.0, abs=0.02)
