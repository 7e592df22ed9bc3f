"""The engine facade against docs/design.md's JSON contract, as an agent or a ROS client sees it."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from chat_server import ChatServer
from engine_support import T0, FakeClock, PoseBox, make_engine

from memory_node.core.contract import ErrorAnswer, SaveAnswer, SearchAnswer, VisitsAnswer
from memory_node.core.engine import dumps
from memory_node.core.ingest import CameraFrame
from memory_node.core.llm import LLMSettings
from memory_node.core.types import Pose


@pytest.fixture
def env(tmp_path):
    clock, pose = FakeClock(), PoseBox(Pose(1.0, 2.0, 0.0, 0.5))
    eng = make_engine(tmp_path / "mem", clock, pose)
    yield eng, clock, pose, tmp_path / "mem"
    eng.close()


def call(fn, arg=None):
    out = fn() if arg is None else fn(arg)
    assert isinstance(out, str)
    return json.loads(out)


def snapshot(root):
    """Everything a bad request must leave untouched."""
    db = (root / "memory.db").read_bytes()
    notes = {p.name: p.read_text() for p in (root / "notes").glob("*.md")}
    return db, notes


def test_save_then_search_contract_shape(env):
    eng, clock, pose, root = env
    saved = call(eng.save, "Met Alice at the front door. She wore a red coat.")
    assert saved["ok"] is True and saved["indexed"] is True
    assert isinstance(saved["id"], int) and saved["t"] == T0
    assert saved["pose"] == {"x": 1.0, "y": 2.0, "z": 0.0, "yaw": 0.5, "frame": "map",
                             "source": "tf"}
    clock.t += 300
    res = call(eng.search, "who did I greet at the door")
    assert res["ok"] is True and res["count"] == 1 and isinstance(res["took_ms"], float)
    [r] = res["results"]
    assert set(r) == {"id", "stream", "t", "pose", "score", "tags", "text", "ref"}
    assert r["id"] == saved["id"] and r["stream"] == "events" and r["score"] > 0.3
    md = next((root / "notes").glob("*_notes.md")).read_text()
    assert "Met Alice at the front door" in md and "2025-11-30" in md


def test_streams_lists_every_stream_with_rows(env):
    eng, clock, pose, _ = env
    empty = call(eng.streams)
    assert empty["disk_bytes"] > 0 and empty["disk_free_bytes"] > 0
    assert {k: v for k, v in empty.items() if k not in ("disk_bytes", "disk_free_bytes")} == {
        "ok": True, "streams": [], "places": [], "disk_budget_bytes": None,
        "took_ms": pytest.approx(0, abs=50)}
    eng.save("note one")
    eng.add_observation("odom", T0 + 5, Pose(0, 0), {"speed": 0.4})
    streams = {s["name"]: s for s in call(eng.streams)["streams"]}
    assert streams["events"]["count"] == 1 and streams["events"]["semantic"] is True
    assert streams["odom"] == {"name": "odom", "count": 1, "first_t": T0 + 5, "last_t": T0 + 5,
                               "semantic": False, "evicted": 0, "oldest_t": T0 + 5}


def test_bad_requests_change_nothing(env):
    eng, clock, pose, root = env
    eng.save("a note that must survive")
    before = snapshot(root)
    bad = ['{"radius": NaN}', "{oops", '{"k": 0}', '{"stream": "nope"}',
           '{"near_x": 1, "near_y": 1, "radius": -2}', "x" * 100_000]
    for q in bad:
        res = call(eng.search, q)
        assert res["ok"] is False and res["error"]["code"] == "bad_request", q
        assert res["error"]["message"]
    for note in ["", "x" * 10_000_000, '{"note": 3}', '{"note": "x", "tags": {"a": NaN}}']:
        res = call(eng.save, note)
        assert res["ok"] is False and res["error"]["code"] == "bad_request"
    assert snapshot(root) == before
    assert call(eng.search, "survive")["count"] == 1


def test_near_here_needs_a_pose(env):
    eng, clock, pose, _ = env
    eng.save("kitchen note")
    assert call(eng.search, '{"near_here": true, "radius": 1}')["count"] == 1
    pose.pose = None
    res = call(eng.search, '{"near_here": true}')
    assert res["error"]["code"] == "unavailable" and "pose" in res["error"]["message"]


def test_save_without_pose_is_stored_with_source_none(env):
    eng, clock, pose, _ = env
    pose.pose = None
    saved = call(eng.save, "heard a loud noise")
    assert saved["pose"]["source"] == "none" and saved["pose"]["x"] is None
    assert call(eng.search, '{"near_x": 0, "near_y": 0, "radius": 100}')["count"] == 0
    assert call(eng.search, "loud noise")["count"] == 1


def test_near_duplicate_notes_are_folded(env):
    eng, clock, pose, root = env
    first = call(eng.save, "Met Bob near the kitchen entrance.")
    clock.t += 20
    again = call(eng.save, "Met Bob near the kitchen entrance")
    assert again["folded"] is True and again["id"] == first["id"]
    clock.t += 120  # outside the folding window: a new note
    third = call(eng.save, "Met Bob near the kitchen entrance.")
    assert third["id"] != first["id"]
    pose.pose = Pose(8, 8)  # elsewhere: a new note too
    clock.t += 1
    assert call(eng.save, "Met Bob near the kitchen entrance.")["id"] != third["id"]
    assert call(eng.streams)["streams"][0]["count"] == 3
    md = next((root / "notes").glob("*.md")).read_text()
    assert md.count("Met Bob") == 3


def test_filters_tags_and_order(env):
    eng, clock, pose, _ = env
    rng = np.random.default_rng(0)
    for i in range(12):
        img = np.full((120, 160, 3), int(20 * i), np.uint8)
        eng.add_stream_rows("camera", [CameraFrame(T0 + i * 10, Pose(i * 0.5, 0), img,
                                           {"frame": i})])
    clock.t = T0 + 200
    brightest = call(eng.search, '{"stream": "camera", "order_by": "-brightness", "k": 1}')
    assert brightest["results"][0]["tags"]["frame"] == 11
    assert brightest["results"][0]["ref"].startswith("blobs/camera/")
    near = call(eng.search, '{"stream": "camera", "near_x": 0, "near_y": 0, "radius": 1.01}')
    assert sorted(r["tags"]["frame"] for r in near["results"]) == [0, 1, 2]
    recent = call(eng.search, '{"stream": "camera", "after_seconds_ago": 105, "k": 50}')
    assert [r["tags"]["frame"] for r in recent["results"]] == [11, 10]
    old = call(eng.search, '{"stream": "camera", "before_seconds_ago": 175, "order_by": "time"}')
    assert [r["tags"]["frame"] for r in old["results"]] == [0, 1, 2]
    dark = call(eng.search, '{"stream": "camera", "tags": {"brightness": {"lt": 0.1}}}')
    assert {r["tags"]["frame"] for r in dark["results"]} == {0, 1}
    combined = call(eng.search, json.dumps({
        "stream": "camera", "semantic_query": "a dark scene", "near_x": 2, "near_y": 0,
        "radius": 1.5, "after_seconds_ago": 180, "k": 3}))
    frames = [r["tags"]["frame"] for r in combined["results"]]
    assert len(frames) == 3 and all(2 <= f <= 7 for f in frames)
    assert all(r["score"] is not None for r in combined["results"])
    _ = rng


def test_semantic_query_on_a_stream_without_vectors_lists_rows_in_the_asked_order(env):
    eng, clock, _, _ = env
    for i in range(4):
        eng.add_observation("odom", T0 + i, Pose(float(i), 0.0), {"i": i})
    clock.t = T0 + 100
    oldest = call(eng.search, '{"stream": "odom", "semantic_query": "a door", '
                              '"order_by": "time", "k": 3}')
    assert [r["tags"]["i"] for r in oldest["results"]] == [0, 1, 2]
    assert all(r["score"] is None for r in oldest["results"])
    assert oldest["notes"] == ["no embedded rows in the requested stream(s): "
                               "semantic_query ignored"]
    newest = call(eng.search, '{"stream": "odom", "semantic_query": "a door", "k": 3}')
    assert [r["tags"]["i"] for r in newest["results"]] == [3, 2, 1]
    assert newest["notes"] == ["no embedded rows in the requested stream(s): "
                               "semantic_query ignored, newest first"]


def test_compact_without_llm_reports_unavailable_and_keeps_notes(env):
    eng, clock, pose, _ = env
    eng.save("remember the red door")
    for i in range(20):  # a robot standing still for 20 frames, two days ago
        eng.add_observation("odom", T0 - 2 * 86400 + i, Pose(0.1, 0.1), {"speed": 0.0})
    res = call(eng.compact)
    assert res["ok"] is True and res["summaries"]["status"] == "unavailable"
    # One visit to one cell: its first and last frame stay, the newest counts the rest.
    assert res["thinned"] == 18 and res["archived_total"] == 18
    assert res["kept"]["visit_first_last"] == 2 and res["clock"] == "clock"
    streams = {s["name"]: s for s in call(eng.streams)["streams"]}
    assert streams["odom"]["count"] == 2 and streams["events"]["count"] == 1
    kept, first = call(eng.search, '{"stream": "odom"}')["results"]
    assert kept["tags"]["merged"] == 18 and kept["tags"]["span"] == [T0 - 2 * 86400 + 1,
                                                                       T0 - 2 * 86400 + 19]
    assert first["t"] == T0 - 2 * 86400


def test_compact_writes_llm_summaries_of_old_notes(tmp_path):
    def reply(body):
        return {"role": "assistant", "content": "- Met Alice at the front door."}

    with ChatServer(reply) as srv:
        settings = LLMSettings(base_url=srv.base_url, api_key="sk-test-secret", model="gpt-5.5")
        clock = FakeClock(T0)
        eng = make_engine(tmp_path / "m", clock, PoseBox(Pose(3, 4)), llm_settings=settings)
        eng.save("Met Alice at the front door.")
        eng.save('{"note": "Fed the cat in the kitchen", "tags": {"room": "kitchen"}}')
        clock.t += 2 * 86400
        res = call(eng.compact)
        assert res["summaries"]["status"] == "ok" and res["summaries"]["written"] == 1
        [req] = srv.requests
        assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test-secret"
        assert "Met Alice" in req["body"]["messages"][-1]["content"]
        summ = call(eng.search, '{"stream": "summaries"}')["results"]
        assert summ[0]["text"] == "- Met Alice at the front door."
        assert summ[0]["tags"]["notes"] == 2
        assert call(eng.search, '{"stream": "events"}')["count"] == 2  # notes stay
        again = call(eng.compact)  # nothing new to summarise
        assert again["summaries"]["written"] == 0 and len(srv.requests) == 1
        eng.close()


def test_markdown_is_the_record_of_notes(tmp_path):
    root = tmp_path / "m"
    eng = make_engine(root, FakeClock(), PoseBox(Pose(1, 1)))
    eng.save("## not a heading\n# nor this\nMet Carol in the garden")
    eng.close()
    notes = next((root / "notes").glob("*.md"))
    with open(notes, "a") as fh:  # a person adds a note by hand
        fh.write("\n## Kitchen\nThe fridge door squeaks.\n")
    (root / "memory.db").unlink()
    for p in root.glob("memory.db-*"):
        p.unlink()
    shutil.rmtree(root / "index")
    eng = make_engine(root, FakeClock(), PoseBox())
    res = call(eng.search, '{"stream": "events", "k": 10}')
    texts = sorted(r["text"] for r in res["results"])
    assert texts == ["## Kitchen\nThe fridge door squeaks.",
                     "## not a heading\n# nor this\nMet Carol in the garden"]
    carol = next(r for r in res["results"] if "Carol" in r["text"])
    assert carol["pose"]["x"] == 1.0
    eng.close()
    eng = make_engine(root, FakeClock(), PoseBox())  # picked up once, not twice
    assert call(eng.streams)["streams"][0]["count"] == 2
    eng.close()


@pytest.mark.parametrize("damage", ["missing", "corrupt", "foreign"])
def test_index_cache_is_rebuilt_when_unusable(tmp_path, damage):
    root = tmp_path / "m"
    eng = make_engine(root)
    for text in ["red door", "green sofa", "bright window"]:
        eng.save(text)
    want = call(eng.search, "a door")["results"]
    eng.close()
    idx = root / "index"
    if damage == "missing":
        shutil.rmtree(idx)
    elif damage == "corrupt":
        for f in idx.glob("*.npy"):
            f.write_bytes(b"garbage")
    else:
        manifest = json.loads((idx / "manifest.json").read_text())
        manifest["db_uuid"] = "someone-else"
        (idx / "manifest.json").write_text(json.dumps(manifest))
    eng = make_engine(root)
    assert call(eng.search, "a door")["results"] == want
    eng.close()


def test_graph_cached_with_other_settings_is_rebuilt_and_said(tmp_path, caplog):
    root = tmp_path / "m"
    texts = [f"note {i}: the {c} door near the {p}" for i, (c, p) in enumerate(
        (c, p) for c in ("red", "green", "blue", "white") for p in ("kitchen", "lab", "dock"))]
    eng = make_engine(root, hnsw_min_rows=5, hnsw_storage="flat")
    for text in texts:
        eng.save(text)
    want = call(eng.search, '{"semantic_query": "a blue door", "k": 3}')["results"]
    # The graph is built in the background: on a loaded host a close before it is done
    # caches no graph, and there is nothing for the next start to find unusable.
    assert eng.indexes.wait_for_graphs(60)
    eng.close()
    with caplog.at_level("WARNING", logger="memory_node.core"):
        eng = make_engine(root, hnsw_min_rows=5, hnsw_storage="sq8")
        assert eng.indexes.wait_for_cached_graphs(60)  # cached graphs are read in the background
    assert "cached HNSW graph of" in caplog.text and "events" in caplog.text
    got = call(eng.search, '{"semantic_query": "a blue door", "k": 3}')["results"]
    assert [r["id"] for r in got] == [r["id"] for r in want]
    eng.close()
    caplog.clear()
    with caplog.at_level("WARNING", logger="memory_node.core"):
        make_engine(root, hnsw_min_rows=5, hnsw_storage="sq8").close()  # now cached as sq8
    assert "cached HNSW graph" not in caplog.text


def test_closed_engine_answers_unavailable(tmp_path):
    eng = make_engine(tmp_path / "m")
    eng.close()
    assert call(eng.search, "x")["error"]["code"] == "unavailable"


def test_schema_1_store_is_migrated_and_a_newer_one_refused(tmp_path):
    import sqlite3

    import numpy as np
    from engine_support import minilm

    from memory_node.core.store.sqlite_store import SqliteObservationStore

    root = tmp_path / "old"
    root.mkdir()
    vec = minilm().embed_texts(["the red door"])[0]
    db = sqlite3.connect(root / "memory.db")  # what schema 1 wrote: embeddings inline
    db.executescript("""
        CREATE TABLE observations (id INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL,
          t REAL NOT NULL, x REAL, y REAL, z REAL, yaw REAL, frame TEXT,
          pose_source TEXT NOT NULL DEFAULT 'none', tags TEXT NOT NULL DEFAULT '{}',
          text TEXT NOT NULL DEFAULT '', ref TEXT, embedding BLOB, model_id TEXT,
          note_key TEXT UNIQUE, created REAL NOT NULL);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE vector_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, obs_id INTEGER NOT NULL,
          op TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');""")
    db.execute("INSERT INTO observations(stream, t, x, y, text, embedding, model_id, created)"
               " VALUES ('camera', 1.0, 0, 0, 'the red door', ?, ?, 0)",
               (np.asarray(vec, np.float32).tobytes(), minilm().model_id))
    db.execute("INSERT INTO vector_log(obs_id, op) VALUES (1, 'add')")
    db.commit()
    db.close()
    eng = make_engine(root)
    res = call(eng.search, "a red door")
    assert res["count"] == 1 and res["results"][0]["score"] > 0.9
    eng.close()
    st = SqliteObservationStore(root / "memory.db")
    assert st.get_meta("schema_version") == "3"
    st.set_meta("schema_version", "99")
    st.close()
    with pytest.raises(RuntimeError, match="newer than this memory_node"):
        SqliteObservationStore(root / "memory.db")


