"""memory-view's JSON API over a real imported store: every route answers the services'
contract, bad requests get the contract's error with a matching HTTP status and change nothing,
tokens, Host and Origin are checked, and images are served only from the store's blobs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import camera_ids, get_json, http, open_view
from ros_helpers import spawn, stop

from memory_node.view.store_reader import NotFound, StoreReader


def _store_rows(memory: Path) -> int:
    with sqlite3.connect(f"file:{memory / 'memory.db'}?mode=ro", uri=True) as con:
        return int(con.execute("SELECT count(*) FROM observations").fetchone()[0])


def test_every_route_answers_the_services_contract(view, imported_store):
    server, engine = view
    base = server.url.rstrip("/")

    status, streams = get_json(f"{base}/api/streams")
    assert status == 200 and streams["ok"] is True
    ours = {s["name"]: s["count"] for s in json.loads(engine.streams())["streams"]}
    assert {s["name"]: s["count"] for s in streams["streams"]} == ours
    assert ours["camera"] > 20

    # The same search as the service, in plain text and as JSON.
    for query in ("a bright scene", '{"stream": "camera", "semantic_query": "white wall", '
                                    '"k": 7}'):
        status, answer = get_json(f"{base}/api/search", data=query.encode())
        assert status == 200 and answer["ok"] is True
        direct = json.loads(engine.search(query))
        assert [r["id"] for r in answer["results"]] == [r["id"] for r in direct["results"]]
        assert answer["count"] == len(answer["results"]) > 0

    status, track = get_json(f"{base}/api/track")
    assert status == 200 and track["ok"] is True and track["frame"] == "map"
    times = [p[0] for p in track["points"]]
    assert len(times) > 50 and times == sorted(times)
    assert all(len(p) == 3 for p in track["points"])
    # Downsampled on the server, first and last kept.
    status, small = get_json(f"{base}/api/track?max_points=10")
    assert len(small["points"]) == 10
    assert small["points"][0] == track["points"][0] and small["points"][-1] == track["points"][-1]
    t_mid = times[len(times) // 2]
    _, late = get_json(f"{base}/api/track?after={t_mid}")
    assert late["points"] and min(p[0] for p in late["points"]) >= t_mid

    status, kf = get_json(f"{base}/api/keyframes")
    assert status == 200
    assert {k[0] for k in kf["keyframes"]} == camera_ids(imported_store)
    assert kf["total"] == len(kf["keyframes"])

    # One row: the same item a search answers (bar the score), and its neighbours in time.
    hit = json.loads(engine.search('{"stream": "camera", "semantic_query": "bright", '
                                   '"k": 1}'))["results"][0]
    status, row = get_json(f"{base}/api/rows/{hit['id']}")
    assert status == 200 and row["ok"] is True
    assert {k: v for k, v in row["result"].items() if k != "score"} == \
        {k: v for k, v in hit.items() if k != "score"}
    order = [k[0] for k in kf["keyframes"]]
    i = order.index(hit["id"])
    assert row["prev"] == (order[i - 1] if i > 0 else None)
    assert row["next"] == (order[i + 1] if i + 1 < len(order) else None)

    status, headers, jpeg = http(f"{base}/api/rows/{hit['id']}/image")
    assert status == 200 and headers["content-type"] == "image/jpeg"
    assert jpeg == (imported_store / hit["ref"]).read_bytes()
    status, headers, thumb = http(f"{base}/api/rows/{hit['id']}/image?thumb=1")
    assert status == 200 and "max-age" in headers["cache-control"]
    full = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    small_img = cv2.imdecode(np.frombuffer(thumb, np.uint8), cv2.IMREAD_COLOR)
    assert small_img.shape[1] == 160 < full.shape[1] and len(thumb) < len(jpeg)

    # A row without an image: 404 in the contract's shape.
    odom = json.loads(engine.search('{"stream": "odom", "k": 1}'))["results"][0]
    status, missing = get_json(f"{base}/api/rows/{odom['id']}/image")
    assert status == 404 and missing["ok"] is False

    status, occ = get_json(f"{base}/api/occupancy")
    assert status == 200 and len(occ["cells"]) > 100
    # The backdrop is the flat's walls: inside the ground truth's floor plan, not the floor.
    xs = [c[0] for c in occ["cells"]]
    assert min(xs) > -2.0 and max(xs) < 14.0

    status, notes = get_json(f"{base}/api/notes")
    assert status == 200 and notes["notes"] == []
    status, pose = get_json(f"{base}/api/pose")
    assert status == 200 and pose == {"ok": True, "pose": None}

    status, _, page = http(f"{base}/")
    assert status == 200 and b'id="search"' in page and b'id="map"' in page
    for asset in ("app.js", "app.css"):
        status, _, body = http(f"{base}/static/{asset}")
        assert status == 200 and len(body) > 500
        assert b"http://" not in body.replace(b"http://www.w3.org/2000/svg", b"")


def test_bad_requests_get_the_contracts_errors_and_change_nothing(view, imported_store):
    server, _ = view
    base = server.url.rstrip("/")
    before = _store_rows(imported_store)
    cases = [
        ("POST", "/api/search", b'{"semantic_query": "door", ', 400, "bad_request"),
        ("POST", "/api/search", b'{"stream": "camera", "nonsense": 1}', 400, "bad_request"),
        ("POST", "/api/search", b'{"near_x": 1}', 400, "bad_request"),
        ("POST", "/api/search", b"   ", 400, "bad_request"),
        ("POST", "/api/search", b"\xff\xfe", 400, "bad_request"),
        ("POST", "/api/search", b"x" * 70000, 400, "bad_request"),
        ("GET", "/api/rows/999999999", None, 404, "not_found"),
        ("GET", "/api/rows/999999999/image", None, 404, "not_found"),
        ("GET", "/api/rows/abc", None, 400, "bad_request"),
        ("GET", "/api/track?max_points=1", None, 400, "bad_request"),
        ("GET", "/api/track?after=yesterday", None, 400, "bad_request"),
        ("GET", "/api/keyframes?before=nan", None, 400, "bad_request"),
        ("GET", "/api/nothing-here", None, 404, "not_found"),
    ]
    for method, path, body, code, error in cases:
        status, _, raw = http(base + path, data=body, method=method)
        answer = json.loads(raw)
        assert (status, answer["ok"], answer["error"]["code"]) == (code, False, error), path
        assert answer["error"]["message"]
    # Still serving, nothing written.
    assert get_json(f"{base}/api/streams")[0] == 200
    assert _store_rows(imported_store) == before


def test_foreign_host_and_origin_are_refused(view):
    server, _ = view
    base = server.url.rstrip("/")
    status, answer = get_json(f"{base}/api/streams", headers={"Host": "evil.example.com"})
    assert status == 421 and answer["ok"] is False
    status, answer = get_json(f"{base}/api/search", data=b"door",
                              headers={"Origin": "http://evil.example.com"})
    assert status == 403 and answer["ok"] is False
    # The page's own origin and the loopback names are served.
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
        status, answer = get_json(f"{base}/api/search", data=b"door",
                                  headers={"Host": host, "Origin": f"http://{host}"})
        assert status == 200 and answer["ok"] is True


def test_a_token_is_required_checked_and_kept_in_a_strict_cookie(imported_store, caplog):
    token = "s3cret-view-token-4242"
    caplog.set_level("DEBUG")
    server, engine = open_view(imported_store, token=token)
    try:
        base = server.url.rstrip("/")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token},
                        {"Cookie": f"memory_view_session={token}"}):
            status, answer = get_json(f"{base}/api/streams", headers=headers)
            assert status == 401 and answer["ok"] is False, headers
        status, _, _ = http(f"{base}/?token=wrong")
        assert status == 401
        status, answer = get_json(f"{base}/api/streams",
                                  headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and answer["ok"] is True
        # ?token= once: a redirect that drops it, and a SameSite=Strict HttpOnly cookie.
        status, headers, _ = http(f"{base}/?token={token}")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert token not in cookie
        session = cookie.split(";", 1)[0]
        status, answer = get_json(f"{base}/api/streams", headers={"Cookie": session})
        assert status == 200 and answer["ok"] is True
        status, _, page = http(f"{base}/", headers={"Cookie": session})
        assert status == 200 and b'id="map"' in page
    finally:
        server.stop()
        engine.close()
    assert token not in caplog.text


def test_images_only_from_the_blobs_directory(imported_store, tmp_path):
    """Rows whose ref leads out of blobs/ (.., absolute, a symbolic link) serve nothing."""
    memory = tmp_path / "memory"
    shutil.copytree(imported_store, memory)
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"\xff\xd8\xff not for the page")
    link = memory / "blobs" / "camera" / "link.jpg"
    link.symlink_to(secret)
    refs = ["../secret.jpg", str(secret), "blobs/../../secret.jpg", "blobs/camera/link.jpg",
            "memory.db", "blobs/camera/../../memory.db"]
    with sqlite3.connect(memory / "memory.db") as con:
        ids = [r[0] for r in con.execute(
            "SELECT id FROM observations WHERE stream = 'camera' ORDER BY id LIMIT ?",
            (len(refs),))]
        for oid, ref in zip(ids, refs, strict=True):
            con.execute("UPDATE observations SET ref = ? WHERE id = ?", (ref, oid))
    reader = StoreReader(memory)
    for oid in ids:
        with pytest.raises(NotFound):
            reader.image(oid)
    server, engine = open_view(memory)
    try:
        base = server.url.rstrip("/")
        for oid in ids:
            status, _, body = http(f"{base}/api/rows/{oid}/image")
            assert status == 404 and b"not for the page" not in body
        for path in ("/api/rows/..%2F..%2Fsecret.jpg/image", "/static/../memory.db",
                     "/static/%2e%2e/%2e%2e/%2e%2e/memory.db"):
            status, _, body = http(base + path)
            assert status in (400, 404) and b"SQLite" not in body, path
    finally:
        server.stop()
        engine.close()
        reader.close()


def _memory_view() -> list[str]:
    exe = Path(sys.executable).parent / "memory-view"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "memory_node.view.server"]


def test_the_command_refuses_an_open_host_without_a_token_and_a_missing_store(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MEMORY_VIEW_TOKEN"}
    done = subprocess.run([*_memory_view(), "--memory-dir", str(tmp_path), "--host",
                           "0.0.0.0"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "token" in done.stderr and "0.0.0.0" in done.stderr
    done = subprocess.run([*_memory_view(), "--memory-dir", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "no memory store" in done.stderr
    assert not (tmp_path / "none").exists()


def test_the_command_serves_the_store_until_ctrl_c(imported_store):
    proc = spawn([*_memory_view(), "--memory-dir", str(imported_store), "--port", "0"])
    try:
        found = proc.wait_for_line(r"serving .* on (http://127\.0\.0\.1:\d+/)", timeout=120)
        url = found.group(1)
        status, answer = get_json(f"{url}api/streams")
        assert status == 200 and answer["ok"] is True
        proc.popen.send_signal(signal.SIGINT)
        assert proc.popen.wait(timeout=30) == 0
    finally:
        stop(proc)


def test_without_a_store_directory_search_works_and_the_map_says_why_not(view):
    """A memory with no directory on this machine (the fleet store): search and streams are
    served, the map's routes answer 503 saying why."""
    from memory_node.agent.client import EngineClient
    from memory_node.view.server import ViewBackend, ViewServer

    _, engine = view
    server = ViewServer(ViewBackend(EngineClient(engine), None, where="the fleet store"),
                        "127.0.0.1", 0).start()
    try:
        base = server.url.rstrip("/")
        status, answer = get_json(f"{base}/api/search", data=b"a bright scene")
        assert status == 200 and answer["count"] > 0
        for path in ("/api/track", "/api/keyframes", "/api/rows/1",
                     f"/api/rows/{answer['results'][0]['id']}/image", "/api/occupancy"):
            status, err = get_json(base + path)
            assert status == 503 and err["ok"] is False, path
            assert err["error"]["code"] == "unavailable"
            assert "the fleet store" in err["error"]["message"]
    finally:
        server.stop()
