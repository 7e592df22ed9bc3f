"""The JSON contract over the fleet store: the same answers as the robot's own engine, plus
the robot and map fields; maps are never mixed by accident; credentials stay out of sight."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from engine_support import T0, FakeClock, PoseBox, make_engine, minilm
from secret_guard import FLEET_PASSWORD

from memory_node.core.types import Observation, Pose, View
from memory_node.fleet.credentials import (
    CredentialError,
    read_url_file,
    redact,
    resolve_fleet_url,
    scrub,
)
from memory_node.fleet.engine import FleetEngine
from memory_node.fleet.store import FleetStore
from memory_node.fleet.sync import FleetSync

THINGS = ["a red door", "a blue chair", "a person waving", "the kitchen sink", "a green plant",
          "a stack of boxes", "the charging dock", "an open window", "a yellow cone",
          "a wooden table", "a red fire extinguisher", "a sleeping cat"]


def _places_views_track(eng, robot: str, clock: FakeClock, shift: float) -> None:
    """Named places (one moved, one removed), camera keyframes with views that reach far
    from where they were taken, and a dense odometry loop (with a gap) for visits."""
    clock.t = T0 + 30 + shift / 10  # robots on a shared map name places one after another
    for place in ({"place": "kitchen", "x": 1.0 + shift, "y": 0.0, "radius": 1.5},
                  {"place": "dock", "x": 0.5 + shift, "y": 4.0, "radius": 1.0},
                  {"place": "hall", "x": 3.0 + shift, "y": 3.0},
                  {"place": "Kitchen", "x": 8.0 + shift, "y": 2.0, "radius": 1.2},
                  {"place": "hall", "remove": True}):
        clock.t += 1
        assert json.loads(eng.save(json.dumps(place)))["ok"]
    texts = [f"{robot} camera looking {d}: {THINGS[j]}" for j, d in
             enumerate(("east", "north", "west", "south", "east again", "north-east"))]
    vecs = minilm().embed_texts(texts)
    rows = []
    for j, (text, yaw) in enumerate(zip(texts, (0.0, 1.57, 3.14, -1.57, 0.05, 0.8),
                                        strict=True)):
        rows.append(Observation(
            stream="camera", t=T0 + 45 + j, pose=Pose(x=shift, y=0.0, yaw=yaw, frame="map"),
            text=text, tags={"view": j}, view=View(shift, 0.0, yaw, 1.2, 8.0)))
    eng.add_embedded(rows, vecs, eng.text_model_id)
    for j in range(210):
        if 100 <= j < 110:
            continue  # a gap in the pose history
        a = 2 * math.pi * j / 60
        eng.add_observation("odom", T0 + 10 * j, Pose(x=4.0 + 4.0 * math.cos(a) + shift,
                                                      y=2.0 + 2.0 * math.sin(a), frame="map"),
                            {"speed": 0.5}, embed=False)


def _fill(robot: str, root, clock: FakeClock, pose: PoseBox, shift: float) -> None:
    eng = make_engine(root, clock=clock, pose=pose)
    try:
        _places_views_track(eng, robot, clock, shift)
        for i in range(36):
            clock.t = T0 + 60 * i
            pose.pose = Pose(x=(i % 9) * 1.0 + shift, y=(i // 9) * 1.5, yaw=0.1 * i, frame="map")
            thing = THINGS[i % len(THINGS)]
            tags = {"n": i, "kind": "door" if "door" in thing else "other"}
            if i % 4 == 0:
                eng.save(json.dumps({"note": f"{robot} noted {thing} near spot {i}",
                                     "tags": tags}))
            else:
                eng.add_observation("camera", clock.t, pose.pose, tags,
                                    text=f"camera view {i}: {thing}")
        eng.add_observation("odom", clock.t + 1, pose.pose, {"speed": 0.3})  # no text
    finally:
        eng.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, fleet_url):
    base = tmp_path_factory.mktemp("robots")
    clock, pose = FakeClock(), PoseBox()
    store = FleetStore(fleet_url)
    maps = {"r1": None, "r2": None, "r3": "site-A", "r4": "site-A"}
    for n, (robot, map_id) in enumerate(maps.items()):
        _fill(robot, base / robot, clock, pose, shift=0.0 if n < 2 else 20.0 + n)
        sync = FleetSync(base / robot, store, robot, map_id=map_id)
        sync.push_once()
        sync.close()
    store.close()
    clock.t = T0 + 60 * 40
    pose.pose = Pose(x=2.0, y=1.5, frame="map")
    engines = {}

    def engine(robot: str) -> FleetEngine:
        if robot not in engines:
            engines[robot] = FleetEngine(None, fleet_url=fleet_url, robot_id=robot, clock=clock,
                                         pose_provider=pose, text_embedder=minilm())
        return engines[robot]
    yield {"base": base, "clock": clock, "pose": pose, "engine": engine, "url": fleet_url}
    for e in engines.values():
        e.close()


def _local_ids(url: str, fleet_ids: list[int]) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = dict(conn.execute("SELECT id, local_id FROM memory_observations"
                                 " WHERE id = ANY(%s)", (fleet_ids,)).fetchall())
    return [rows[i] for i in fleet_ids]


QUERIES = [
    {"semantic_query": "red door"},
    {"stream": "events"},
    {"stream": "camera", "k": 7},
    {"near_x": 3.0, "near_y": 1.5, "radius": 2.5},
    {"near_here": True, "radius": 1.2, "k": 10},
    {"after_seconds_ago": 900},
    {"tags": {"kind": "door"}, "k": 20},
    {"tags": {"n": {"gte": 5, "lt": 20}}, "semantic_query": "a chair to sit on"},
    {"semantic_query": "kitchen", "near_x": 4.0, "near_y": 3.0, "radius": 4,
     "after_seconds_ago": 1800, "k": 3},
    {"order_by": "-n", "k": 4},
    {"semantic_query": "door", "order_by": "time", "k": 3},
    {"semantic_query": "door", "min_score": 0.4, "k": 50},
    {"stream": "camera", "semantic_query": "someone waving hello", "k": 100},
    {"stream": ["camera", "odom"], "semantic_query": "cat", "near_x": 8.0, "near_y": 4.5,
     "radius": 3},
    # named places (the robot's own, as it named them last)
    {"near": "kitchen", "k": 20},
    {"near": " KITCHEN ", "radius": 3.0, "semantic_query": "a red door", "k": 4},
    {"near": "dock", "stream": "odom", "order_by": "time", "k": 8},
    # camera views that cover a point far from where they were taken
    {"near_x": 6.0, "near_y": 0.5, "radius": 0.5, "seen_near": True, "k": 20},
    {"near_x": 0.0, "near_y": 5.0, "radius": 1.0, "seen_near": True, "semantic_query": "chair"},
    {"near": "dock", "seen_near": True, "stream": "camera", "k": 20},
    {"near_x": 6.0, "near_y": 0.5, "radius": 0.5, "seen_near": True, "include_archived": True},
]


def _robot_and_fleet(fleet, query: dict) -> tuple[dict, dict]:
    """r1's answer from its own engine, and the fleet's to the same query for robot r1."""
    local = make_engine(fleet["base"] / "r1", clock=fleet["clock"], pose=fleet["pose"])
    try:
        want = json.loads(local.search(json.dumps(query)))
    finally:
        local.close()
    got = json.loads(fleet["engine"]("r1").search(json.dumps({**query, "robot": "r1"})))
    assert want["ok"] and got["ok"], (want, got)
    return want, got


@pytest.mark.parametrize("query", QUERIES, ids=[json.dumps(q)[:60] for q in QUERIES])
def test_fleet_answers_equal_the_robots_own_engine(fleet, query):
    want, got = _robot_and_fleet(fleet, query)
    assert got["count"] == want["count"]
    assert all(r["robot"] == "r1" and r["map"] in ("r1/map", None) for r in got["results"])
    ids = _local_ids(fleet["url"], [r["id"] for r in got["results"]])
    assert ids == [r["id"] for r in want["results"]]
    for g, w in zip(got["results"], want["results"], strict=True):
        assert (g["score"] is None) == (w["score"] is None)
        if w["score"] is not None:
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
        assert (g["t"], g["pose"], g["tags"], g["text"], g["stream"]) == (
            w["t"], w["pose"], w["tags"], w["text"], w["stream"])


def test_robot_filter_and_robot_in_every_result(fleet):
    eng = fleet["engine"]("r1")
    both = json.loads(eng.search(json.dumps({"semantic_query": "a red door", "k": 8,
                                             "robot": ["r1", "r2"]})))
    assert {r["robot"] for r in both["results"]} == {"r1", "r2"}
    every = json.loads(eng.search("a red door"))  # plain text: the whole fleet
    assert every["ok"] and all("robot" in r for r in every["results"])
    only = json.loads(eng.search(json.dumps({"stream": "events", "robot": "r4", "k": 50})))
    assert only["count"] == 9 and {r["robot"] for r in only["results"]} == {"r4"}
    for bad in ({"robot": 3}, {"robot": []}, {"robot": [""]}, {"map": ""}):
        ans = json.loads(eng.search(json.dumps(bad)))
        assert ans["error"]["code"] == "bad_request"


def test_spatial_filters_stay_within_one_map(fleet):
    r1 = fleet["engine"]("r1")
    area = {"near_x": 3.0, "near_y": 1.5, "radius": 100.0, "k": 100}
    own = json.loads(r1.search(json.dumps(area)))  # r1 and r2 share coordinates, not maps
    assert own["count"] > 0 and {r["robot"] for r in own["results"]} == {"r1"}
    other = json.loads(r1.search(json.dumps({**area, "map": "r2/map"})))
    assert {r["robot"] for r in other["results"]} == {"r2"}
    named = json.loads(r1.search(json.dumps({**area, "robot": "r2"})))  # that robot's map
    assert {r["robot"] for r in named["results"]} == {"r2"}
    # r3 and r4 sync with the same map id: searched together.
    shared = json.loads(r1.search(json.dumps({"near_x": 25.0, "near_y": 1.5, "radius": 100.0,
                                              "k": 100, "map": "site-A"})))
    assert {r["robot"] for r in shared["results"]} == {"r3", "r4"}
    r3 = fleet["engine"]("r3")
    mine = json.loads(r3.search(json.dumps({"near_x": 25.0, "near_y": 1.5, "radius": 100.0,
                                            "k": 100})))
    assert {r["robot"] for r in mine["results"]} == {"r3", "r4"}
    assert all(r["map"] == "site-A" for r in mine["results"])


def test_streams_per_robot_and_writes_refused(fleet):
    eng = fleet["engine"]("r1")
    ans = json.loads(eng.streams())
    camera = next(s for s in ans["streams"] if s["name"] == "camera")
    assert {r["robot"] for r in camera["robots"]} == {"r1", "r2", "r3", "r4"}
    assert camera["count"] == sum(r["count"] for r in camera["robots"])
    assert {r["robot"]: r["map"] for r in ans["robots"]} == {
        "r1": "r1/map", "r2": "r2/map", "r3": "site-A", "r4": "site-A"}
    assert json.loads(eng.save("hello"))["error"]["code"] == "bad_request"
    assert json.loads(eng.save(json.dumps({"place": "kitchen", "x": 1.0, "y": 2.0})))[
        "error"]["code"] == "bad_request"
    assert json.loads(eng.compact())["error"]["code"] == "bad_request"


VISITS = [
    {"visits": True, "near": "kitchen"},
    {"visits": True, "near_x": 8.0, "near_y": 2.0, "radius": 1.0},
    {"visits": True, "near": "kitchen", "after_seconds_ago": 1500},
    {"visits": True, "near_x": 4.0, "near_y": 4.0, "radius": 0.8, "after_seconds_ago": 2000,
     "before_seconds_ago": 600},
    {"visits": True, "near": "dock", "radius": 3.0},
    {"visits": True, "near_x": 40.0, "near_y": 40.0, "radius": 1.0},
]


@pytest.mark.parametrize("query", VISITS, ids=[json.dumps(q)[:60] for q in VISITS])
def test_fleet_visits_equal_the_robots_own(fleet, query):
    want, got = _robot_and_fleet(fleet, query)
    assert all(v.pop("robot") == "r1" for v in got["visits"])
    got.pop("took_ms")
    want.pop("took_ms")
    assert got == want


def test_fleet_visits_of_robots_sharing_a_map_keep_their_own_tracks(fleet):
    r3, r4 = fleet["engine"]("r3"), fleet["engine"]("r4")
    query = {"visits": True, "near_x": 30.0, "near_y": 2.0, "radius": 0.45}
    both = json.loads(r3.search(json.dumps({**query, "map": "site-A"})))
    each = {r: json.loads(r3.search(json.dumps({**query, "robot": r}))) for r in ("r3", "r4")}
    assert both["ok"] and {v["robot"] for v in both["visits"]} == {"r3"}  # r4's loop is 1 m off
    assert both["count"] == each["r3"]["count"] + each["r4"]["count"] > 0
    assert both["total_s"] == pytest.approx(each["r3"]["total_s"] + each["r4"]["total_s"])
    # The asking robot's map by default: r4 shares site-A with r3.
    mine = json.loads(r4.search(json.dumps(query)))
    assert mine["count"] == both["count"]
    # r1's map has no track near there: no visits, and the answer says why.
    r1 = json.loads(fleet["engine"]("r1").search(json.dumps(query)))
    assert r1["count"] == 0 and r1["visits"] == []


def test_named_places_belong_to_a_robot_and_a_map(fleet):
    r1 = fleet["engine"]("r1")
    own = json.loads(r1.search(json.dumps({"near": "kitchen", "k": 50})))
    assert own["ok"] and own["count"] > 0 and {r["robot"] for r in own["results"]} == {"r1"}
    # Another robot's place: its own coordinates on its own map.
    theirs = json.loads(r1.search(json.dumps({"near": "kitchen", "robot": "r3", "k": 50})))
    assert {r["robot"] for r in theirs["results"]} == {"r3"}
    assert all(r["map"] == "site-A" for r in theirs["results"])
    assert all(math.hypot(r["pose"]["x"] - 30.0, r["pose"]["y"] - 2.0) <= 1.2
               for r in theirs["results"])
    # On a shared map the newest naming wins (r4 named it last: x = 31), robots together.
    shared = json.loads(r1.search(json.dumps({"near": "kitchen", "map": "site-A", "k": 50})))
    assert {r["robot"] for r in shared["results"]} == {"r3", "r4"}
    assert all(math.hypot(r["pose"]["x"] - 31.0, r["pose"]["y"] - 2.0) <= 1.2
               for r in shared["results"])
    # A robot with no place of that name: the name is on three maps, so it must say which.
    ans = json.loads(fleet["engine"]("r9").search(json.dumps({"near": "kitchen"})))
    assert ans["error"]["code"] == "bad_request"
    assert "3 maps" in ans["error"]["message"] and "site-A" in ans["error"]["message"]
    for name in ("hall", "attic"):  # removed; never named
        ans = json.loads(r1.search(json.dumps({"near": name})))
        assert ans["error"]["code"] == "bad_request"
        assert "unknown place" in ans["error"]["message"] and "Kitchen" in ans["error"]["message"]
    listed = json.loads(r1.streams())["places"]
    assert {(p["robot"], p["name"]) for p in listed} == {
        (r, n) for r in ("r1", "r2", "r3", "r4") for n in ("dock", "Kitchen")}
    kitchen = next(p for p in listed if p["robot"] == "r1" and p["name"] == "Kitchen")
    assert kitchen == {"name": "Kitchen", "x": 8.0, "y": 2.0, "radius": 1.2, "frame": None,
                       "robot": "r1", "map": "r1/map"}


def test_seen_near_stays_within_one_map(fleet):
    r1 = fleet["engine"]("r1")
    query = {"near_x": 6.0, "near_y": 0.5, "radius": 0.5, "seen_near": True, "k": 50}
    ans = json.loads(r1.search(json.dumps(query)))
    assert ans["ok"] and {r["robot"] for r in ans["results"]} == {"r1"}
    views = [r for r in ans["results"] if "view" in r["tags"]]
    assert {r["tags"]["view"] for r in views} == {0, 4}  # looking east: the point is 6 m ahead
    other = json.loads(r1.search(json.dumps({**query, "near_x": 28.0, "map": "site-A"})))
    assert {r["robot"] for r in other["results"] if "view" in r["tags"]} == {"r3", "r4"}


def test_unreachable_fleet_answers_unavailable_without_the_password(fleet, tmp_path):
    eng = fleet["engine"]("r1")
    real = eng.fleet_backend.store
    eng.fleet_backend.store = FleetStore(
        f"postgresql://u:s3cret-XYZ@/db?host={tmp_path}&connect_timeout=1")
    try:
        ans = eng.search("red door")
    finally:
        eng.fleet_backend.store = real
    assert json.loads(ans)["error"]["code"] == "unavailable"
    assert "s3cret-XYZ" not in ans


def test_hnsw_for_unfiltered_semantic_search_matches_exact(fleet):
    eng = fleet["engine"]("r1")
    query = json.dumps({"semantic_query": "a sleeping cat", "k": 5})
    exact = json.loads(eng.search(query))
    done = subprocess.run([sys.executable, "-m", "memory_node.fleet.sync",
                           "--create-vector-index"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "MEMORY_FLEET_URL": fleet["url"]})
    assert done.returncode == 0, done.stderr
    assert f"HNSW index for {eng.text_model_id} (384-d, m 32, ef_construction 200)" in done.stdout
    eng.fleet.drop_connection()
    eng.fleet._hnsw = None  # noqa: SLF001 - a running server sees a new index after reconnect
    assert eng.text_model_id in eng.fleet.hnsw_models()
    approx = json.loads(eng.search(query))
    assert [r["id"] for r in approx["results"]] == [r["id"] for r in exact["results"]]


def test_memory_mcp_serves_the_fleet_in_process(fleet):
    from memory_node.agent.mcp_server import _make_client, _parser

    args = _parser().parse_args(["--fleet-url", fleet["url"], "--robot-id", "r2"])
    client = _make_client(args, [])
    try:
        ans = json.loads(client.search(json.dumps({"semantic_query": "red door", "k": 3})))
        assert ans["ok"] and all("robot" in r for r in ans["results"])
    finally:
        client.close()


def test_credentials_only_from_env_or_a_private_file(tmp_path, monkeypatch):
    with pytest.raises(CredentialError):
        resolve_fleet_url("postgresql://robot:pw@db.example/fleet", env={})
    with pytest.raises(CredentialError):
        resolve_fleet_url("host=db password=pw", env={})
    assert resolve_fleet_url("postgresql://robot@db/fleet", env={}) == "postgresql://robot@db/fleet"
    assert resolve_fleet_url(None, env={"MEMORY_FLEET_URL": "postgresql://r:pw@h/f"}) == \
        "postgresql://r:pw@h/f"
    f = tmp_path / "fleet_url"
    f.write_text("postgresql://r:pw2@h/f\n")
    f.chmod(0o644)
    with pytest.raises(CredentialError, match="chmod 600"):
        read_url_file(f)
    f.chmod(0o600)
    assert resolve_fleet_url(None, env={"MEMORY_FLEET_URL_FILE": str(f)}) == \
        "postgresql://r:pw2@h/f"
    assert "pw" not in redact("postgresql://r:pw@h/f?password=pw")
    assert scrub("failed for postgresql://r:pw@h/f", "postgresql://r:pw@h/f").count("pw") == 0
    # The command refuses a password on its command line and never echoes it.
    done = subprocess.run([sys.executable, "-m", "memory_node.fleet.sync", "--memory-dir",
                           str(tmp_path / "m"), "--fleet-url", "postgresql://r:hunter2@h/f",
                           "--once"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "hunter2" not in done.stdout + done.stderr
    # A password from the environment stays out of the log when the connection fails.
    make_engine(tmp_path / "m").close()  # a memory to push
    env = {"MEMORY_FLEET_URL": f"postgresql://r:hunter3@/f?host={tmp_path}&connect_timeout=1",
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "memory_node.fleet.sync", "--memory-dir",
                           str(tmp_path / "m"), "--once", "--timeout", "1"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1 and "hunter3" not in done.stdout + done.stderr
    assert "r:***@" in done.stderr


ROBOT_ROLE_SQL = """
CREATE ROLE memory_robot NOLOGIN;
GRANT SELECT ON memory_fleet_meta TO memory_robot;
GRANT SELECT, INSERT, UPDATE ON memory_observations, memory_sync_state, memory_robots,
    memory_models, memory_places TO memory_robot;
