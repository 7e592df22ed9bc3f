"""Crash safety and sharing a directory between processes, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from engine_support import make_engine

ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {test_dir!r})
    from engine_support import make_engine, FakeClock
    from memory_node.core.types import Pose
    eng = make_engine({root!r})
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd.startswith("save "):
            print(eng.save(cmd[5:]), flush=True)
        elif cmd.startswith("odom "):
            n = int(cmd[5:])
            for i in range(n):
                eng.add_observation("odom", 1764460800.0 + i, Pose(i * 0.1, 0.0), {{"i": i}})
                print("added", i, flush=True)
                time.sleep(0.05)
""")


def _spawn(root: Path) -> subprocess.Popen:
    code = WRITER.format(test_dir=str(Path(__file__).parents[1]), root=str(root))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_note_acknowledged_before_sigkill_survives(tmp_path):
    root = tmp_path / "m"
    proc = _spawn(root)
    try:
        proc.stdin.write("save Met Dora by the blue bed, she left her keys\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["ok"] is True
        os.kill(proc.pid, signal.SIGKILL)  # no clean shutdown, no index persisted
    finally:
        proc.kill()
        proc.wait(10)
    eng = make_engine(root)
    res = json.loads(eng.search("where are Dora's keys"))
    assert res["results"][0]["id"] == answer["id"]
    assert "Dora" in res["results"][0]["text"]
    eng.close()


def test_reader_sees_writer_rows_within_a_second(tmp_path):
    root = tmp_path / "m"
    reader = make_engine(root)
    proc = _spawn(root)
    try:
        proc.stdin.write("odom 20\n")
        proc.stdin.flush()
        lags, announced = [], []
        for _ in range(20):
            i = int(proc.stdout.readline().split()[1])
            announced.append(i)
            written = time.monotonic()
            while True:
                res = json.loads(reader.search('{"stream": "odom", "k": 1}'))
                if res["count"] and res["results"][0]["tags"]["i"] == i:
                    break
                assert time.monotonic() - written < 1.0, f"row {i} not visible within 1 s"
                time.sleep(0.005)
            lags.append(time.monotonic() - written)
        # Every row the writer committed is in the reader's answers, once, none lost.
        every = json.loads(reader.search('{"stream": "odom", "k": 100}'))
        assert sorted(r["tags"]["i"] for r in every["results"]) == sorted(announced)
        assert len(set(announced)) == 20 and max(lags) < 1.0
        # The semantic side follows too: a note saved by the writer is found by meaning.
        proc.stdin.write("save the plant in the hallway needs water\n")
        proc.stdin.flush()
        note = json.loads(proc.stdout.readline())
        res = json.loads(reader.search("which plant is thirsty"))
        assert res["results"][0]["id"] == note["id"]
    finally:
        proc.stdin.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.close()
