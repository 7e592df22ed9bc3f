"""memory-replay against real bags: MCAP and sqlite3, --topics/--start/--duration, /tf_static
latched for late subscribers, and clear errors (exit 2) for bags it cannot play, while a node
listening goes on unaffected."""

from __future__ import annotations

import json
import shutil
import sys
import time

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from tf2_msgs.msg import TFMessage

from memory_node.ros.replay import CLOCK_PERIOD_S, Replayer, ReplayError, bag_info, main
from memory_node.sim.generate import generate_sample


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("bags")
    mcap = generate_sample(root / "mcap", seed=3, duration_s=12.0)
    sqlite = generate_sample(root / "sqlite", seed=3, duration_s=12.0, fmt="sqlite3")
    return mcap.bag_dir, sqlite.bag_dir


@pytest.fixture
def node():
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    n = rclpy.create_node("replay_test", context=ctx)
    yield n
    n.destroy_node()
    rclpy.shutdown(context=ctx)


def test_info_lists_topics_and_counts(bags, capsys):
    mcap, _ = bags
    info = bag_info(mcap)
    assert info.topics["/camera/image_raw"][0] == "sensor_msgs/msg/Image"
    assert 130 <= info.topics["/camera/image_raw"][1] <= 160  # ~12 Hz for 12 s
    assert 11.5 < info.duration_s < 12.5
    assert main([str(mcap), "--info"]) == 0
    assert "/lidar/points" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["mcap", "sqlite3"])
def test_replays_selected_topics_with_clock_and_latched_static_tf(bags, node, fmt):
    bag = bags[0] if fmt == "mcap" else bags[1]
    received: dict[str, list] = {"odom": [], "clock": [], "static": []}
    from nav_msgs.msg import Odometry
    from rosgraph_msgs.msg import Clock

    node.create_subscription(Odometry, "/odom", received["odom"].append, 100)
    node.create_subscription(Clock, "/clock", received["clock"].append, 100)
    rep = Replayer(node, bag, rate=4.0, topics=["/odom", "/tf_static"], start_s=2.0,
                   duration_s=5.0, wait_subscribers_s=5.0)
    n = rep.run()
    # A subscriber that comes late still gets every static transform (transient local).
    node.create_subscription(
        TFMessage, "/tf_static", received["static"].append,
        QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                   durability=DurabilityPolicy.TRANSIENT_LOCAL))
    ex = SingleThreadedExecutor(context=node.context)
    ex.add_node(node)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (len(received["odom"]) < 95 or not received["static"]):
        ex.spin_once(timeout_sec=0.1)
    ex.shutdown()
    assert n >= 100  # ~20 Hz odometry for 5 s (+ nothing else: the static TF is at t=0)
    assert 95 <= len(received["odom"]) <= n
    t0 = received["odom"][0].header.stamp.sec + received["odom"][0].header.stamp.nanosec * 1e-9
    assert abs(t0 - (1764460800 + 2.0)) < 0.1  # --start 2 s into the bag
    children = {ts.child_frame_id for m in received["static"] for ts in m.transforms}
    assert {"camera_link", "lidar"} <= children
    clock_s = [c.clock.sec + c.clock.nanosec * 1e-9 for c in received["clock"]]
    assert clock_s and clock_s == sorted(clock_s) and clock_s[-1] >= t0 + 4.5


