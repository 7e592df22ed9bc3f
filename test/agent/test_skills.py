"""The skills on a real engine (in-process client): answers, errors, live descriptions,
OpenAI-style specs and calls, and the optional skill-call recorder."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_support import Clock, PoseBox, make_engine, seed

from memory_node.agent.answers import NO_RESULTS
from memory_node.agent.client import EngineClient
from memory_node.agent.recorder import SkillCallRecorder
from memory_node.agent.skills import (
    MEMORY_SKILL_NAMES,
    Skill,
    call_openai_tool,
    get_skills,
    openai_tool_specs,
)
from memory_node.core.engine import MemoryEngine
from memory_node.core.types import Pose

NOW = 1764460800.0
SKILL_NAMES = ["list_memory_streams", "query_memory", "remember", "query_agent_memory",
               "compact_memory", "visits", "name_place", "where_am_i"]


class Memory:
    """A seeded engine, its client and its skills by name."""

    def __init__(self, root: Path):
        self.clock = Clock(NOW)
        self.pose = PoseBox(Pose(1.2, -0.4, yaw=1.5708))
        self.engine: MemoryEngine = make_engine(root, self.clock, self.pose)
        self.ids = seed(self.engine, NOW)
        self.client = EngineClient(self.engine)

    def skills(self) -> dict[str, Skill]:
        return {s.name: s for s in get_skills(self.client)}

    def run(self, skill: str, /, **kwargs):
        return self.skills()[skill].run(**kwargs)


@pytest.fixture(scope="module")
def mem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memory]:
    """Read-only tests share one seeded memory."""
    m = Memory(tmp_path_factory.mktemp("mem"))
    yield m
    m.engine.close()


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Memory]:
    """Tests that write get their own memory."""
    m = Memory(tmp_path)
    yield m
    m.engine.close()


def ids_in(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"^#(\d+) ", text, re.M)]


# ---- the list --------------------------------------------------------------------------

def test_the_skill_list_and_its_schemas(mem):
    skills = get_skills(mem.client)
    assert [s.name for s in skills] == SKILL_NAMES
    assert set(SKILL_NAMES) == MEMORY_SKILL_NAMES
    by = {s.name: s for s in skills}
    q = by["query_memory"].parameters
    assert q["required"] == ["stream"] and q["additionalProperties"] is False
    # The whole search contract a model needs: place, time both ways, tags, order, count.
    assert list(q["properties"]) == [
        "stream", "semantic_query", "near_x", "near_y", "near", "radius", "after_seconds_ago",
        "before_seconds_ago", "after", "before", "tags", "order_by", "k", "seen_near"]
    props = q["properties"]
    assert props["radius"]["type"] == "number" and props["radius"]["exclusiveMinimum"] == 0
    assert props["k"]["type"] == "integer" and props["k"]["default"] == 5
    assert props["k"]["minimum"] == 1
    assert props["tags"]["type"] == "object"
    assert props["after"]["anyOf"] == [{"type": "number"}, {"type": "string"}]
    assert "-brightness" in props["order_by"]["description"]
    assert all(p["description"] for p in props.values())
    agent_q = by["query_agent_memory"].parameters
    assert agent_q["required"] == [] and "stream" not in agent_q["properties"]
    assert list(agent_q["properties"]) == list(props)[1:-1]
    assert by["name_place"].parameters["required"] == ["name"]
    assert by["name_place"].parameters["properties"]["radius"]["default"] == 2.0
    assert list(by["visits"].parameters["properties"]) == [
        "near", "near_x", "near_y", "near_here", "radius", "after_seconds_ago",
        "before_seconds_ago", "after", "before"]
    assert by["remember"].parameters["required"] == ["note"]
    for name in ("list_memory_streams", "compact_memory", "where_am_i"):
        assert by[name].parameters["properties"] == {}
    assert not by["remember"].read_only and by["query_memory"].read_only


def test_the_readme_names_every_skill(mem):
    """The README's skill list is the registry's: its count in words and every name."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    said = re.search(r"^(\w+) skills — (.+?) — as a", readme, re.M | re.S)
    assert said, "the README's 'For the agent' section names the skills"
    names = re.findall(r"`(\w+)`", said.group(2))
    assert sorted(names) == sorted(s.name for s in get_skills(mem.client))
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
             "ten", "eleven", "twelve"]
    assert words.index(said.group(1).lower()) == len(names)


