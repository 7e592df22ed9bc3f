"""memory-node (Fast DDS: the RMW the ROS 2 wheels ship) hears a robot whose middleware is
Cyclone DDS, as a Go2's is: a plain Cyclone DDS participant (test/ros/cyclone_publisher.py,
the `cyclonedds` binding and its bundled library, no ROS) publishes `/odom` and `/tf`, and
the node stores odometry keyframes posed through that TF.

Localhost only: Cyclone DDS is bound to the loopback interface with unicast discovery to
127.0.0.1, and the run's own ROS_DOMAIN_ID (test/conftest.py). Cyclone DDS 11 rejects the
type information Fast DDS 3 announces for these types ("ddsi_xt_type_init_impl with invalid
type object") and then matches nothing; its `Compatibility/IgnoreTypeInformation` for eProsima's
vendor id (1.15) makes it match by type name, as DDS implementations without XTypes do.
About 15 s."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from waiting import wait_until

PUBLISHER = Path(__file__).with_name("cyclone_publisher.py")
CYCLONE_CONFIG = """<CycloneDDS><Domain Id="any">
  <General>
    <Interfaces><NetworkInterface name="lo"/></Interfaces>
    <AllowMulticast>false</AllowMulticast>
  </General>
  <Compatibility><IgnoreTypeInformation>1.15</IgnoreTypeInformation></Compatibility>
  <Discovery><Peers><Peer address="127.0.0.1"/></Peers></Discovery>
</Domain></CycloneDDS>
"""


def test_memory_node_hears_odom_and_tf_from_cyclone_dds(ros, ros_process, tmp_path):
    _, caller, _ = ros
    config = tmp_path / "cyclonedds.xml"
    config.write_text(CYCLONE_CONFIG)
    node = ros_process(["-m", "memory_node.ros.main", "--memory-dir", str(tmp_path / "m"),
                        "--ros-args", "-p", "min_distance:=0.5", "-p", "max_interval:=100.0",
                        "-p", "min_yaw:=3.0"])
    node.wait_for_line(r"\[memory_recorder\]: recording ", timeout=60)
    robot = ros_process([str(PUBLISHER), "40"],
                        env={"CYCLONEDDS_URI": config.as_uri()})
    robot.wait_for_line(r"^matched /odom and /tf$", timeout=70)
    robot.wait_for_line(r"^published 40$", timeout=30)
    assert robot.popen.wait(10) == 0, robot.output

    def call(verb, payload=None):
        return json.loads(caller.call(verb, payload, 20.0))

    rows = call("search", '{"stream": "odom", "k": 100, "order_by": "time"}')["results"]
    # 3.9 m at 10 Hz, a keyframe per 0.5 m: 8 (0, 0.5, ..., 3.5); one or two fewer when the
    # first messages go out before Fast DDS has matched the writer on its side
    assert 6 <= len(rows) <= 9, rows
    for r in rows:
        # posed through Cyclone's /tf: map -> odom (1, 2) composed with odom -> base_link
        assert r["pose"]["source"] == "tf" and r["pose"]["frame"] == "map", r
        assert r["pose"]["y"] == pytest.approx(2.0) and 1.0 <= r["pose"]["x"] <= 4.95, r
        assert r["tags"]["speed"] == pytest.approx(1.0)  # the twist of Cyclone's /odom
    xs = [r["pose"]["x"] for r in rows]
    assert all(b - a >= 0.45 for a, b in pairwise(xs)), xs
    assert xs[-1] >= 4.3, xs  # through to the end of the drive
    # The stream's state comes from the recorder's /memory/recorder_stats, published on each
    # change and every 5 s; it stays "recording" for topic_timeout_s (10 s) after the last odom.
    odom = wait_until(lambda: next((s for s in call("streams")["streams"]
                                    if s["name"] == "odom" and "status" in s), None),
                      "the recorder's state in the streams answer", timeout=8)
    assert odom["status"] == "recording", odom
    assert "Traceback" not in node.output + robot.output
