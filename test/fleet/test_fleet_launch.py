"""The launch file with a fleet URL: `memory-sync` starts beside `memory-node` (the URL through
the environment), and a note saved on the robot reaches the fleet's PostgreSQL."""

from __future__ import annotations

import json
import os
import time

import psycopg
import rclpy
from launch_support import RUN_LAUNCH, install_prefix

from memory_node.ros.cli import ServiceCaller


def test_launch_with_a_fleet_url_starts_the_sync(fleet_url, ros_process, tmp_path):
    launch_file = install_prefix(tmp_path / "install")
    env = {"AMENT_PREFIX_PATH": os.pathsep.join(
        [str(tmp_path / "install"), os.environ.get("AMENT_PREFIX_PATH", "")]).rstrip(os.pathsep),
        "MEMORY_FLEET_URL": fleet_url}
    proc = ros_process(["-c", RUN_LAUNCH, str(launch_file), f"memory_dir:={tmp_path / 'mem'}",
                        "robot_id:=go2-7"], env=env)
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    caller = ServiceCaller("fleet_launch_client", context=ctx)
    try:
        saved = json.loads(caller.call("save", "the red door to the garden is open", 30.0))
    finally:
        caller.close()
        rclpy.shutdown(context=ctx)
    assert saved["ok"], saved
    deadline = time.monotonic() + 60
    rows = []
    while time.monotonic() < deadline and not rows:
        with psycopg.connect(fleet_url) as conn:
            rows = conn.execute("SELECT robot_id, text FROM memory_observations WHERE stream ="
                                " 'events'").fetchall()
        time.sleep(0.5)
    assert rows == [("go2-7", "the red door to the garden is open")], proc.output[-3000:]
