"""`view_port` on the query server: the running node serves the same page and API over its
own engine while active, and stops serving when it shuts down; `memory-view --ros` beside it
answers the same searches through the services."""

from __future__ import annotations

import shutil
import socket

from conftest import camera_ids, get_json, http
from ros_helpers import stop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_server_serves_the_view_on_view_port(imported_store, ros_process, tmp_path):
    memory = tmp_path / "memory"
    shutil.copytree(imported_store, memory)
    port = _free_port()
    proc = ros_process(["-m", "memory_node.ros.server", "--ros-args", "-p",
                        f"memory_dir:={memory}", "-p", f"view_port:={port}"])
    proc.wait_for_line(rf"memory view on http://127\.0\.0\.1:{port}/", timeout=120)
    base = f"http://127.0.0.1:{port}"
    status, streams = get_json(f"{base}/api/streams")
    assert status == 200 and streams["ok"] is True
    assert {s["name"] for s in streams["streams"]} >= {"camera", "lidar", "odom"}
    status, kf = get_json(f"{base}/api/keyframes")
    assert {k[0] for k in kf["keyframes"]} == camera_ids(memory)
    status, answer = get_json(f"{base}/api/search", data=b"a bright scene")
    assert status == 200 and answer["count"] > 0
    status, _, page = http(f"{base}/")
    assert status == 200 and b'id="map"' in page
    # memory-view --ros beside it: search through the services, the map from the directory.
    view_port = _free_port()
    view = ros_process(["-m", "memory_node.view.server", "--ros", "--memory-dir", str(memory),
                        "--port", str(view_port)])
    view.wait_for_line(r"memory-view: serving .* on http://127\.0\.0\.1:\d+/", timeout=120)
    other = f"http://127.0.0.1:{view_port}"
    status, answer_ros = get_json(f"{other}/api/search", data=b"a bright scene")
    assert status == 200
    assert [r["id"] for r in answer_ros["results"]] == [r["id"] for r in answer["results"]]
    status, kf_ros = get_json(f"{other}/api/keyframes")
    assert status == 200 and kf_ros["keyframes"] == kf["keyframes"]
    assert stop(view) == 0

    # Shut down (Ctrl-C): the view stops with the node, cleanly.
    assert stop(proc) == 0
    assert "Traceback" not in proc.output
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