ALTER TABLE memory_observations ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_sync_state ENABLE ROW LEVEL SECURITY;
ALTER TABLE memory_places ENABLE ROW LEVEL SECURITY;
CREATE POLICY fleet_read ON memory_observations FOR SELECT USING (true);
CREATE POLICY places_read ON memory_places FOR SELECT USING (true);
CREATE POLICY robot_own_places ON memory_places FOR ALL TO memory_robot
    USING (robot_id = current_user) WITH CHECK (robot_id = current_user);
CREATE POLICY robot_inserts_own ON memory_observations FOR INSERT TO memory_robot
    WITH CHECK (robot_id = current_user);
CREATE POLICY robot_updates_own ON memory_observations FOR UPDATE TO memory_robot
    USING (robot_id = current_user) WITH CHECK (robot_id = current_user);
CREATE POLICY robot_own_state ON memory_sync_state FOR ALL TO memory_robot
    USING (robot_id = current_user) WITH CHECK (robot_id = current_user);
CREATE ROLE "go2-07" LOGIN IN ROLE memory_robot;
"""


def test_least_privilege_robot_role_syncs_its_own_rows_only(tmp_path, pg):
    from fleet_support import create_database, drop_database

    url = create_database(pg)
    try:
        FleetStore(url).init_schema()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute('DROP ROLE IF EXISTS "go2-07"')
            conn.execute("DROP ROLE IF EXISTS memory_robot")
            conn.execute(ROBOT_ROLE_SQL)
        p = urlsplit(url)
        robot_url = urlunsplit((p.scheme, "go2-07@" + p.netloc.split("@")[-1], p.path,
                                p.query, ""))
        mem = tmp_path / "go2"
        robot = make_engine(mem)
        robot.save("the loading bay door is stuck")
        robot.save(json.dumps({"place": "loading bay", "x": 3.0, "y": -1.0}))
        robot.close()
        done = subprocess.run([sys.executable, "-m", "memory_node.fleet.sync", "--memory-dir",
                               str(mem), "--robot-id", "go2-07", "--once", "--no-create",
                               "--fleet-url", robot_url], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        wrong = subprocess.run([sys.executable, "-m", "memory_node.fleet.sync", "--memory-dir",
                                str(mem), "--robot-id", "someone-else", "--once",
                                "--no-create", "--timeout", "3", "--fleet-url", robot_url],
                               capture_output=True, text=True, timeout=120)
        assert wrong.returncode != 0  # row-level security: only its own robot id
        with (psycopg.connect(robot_url, autocommit=True) as conn,
              pytest.raises(psycopg.errors.InsufficientPrivilege)):
            conn.execute("DELETE FROM memory_observations")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT robot_id, count(*) FROM memory_observations"
                                " GROUP BY robot_id").fetchall() == [("go2-07", 1)]
            assert conn.execute("SELECT robot_id, name FROM memory_places").fetchall() == [
                ("go2-07", "loading bay")]
    finally:
        drop_database(pg, url)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute('DROP ROLE IF EXISTS "go2-07"')
            conn.execute("DROP ROLE IF EXISTS memory_robot")


def test_memory_server_backend_fleet_serves_the_same_services(fleet, ros_process, tmp_path):
    """`memory-server -p backend:=fleet` (URL from the environment) answers /memory/search
    and /memory/streams from the shared store, robot in every result; its log names the
    fleet store, not a memory directory or index cache it does not have."""
    import rclpy
    from ros_helpers import stop

    from memory_node.ros.cli import ServiceCaller

    # A password in the URL (the server trusts local connections, so it is not checked):
    # it must reach no answer, no output and no ROS log (conftest scans them all).
    url = _with_password(fleet["url"])
    proc = ros_process(["-m", "memory_node.ros.server", "--ros-args", "-p", "backend:=fleet",
                        "-p", "robot_id:=r1", "-p", f"memory_dir:={tmp_path / 'unused'}"],
                       env={"MEMORY_FLEET_URL": url})
    proc.wait_for_line(r"active: /memory/search", timeout=120)
    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    caller = ServiceCaller("fleet_server_client", context=ctx)
    try:
        ans = json.loads(caller.call("search", json.dumps({"semantic_query": "red door",
                                                           "robot": ["r2", "r3"], "k": 5}),
                                     30.0))
        assert ans["ok"], ans
        assert ans["results"] and {r["robot"] for r in ans["results"]} <= {"r2", "r3"}
        streams_text = caller.call("streams", None, 30.0)
        streams = json.loads(streams_text)
        assert streams["ok"] and {s["name"] for s in streams["streams"]} >= {"camera", "events"}
        assert FLEET_PASSWORD not in streams_text
    finally:
        caller.close()
        rclpy.shutdown(context=ctx)
    assert stop(proc) == 0
    log = proc.output
    assert f"configured: the fleet store {redact(url)} (read-only), asked as robot " \
        "'r1'" in log, log
    assert ":***@" in redact(url) and FLEET_PASSWORD not in log
    assert "fleet store connection closed" in log, log
    assert "memory at" not in log and "index cache" not in log, log
    assert not (tmp_path / "unused").exists()


def _with_password(url: str) -> str:
    """`url` with the tests' fleet password for its user."""
    parts = urlsplit(url)
    user, _, host = parts.netloc.rpartition("@")
    user = (user or "postgres").split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{FLEET_PASSWORD}@{host}"))


