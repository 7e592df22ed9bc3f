"""A real full disk for the tests: a small tmpfs that root mounts in a private mount namespace
(`unshare -m --propagation private`), so nothing stays mounted when a test dies, filled by
the code under test and grown back with `mount -o remount,size=...` while it runs.

A scenario runs whole inside the namespace: this file is its program
(`unshare -m --propagation private python disk_support.py SCENARIO WORKDIR ARGS`). It mounts,
starts what it tests (memory-import, memory-node, an engine), grows the filesystem when the
scenario says, checks the store before the namespace (and the mount with it) goes, and prints
what it saw as JSON on its last line; the test asserts on that.

Needs root and util-linux's unshare (CI runs as root): without them the tests FAIL with the
reason; a full disk is not something to skip silently.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULT = "SCENARIO-RESULT "
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def private_mounts_problem() -> str | None:
    """Why a private mount namespace with a tmpfs cannot be had here, or None."""
    if os.geteuid() != 0:
        return ("the full-disk tests mount a small tmpfs and need root (CI runs as root); "
                f"this run is uid {os.geteuid()}")
    unshare = shutil.which("unshare")
    if unshare is None:
        return "the full-disk tests need util-linux's unshare (apt-get install util-linux)"
    probe = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && "
                            "umount $d && rmdir $d"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return ("cannot mount a tmpfs in a private mount namespace (a container without "
                f"CAP_SYS_ADMIN?): {probe.stderr.strip() or probe.returncode}")
    return None


def run_scenario(name: str, workdir: Path, timeout: float, **kwargs: Any) -> dict[str, Any]:
    """Run scenario `name` in a private mount namespace; its result. Fails the test (never
    skips) when that cannot be done."""
    import pytest

    problem = private_mounts_problem()
    if problem:
        pytest.fail(problem)
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(HERE), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [shutil.which("unshare") or "unshare", "-m", "--propagation", "private",
           sys.executable, str(Path(__file__).resolve()), name, str(workdir),
           json.dumps(kwargs)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-4000:]
        pytest.fail(f"scenario {name} ran past {timeout} s:\n{out!r}")
    (workdir / f"{name}.out").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT)]
    assert done.returncode == 0 and lines, (
        f"scenario {name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
        f"{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


# ---- inside the namespace ---------------------------------------------------------------------
def mount(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)


def grow(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path) -> Path:
    """Write a file until the filesystem is full; the file."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (65536, 4096, 512, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


def store_check(memory: Path) -> dict[str, Any]:
    """integrity_check and rows per stream of a store."""
    with sqlite3.connect(memory / "memory.db", timeout=10) as con:
        integrity = [r[0] for r in con.execute("PRAGMA integrity_check")]
        counts = dict(con.execute("SELECT stream, count(*) FROM observations GROUP BY stream"))
        rows = [list(r) for r in con.execute(
            "SELECT stream, t FROM observations WHERE stream IN ('camera', 'lidar', 'odom')"
            " ORDER BY stream, t")]
        notes = {str(k): t for k, t in con.execute(
            "SELECT id, text FROM observations WHERE stream = 'events'")}
    return {"integrity": integrity, "counts": counts, "rows": rows, "notes": notes}


def _import(bag: str, memory: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "memory_node.ros.bag_import", bag,
                           "--memory-dir", str(memory), *extra], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def scenario_import(work: Path, bag: str, size: str) -> dict[str, Any]:
    """memory-import into a filesystem too small for the bag, then again after growing it,
    then a third time."""
    fs = work / "fs"
    mount(fs, size)
    memory = fs / "memory"
    filler = fill(fs)
    already_full = _import(bag, memory)  # not even the store can be created
    filler.unlink()
    first = _import(bag, memory)
    after_first = store_check(memory)
    after_first.pop("rows")
    blobs = sum(1 for _ in (memory / "blobs").rglob("*.jpg"))
    grow(fs, "400m")
    second = _import(bag, memory)
    third = _import(bag, memory)
    return {"already_full": already_full, "first": first, "after_first": after_first,
            "blobs_after_first": blobs,
            "second": second, "third": third, "end": store_check(memory),
            "jpgs": sum(1 for _ in (memory / "blobs").rglob("*.jpg"))}