def test_query_memory_description_carries_the_live_streams(fresh):
    desc = fresh.skills()["query_memory"].description
    assert "- camera: 2 observations, semantic search" in desc
    assert "- events: 2 observations" in desc
    assert "- lidar: 1 observation," in desc
    assert "odom" not in desc.split("Streams now:")[1]  # nothing recorded there
    fresh.run("remember", note="Alice waved from the sofa.")
    assert "- events: 3 observations" in fresh.skills()["query_memory"].description


def test_descriptions_name_the_numeric_tags_each_stream_can_be_ordered_by(fresh):
    lines = fresh.skills()["query_memory"].description.splitlines()
    camera = next(line for line in lines if line.startswith("- camera:"))
    assert camera.endswith("order_by tags: brightness")  # not colors or person: not numbers
    lidar = next(line for line in lines if line.startswith("- lidar:"))
    assert lidar.endswith("order_by tags: max_range, mean_range, points")
    assert "order_by tags" not in next(line for line in lines if line.startswith("- events:"))
    assert "Numeric tags of the notes" not in fresh.skills()["query_agent_memory"].description
    fresh.engine.save('{"note": "Fed the cat twice.", "tags": {"portions": 2}}')
    assert "Numeric tags of the notes (for order_by): portions." in \
        fresh.skills()["query_agent_memory"].description


def test_brightest_is_asked_exactly_with_order_by(mem):
    """'Where was it brightest?': a tag order, not a guess by meaning."""
    brightest = mem.run("query_memory", stream="camera", order_by="-brightness", k=1).text
    assert ids_in(brightest) == [mem.ids["door"]]
    darkest = mem.run("query_memory", stream="camera", order_by="brightness", k=1).text
    assert ids_in(darkest) == [mem.ids["hall"]]
    people = mem.run("query_memory", stream="camera", tags={"person": True}).text
    assert ids_in(people) == [mem.ids["door"]]
    older = mem.run("query_memory", stream="camera", before_seconds_ago=3600).text
    assert ids_in(older) == [mem.ids["hall"]]
    window = mem.run("query_memory", stream="camera", after=NOW - 4 * 3600,
                     before="2025-11-29T23:00:00Z").text  # NOW is 2025-11-30T00:00Z
    assert ids_in(window) == [mem.ids["hall"]]


def test_description_falls_back_to_configured_streams_when_memory_is_down(tmp_path):
    engine = make_engine(tmp_path)
    client = EngineClient(engine)
    assert "Memory holds no observations yet; configured streams: camera, lidar, odom, " \
           "events, summaries." in {s.name: s for s in get_skills(client)}["query_memory"
                                                                           ].description
    engine.close()
    desc = {s.name: s for s in get_skills(client)}["query_memory"].description
    assert "Streams (configured; the live list is unavailable now): camera, lidar, odom, " \
           "events, summaries." in desc
    # ... and a call says why, as an error the model can read.
    result = {s.name: s for s in get_skills(client)}["query_memory"].run(stream="camera")
    assert result.is_error and "the memory store is closed (unavailable)" in result.text


# ---- answers ---------------------------------------------------------------------------

def test_list_memory_streams(mem):
    text = mem.run("list_memory_streams").text
    lines = text.splitlines()
    assert lines[0].startswith("camera: 2 observations, semantic search, from ")
    assert "(3 h ago) to " in lines[0] and "(5 min ago)" in lines[0]
    assert lines[-1] == "No observations yet in: odom, summaries."