def test_a_password_typed_as_a_parameter_is_refused_and_never_printed(ros_process):
    """Issue 40: `memory-server -p fleet_url:=postgresql://go2-a:PW@...` is refused, and the
    start line before the refusal, which names each value's origin, shows the URL with its
    password masked (the console and ~/.ros/log are readable by every user)."""
    url = f"postgresql://go2-a:{FLEET_PASSWORD}@/postgres?host=/var/run/postgresql"
    proc = ros_process(["-m", "memory_node.ros.server", "--ros-args", "-p", "backend:=fleet",
                        "-p", f"fleet_url:={url}"])
    proc.wait_for_line(r"configure failed: CredentialError", timeout=60)
    log = proc.output
    assert "fleet_url = postgresql://go2-a:***@/postgres?host=/var/run/postgresql " \
        "(command line)" in log, log
    assert FLEET_PASSWORD not in log


def test_skills_on_a_fleet_take_robot_and_say_which_robot(fleet):
    """On a fleet store the query skills (and so the MCP tools) take `robot`; answers name
    the robot; list_memory_streams counts rows per robot and lists the robots."""
    from memory_node.agent.client import EngineClient
    from memory_node.agent.skills import get_skills

    client = EngineClient(fleet["engine"]("r1"))
    skills = {s.name: s for s in get_skills(client, clock=fleet["clock"])}
    assert "robot" in skills["query_memory"].parameters["properties"]
    assert "robot" in skills["query_agent_memory"].parameters["properties"]
    answer = skills["query_memory"].call(stream="camera", semantic_query="red door",
                                         robot="r2", k=3)
    lines = answer.splitlines()
    assert lines and all(" robot=r2 " in line for line in lines), answer
    listing = skills["list_memory_streams"].call()
    assert "by robot: r1 " in listing and "Robots in the fleet" in listing, listing
    assert "robot" in skills["visits"].parameters["properties"]
    visits = skills["visits"].call(near_x=30.0, near_y=2.0, radius=0.45, robot=["r3", "r4"])
    assert "visits to x=30.00 y=2.00" in visits and "\n- r3 from " in visits, visits
    seen = skills["query_memory"].call(stream="camera", near_x=6.0, near_y=0.5, radius=0.5,
                                       seen_near=True, k=20)
    assert "r1 camera looking east" in seen, seen
    # one robot's own memory has no robot parameter
    from engine_support import make_engine

    local = make_engine(fleet["base"] / "local-only")
    try:
        own = {s.name: s for s in get_skills(EngineClient(local))}
        assert "robot" not in own["query_memory"].parameters["properties"]
    finally:
        local.close()
