"""Damage and odd state a user can run into: reserved tags, a failing LLM endpoint during
compaction, a full disk during a save."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
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
        assert res["thinned"] == 8 and res["archived_total"] == 8  # a visit's ends stay
        assert res["summaries"]["status"] == "error" and res["summaries"]["written"] == 0
        assert "base URL" in res["summaries"]["message"]
        assert "sk-test" not in answer
        counts = {s["name"]: s["count"] for s in call(eng.streams)["streams"]}
        assert counts == {"events": 1, "odom": 2}
    finally:
        eng.close()


DISK_FULL_CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    from pathlib import Path
    sys.path.insert(0, {test_dir!r})
    from engine_support import make_engine, FakeClock, PoseBox
    from memory_node.core.types import Pose

    root, mode = Path({root!r}), {mode!r}
    eng = make_engine(root, FakeClock(), PoseBox(Pose(1.0, 2.0)))
    out = {{"first": json.loads(eng.save("Met Alice at the front door"))}}
    notes = root / "notes" / "2025-11-30_notes.md"
    before = notes.read_bytes()
    if mode == "fsize":  # the file may not grow past 1000 more bytes (EFBIG, a real limit)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 1000, hard))
    else:  # fill the small tmpfs on notes/ (ENOSPC); the notes file's page has room left
        fd = os.open(root / "notes" / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:
            pass
        os.close(fd)
    out["full"] = json.loads(eng.save("The courier left a parcel by the garage. " * 150))
    out["unchanged"] = notes.read_bytes() == before
    if mode == "fsize":
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    else:
        os.unlink(root / "notes" / "filler")
    out["after"] = json.loads(eng.save("Fed the cat in the kitchen"))
    eng.close()
    print(json.dumps(out))
""")


@pytest.fixture
def small_tmpfs_on_notes(tmp_path):
    """notes/ on a 64 KiB tmpfs (needs root and mount; skipped where there is none)."""
    notes = tmp_path / "m" / "notes"
    notes.mkdir(parents=True)
    if not shutil.which("mount") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(notes)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield
    subprocess.run(["umount", str(notes)], check=True)


@pytest.mark.parametrize("mode", ["fsize", "tmpfs"])
def test_a_save_the_disk_refuses_leaves_no_torn_note(tmp_path, mode, request):
    """A save answered `unavailable` because the file could not grow leaves the Markdown file
    byte-identical, and nothing of it is read back as a note at the next start."""
    if mode == "tmpfs":
        request.getfixturevalue("small_tmpfs_on_notes")
    root = tmp_path / "m"
    code = DISK_FULL_CHILD.format(test_dir=str(Path(__file__).parents[1]), root=str(root),
                                  mode=mode)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"]["ok"] is True and out["after"]["ok"] is True
    assert out["full"]["ok"] is False and out["full"]["error"]["code"] == "unavailable"
    message = out["full"]["error"]["message"]
    if mode == "fsize":
        assert "notes file" in message, message
    else:  # ENOSPC is a full disk, said as one
        assert message.startswith("disk full: the note was not saved"), message
    assert out["unchanged"] is True
    # A fresh start on the directory, from Markdown alone, sees the two acknowledged notes.
    (root / "memory.db").unlink()
    for extra in root.glob("memory.db-*"):
        extra.unlink()
    eng = make_engine(root, FakeClock(), PoseBox())
    try:
        texts = sorted(r["text"] for r in call(eng.search, '{"stream": "events", "k": 10}')
                       ["results"])
    finally:
        eng.close()
    assert texts == ["Fed the cat in the kitchen", "Met Alice at the front door"]