def test_semantic_query_ranks_and_formats(mem):
    result = mem.run("query_memory", stream="camera", semantic_query="a person", k=2)
    assert not result.is_error
    lines = result.text.splitlines()
    assert ids_in(result.text) == [mem.ids["door"], mem.ids["hall"]]
    assert lines[0].startswith(f"#{mem.ids['door']} camera ")
    assert "(5 min ago) at x=1.20 y=-0.40 heading=90° score=" in lines[0]
    assert lines[0].endswith("| bright scene; mostly red, white; one person | "
                             "tags: brightness=0.82 colors=red,white person=true")


def test_without_semantic_query_newest_first_and_time_filter(mem):
    assert ids_in(mem.run("query_memory", stream="camera").text) == [mem.ids["door"],
                                                                      mem.ids["hall"]]
    recent = mem.run("query_memory", stream="camera", after_seconds_ago=3600).text
    assert ids_in(recent) == [mem.ids["door"]]


def test_tool_chaining_from_a_result_line_to_a_spatial_query(mem):
    """'What did I see near the kitchen?': find the place, re-use its x and y."""
    note = mem.run("query_agent_memory", semantic_query="where is the kitchen", k=1).text
    assert ids_in(note) == [mem.ids["kitchen"]]
    x, y = re.search(r"at x=(-?[\d.]+) y=(-?[\d.]+)", note).groups()
    seen = mem.run("query_memory", stream="camera", near_x=float(x), near_y=float(y),
                   radius=2.0).text
    assert ids_in(seen) == [mem.ids["hall"]]
    # The same around the robot now, from the pose line's numbers.
    here = mem.run("query_memory", stream="camera", near_x=1.2, near_y=-0.4).text
    assert ids_in(here) == [mem.ids["door"]]


def test_nothing_found(mem):
    text = mem.run("query_memory", stream="camera", near_x=100.0, near_y=100.0).text
    assert text == NO_RESULTS
    assert mem.run("query_memory", stream="odom").text == NO_RESULTS


def test_query_agent_memory_searches_notes_only(mem):
    text = mem.run("query_agent_memory", semantic_query="who asked for water").text
    assert ids_in(text)[0] == mem.ids["bob"]
    assert set(ids_in(text)) == {mem.ids["bob"], mem.ids["kitchen"]}
    assert all(" events " in line for line in text.splitlines())


@pytest.mark.parametrize("kwargs, message", [
    ({"stream": "kitchen"}, "unknown stream 'kitchen'. Valid: camera, events, lidar, odom, "
                            "summaries. (bad_request)"),
    ({"stream": "camra"}, "unknown stream 'camra'; did you mean 'camera'?"),
    ({"stream": "camera", "radius": -1.0, "near_x": 0, "near_y": 0},
     "'radius' must be > 0, got -1.0 (bad_request)"),
    ({"stream": "camera", "radius": 3.0}, "'radius' needs a centre: give near_x and near_y"),
    ({"stream": "camera", "near_x": 1.0}, "'near_x' and 'near_y' must be given together"),
    ({"stream": "camera", "k": 0}, "'k' must be a positive integer, got 0 (bad_request)"),
    ({"stream": "camera", "after_seconds_ago": -5}, "'after_seconds_ago' must be >= 0"),
    ({"stream": "camera", "radius": "far"}, "'radius' must be a number, got a string"),
    ({"stream": "camera", "k": 2.5}, "'k' must be a positive integer, got a number"),
    ({"stream": "camera", "colour": "red"}, "unknown argument 'colour' of query_memory."),
    ({"stream": "camera", "semantic_querry": "door"},
     "unknown argument 'semantic_querry' of query_memory; did you mean 'semantic_query'? "
     "Valid: stream, semantic_query, near_x, near_y, near, radius, after_seconds_ago"),
    ({"stream": "camera", "order_by": "-brightnes"},
     "unknown order_by '-brightnes' in camera; did you mean '-brightness'? Valid: score, "
     "time, -time, or a numeric tag with or without '-': brightness. (bad_request)"),
    ({"stream": "camera", "tags": {"persn": True}},
     "unknown tag 'persn' in camera; did you mean 'person'? Valid: brightness, colors, "
     "person. (bad_request)"),
    ({"stream": "camera", "order_by": "colors"}, "tag 'colors' holds no numbers in camera"),
    ({}, "missing argument 'stream'"),
    ({"stream": " "}, "'stream' must name a stream; call list_memory_streams()"),
])
def test_bad_arguments_are_readable_errors(mem, kwargs, message):
    text = mem.skills()["query_memory"].call(**kwargs)  # what the model reads
    assert text.startswith("Error: ") and message in text, text
    result = mem.run("query_memory", **kwargs)
    assert result.is_error and result.text == text


