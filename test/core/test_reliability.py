"""Damage and odd state a user can run into: reserved tags, a failing LLM endpoint during
compaction, a full disk during a save."""

from __future__ import annotations

import json

from engine_support import T0, FakeClock, PoseBox, make_engine

from memory_node.core.types import Pose

TEXT = "Charged the battery at the dock"


def call(fn, arg=None):
    return json.loads(fn() if arg is None else fn(arg))


def test_repeats_tag_is_reserved_and_folding_tolerates_odd_values(tmp_path):
    root = tmp_path / "m"
    # A note whose tags came from a hand-edited Markdown file: "repeats" is not a count.
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "2025-11-30_notes.md").write_text(
        "# Notes 2025-11-30\n\n"
        "## 00:00:00.000 UTC · events · n-0123456789ab\n"
        f"- t: {T0:.6f}\n"
        "- pose: x=1.0000 y=2.0000 z=0.0000 yaw=0.0000 frame=map source=tf\n"
        '- tags: {"repeats": "many"}\n\n'
        f"> {TEXT}\n\n")
    clock = FakeClock(T0 + 5)
    eng = make_engine(root, clock, PoseBox(Pose(1.0, 2.0)))
    try:
        refused = call(eng.save, json.dumps({"note": TEXT, "tags": {"repeats": "many"}}))
        assert refused["ok"] is False and refused["error"]["code"] == "bad_request"
        assert "repeats" in refused["error"]["message"]
        refused = call(eng.save, json.dumps({"note": TEXT, "tags": {"last_t": 1}}))
        assert refused["error"]["code"] == "bad_request"

        [prior] = call(eng.search, '{"stream": "events"}')["results"]
        for n in (2, 3):  # the same note again, within the folding window
            clock.t += 5
            again = call(eng.save, TEXT)
            assert again["ok"] is True, again
            assert again["folded"] is True and again["id"] == prior["id"]
            [row] = call(eng.search, '{"stream": "events"}')["results"]
            assert row["tags"]["repeats"] == n
        # Searching by the reserved tag stays allowed.
        found = call(eng.search, '{"tags": {"repeats": {"gte": 2}}}')
        assert [r["id"] for r in found["results"]] == [prior["id"]]
    finally:
        eng.close()


def test_compact_with_an_invalid_llm_url_reports_what_it_did(tmp_path):
    """Thinning archives rows before the summary step; a bad LLM setting must not turn that
    into an error answer (the caller would think nothing happened)."""
    from memory_node.core.llm import LLMSettings

    settings = LLMSettings(base_url="htp//llm.local:8000/v1", api_key="sk-test-0123456789abc")
    clock = FakeClock(T0)
    eng = make_engine(tmp_path / "m", clock, PoseBox(Pose(1, 1)), llm_settings=settings)
    try:
        eng.save("Met Alice at the front door.")
        for i in range(10):  # the robot stood still two days ago
            eng.add_observation("odom", T0 - 2 * 86400 + i, Pose(0.1, 0.1), {"speed": 0.0})
        clock.t += 2 * 86400
        answer = eng.compact()
        res = json.loads(answer)
        assert res["ok"] is True, res
        assert res["thinned"] == 9 and res["archived_total"] == 9
        assert res["summaries"]["status"] == "error" and res["summaries"]["written"] == 0
        assert "base URL" in res["summaries"]["message"]
        assert "sk-test" not in answer
        counts = {s["name"]: s["count"] for s in call(eng.streams)["streams"]}
        assert counts == {"events": 1, "odom": 1}
    finally:
        eng.close()
