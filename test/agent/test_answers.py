"""Answer lines and the pose line: what the model reads, and re-uses as arguments."""

from __future__ import annotations

import math
import re
from datetime import datetime

from agent_support import PoseBox, make_engine

from memory_node.agent.answers import (
    NO_RESULTS,
    format_age,
    format_clock,
    format_heading,
    format_result,
    format_results,
    format_tags,
)
from memory_node.agent.client import EngineClient
from memory_node.agent.prompt import (
    MEMORY_PROMPT_SECTION,
    UNKNOWN_POSE_LINE,
    pose_line,
    prepend_pose,
)
from memory_node.core.types import Pose

NOW = datetime(2025, 11, 30, 14, 8, 12).timestamp()  # local time, like the answers


def test_result_line_has_every_part_in_reusable_form():
    result = {"id": 42, "stream": "camera", "t": NOW - 300,
              "pose": {"x": 1.2, "y": -0.4, "z": 0.0, "yaw": math.pi / 2, "frame": "map",
                       "source": "tf"},
              "score": 0.7123, "tags": {"brightness": 0.82, "colors": ["red", "white"],
                                        "person": True},
              "text": "bright scene; mostly red, white; one person", "ref": "blobs/x.jpg"}
    assert format_result(result, NOW) == (
        "#42 camera 14:03:12 (5 min ago) at x=1.20 y=-0.40 heading=90° score=0.71 | "
        "bright scene; mostly red, white; one person | "
        "tags: brightness=0.82 colors=red,white person=true")


def test_result_coordinates_parse_back_into_spatial_parameters():
    """Tool chaining: the x= and y= of a line are exactly near_x and near_y."""
    result = {"id": 7, "stream": "events", "t": NOW, "pose": {"x": -12.345, "y": 0.004,
              "yaw": 0.0, "frame": "map"}, "score": None, "tags": {}, "text": "note"}
    line = format_result(result, NOW)
    m = re.search(r"at x=(-?\d+\.\d+) y=(-?\d+\.\d+)", line)
    assert m and (float(m[1]), float(m[2])) == (-12.35, 0.0)
    assert "score" not in line and "tags:" not in line


def test_result_without_pose_text_or_tags_stays_one_short_line():
    result = {"id": 3, "stream": "lidar", "t": NOW - 7200,
              "pose": {"x": None, "y": None, "frame": None, "source": "none"},
              "score": None, "tags": {}, "text": ""}
    assert format_result(result, NOW) == "#3 lidar 12:08:12 (2 h ago) at an unknown place"


def test_long_text_is_flattened_and_shortened():
    result = {"id": 1, "stream": "events", "t": NOW, "pose": None, "score": None, "tags": {},
              "text": "line one\nline two " + "x" * 500}
    line = format_result(result, NOW)
    assert "\n" not in line and line.endswith("…") and len(line) < 400


def test_empty_results_and_engine_notes():
    assert format_results([], NOW) == NO_RESULTS
    assert format_results([], NOW, ["k capped at 100"]) == f"{NO_RESULTS}\n(k capped at 100)"


def test_ages_and_clock_times():
    assert format_age(NOW, NOW) == "just now"
    assert format_age(NOW - 12, NOW) == "12 s ago"
    assert format_age(NOW - 300, NOW) == "5 min ago"
    assert format_age(NOW - 7500, NOW) == "2 h 5 min ago"
    assert format_age(NOW - 3 * 86400, NOW) == "3 d ago"
    assert format_age(NOW + 30, NOW) == "in 30 s"
    assert format_clock(NOW - 3600, NOW) == "13:08:12"
    assert format_clock(NOW - 86400, NOW) == "2025-11-29 14:08:12"


def test_headings_are_whole_degrees_in_half_open_range():
    assert format_heading(0.0) == "0°"
    assert format_heading(math.pi / 2) == "90°"
    assert format_heading(-math.pi / 2) == "-90°"
    assert format_heading(math.pi) == "180°"
    assert format_heading(-math.pi) == "180°"
    assert format_heading(3 * math.pi / 2) == "-90°"


def test_tags_quote_what_would_be_ambiguous():
    tags = {"kind": "skill_call", "who": "Bob Smith", "n": 3, "x": None, "last_t": NOW - 60}
    assert format_tags(tags, NOW) == (
        'kind=skill_call who="Bob Smith" n=3 x=null last_t=14:07:12')


def test_pose_line_forms():
    assert pose_line(Pose(1.2, -0.4, yaw=math.pi / 2)) == (
        "[Current pose: x=1.20, y=-0.40, heading=90°, frame=map]")
    assert pose_line(Pose(0, 0, frame="odom", source="odom")) == (
        "[Current pose: x=0.00, y=0.00, heading=0°, frame=odom]")
    assert pose_line(None) == UNKNOWN_POSE_LINE == "[Current pose: unknown]"


def test_prepend_pose_uses_the_clients_current_pose(tmp_path):
    pose = PoseBox(Pose(3.0, 4.0, yaw=math.pi))
    engine = make_engine(tmp_path, pose=pose)
    try:
        client = EngineClient(engine)
        assert prepend_pose("Anyone around me?", client) == (
            "[Current pose: x=3.00, y=4.00, heading=180°, frame=map]\nAnyone around me?")
        pose.pose = None
        assert prepend_pose("Hi", client) == "[Current pose: unknown]\nHi"
    finally:
        engine.close()


def test_prompt_section_names_every_skill_and_both_coordinate_sources():
    for name in ("query_memory", "list_memory_streams", "query_agent_memory", "remember",
                 "where_am_i", "near_x", "near_y", "[Current pose:"):
        assert name in MEMORY_PROMPT_SECTION
    assert "Do not call `remember()`" in MEMORY_PROMPT_SECTION