def test_null_means_default_for_optional_arguments(mem):
    a = mem.run("query_memory", stream="camera", semantic_query=None, radius=None, k=None)
    assert not a.is_error and ids_in(a.text) == [mem.ids["door"], mem.ids["hall"]]


def test_remember_and_the_fold_of_a_repeat(fresh):
    first = fresh.run("remember", note="Charlie left a parcel by the door.")
    assert not first.is_error
    m = re.fullmatch(r"Remembered as #(\d+) at [\d:]+ \(just now\), at x=1\.20 y=-0\.40\.",
                     first.text)
    assert m, first.text
    fresh.clock.t += 5
    again = fresh.run("remember", note="Charlie left a parcel by the door.")
    assert again.text.startswith(f"Already remembered: note #{m[1]} (written ")
    assert "it now counts this repeat, nothing new stored." in again.text
    found = fresh.run("query_agent_memory", semantic_query="parcel", k=1).text
    assert ids_in(found) == [int(m[1])] and "repeats=2" in found
    assert fresh.run("remember", note="   ").is_error


def test_compact_memory(fresh):
    text = fresh.run("compact_memory").text
    assert text.startswith("Compaction done: 0 old keyframe(s) thinned, ")
    assert "nothing was deleted" in text
    assert "Summaries unavailable: no LLM configured" in text


def test_where_am_i_tells_when_the_robot_was_here_before(mem):
    text = mem.run("where_am_i").text
    lines = text.splitlines()
    assert lines[0] == "[Current pose: x=1.20, y=-0.40, heading=90°, frame=map]"
    assert lines[1].startswith("Been within 2 m of here before: most recently ")
    assert "(2 min ago), first " in lines[1] and "(5 min ago)." in lines[1]
    assert lines[2] == "Latest observations here:"
    assert ids_in(text)[0] == mem.ids["bob"] and mem.ids["door"] in ids_in(text)


def test_where_am_i_elsewhere_and_unknown(mem):
    mem.pose.pose = Pose(50.0, 50.0)
    try:
        far = mem.run("where_am_i").text
        assert far.splitlines()[1] == ("No memory of being within 2 m of here before (more "
                                       "than a minute ago).")
        mem.pose.pose = None
        unknown = mem.run("where_am_i")
        assert not unknown.is_error
        assert unknown.text.startswith("[Current pose: unknown]\nThe robot's position is not "
                                       "known yet")
    finally:
        mem.pose.pose = Pose(1.2, -0.4, yaw=1.5708)


def test_ages_count_from_the_memory_clock_not_the_wall_clock(mem):
    """Simulated time: the clock passed in decides 'N min ago'."""
    later = {s.name: s for s in get_skills(mem.client, clock=lambda: NOW + 3600)}
    text = later["query_memory"].call(stream="camera", k=1)
    assert "(1 h 5 min ago)" in text


# ---- OpenAI-style tools ------------------------------------------------------------------