def scenario_saves(work: Path, size: str) -> dict[str, Any]:
    """An engine's saves and searches on a filesystem that fills up, then grows back: each
    answer, and what is searchable and stored after (no restart)."""
    from engine_support import FakeClock, make_engine

    fs = work / "fs"
    mount(fs, size)
    memory = fs / "memory"
    clock = FakeClock()
    engine = make_engine(memory, clock, note_fold_window_s=0.5)
    words = ("kitchen", "hallway", "garage", "balcony", "library", "bathroom", "attic",
             "cellar", "office", "pantry", "porch", "studio")
    animals = ("cat", "dog", "parrot", "tortoise", "hamster", "rabbit", "goldfish", "horse")
    answers: list[dict[str, Any]] = []
    notes: list[str] = []

    def save(text: str) -> dict[str, Any]:
        clock.t += 5.0  # beyond the fold window: each note a row of its own
        answer = json.loads(engine.save(text))
        answers.append(answer)
        notes.append(text)
        return answer

    save("a blue umbrella leans on the front door")
    filler = fill(fs)
    kinds: set[str] = set()
    for i in range(120):
        text = (f"the {animals[i % len(animals)]} number {i} sleeps in the "
                f"{words[i % len(words)]}")
        a = save(text)
        if not a["ok"]:
            msg = a["error"]["message"]
            kinds.add("kept" if "kept in" in msg else "not_saved")
        if kinds == {"kept", "not_saved"}:
            break
    search_full = json.loads(engine.search("umbrella by the front door"))
    free_when_full = free_bytes(fs)
    from memory_node.core.disk import is_disk_full

    io_error_is_full = is_disk_full(sqlite3.OperationalError("disk I/O error"), memory)
    filler.unlink()
    grow(fs, "400m")
    # The notes kept in Markdown are added by the catch-up thread: no call, no restart.
    deadline = time.monotonic() + 20
    kept = [n for n, a in zip(notes, answers, strict=True)
            if not a["ok"] and "kept in" in a["error"]["message"]]
    found: dict[str, bool] = {}
    while time.monotonic() < deadline:
        for text in kept:
            if not found.get(text):
                hits = json.loads(engine.search(json.dumps(
                    {"semantic_query": text, "stream": "events", "k": 3})))
                found[text] = any(h["text"] == text for h in hits.get("results", []))
        if all(found.get(t) for t in kept):
            break
        time.sleep(0.5)
    after = json.loads(engine.save("the disk has room again"))
    engine.close()
    md = "".join(p.read_text() for p in sorted((memory / "notes").glob("*_notes.md")))
    return {"answers": answers, "notes": notes, "search_full": search_full,
            "free_when_full": free_when_full, "io_error_is_full": io_error_is_full,
            "kept_found": found, "after": after,
            "end": store_check(memory), "markdown": md}


