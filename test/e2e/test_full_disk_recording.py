"""memory-node recording a replay into a filesystem that fills up, grown back halfway: a real
1.5 MB tmpfs in a private mount namespace (test/disk_support.py); the sample flat, 45 s of it,
replayed at 3x (the shared 150 s sample would take 50 s here).

What a user notices: the node keeps running and answers every search; each save is either ok
with an id, or `unavailable` "disk full: ..." (never internal, never ok with no id); the
recorder's stats count the rows not stored (`not_stored.disk_full`); the log says it once,
not once per row; once grown, recording resumes by itself, the notes kept in Markdown while
the disk was full become searchable without a restart, and nothing acknowledged is lost
(integrity_check, every acknowledged note in memory.db).
"""

from __future__ import annotations

import re

import pytest
from disk_support import run_scenario

from memory_node.sim.generate import generate_sample


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return generate_sample(tmp_path_factory.mktemp("sample"), seed=7, duration_s=45.0)


def test_recording_into_a_full_disk_goes_on_and_resumes_when_space_returns(sample, tmp_path):
    r = run_scenario("recording", tmp_path, timeout=240, bag=str(sample.bag_dir),
                     size="1500k", rate=3.0)
    saves = r["saves"]
    assert r["grown_at"] is not None
    full = r["full_at_grow"]
    # The disk did fill: rows were not stored for it, counted by reason, and saves said so.
    assert full["stats"]["not_stored"].get("disk_full", 0) > 0, full
    assert full["saves"] >= 1 and full["free"] < 64 * 1024, full
    for s in saves:
        a = s["answer"]
        if a["ok"]:
            assert isinstance(a["id"], int), s
        else:
            assert a["error"]["code"] == "unavailable", s
            assert a["error"]["message"].startswith("disk full"), s
    assert all(s["answer"]["ok"] for s in saves if s["phase"] == "grown"), saves
    # Searches were answered all along.
    assert r["searches"] and all(a["ok"] for a in r["searches"]), r["searches"]
    # Recording resumed by itself: most of the bag's camera keyframes came after the disk
    # was grown back.
    assert r["camera_at_end"] > r["camera_at_grow"] + 30, (r["camera_at_grow"],
                                                           r["camera_at_end"])
    stats = r["stats"]
    assert stats["not_stored"]["disk_full"] >= full["stats"]["not_stored"]["disk_full"]
    # Notes the answer said were kept in Markdown: stored and searchable, no restart.
    kept = [s["text"] for s in saves if not s["answer"]["ok"]
            and "kept in notes/" in s["answer"]["error"]["message"]]
    assert all(r["kept_found"].get(t) for t in kept), r["kept_found"]
    # Nothing acknowledged was lost.
    end = r["end"]
    assert end["integrity"] == ["ok"]
    for s in saves:
        if s["answer"]["ok"]:
            assert str(s["answer"]["id"]) in end["notes"], s
    assert set(kept) <= set(end["notes"].values())
    log = r["log"]
    assert "cannot rollback" not in log
    assert "Traceback" not in log
    # Said once a minute at most, not once per row or per save.
    said = [ln for ln in log.splitlines() if re.search(r"(?i)disk full", ln)]
    assert 1 <= len(said) <= 1 + int(r["duration_s"] // 60), said
    assert len([ln for ln in log.splitlines()
                if re.search(r"(?i)no space left|disk is full", ln)]) <= 2, log[-3000:]