def test_openai_specs_are_what_a_model_needs(mem):
    specs = openai_tool_specs(mem.client)
    assert json.loads(json.dumps(specs)) == specs  # plain JSON all the way down
    assert [s["type"] for s in specs] == ["function"] * 8
    fn = {s["function"]["name"]: s["function"] for s in specs}
    assert list(fn) == SKILL_NAMES
    assert all(set(f) == {"name", "description", "parameters"} for f in fn.values())
    # The descriptions say what each tool is for, and query_memory's what is in memory now.
    assert fn["list_memory_streams"]["description"].startswith(
        "List the robot's memory streams: how many observations each holds")
    query = fn["query_memory"]["description"]
    assert query.startswith("Search the robot's memory of what it perceived")
    assert "'-brightness' = brightest first" in query
    streams = query.split("Streams now:\n")[1].splitlines()
    assert [line.split(":")[0] for line in streams] == ["- camera", "- events", "- lidar"]
    assert streams[0].startswith("- camera: 2 observations, semantic search, from ")
    assert streams[0].endswith("order_by tags: brightness")
    assert streams[2].endswith("order_by tags: max_range, mean_range, points")
    assert fn["remember"]["description"].startswith("Write an episodic note to long-term memory")
    assert fn["query_agent_memory"]["description"].startswith(
        "Search the agent's own episodic notes (stream 'events'")
    assert fn["compact_memory"]["description"].startswith("Consolidate memory:")
    assert fn["where_am_i"]["description"].startswith("The robot's current position")
    # Parameters: JSON Schema objects a model can fill without guessing.
    assert fn["query_memory"]["parameters"]["required"] == ["stream"]
    assert fn["query_memory"]["parameters"]["properties"]["stream"]["type"] == "string"
    assert fn["remember"]["parameters"] == {
        "type": "object", "required": ["note"], "additionalProperties": False,
        "properties": {"note": {
            "type": "string",
            "description": "The note, e.g. 'Met Bob at the front door; he asked for water.'"}}}
    for name in ("list_memory_streams", "compact_memory", "where_am_i"):
        assert fn[name]["parameters"] == {"type": "object", "properties": {}, "required": [],
                                          "additionalProperties": False}
    assert fn["visits"]["description"].startswith("The robot's visits to a place")
    assert fn["name_place"]["description"].startswith("Name the robot's current position")


def test_call_openai_tool_runs_every_tool(fresh):
    c = fresh.client
    assert call_openai_tool(c, "list_memory_streams", "{}").startswith("camera: 2 ")
    assert ids_in(call_openai_tool(c, "query_memory",
                                   '{"stream": "camera", "semantic_query": "person", "k": 1}')
                  ) == [fresh.ids["door"]]
    assert call_openai_tool(c, "remember", '{"note": "Dana is at the desk."}').startswith(
        "Remembered as #")
    assert "Dana" in call_openai_tool(c, "query_agent_memory", {"semantic_query": "Dana"})
    assert call_openai_tool(c, "compact_memory", "").startswith("Compaction done")
    assert call_openai_tool(c, "where_am_i", None).startswith("[Current pose: x=1.20")


def test_call_openai_tool_errors(mem):
    c = mem.client
    assert call_openai_tool(c, "fly", "{}") == (
        "Error: unknown tool 'fly'; memory tools: " + ", ".join(SKILL_NAMES))
    assert call_openai_tool(c, "query_memory", "{stream").startswith(
        "Error: the arguments of query_memory are not valid JSON")
    assert call_openai_tool(c, "query_memory", "[1]") == (
        "Error: the arguments of query_memory must be a JSON object")
    assert call_openai_tool(c, "query_memory", '{"stream": "camera", "radius": -2}') == (
        "Error: 'radius' must be > 0, got -2 (bad_request)")


# ---- the optional skill-call recorder ------------------------------------------------------

def test_recorder_is_off_by_default_and_never_records_memory_skills(fresh):
    def navigate_to(x: float, y: float) -> str:
        return f"arrived at {x}, {y}"

    before = fresh.engine.store.count()
    off = SkillCallRecorder(fresh.client)
    assert off.wrap_function(navigate_to)(x=1.0, y=2.0) == "arrived at 1.0, 2.0"
    on = SkillCallRecorder(fresh.client, record_skill_calls=True)
    for name in MEMORY_SKILL_NAMES:
        assert not on.wants(name)
    skills = get_skills(fresh.client)
    assert all(on.wrap(s) is s for s in skills)
    {s.name: s for s in skills}["query_memory"].call(stream="camera")
    assert fresh.engine.store.count() == before


