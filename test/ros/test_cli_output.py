"""`memory-cli`: a readable table on a terminal, the JSON for scripts, usage errors for extra
arguments (checked before any ROS call)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from memory_node.ros.cli import main, render

NOW = 1764504000.0  # 2025-11-30 12:00:00 UTC
SEARCH = json.dumps({
    "ok": True, "count": 2, "took_ms": 1.0, "notes": ["k capped at 100"],
    "results": [
        {"id": 42, "stream": "camera", "t": NOW - 300, "score": 0.71234,
         "pose": {"x": 1.2, "y": -0.4, "z": 0.0, "yaw": 1.5708, "frame": "map", "source": "tf"},
         "tags": {"brightness": 0.82}, "text": "bright scene;  mostly red\nand white " * 5,
         "ref": "blobs/camera/42.jpg"},
        {"id": 7, "stream": "events", "t": NOW - 2 * 86400, "score": None,
         "pose": {"x": None, "y": None, "z": None, "yaw": None, "frame": None,
                  "source": "none"},
         "tags": {}, "text": "Met Bob", "ref": None}]})


def test_search_answer_as_a_table():
    text, ok = render("search", SEARCH, now=NOW)
    assert ok
    header, first, second, count, note = text.splitlines()
    assert header.split() == ["id", "stream", "time", "(age)", "x", "y", "yaw", "frame",
                              "score", "text"]
    clock = datetime.fromtimestamp(NOW - 300).strftime("%H:%M:%S")
    assert first.split()[:10] == ["42", "camera", clock, "(5", "min", "ago)", "1.20", "-0.40",
                                  "1.57", "map"]
    assert "0.712" in first and first.endswith("…") and "\n" not in first
    assert len(first) < 160  # long text is cut to one short line
    assert second.split()[:2] == ["7", "events"] and "(2 d ago)" in second
    assert second.split()[7:] == ["-"] * 5 + ["Met", "Bob"]  # no pose, no score
    assert count == "2 result(s)" and note == "note: k capped at 100"


def test_other_answers_read_as_lines():
    text, ok = render("save", json.dumps({
        "ok": True, "id": 9, "t": NOW, "indexed": True,
        "pose": {"x": 1.0, "y": 2.0, "z": 0.0, "yaw": 0.0, "frame": "map", "source": "tf"}}),
        now=NOW)
    assert ok and text.startswith("saved as #9 at ") and "x=1.00 y=2.00" in text
    text, ok = render("streams", json.dumps({"ok": True, "streams": [
        {"name": "camera", "count": 812, "first_t": NOW - 60, "last_t": NOW,
         "semantic": True}]}), now=NOW)
    assert ok and text.splitlines()[1].split()[:2] == ["camera", "812"]
    text, ok = render("compact", json.dumps({
        "ok": True, "thinned": 3, "folded": 1, "archived_total": 4,
        "summaries": {"status": "unavailable", "written": 0, "message": "no LLM"}}), now=NOW)
    assert ok and text == ("thinned 3, folded 1, archived in all 4; summaries: unavailable "
                           "(no LLM)")
    text, ok = render("search", json.dumps({"ok": False, "error": {
        "code": "bad_request", "message": "unknown field 'k2'"}}))
    assert not ok and text == "error (bad_request): unknown field 'k2'"
    text, ok = render("search", "not json")
    assert not ok and text.startswith("error (internal): memory answered something")


@pytest.mark.parametrize("argv", [
    ["streams", "extra"],
    ["compact", "now"],
    ["search", "red", "door"],
    ["search"],
    ["streams", "--bogus"],
])
def test_extra_or_missing_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage: memory-cli" in capsys.readouterr().err