class _StallingReplayer(Replayer):
    """A replay that stalls once, 0.5 s before its 10th message, as a loaded machine would,
    and notes what it published in order: ("clock", t) and ("msg", t_of_message)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, float]] = []

    def _publish_clock(self, t_ns: int) -> None:
        self.sent.append(("clock", t_ns / 1e9))
        super()._publish_clock(t_ns)

    def _publish(self, topic: str, raw: bytes) -> None:
        from rclpy.serialization import deserialize_message

        msgs = sum(kind == "msg" for kind, _ in self.sent)
        if msgs == 10:
            time.sleep(0.5)
        stamp = deserialize_message(raw, self.types[topic]).header.stamp
        self.sent.append(("msg", stamp.sec + stamp.nanosec * 1e-9))
        super()._publish(topic, raw)


def test_a_replay_that_falls_behind_keeps_clock_up_with_what_it_publishes(bags, node):
    """After a stall the replay catches up in a burst; /clock keeps pace with it, so a node
    stamping on arrival is not handed a clock seconds behind the message it gets."""
    rep = _StallingReplayer(node, bags[0], rate=4.0, topics=["/odom"], duration_s=4.0)
    rep.run()
    step = CLOCK_PERIOD_S * 4.0
    clock, behind = -1.0, []
    for kind, t in rep.sent:
        if kind == "clock":
            clock = t
        else:
            behind.append(t - clock)
    assert len(behind) >= 70  # ~20 Hz odometry for 4 s
    assert max(behind) <= step + 0.06, max(behind)  # one period, plus the bag's receipt lag


def test_unknown_topic_and_type_and_corrupt_bags_are_clear_errors(bags, tmp_path, node):
    mcap, _ = bags
    with pytest.raises(ReplayError, match="not in the bag: /nope"):
        Replayer(node, mcap, topics=["/nope"])
    with pytest.raises(ReplayError, match="does not exist"):
        Replayer(node, tmp_path / "missing")
    # A bag whose type no installed package provides.
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    store.register(get_types_from_msg("int32 level", "acme_msgs/msg/Battery"))
    odd = tmp_path / "odd_bag"
    with Writer(odd, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection("/battery", "acme_msgs/msg/Battery", typestore=store)
        msg = store.types["acme_msgs/msg/Battery"](level=3)
        w.write(conn, 1, store.serialize_cdr(msg, "acme_msgs/msg/Battery"))
    with pytest.raises(ReplayError, match="unknown message type acme_msgs/msg/Battery"):
        Replayer(node, odd)  # nothing else in it to play
    # A truncated recording: the replay stops with a message, not a traceback.
    broken = tmp_path / "broken"
    shutil.copytree(mcap, broken)
    data = next(broken.glob("*.mcap"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(ReplayError, match="broken"):
        Replayer(node, broken, rate=50.0).run()


def test_a_robot_bag_with_vendor_types_and_its_own_clock_replays_what_it_can(tmp_path, node):
    """A bag recorded on a robot carries vendor messages (no Python package here) and often
    /clock: the known topics play, the rest is left out and said so; naming an unplayable
    topic is still an error."""
    from nav_msgs.msg import Odometry
    from rclpy.serialization import serialize_message
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore
    from rosgraph_msgs.msg import Clock

    store = get_typestore(Stores.ROS2_KILTED)
    store.register(get_types_from_msg("uint8[4] head", "unitree_go/msg/SportModeState"))
    bag = tmp_path / "robot_bag"
    base_ns = 1_764_460_800_000_000_000
    with Writer(bag, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        vendor = w.add_connection("/sportmodestate", "unitree_go/msg/SportModeState",
                                  typestore=store)
        odom = w.add_connection("/odom", "nav_msgs/msg/Odometry", typestore=store)
        clock = w.add_connection("/clock", "rosgraph_msgs/msg/Clock", typestore=store)
        for i in range(20):
            t_ns = base_ns + i * 50_000_000
            w.write(vendor, t_ns, store.serialize_cdr(
                store.types["unitree_go/msg/SportModeState"](head=np.zeros(4, np.uint8)),
                "unitree_go/msg/SportModeState"))
            m = Odometry()
            m.header.stamp.sec, m.header.stamp.nanosec = divmod(t_ns, 1_000_000_000)
            w.write(odom, t_ns, serialize_message(m))
            c = Clock()
            c.clock.sec, c.clock.nanosec = divmod(t_ns + 10**9, 1_000_000_000)  # another clock
            w.write(clock, t_ns, serialize_message(c))
    rep = Replayer(node, bag, rate=10.0)
    assert rep.topics == ["/odom"]
    assert "unitree_go/msg/SportModeState" in rep.skipped["/sportmodestate"]
    assert "/clock" in rep.skipped
    received: dict[str, list] = {"odom": [], "clock": []}
    node.create_subscription(Odometry, "/odom", received["odom"].append, 100)
    node.create_subscription(Clock, "/clock", received["clock"].append, 100)
    ex = SingleThreadedExecutor(context=node.context)
    ex.add_node(node)
    assert rep.run() == 20
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(received["odom"]) < 20:
        ex.spin_once(timeout_sec=0.1)
    for _ in range(10):
        ex.spin_once(timeout_sec=0.05)
    ex.shutdown()
    assert len(received["odom"]) == 20
    clock_s = [c.clock.sec + c.clock.nanosec * 1e-9 for c in received["clock"]]
    assert clock_s == sorted(clock_s) and max(clock_s) <= base_ns / 1e9 + 0.95 + 1e-6
    with pytest.raises(ReplayError, match="unitree_go"):
        Replayer(node, bag, topics=["/odom", "/sportmodestate"])


def test_cli_exit_codes_and_listening_node_unaffected(bags, tmp_path, ros_process):
    mcap, _ = bags
    server = ros_process(["-m", "memory_node.ros.main", "--memory-dir", str(tmp_path / "m")])
    server.wait_for_line("recording", timeout=60)
    broken = tmp_path / "broken"
    shutil.copytree(mcap, broken)
    data = next(broken.glob("*.mcap"))
    data.write_bytes(data.read_bytes()[:2000])
    proc = ros_process([sys.executable, "-m", "memory_node.ros.replay", str(broken)])
    assert proc.popen.wait(60) == 2
    assert "memory-replay:" in proc.output and "Traceback" not in proc.output
    cli = ros_process([sys.executable, "-m", "memory_node.ros.cli", "streams", "--timeout", "30"])
    assert cli.popen.wait(60) == 0
    assert json.loads(cli.output.strip().splitlines()[-1])["ok"] is True
    assert server.poll() is None


def test_a_publish_the_middleware_refuses_is_counted_and_the_replay_goes_on(bags, node):
    """A publisher whose middleware call fails (its handle destroyed here: rclpy raises the
    same RCLError as a reliable writer that gave up waiting for a slow subscriber) drops
    that topic's messages, counted and said once; the other topics and /clock play to the end
    (the full suite under load once ended a replay on one "cannot publish data")."""
    rep = Replayer(node, bags[0], rate=8.0, topics=["/odom", "/tf"], duration_s=1.0)
    node.destroy_publisher(rep.publishers["/odom"])
    n = rep.run()
    assert rep.not_published >= 15  # ~20 Hz odometry for 1 s, each refused 5 times
    assert n >= 15  # /tf still played through