TOOK_MS = re.compile(r',\s*"took_ms":\s*[0-9.e+-]+')


# The filesystem's free space, read live: other processes write between two answers.
FREE_BYTES = re.compile(r'"disk_free_bytes":\d+')


def same_but_took_ms(a: str, b: str) -> bool:
    """Two answers' JSON texts byte for byte, but for the time each took (and the free space
    on the disk, which is what the filesystem says at that moment)."""
    def plain(text: str) -> str:
        return FREE_BYTES.sub("", TOOK_MS.sub("", text))
    return plain(a) == plain(b)


def test_each_operation_answers_one_model_as_text_or_model(env):
    """`search(text)` is `ask_search(text)` dumped; the request as text or as its model gets
    the same answer, and a request that does not parse is the same ErrorAnswer either way."""
    eng, clock, pose, root = env
    saved = eng.ask_save('{"note": "Met Alice at the front door.", "tags": {"person": "Alice"}}')
    assert isinstance(saved, SaveAnswer) and saved.indexed and saved.pose.x == 1.0
    eng.add_observation("odom", T0 - 5, Pose(1.0, 2.0))
    texts = ['{"stream": "events", "semantic_query": "who was at the door", "k": 3}',
             "who was at the door",
             '{"stream": "odom", "near_x": 1.0, "near_y": 2.0, "radius": 1, "visits": true}',
             '{"stream": "nowhere"}', '{"k": "five"}', "{not json",
             "x" * (eng.config.max_query_bytes + 1)]
    answers = [eng.ask_search(text) for text in texts]
    assert [type(a) for a in answers] == [SearchAnswer, SearchAnswer, VisitsAnswer,
                                          *[ErrorAnswer] * 4]
    assert answers[0].results[0].text == "Met Alice at the front door."
    for text, answer in zip(texts, answers, strict=True):
        assert same_but_took_ms(eng.search(text), dumps(answer)), text
    for text in texts[:3]:
        assert same_but_took_ms(dumps(eng.ask_search(eng.read_search(text))),
                                eng.search(text)), text
    assert [a.error.code for a in answers[3:]] == ["bad_request"] * 4
    assert "nowhere" in answers[3].error.message and "k" in answers[4].error.message

    for bad in ("", '{"note": 5}', "y" * (eng.config.max_note_bytes + 1)):
        refused = eng.ask_save(bad)
        assert isinstance(refused, ErrorAnswer) and refused.error.code == "bad_request"
        assert same_but_took_ms(eng.save(bad), dumps(refused)), bad
    assert same_but_took_ms(eng.streams(), dumps(eng.ask_streams()))
    assert {s["name"]: s["count"] for s in json.loads(eng.streams())["streams"]} == {
        "events": 1, "odom": 1}
    # Nothing is old enough to compact: a second pass answers what the first did.
    assert same_but_took_ms(eng.compact(), dumps(eng.ask_compact()))