def test_recorder_writes_one_tagged_line_per_selected_call(fresh):
    rec = SkillCallRecorder(fresh.client, record_skill_calls=True,
                            include={"navigate_to", "pick"})

    @rec.wrap_function
    def navigate_to(x: float, y: float) -> str:
        return "Arrived."

    def look(direction: str) -> str:
        return "a wall"

    @rec.wrap_function
    def pick(item: str) -> str:
        raise RuntimeError("gripper jammed")

    assert navigate_to(x=5.5, y=4.2) == "Arrived."
    rec.wrap_function(look)(direction="left")  # not selected
    with pytest.raises(RuntimeError):
        pick(item="cup")
    notes = fresh.run("query_agent_memory", k=10).text
    lines = [ln for ln in notes.splitlines() if "kind=skill_call" in ln]
    assert len(lines) == 2, notes
    assert "Skill call pick(item=cup) failed: RuntimeError: gripper jammed" in lines[0]
    assert "ok=false" in lines[0]
    assert "Skill call navigate_to(x=5.5, y=4.2) -> Arrived." in lines[1]
    assert "skill=navigate_to ok=true" in lines[1]


def test_recorder_wraps_skill_objects_and_filters_by_predicate(fresh):
    host = Skill("wave", "Wave a paw.", (), lambda: "Waved.", read_only=False)
    rec = SkillCallRecorder(fresh.client, record_skill_calls=True,
                            include=lambda name: name.startswith("wa"), exclude={"walk"})
    assert rec.wants("wave") and not rec.wants("walk") and not rec.wants("sit")
    assert rec.wrap(host).call() == "Waved."
    text = fresh.run("query_agent_memory", semantic_query="wave", k=1).text
    assert "Skill call wave() -> Waved." in text


# ---- places and visits -------------------------------------------------------------------

def test_name_place_then_visits_and_searches_by_name(fresh):
    eng, now = fresh.engine, fresh.clock()
    for i, x in enumerate([-3.0, -1.0, 0.0, 1.0, 3.0, 1.0, 0.0, -1.0, -3.0]):
        eng.add_observation("odom", now - 100 + i, Pose(x, 5.0), {"speed": 0.5})
    answer = fresh.run("name_place", name="front door", x=0.0, y=5.0, radius=1.5)
    assert answer.text == ("Named 'front door': x=0.00 y=5.00, radius 1.5 m. Searches and "
                           "visits take near='front door'.")
    listed = fresh.run("list_memory_streams").text
    assert "Named places (use near='<name>'): front door at x=0.00 y=5.00 (radius 1.5 m)" in listed
    # In, out past x=1.5 and back in: two visits of 2.5 s (crossings interpolated).
    text = fresh.run("visits", near="front door", after_seconds_ago=110,
                     before_seconds_ago=90).text
    first, *rest = text.splitlines()
    assert first.startswith("2 visits to 'front door', 5.0 s in all; first there ")
    assert rest[0] == "- from 2025-11-29 23:58:20 to 2025-11-29 23:58:23: 2.5 s (1 min ago)"
    assert rest[1].endswith(": 2.5 s (1 min ago)")
    # The history stops at 92 s ago for 32 s, reaching into the window: said.
    assert len(rest) == 3 and rest[2].startswith("Note: no pose history from ")
    assert "(32 s, more than the 30 s gap threshold)" in rest[2]
    found = fresh.run("query_memory", stream="odom", near="front door", k=10).text
    assert len(re.findall(r"^#\d+ odom", found, re.M)) == 6
    gone = fresh.run("name_place", name="front door", remove=True).text
    assert gone.startswith("Removed the name 'front door'")
    err = fresh.run("visits", near="front door")
    assert err.is_error and "unknown place 'front door'" in err.text


def test_visits_say_when_there_is_no_pose_history(fresh):
    text = fresh.run("visits", near_x=50.0, near_y=50.0, radius=1.0,
                     after_seconds_ago=60).text
    assert text.startswith("No visits to x=50.00 y=50.00 (within 1 m)")
    assert "Note: no pose history" in text
    err = fresh.run("visits", radius=2.0)
    assert err.is_error and "needs a centre" in err.text
