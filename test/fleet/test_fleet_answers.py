"""Fleet answers where they used to differ from the robot's, or fail once.

Equal captions tie: a describer gives many keyframes the same caption, so equal scores are
common; the robot breaks them by its row id, newest first, and the fleet has to do the same
(its own ids are assigned in sync order and mean nothing to the robot). Equal times break the
same way. A query server outlives database restarts: its first query after one answers.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from engine_support import T0, FakeClock, PoseBox, make_engine, minilm

from memory_node.core.types import Pose
from memory_node.fleet.engine import FleetEngine
from memory_node.fleet.store import FleetStore
from memory_node.fleet.sync import FleetSync

ROBOT = "rt"


@pytest.fixture(scope="module")
def tied(tmp_path_factory, fleet_url):
    """One robot: 48 camera keyframes along a corridor, three in four captioned "a red wall"
    (the describer's usual repetition), every pair of rows sharing a time stamp."""
    root = tmp_path_factory.mktemp("tied") / ROBOT
    clock, pose = FakeClock(), PoseBox()
    eng = make_engine(root, clock=clock, pose=pose)
    try:
        for i in range(48):
            text = "a blue chair" if i % 4 == 3 else "a red wall"
            eng.add_observation("camera", T0 + 10 * (i // 2),
                                Pose(x=float(i % 12), y=0.0, frame="map"),
                                {"n": i % 3}, text=text)
    finally:
        eng.close()
    store = FleetStore(fleet_url)
    sync = FleetSync(root, store, ROBOT)
    sync.push_once()
    sync.close()
    store.close()
    clock.t = T0 + 600
    fleet = FleetEngine(None, fleet_url=fleet_url, robot_id=ROBOT, clock=clock,
                        pose_provider=pose, text_embedder=minilm())
    yield {"root": root, "clock": clock, "pose": pose, "fleet": fleet, "url": fleet_url}
    fleet.close()


QUERIES = [
    {"stream": "camera", "semantic_query": "red wall", "near_x": 4, "near_y": 0, "radius": 3,
     "k": 6},
    {"stream": "camera", "semantic_query": "red wall", "k": 5},
    {"semantic_query": "a red wall", "tags": {"n": 1}, "k": 4},
    {"semantic_query": "blue chair", "near_x": 8, "near_y": 0, "radius": 2.5, "k": 3},
    {"semantic_query": "red wall", "order_by": "-time", "k": 5},
    {"semantic_query": "red wall", "order_by": "time", "k": 5},
    {"stream": "camera", "k": 5},
    {"order_by": "time", "k": 5},
    {"order_by": "-n", "k": 7},
    {"order_by": "n", "near_x": 3, "near_y": 0, "radius": 1, "k": 7},
]


@pytest.mark.parametrize("query", QUERIES, ids=[json.dumps(q)[:60] for q in QUERIES])
def test_ties_break_as_on_the_robot(tied, query):
    local = make_engine(tied["root"], clock=tied["clock"], pose=tied["pose"])
    try:
        want = json.loads(local.search(json.dumps(query)))
    finally:
        local.close()
    got = json.loads(tied["fleet"].search(json.dumps({**query, "robot": ROBOT})))
    assert want["ok"] and got["ok"], (want, got)
    local_id = _local_ids(tied["url"])
    assert [local_id[r["id"]] for r in got["results"]] == [r["id"] for r in want["results"]]
    for g, w in zip(got["results"], want["results"], strict=True):
        assert (g["score"] is None) == (w["score"] is None)
        if w["score"] is not None:
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
    if query is QUERIES[0]:  # the case that went wrong: six of many equal scores
        assert len({round(r["score"], 5) for r in want["results"]}) == 1
        assert want["count"] == 6


def _local_ids(url: str) -> dict[int, int]:
    """Fleet id -> the robot's own id, for this module's robot."""
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT id, local_id FROM memory_observations"
                                 " WHERE robot_id = %s", (ROBOT,)).fetchall())


def test_first_query_after_a_database_restart_answers(tied, pg):
    """The server's connection dies with the database; the next query reconnects on its own
    rather than answering `unavailable` once."""
    if not pg.local:
        pytest.skip("restarts the server: only on the self-contained test server")
    fleet = tied["fleet"]
    query = json.dumps({"stream": "camera", "semantic_query": "red wall", "k": 3,
                        "robot": ROBOT})
    before = json.loads(fleet.search(query))
    assert before["ok"] and before["count"] == 3
    pg.stop()
    pg.start()
    after = json.loads(fleet.search(query))  # over the connection the restart cut
    assert after.get("ok"), after
    assert [r["id"] for r in after["results"]] == [r["id"] for r in before["results"]]
    assert json.loads(fleet.streams())["ok"]
    pg.stop()  # still down: a clear answer, not a hang
    try:
        down = json.loads(fleet.search(query))
        assert down["error"]["code"] == "unavailable", down
    finally:
        pg.start()
    assert json.loads(fleet.search(query))["ok"]