def scenario_recording(work: Path, bag: str, size: str, rate: float) -> dict[str, Any]:
    """memory-node recording a replay into a filesystem that fills, grown back halfway
    through: the saves' and searches' answers, the recorder's stats, and the store after."""
    from std_msgs.msg import String

    from memory_node.agent.ros_client import RosClient
    from memory_node.session import NodeProcess, Session, isolated_env, wait_until_settled

    fs = work / "fs"
    mount(fs, size)
    memory = fs / "memory"
    env = isolated_env()
    for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOCALHOST_ONLY"):
        if k in env:
            os.environ[k] = env[k]
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    node = NodeProcess(["-m", "memory_node.ros.main", "--memory-dir", str(memory),
                        "--use-sim-time"], env, logs / "memory-node.log")
    session = Session(memory, env, logs)
    session.procs = [node]
    stats: list[dict[str, Any]] = []
    out: dict[str, Any] = {"saves": [], "searches": [], "grown_at": None}
    client = None
    try:
        node.wait_for("recording", timeout=120)
        client = RosClient(use_sim_time=True, timeout_s=20.0)
        client.node.create_subscription(
            String, "/memory/recorder_stats", lambda m: stats.append(json.loads(m.data)), 10)
        state: dict[str, Any] = {"next": time.monotonic(), "i": 0}
        t_start = time.monotonic()

        def camera_rows() -> int:
            answer = json.loads(client.streams())
            return sum(s["count"] for s in answer.get("streams", []) if s["name"] == "camera")

        def tick() -> None:
            now = time.monotonic()
            if now < state["next"] or not stats or not stats[-1]["camera"]["received"]:
                return  # saves from when the replay runs (its /clock is the node's)
            state["next"] = now + 0.5
            i = state["i"] = state["i"] + 1
            text = f"note {i}: the robot passed the {('red', 'green', 'blue')[i % 3]} door"
            answer = json.loads(client.save(text))
            out["saves"].append({"text": text, "answer": answer,
                                 "phase": "grown" if out["grown_at"] else "filling"})
            out["searches"].append(json.loads(client.search("door")))
            full_saves = sum(1 for s in out["saves"] if not s["answer"]["ok"])
            disk_full_rows = (stats[-1].get("not_stored", {}).get("disk_full", 0)
                              if stats else 0)
            if disk_full_rows and "first_full" not in state:
                state["first_full"] = now
            # Grown once saves met the full disk too (or, at the latest, 6 s after rows did).
            if out["grown_at"] is None and disk_full_rows and (
                    full_saves >= 2 or now - state["first_full"] > 6):
                out["full_at_grow"] = {"saves": full_saves, "stats": stats[-1] if stats
                                       else None, "free": free_bytes(fs)}
                grow(fs, "400m")
                out["grown_at"] = now - t_start
                out["camera_at_grow"] = camera_rows()

        session.replay(Path(bag), rate, on_wait=tick)
        wait_until_settled(client, quiet_s=2.0, timeout=30)
        out["camera_at_end"] = camera_rows()
        kept = [s["text"] for s in out["saves"]
                if not s["answer"]["ok"] and "kept in" in s["answer"]["error"]["message"]]
        found: dict[str, bool] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for text in kept:
                if not found.get(text):
                    hits = json.loads(client.search(json.dumps(
                        {"semantic_query": text, "stream": "events", "k": 5})))
                    found[text] = any(h["text"] == text for h in hits.get("results", []))
            if all(found.get(t) for t in kept):
                break
            time.sleep(0.5)
        out["kept_found"] = found
        out["stats"] = stats[-1] if stats else None
        out["duration_s"] = time.monotonic() - t_start
    finally:
        if client is not None:
            client.close()
        session.stop()
    out["log"] = (logs / "memory-node.log").read_text()
    out["end"] = store_check(memory)
    return out


CRASH_WRITER = """
import json, sys
from engine_support import FakeClock, make_engine
clock = FakeClock()
engine = make_engine(sys.argv[1], clock, note_fold_window_s=0.5)
print("ready", flush=True)
for i in range(100000):
    clock.t += 5.0
    text = f"waypoint {i}: the {('red', 'green', 'blue', 'white')[i % 4]} box number {i}"
    print(json.dumps({"text": text, "answer": json.loads(engine.save(text))}), flush=True)
"""


def scenario_crash(work: Path, size: str) -> dict[str, Any]:
    """A process saving notes while the disk fills, killed (SIGKILL) while it is full; the
    disk grown back and the store opened again: what the writer was told, and what the
    reopened store holds."""
    import signal
    import threading

    from engine_support import FakeClock, make_engine

    fs = work / "fs"
    mount(fs, size)
    memory = fs / "memory"
    writer = subprocess.Popen([sys.executable, "-c", CRASH_WRITER, str(memory)],
                              stdout=subprocess.PIPE, text=True)
    acks: list[dict[str, Any]] = []
    done = threading.Event()

    def read() -> None:
        assert writer.stdout is not None
        for line in writer.stdout:
            if line.startswith("{"):
                acks.append(json.loads(line))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 60
    while len(acks) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    fill(fs)
    while (sum(1 for a in acks if not a["answer"]["ok"]) < 5
           and time.monotonic() < deadline):
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    done.wait(10)
    (fs / "filler").unlink()
    grow(fs, "400m")
    engine = make_engine(memory, FakeClock())
    found = {}
    for a in acks:
        hits = json.loads(engine.search(json.dumps(
            {"semantic_query": a["text"], "stream": "events", "k": 3})))
        found[a["text"]] = any(h["text"] == a["text"] for h in hits.get("results", []))
    engine.close()
    return {"acks": acks, "found": found, "end": store_check(memory)}


SCENARIOS = {"import": scenario_import, "saves": scenario_saves,
             "recording": scenario_recording, "crash": scenario_crash}


def main() -> int:
    name, work, args = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    # The namespace's own mounts only: a mount made here must not be the host's.
    with open("/proc/self/mountinfo") as fh:
        shared = [ln for ln in fh if re.search(r" shared:\d+", ln)]
    if shared:
        print(f"the mount namespace is not private: {shared[0]}", file=sys.stderr)
        return 2
    result = SCENARIOS[name](work, **args)
    print(RESULT + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
