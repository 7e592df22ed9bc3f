"""What a robot engineer meets on the first day, with real `memory-node` processes: parameter
files with integers and typos, topics nobody publishes, a node stopped with Ctrl-C, a burst of
requests, and simulated time before the first /clock."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import rclpy
from nav_msgs.msg import Odometry
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import PointCloud2

from memory_node.srv import Save, Streams


def call(caller, verb, payload=None, timeout=30.0):
    return json.loads(caller.call(verb, payload, timeout))


def params_file(tmp_path, recorder: str = "", server: str = "", common: str = "") -> str:
    path = tmp_path / "robot.yaml"
    path.write_text("/**:\n  ros__parameters:\n    memory_dir: \"\"\n" + common
                    + "memory_recorder:\n  ros__parameters:\n    stats_period_s: 1.0\n" + recorder
                    + ("memory_server:\n  ros__parameters:\n" + server if server else ""))
    return str(path)


def node_cmd(tmp_path, config: str, *extra: str) -> list[str]:
    return ["-m", "memory_node.ros.main", "--config", config, "--memory-dir",
            str(tmp_path / "mem"), *extra]


# -- parameters ----------------------------------------------------------------------------
def test_integers_where_floats_are_declared_are_accepted(ros, ros_process, tmp_path):
    config = params_file(tmp_path, recorder="    max_interval: 10\n    min_distance: 1\n"
                         "    tf_wait_s: 2\n", common="    tf_tolerance_s: 1\n")
    proc = ros_process(node_cmd(tmp_path, config))
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    _, caller, _ = ros
    assert call(caller, "streams")["ok"] is True
    assert "InvalidParameterType" not in proc.output and "Traceback" not in proc.output


@pytest.mark.parametrize(("section", "line", "name", "expected"), [
    ("recorder", "    max_interval: ten\n", "max_interval", "a number"),
    ("recorder", "    use_compressed: 3\n", "use_compressed", "a boolean"),
    ("server", "    max_pending_requests: 2.5\n", "max_pending_requests", "an integer"),
    ("common", "    world_frame: 7\n", "world_frame", "a string"),
])
def test_invalid_values_stop_the_node_before_any_service(ros_process, tmp_path, section, line,
                                                         name, expected):
    config = params_file(tmp_path, **{section: line})
    proc = ros_process(node_cmd(tmp_path, config))
    assert proc.popen.wait(120) == 2, proc.output
    proc.read_to_end()
    errors = [ln for ln in proc.output.splitlines() if ln.startswith("memory-node: parameter")]
    assert len(errors) == 1, proc.output
    assert name in errors[0] and expected in errors[0], errors[0]
    assert "Traceback" not in proc.output
    assert "active:" not in proc.output  # no service was advertised


def test_unknown_key_is_warned_with_the_nearest_known_name(ros_process, tmp_path):
    config = params_file(tmp_path, recorder="    lidar_topik: /point_cloud2\n")
    proc = ros_process(node_cmd(tmp_path, config))
    proc.wait_for_line(r"unknown parameter lidar_topik \(ignored\); did you mean lidar_topic\?",
                       timeout=120)
    proc.wait_for_line(r"active: /memory/search", timeout=60)


# -- watchdog ------------------------------------------------------------------------------
def test_silent_topics_and_missing_tf_are_named(ros, ros_process, tmp_path):
    """The configured lidar topic has no publisher while the robot's lidar publishes under
    another name: a warning names both, and the streams answer says lidar is not recording."""
    ctx, caller, node = ros
    lidar = node.create_publisher(PointCloud2, "/point_cloud2", 10)
    odom = node.create_publisher(Odometry, "/odom", 10)
    config = params_file(tmp_path, recorder="    topic_timeout_s: 1.5\n")
    stop = threading.Event()

    def odometry() -> None:  # the robot's odometry keeps flowing throughout
        while not stop.is_set():
            msg = Odometry()
            msg.header.frame_id = "odom"
            msg.header.stamp = node.get_clock().now().to_msg()
            msg.pose.pose.orientation.w = 1.0
            odom.publish(msg)
            time.sleep(0.1)

    flow = threading.Thread(target=odometry, daemon=True)
    flow.start()
    try:
        proc = ros_process(node_cmd(tmp_path, config))
        proc.wait_for_line(r"active: /memory/search", timeout=120)
        # The first warning may come before discovery has seen every topic; a topic of the
        # type that appears later is named in a warning of its own.
        proc.wait_for_line(r"no messages on /lidar/points for 1.5 s \(no publisher\); "
                           r"PointCloud2 topics: /point_cloud2", timeout=30)
        proc.wait_for_line(r"no transform map <- base_link for 1.5 s", timeout=30)
        deadline = time.monotonic() + 30
        answer = call(caller, "streams")
        while time.monotonic() < deadline and not (
                "recorder" in answer and any(s["name"] == "odom" for s in answer["streams"])):
            time.sleep(0.5)
            answer = call(caller, "streams")
    finally:
        stop.set()
        flow.join()
    assert answer["ok"] is True
    rec = answer["recorder"]
    assert rec["lidar"] == {"status": "no_publisher", "topic": "/lidar/points"}
    assert rec["camera"]["status"] == "no_publisher"
    assert rec["odom"] == {"status": "recording", "topic": "/odom"}
    assert rec["tf"]["status"] in ("no_publisher", "silent")
    [odom_entry] = [s for s in answer["streams"] if s["name"] == "odom"]
    assert odom_entry["status"] == "recording" and odom_entry["topic"] == "/odom"
    node.destroy_publisher(lidar)
    node.destroy_publisher(odom)


# -- stopping ------------------------------------------------------------------------------
@pytest.mark.parametrize("signals", [1, 2])
def test_one_sigint_stops_within_five_seconds_without_noise(ros, ros_process, tmp_path, signals):
    _, caller, _ = ros
    proc = ros_process(node_cmd(tmp_path, params_file(tmp_path)))
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    assert call(caller, "save", "a note before stopping")["ok"] is True
    start = time.monotonic()
    for _ in range(signals):
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.05)
    assert proc.popen.wait(10) == 0, proc.output
    took = time.monotonic() - start
    assert took < 5.0, f"stopped after {took:.1f} s"
    out = proc.read_to_end()
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert "rosout" not in out and "context is invalid" not in out, out
    assert "recorder stopped:" in out and "memory closed" in out, out


# -- bursts --------------------------------------------------------------------------------
WORDS = ("kitchen", "door", "battery", "charger", "window", "chair", "person", "table", "red",
         "blue", "lamp", "stairs", "plant", "box", "cable", "dog", "cup", "shelf", "robot")


def _burst(ctx, n: int, timeout: float = 60.0) -> list[dict]:
    node = rclpy.create_node("test_burst_client", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    try:
        # A client that sends a burst keeps a deep queue for the answers, as the server does
        # for the requests (the default depth of 10 would drop answers on the client side).
        client = node.create_client(Save, "/memory/save", qos_profile=QoSProfile(depth=n))
        assert client.wait_for_service(timeout_sec=30)
        futures = []
        for i in range(n):
            req = Save.Request()
            req.note.data = f"burst {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)]
                                                      for j in range(6))
            futures.append(client.call_async(req))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            rclpy.spin_once(node, executor=executor, timeout_sec=0.1)
        answered = [json.loads(f.result().result.data) for f in futures if f.done()]
        return answered + [None] * (n - len(answered))
    finally:
        node.destroy_node()


def test_fifty_saves_at_once_are_all_answered(ros, ros_process, tmp_path):
    ctx, caller, _ = ros
    proc = ros_process(node_cmd(tmp_path, params_file(tmp_path), "--no-recorder"))
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    answers = _burst(ctx, 50)
    assert None not in answers, f"{answers.count(None)} of 50 saves never answered"
    assert all(a["ok"] for a in answers), [a for a in answers if not a["ok"]][:3]
    events = [s for s in call(caller, "streams")["streams"] if s["name"] == "events"]
    # near-duplicate notes fold into an earlier one (same id): every distinct id is stored
    assert events and events[0]["count"] == len({a["id"] for a in answers})


def test_a_full_request_queue_refuses_rather_than_drops(ros, ros_process, tmp_path):
    ctx, _, _ = ros
    config = params_file(tmp_path, server="    max_pending_requests: 1\n")
    proc = ros_process(node_cmd(tmp_path, config, "--no-recorder"))
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    answers = _burst(ctx, 40)
    assert None not in answers, f"{answers.count(None)} of 40 saves never answered"
    refused = [a for a in answers if not a["ok"]]
    assert all(a["error"]["code"] == "unavailable" and "max_pending_requests"
               in a["error"]["message"] for a in refused), refused[:3]
    assert len(refused) < 40  # the one allowed at a time is served


def test_an_answer_the_middleware_cannot_deliver_is_resent_then_reported(ros, ros_process,
                                                                          tmp_path):
    """Fast DDS drops an answer to a client whose response reader the server has not matched
    (a new client's first request can outrun discovery on a loaded machine). A client whose
    reader can never match (it asks for transient-local answers) makes that state last: the
    server keeps re-sending for answer_resend_s, says so in one line, and serves others."""
    ctx, caller, _ = ros
    config = params_file(tmp_path, server="    answer_resend_s: 1.0\n")
    proc = ros_process(node_cmd(tmp_path, config, "--no-recorder"))
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    node = rclpy.create_node("unmatched_reader_client", context=ctx)
    try:
        qos = QoSProfile(depth=10, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        # (wait_for_service would wait forever: it also wants the answers' reader matched)
        client = node.create_client(Streams, "/memory/streams", qos_profile=qos)
        executor = SingleThreadedExecutor(context=ctx)
        executor.add_node(node)
        line, next_call = None, 0.0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and line is None:
            if time.monotonic() >= next_call:  # until discovery lets a request through
                client.call_async(Streams.Request())
                next_call = time.monotonic() + 3.0
            executor.spin_once(timeout_sec=0.1)
            line = next((ln for ln in proc.output.splitlines() if "not delivered" in ln), None)
        assert line is not None, proc.output
        assert "/memory/streams" in line and "1 s" in line
        assert "RuntimeWarning" not in proc.output
        assert call(caller, "streams")["ok"] is True  # others are served meanwhile and after
    finally:
        node.destroy_node()


# -- simulated time ------------------------------------------------------------------------
def test_no_clock_yet_answers_unavailable_never_1970(ros, ros_process, tmp_path):
    ctx, caller, node = ros
    config = params_file(tmp_path, server="    clock_wait_s: 0.5\n")
    proc = ros_process(node_cmd(tmp_path, config, "--use-sim-time"))
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    answer = call(caller, "save", "stamped before any clock")
    assert answer["ok"] is False and answer["error"]["code"] == "unavailable", answer
    assert "/clock" in answer["error"]["message"]
    assert not list((tmp_path / "mem" / "notes").glob("1970-*"))
    clock = node.create_publisher(Clock, "/clock", 10)
    sim_t = 1_764_460_800  # 2025-11-30
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = Clock()
        msg.clock.sec = sim_t
        clock.publish(msg)
        answer = call(caller, "save", "stamped on the simulated clock", timeout=5)
        if answer["ok"]:
            break
    assert answer["ok"] is True, answer
    assert abs(answer["t"] - sim_t) < 5
    assert list((tmp_path / "mem" / "notes").glob("2025-11-30_notes.md"))
    assert not list((tmp_path / "mem" / "notes").glob("1970-*"))
    node.destroy_publisher(clock)
