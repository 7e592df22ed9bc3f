"""`memory-node` under a real robot's /tf load (issue 16).

`python -m bench --only tf_load [--duration S]` (or `python -m bench.tf_load`) publishes, from
this process, what a Go2-like stack puts out while the robot stands at known poses:

- /tf at `tf_hz` (100): one message of `joints` (20) joint transforms below base_link (four
  legs of five links, as robot_state_publisher sends them) plus odom -> base_link, i.e. 2,000
  joint transforms/s; map -> odom in messages of its own at 20 Hz (a localiser's rate);
- camera 640x480 rgb8 at 14 Hz, lidar (20k points) at 8 Hz, odometry at 20 Hz;

into `memory-node --memory-dir D` (one process: recorder, server and their TF listener). The
robot stands still for `stop_s` seconds at each of a few known poses and moves between them in
1 s; a note is saved through /memory/save 1 s and 3 s into every stop (`save_after_s`), so a
note that got a pose older than ~1 s lands on the previous stop, metres away: a still robot
alone cannot tell an up-to-date listener from one that lags by seconds.

Reported: note-pose error (max, p50) and the answer's `age_s`, the recorder's counters (final
"recorder stopped:" line; /memory/recorder_stats during the run), CPU per process (psutil:
memory-node and this publisher), TF messages the node processed per second, and the publish
rates achieved. `--python` runs another checkout's node (e.g. the code before the fix) with the
same publisher, so the two compare in one session. The recorder-drop check of the sample bag
replayed at 1x/2x/4x reuses `bench.ros_bench.section_ros_ingest` with the one-process node.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_DIR,
    DEFAULT_RESULTS,
    REPO_ROOT,
    interrupt,
    machine_info,
    write_json,
)

Log = Callable[[str], None]

# Where the robot stands first (map frame) and where the localiser puts odom in the map.
ROBOT_POSE = (3.2, -1.4, 0.7)
MAP_ODOM = (0.8, 0.3, 0.25)
# Further stops (the bench visits them in turn, then starts over).
STOPS = [ROBOT_POSE, (6.0, 1.5, 2.2), (1.0, 2.0, -2.5), (4.5, -3.0, 0.0)]
# Test runs take ROS domains 1..100, the demo 101..199, bench/ros_bench.py 230 and 231 (and
# other benches on a shared machine may take any fixed one): the run takes the first domain of
# these where no node is seen (`quiet_domain`).
DOMAINS = range(215, 230)
LEGS = ("FL", "FR", "RL", "RR")
LINKS = ("hip", "thigh", "calf", "foot", "toe")  # 4 x 5 = 20 joint frames below base_link


# ---- geometry and the wire ---------------------------------------------------------------
def quat_yaw(yaw: float) -> tuple[float, float, float, float]:
    return (0.0, 0.0, math.sin(yaw / 2.0), math.cos(yaw / 2.0))


def compose(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """a ∘ b for planar poses (x, y, yaw)."""
    c, s = math.cos(a[2]), math.sin(a[2])
    return (a[0] + c * b[0] - s * b[1], a[1] + s * b[0] + c * b[1], a[2] + b[2])


def invert(a: Sequence[float]) -> tuple[float, float, float]:
    c, s = math.cos(a[2]), math.sin(a[2])
    return (-c * a[0] - s * a[1], s * a[0] - c * a[1], -a[2])


def odom_base_for(robot: Sequence[float], map_odom: Sequence[float] = MAP_ODOM
                  ) -> tuple[float, float, float]:
    """odom -> base_link that puts base_link at `robot` in the map through `map_odom`."""
    return compose(invert(map_odom), robot)


Edge = tuple[str, str, float, Sequence[float], Sequence[float]]  # parent, child, t, xyz, xyzw


def planar_edge(parent: str, child: str, t: float, pose: Sequence[float]) -> Edge:
    return (parent, child, t, (pose[0], pose[1], 0.0), quat_yaw(pose[2]))


def joint_edges(t: float, phase: float = 0.0, base: str = "base_link") -> list[Edge]:
    """20 joint transforms (four legs of five links) below `base`, angles moving with `phase`."""
    out: list[Edge] = []
    for i, leg in enumerate(LEGS):
        parent = base
        for j, link in enumerate(LINKS):
            child = f"{leg}_{link}"
            a = 0.3 * math.sin(phase + i + j)
            xyz = (0.19 if i < 2 else -0.19, 0.05 if i % 2 == 0 else -0.05, 0.0) if j == 0 \
                else (0.0, 0.0, -0.2)
            out.append((parent, child, t, xyz, (math.sin(a / 2.0), 0.0, 0.0, math.cos(a / 2.0))))
            parent = child
    return out


_U32 = struct.Struct("<I")
_STAMP = struct.Struct("<iI")
_POSE = struct.Struct("<7d")


def encode_tf(edges: Sequence[Edge]) -> bytes:
    """A tf2_msgs/TFMessage in CDR (little endian), as the RMW sends it; publishers accept
    these bytes as they are. Alignment counts from the payload, after the 4-byte header."""
    out = bytearray(b"\x00\x01\x00\x00")
    out += _U32.pack(len(edges))

    def align(n: int) -> None:
        pad = (-(len(out) - 4)) % n
        out.extend(b"\x00" * pad)

    for parent, child, t, xyz, q in edges:
        align(4)
        sec = math.floor(t)
        out += _STAMP.pack(sec, min(999_999_999, int(round((t - sec) * 1e9))))
        for name in (parent, child):
            align(4)
            raw = name.encode() + b"\x00"
            out += _U32.pack(len(raw)) + raw
        align(8)
        out += _POSE.pack(*xyz, *q)
    return bytes(out)


# ---- the robot's publishers ----------------------------------------------------------------
class Stops:
    """The robot's map pose over time: `stop_s` still at each of `stops`, 1 s moves between
    (linear in x, y and yaw). `times(i)` says when stop i's stillness starts and ends."""

    MOVE_S = 1.0

    def __init__(self, stops: Sequence[Sequence[float]], stop_s: float, t0: float) -> None:
        self.stops = [tuple(s) for s in stops]
        self.stop_s, self.t0 = stop_s, t0

    @property
    def period(self) -> float:
        return self.stop_s + self.MOVE_S

    def index(self, t: float) -> int:
        return max(0, int((t - self.t0) // self.period))

    def times(self, i: int) -> tuple[float, float]:
        start = self.t0 + i * self.period
        return start, start + self.stop_s

    def at(self, i: int) -> tuple[float, float, float]:
        return self.stops[i % len(self.stops)]

    def pose(self, t: float) -> tuple[float, float, float]:
        i = self.index(t)
        start, end = self.times(i)
        a = self.at(i)
        if t <= end or len(self.stops) == 1:
            return a
        b = self.at(i + 1)
        r = min(1.0, (t - end) / self.MOVE_S)
        dyaw = math.atan2(math.sin(b[2] - a[2]), math.cos(b[2] - a[2]))
        return (a[0] + r * (b[0] - a[0]), a[1] + r * (b[1] - a[1]), a[2] + r * dyaw)


class RobotPublisher:
    """What a legged robot's stack publishes, each stream on a thread of its own, paced on
    absolute deadlines (a late tick is skipped and counted, never sent in a burst).

    `where(t)` gives the map pose of base_link at wall time t. TF and sensors can be started
    and stopped separately (a test stops TF alone to see poses go stale).
    """

    def __init__(self, node: Any, where: Callable[[float], Sequence[float]], *,
                 tf_hz: float = 100.0, joints: bool = True, map_odom_hz: float = 20.0,
                 camera_hz: float = 14.0, camera_size: tuple[int, int] = (640, 480),
                 lidar_hz: float = 8.0, lidar_points: int = 20_000, odom_hz: float = 20.0,
                 map_odom: Sequence[float] = MAP_ODOM) -> None:
        from nav_msgs.msg import Odometry
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image, PointCloud2
        from tf2_msgs.msg import TFMessage

        self.node, self.where, self.map_odom = node, where, tuple(map_odom)
        self.rates = {"tf": tf_hz, "map_odom": map_odom_hz, "camera": camera_hz,
                      "lidar": lidar_hz, "odom": odom_hz}
        self.joints = joints
        self.camera_size, self.lidar_points = camera_size, lidar_points
        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.pubs = {
            "tf": node.create_publisher(TFMessage, "/tf", reliable),
            "static": node.create_publisher(TFMessage, "/tf_static", QoSProfile(
                depth=1, reliability=ReliabilityPolicy.RELIABLE,
                durability=DurabilityPolicy.TRANSIENT_LOCAL)),
            "camera": node.create_publisher(Image, "/camera/image_raw", QoSProfile(
                depth=10, reliability=ReliabilityPolicy.RELIABLE)),
            "lidar": node.create_publisher(PointCloud2, "/lidar/points", QoSProfile(
                depth=10, reliability=ReliabilityPolicy.RELIABLE)),
            "odom": node.create_publisher(Odometry, "/odom", reliable),
        }
        self.published = {k: 0 for k in ("tf", "map_odom", "camera", "lidar", "odom")}
        self.late = {k: 0 for k in self.published}
        self.tf_transforms = 0
        self._events: dict[str, threading.Event] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._msgs: dict[str, Any] = {}

    def wait_subscribed(self, names: Sequence[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.pubs[n].get_subscription_count() > 0 for n in names):
                return
            time.sleep(0.1)
        raise RuntimeError(f"nothing subscribed to {', '.join(names)} within {timeout:.0f} s")

    def publish_static(self) -> None:
        t = time.time()
        edges = [("base_link", "camera_link", t, (0.3, 0.0, 0.08), (0.0, 0.0, 0.0, 1.0)),
                 ("base_link", "lidar", t, (0.28, 0.0, 0.14), (0.0, 0.0, 0.0, 1.0))]
        self.pubs["static"].publish(encode_tf(edges))

    # -- the streams
    def _tick_tf(self, t: float) -> None:
        odom_base = odom_base_for(self.where(t), self.map_odom)
        edges = joint_edges(t, phase=t * 3.0) if self.joints else []
        edges.append(planar_edge("odom", "base_link", t, odom_base))
        self.pubs["tf"].publish(encode_tf(edges))
        self.tf_transforms += len(edges)

    def _tick_map_odom(self, t: float) -> None:
        self.pubs["tf"].publish(encode_tf([planar_edge("map", "odom", t, self.map_odom)]))
        self.tf_transforms += 1

    def _tick_camera(self, t: float) -> None:
        msg = self._msgs.get("camera")
        if msg is None:
            import numpy as np

            from memory_node.wire.image_codec import bgr_to_image_msg

            w, h = self.camera_size
            rng = np.random.default_rng(0)
            img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            msg = self._msgs["camera"] = bgr_to_image_msg(img, "rgb8", "camera_link", t)
        msg.header.stamp = _stamp(t)
        self.pubs["camera"].publish(msg)

    def _tick_lidar(self, t: float) -> None:
        msg = self._msgs.get("lidar")
        if msg is None:
            import numpy as np

            from memory_node.wire.pointcloud import make_cloud

            pts = np.random.default_rng(1).uniform(-8, 8, (self.lidar_points, 3))
            msg = self._msgs["lidar"] = make_cloud(pts.astype(np.float32), "lidar", t)
        msg.header.stamp = _stamp(t)
        self.pubs["lidar"].publish(msg)

    def _tick_odom(self, t: float) -> None:
        from nav_msgs.msg import Odometry

        x, y, yaw = odom_base_for(self.where(t), self.map_odom)
        m = Odometry()
        m.header.frame_id, m.child_frame_id = "odom", "base_link"
        m.header.stamp = _stamp(t)
        m.pose.pose.position.x, m.pose.pose.position.y = x, y
        q = quat_yaw(yaw)
        o = m.pose.pose.orientation
        o.x, o.y, o.z, o.w = q
        self.pubs["odom"].publish(m)

    def start(self, names: Sequence[str]) -> None:
        for name in names:
            if self.rates[name] <= 0 or name in self._threads:
                continue
            ev = threading.Event()
            th = threading.Thread(target=self._loop, args=(name, ev), daemon=True,
                                  name=f"pub-{name}")
            self._events[name], self._threads[name] = ev, th
            th.start()

    def stop(self, names: Sequence[str] | None = None) -> None:
        for name in list(names or self._threads):
            ev, th = self._events.pop(name, None), self._threads.pop(name, None)
            if ev is not None and th is not None:
                ev.set()
                th.join(5.0)

    def _loop(self, name: str, stop: threading.Event) -> None:
        tick = getattr(self, f"_tick_{name}")
        period = 1.0 / self.rates[name]
        nxt = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now < nxt:
                stop.wait(nxt - now)
                continue
            if now - nxt > period:  # more than a period behind: skip, do not burst
                missed = int((now - nxt) // period)
                self.late[name] += missed
                nxt += missed * period
            try:
                tick(time.time())
                self.published[name] += 1
            except Exception:  # noqa: BLE001 - a context shut down under us ends the stream
                if stop.is_set():
                    return
                raise
            nxt += period


def _stamp(t: float) -> Any:
    from memory_node.wire.geometry import seconds_to_stamp

    return seconds_to_stamp(t)


# ---- the node under test -------------------------------------------------------------------
class NodeUnderTest:
    """`memory-node` (any checkout's interpreter) in its own process group, output to a file."""

    def __init__(self, python: str, memory_dir: Path, env: dict[str, str], log: Path,
                 extra: Sequence[str] = ()) -> None:
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop(); a file: a full pipe blocks
        self.proc = subprocess.Popen(
            [python, "-m", "memory_node.ros.main", "--memory-dir", str(memory_dir), *extra],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 120.0) -> None:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if regex.search(self.text()):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{pattern!r} never appeared; log {self.log_path}:\n"
                           + "\n".join(self.text().splitlines()[-30:]))

    def stop(self, timeout: float = 20.0) -> tuple[int, float]:
        """SIGINT; (exit code, seconds it took). Killed after `timeout` (code -9)."""
        took = interrupt(self.proc, timeout)
        self._log.close()
        return self.proc.returncode, took


def final_counters(text: str) -> dict[str, Any] | None:
    """The recorder's last 'recorder stopped: {...}' line, parsed."""
    found = None
    for line in text.splitlines():
        if "recorder stopped:" in line:
            try:
                found = json.loads(line.split("recorder stopped:", 1)[1].strip())
            except ValueError:
                pass
    return found


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return round(s[lo] + (s[hi] - s[lo]) * (k - lo), 4)


def _isolated_env(domain: int) -> dict[str, str]:
    env = dict(os.environ)
    # PYTHONSAFEPATH: `python -m` must not put the current directory (this checkout) first on
    # sys.path, or another checkout's interpreter would run this checkout's package.
    env.update({"ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"})
    if env.get("ROS_DISTRO", "").lower() == "humble":
        env["ROS_LOCALHOST_ONLY"] = "1"
    env.pop("ROS_STATIC_PEERS", None)
    return env


def quiet_domain(candidates: Sequence[int] = DOMAINS, wait_s: float = 2.5) -> int:
    """The first ROS domain where discovery on this host finds no other node: a benchmark
    that shares its domain with someone else's nodes counts their messages as its own."""
    import rclpy

    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    for d in candidates:
        ctx = rclpy.Context()
        rclpy.init(context=ctx, domain_id=d)
        try:
            node = rclpy.create_node("tf_load_probe", context=ctx)
            time.sleep(wait_s)
            others = [n for n in node.get_node_names() if n != "tf_load_probe"]
            node.destroy_node()
        finally:
            rclpy.try_shutdown(context=ctx)
        if not others:
            return d
    raise RuntimeError(f"every ROS domain in {list(candidates)} has nodes of someone else")


def run_load(duration_s: float, *, python: str = sys.executable, label: str = "fixed",
             stop_s: float = 5.0, save_after_s: Sequence[float] = (1.0, 3.0),
             tf_hz: float = 100.0, camera_size: tuple[int, int] = (640, 480),
             scratch: Path | None = None, log: Log = print,
             domain: int | None = None) -> dict[str, Any]:
    """One configuration: the publisher in this process, `memory-node` from `python`."""
    import psutil
    import rclpy
    from std_msgs.msg import String

    from memory_node.ros.cli import ServiceCaller

    scratch = Path(scratch or tempfile.mkdtemp(prefix="tf_load-"))
    mem = scratch / f"mem_{label}"
    shutil.rmtree(mem, ignore_errors=True)
    domain = quiet_domain() if domain is None else domain
    env = _isolated_env(domain)
    # This process joins the node's domain (rclpy reads the environment at init).
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    node_proc = NodeUnderTest(python, mem, env, scratch / f"memory-node_{label}.log")
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    caller = ServiceCaller(f"tf_load_caller_{label}", context=ctx)
    pub_node = rclpy.create_node(f"tf_load_robot_{label}", context=ctx)
    stats: list[dict[str, Any]] = []
    from rclpy.executors import SingleThreadedExecutor

    stats_node = rclpy.create_node(f"tf_load_stats_{label}", context=ctx)
    stats_node.create_subscription(
        String, "/memory/recorder_stats",
        lambda m: stats.append(json.loads(m.data) | {"_wall": time.monotonic()}), 10)
    stats_exec = SingleThreadedExecutor(context=ctx)
    stats_exec.add_node(stats_node)
    spin_stop = threading.Event()

    def spin_stats() -> None:
        while not spin_stop.is_set() and ctx.ok():
            stats_exec.spin_once(timeout_sec=0.1)

    threading.Thread(target=spin_stats, daemon=True).start()
    out: dict[str, Any] = {"label": label, "python": python, "domain": domain,
                           "duration_s": duration_s,
                           "stop_s": stop_s, "save_after_s": list(save_after_s)}
    robot = None
    try:
        node_proc.wait_for(r"recording", timeout=180)
        stops = Stops(STOPS, stop_s, time.time() + 3.0)
        robot = RobotPublisher(pub_node, lambda t: stops.pose(max(t, stops.t0)), tf_hz=tf_hz,
                               camera_size=camera_size)
        robot.wait_subscribed(["tf", "camera", "lidar", "odom"])
        robot.publish_static()
        robot.start(["tf", "map_odom", "camera", "lidar", "odom"])
        first = json.loads(caller.call("streams", None, 60.0))
        if not first.get("ok"):
            raise RuntimeError(f"the node does not answer: {first}")
        ps_node, ps_self = psutil.Process(node_proc.proc.pid), psutil.Process()
        while time.time() < stops.t0:
            time.sleep(0.05)
        c_node, c_self, w0 = ps_node.cpu_times(), ps_self.cpu_times(), time.monotonic()
        n_stats0 = len(stats)
        pub0, tf0 = dict(robot.published), robot.tf_transforms
        notes: list[dict[str, Any]] = []
        end = stops.t0 + duration_s
        i = 0
        while True:
            start, _ = stops.times(i)
            if start + max(save_after_s) > end:
                break
            want = stops.at(i)
            for after in save_after_s:
                while time.time() < start + after:
                    time.sleep(0.01)
                t_call = time.time()
                ans = json.loads(caller.call("save", f"tf_load stop {i} +{after:g}s", 10.0))
                rtt = time.time() - t_call
                row: dict[str, Any] = {"stop": i, "after_s": after, "ok": ans.get("ok"),
                                       "rtt_s": round(rtt, 4)}
                pose = ans.get("pose") or {}
                if ans.get("ok") and "x" in pose:
                    row.update(x=pose["x"], y=pose["y"], yaw=pose.get("yaw"),
                               source=pose.get("source"), age_s=pose.get("age_s"),
                               stale=pose.get("stale", False),
                               err_m=round(math.hypot(pose["x"] - want[0],
                                                      pose["y"] - want[1]), 4))
                else:
                    row["answer"] = ans
                notes.append(row)
            i += 1
        while time.time() < end:
            time.sleep(0.05)
        wall = time.monotonic() - w0
        c1_node, c1_self = ps_node.cpu_times(), ps_self.cpu_times()
        window_stats = stats[n_stats0:]
        stats1 = stats[-1] if stats else None
        pub1 = dict(robot.published)
        robot.stop()
        out["published_total"] = dict(robot.published)
        errs = [n["err_m"] for n in notes if "err_m" in n]
        ages = [n["age_s"] for n in notes if n.get("age_s") is not None]
        tf_rate = None
        if len(window_stats) >= 2 and "tf" in window_stats[0]:
            # Stats arrive every few seconds: the rate between the first and last in the window.
            a, b = window_stats[0], window_stats[-1]
            tf_rate = (b["tf"]["tf_messages"] - a["tf"]["tf_messages"]) / (b["_wall"] - a["_wall"])
        out.update({
            "wall_s": round(wall, 2),
            "published": {k: pub1[k] - pub0[k] for k in pub1},
            "published_per_s": {k: round((pub1[k] - pub0[k]) / wall, 1) for k in pub1},
            "publisher_late_ticks": dict(robot.late),
            "notes": len(notes), "notes_ok": sum(1 for n in notes if n.get("ok")),
            "notes_stale": sum(1 for n in notes if n.get("stale")),
            "pose_err_m": {"max": max(errs) if errs else None, "p50": _pct(errs, 50)},
            "pose_age_s": {"p50": _pct(ages, 50), "max": max(ages) if ages else None},
            "save_rtt_s": {"p50": _pct([n["rtt_s"] for n in notes], 50),
                           "max": max((n["rtt_s"] for n in notes), default=None)},
            "cpu_percent": {
                "memory-node": round(100 * (c1_node.user + c1_node.system - c_node.user
                                            - c_node.system) / wall, 1),
                "publisher (this process)": round(100 * (c1_self.user + c1_self.system
                                                         - c_self.user - c_self.system) / wall,
                                                  1)},
            "tf_messages_processed_per_s": round(tf_rate, 1) if tf_rate is not None else None,
            "note_rows": notes,
        })
        out["tf_messages_published_per_s"] = round(
            (pub1["tf"] - pub0["tf"] + pub1["map_odom"] - pub0["map_odom"]) / wall, 1)
        out["tf_transforms_published_per_s"] = round((robot.tf_transforms - tf0) / wall, 1)
        out["last_stats"] = stats1
    finally:
        if robot is not None:
            robot.stop()
        code, took = node_proc.stop()
        spin_stop.set()
        caller.close()
        stats_exec.shutdown()
        for n in (stats_node, pub_node):
            n.destroy_node()
        rclpy.try_shutdown(context=ctx)
    text = node_proc.text()
    out["stop"] = {"exit_code": code, "seconds": round(took, 2),
                   "traceback": "Traceback" in text}
    out["final_counters"] = final_counters(text)
    out["log_tail"] = text.splitlines()[-12:]
    fc = out["final_counters"] or {}
    total = out.get("published_total", {})
    out["recorder"] = {s: {k: fc[s].get(k) for k in ("received", "kept", "dropped", "failed")
                           if k in fc[s]} | {"published": total.get(s)}
                       for s in ("camera", "lidar", "odom") if s in fc}
    if "tf" in fc:
        out["recorder"]["tf"] = {k: fc["tf"].get(k) for k in
                                 ("tf_messages", "tf_edges", "tf_filtered", "tf_malformed")}
    log(f"  tf_load {label}: notes {out.get('notes')} (stale {out.get('notes_stale')}), "
        f"pose err max {out.get('pose_err_m', {}).get('max')} m, age p50 "
        f"{out.get('pose_age_s', {}).get('p50')} s, cpu {out.get('cpu_percent')}, "
        f"tf msgs/s {out.get('tf_messages_processed_per_s')}, recorder {out['recorder']}")
    return out


def section_tf_load(duration_s: float, log: Log, before: str | None = None,
                    ingest_rates: Sequence[float] = (1.0, 2.0, 4.0),
                    ingest_bag_s: float = 60.0, scratch: Path | None = None,
                    camera_size: tuple[int, int] = (640, 480)) -> dict[str, Any]:
    """The load run on this checkout and (with `before`: another checkout's interpreter) on
    the code before the fix; then the sample bag replayed at each rate into memory-node."""
    from bench.ros_bench import section_ros_ingest

    scratch = Path(scratch or BENCH_DIR / "results" / "raw" / "scratch" / "tf_load")
    scratch.mkdir(parents=True, exist_ok=True)
    domain = quiet_domain()
    log(f"[tf_load] ROS domain {domain} (no other node seen there)")
    res: dict[str, Any] = {"machine": machine_info(), "configs": {}, "domain": domain}
    configs = [("fixed", sys.executable)] + ([("before", before)] if before else [])
    for label, py in configs:
        log(f"[tf_load] {label}: {duration_s:.0f} s of load into memory-node ({py})")
        try:
            res["configs"][label] = run_load(duration_s, python=py, label=label,
                                             scratch=scratch, log=log,
                                             camera_size=camera_size, domain=domain)
        except Exception as exc:  # noqa: BLE001 - keep the other configuration's figures
            res["configs"][label] = {"error": f"{type(exc).__name__}: {exc}"}
    res["ingest"] = {}
    for label, py in configs:
        if not ingest_rates:
            break
        log(f"[tf_load] {label}: sample bag ({ingest_bag_s:.0f} s) at "
            f"{', '.join(f'{r:g}x' for r in ingest_rates)} into memory-node")
        try:
            res["ingest"][label] = section_ros_ingest(list(ingest_rates), ingest_bag_s,
                                                      scratch, log, python=py,
                                                      one_process=True, domain=domain)
            for r in res["ingest"][label].get("rates", {}).values():
                # More received than the bag holds: someone else published in the domain.
                r["crosstalk"] = any(r.get("received", {}).get(k, 0) > n
                                     for k, n in r.get("in_bag", {}).items())
        except Exception as exc:  # noqa: BLE001
            res["ingest"][label] = {"error": f"{type(exc).__name__}: {exc}"}
    shutil.rmtree(scratch, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tf_load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load per "
                   "configuration (default 120)")
    p.add_argument("--before", metavar="PYTHON", help="also run the node of another "
                   "checkout through this interpreter (e.g. ../wt-prefix/.venv/bin/python)")
    p.add_argument("--rates", default="1,2,4", help="sample-bag replay rates ('' for none)")
    p.add_argument("--bag-seconds", type=float, default=60.0)
    p.add_argument("--camera", default="640x480", help="camera image size WxH")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS / "tf_load.json")
    args = p.parse_args(argv)
    cam = tuple(int(v) for v in args.camera.lower().split("x"))
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    t0 = time.perf_counter()
    res = section_tf_load(args.duration, print, args.before, rates, args.bag_seconds,
                          camera_size=cam)  # type: ignore[arg-type]
    res["params"] = {"duration_s": args.duration, "before": bool(args.before),
                     "rates": rates, "bag_seconds": args.bag_seconds, "camera": args.camera}
    res["argv"] = ["python", "-m", "bench.tf_load", *(argv if argv is not None
                                                      else sys.argv[1:])]
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(args.out, res)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    sys.exit(main())
