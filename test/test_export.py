"""memory-export --mcap on a store made as a user makes one: the sample flat imported by
memory-import, a note and a named place saved through the engine. The file is read back with
the `mcap` reader and each message decoded with the schema the file carries (protobuf), so
what is checked is what Foxglove would read: channels and schema names, one message per row
exported at the row's time, the stored JPEG and points byte for byte, the window of
--after/--before, and the errors a user gets instead of a file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from engine_support import FakeClock, PoseBox, make_engine

from memory_node.core.types import Pose
from memory_node.sim.generate import generate_sample

DURATION_S = 15.0
NOTE = "Met Alice at the front door; she asked me to water the plants."
SCHEMAS = {
    "/memory/tf": "foxglove.FrameTransforms",
    "/memory/trajectory": "foxglove.PosesInFrame",
    "/memory/keyframes": "foxglove.PosesInFrame",
    "/memory/camera/image": "foxglove.CompressedImage",
    "/memory/lidar/points": "foxglove.PointCloud",
    "/memory/notes": "foxglove.Log",
    "/memory/notes/labels": "foxglove.SceneUpdate",
    "/memory/places": "foxglove.SceneUpdate",
}


def _command(name: str) -> list[str]:
    exe = Path(sys.executable).parent / name
    module = {"memory-import": "memory_node.ros.bag_import",
              "memory-export": "memory_node.export"}[name]
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


def run(name: str, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*_command(name), *map(str, args)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.fixture(scope="module")
def memory(tmp_path_factory) -> Path:
    """The sample flat (15 s) imported, then a note where the robot stood, a note with no
    pose, and a place, saved as the services save them."""
    tmp = tmp_path_factory.mktemp("export")
    sample = generate_sample(tmp / "sample", seed=7, duration_s=DURATION_S)
    memory = tmp / "memory"
    done = run("memory-import", sample.bag_dir, "--memory-dir", memory)
    assert done.returncode == 0, done.stderr
    t0 = _rows(memory)[0]["t"]
    clock, pose = FakeClock(t0 + 5.0), PoseBox(Pose(1.5, 2.0, 0.0, 0.4, "map", "tf"))
    engine = make_engine(memory, clock, pose)
    try:
        assert json.loads(engine.save(NOTE))["ok"]
        assert json.loads(engine.save(json.dumps(
            {"place": "kitchen", "x": 3.0, "y": 1.0, "radius": 1.5})))["ok"]
        clock.t, pose.pose = t0 + 12.0, None
        assert json.loads(engine.save("The charger is unplugged."))["ok"]
    finally:
        engine.close()
    return memory


def _rows(memory: Path) -> list[dict]:
    """Every row of memory.db, read with plain SQL (not through the exporter's code)."""
    with sqlite3.connect(memory / "memory.db") as con:
        con.row_factory = sqlite3.Row
        return [dict(r) for r in con.execute(
            "SELECT id, stream, t, x, y, z, yaw, frame, tags, text, ref FROM observations "
            "ORDER BY t, id")]


def _views(memory: Path) -> dict[int, tuple[float, float, float]]:
    with sqlite3.connect(memory / "memory.db") as con:
        return {r[0]: r[1:] for r in con.execute("SELECT id, x, y, yaw FROM views")}


def _ns(t: float) -> int:
    return round(t * 1_000_000) * 1000


_CLASSES: dict[str, type] = {}


def _decode(schema, data: bytes):
    """A message decoded with the protobuf schema the file itself carries."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    if schema.name not in _CLASSES:
        assert schema.encoding == "protobuf"
        files = list(descriptor_pb2.FileDescriptorSet.FromString(schema.data).file)
        pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()
        while files:  # each file after the files it imports
            ready = [f for f in files if set(f.dependency) <= added]
            assert ready, f"{schema.name}: schema imports files it does not hold"
            for f in ready:
                pool.Add(f)
                added.add(f.name)
            files = [f for f in files if f.name not in added]
        _CLASSES[schema.name] = message_factory.GetMessageClass(
            pool.FindMessageTypeByName(schema.name))
    return _CLASSES[schema.name].FromString(data)


def read_mcap(path: Path) -> tuple[dict[str, str], dict[str, list[tuple[int, object]]]]:
    """({topic: schema name}, {topic: [(log time, decoded message), ...]}) of an MCAP file."""
    from mcap.reader import make_reader

    schemas: dict[str, str] = {}
    messages: dict[str, list[tuple[int, object]]] = defaultdict(list)
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None  # a finished file: its summary section is written
        for channel in summary.channels.values():
            schemas[channel.topic] = summary.schemas[channel.schema_id].name
            assert channel.message_encoding == "protobuf"
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            messages[channel.topic].append((message.log_time, _decode(schema, message.data)))
    return schemas, messages


def _stamp_ns(stamp) -> int:
    return stamp.seconds * 1_000_000_000 + stamp.nanos


def _rotate(q, v: tuple[float, float, float]) -> np.ndarray:
    """v rotated by the unit quaternion q (x, y, z, w fields)."""
    u = np.array([q.x, q.y, q.z])
    v_ = np.array(v)
    return 2 * u.dot(v_) * u + (q.w * q.w - u.dot(u)) * v_ + 2 * q.w * np.cross(u, v_)


@pytest.fixture(scope="module")
def exported(memory, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "memory.mcap"
    done = run("memory-export", "--mcap", out, "--memory-dir", memory)
    assert done.returncode == 0, done.stderr
    return out, done.stdout, *read_mcap(out)


def test_every_row_is_a_foxglove_message_at_its_time(memory, exported):
    out, stdout, schemas, messages = exported
    rows = _rows(memory)
    camera = [r for r in rows if r["stream"] == "camera" and r["ref"]]
    lidar = [r for r in rows if r["stream"] == "lidar"]
    notes = [r for r in rows if r["stream"] == "events"]
    posed = [r for r in rows if r["x"] is not None]
    assert len(camera) > 20 and len(lidar) > 20 and len(notes) == 2
    assert schemas == SCHEMAS
    counts = {topic: len(m) for topic, m in messages.items()}
    assert counts == {"/memory/tf": len(posed), "/memory/trajectory": 1,
                      "/memory/keyframes": 1, "/memory/camera/image": len(camera),
                      "/memory/lidar/points": len(lidar), "/memory/notes": len(notes),
                      "/memory/notes/labels": 1, "/memory/places": 1}
    assert (f"{len(camera)} images, {len(lidar)} point clouds, 2 notes, {len(posed)} poses, "
            "1 places") in stdout
    # Log times are the rows' times, in the rows' order.
    for topic, want in (("/memory/camera/image", camera), ("/memory/lidar/points", lidar),
                        ("/memory/notes", notes), ("/memory/tf", posed)):
        assert [t for t, _ in messages[topic]] == [_ns(r["t"]) for r in want], topic
        assert [_stamp_ns(m.timestamp if topic != "/memory/tf" else m.transforms[0].timestamp)
                for _, m in messages[topic]] == [_ns(r["t"]) for r in want], topic

    # Each keyframe's image is its stored JPEG, byte for byte.
    for row, (_, msg) in zip(camera, messages["/memory/camera/image"], strict=True):
        assert msg.format == "jpeg" and msg.frame_id == "camera"
        assert msg.data == (memory / row["ref"]).read_bytes()
        assert msg.data[:3] == b"\xff\xd8\xff"

    # Each lidar keyframe's points are its stored points (x, y, z float32), drawn from the
    # base: the sample's cloud is in the lidar's own frame, whose mount the store keeps not.
    for row, (_, msg) in zip(lidar, messages["/memory/lidar/points"], strict=True):
        stored = np.load(memory / row["ref"])
        assert json.loads(row["tags"])["frame"] == "lidar"
        assert msg.frame_id == "base_link" and msg.point_stride == 12
        assert [(f.name, f.offset) for f in msg.fields] == [("x", 0), ("y", 4), ("z", 8)]
        got = np.frombuffer(msg.data, "<f4").reshape(-1, 3)
        assert got.shape == stored.shape and np.array_equal(got, stored)

    # Poses: map -> base_link at every posed row; map -> camera (optical axes: z along the
    # view's heading) at every keyframe.
    views = _views(memory)
    for row, (_, msg) in zip(posed, messages["/memory/tf"], strict=True):
        base = msg.transforms[0]
        assert (base.parent_frame_id, base.child_frame_id) == ("map", "base_link")
        assert (base.translation.x, base.translation.y) == pytest.approx((row["x"], row["y"]))
        heading = _rotate(base.rotation, (1.0, 0.0, 0.0))
        assert heading == pytest.approx([math.cos(row["yaw"]), math.sin(row["yaw"]), 0.0],
                                        abs=1e-9)
        if row["stream"] == "camera":
            cam = msg.transforms[1]
            x, y, yaw = views[row["id"]]
            assert cam.child_frame_id == "camera"
            assert (cam.translation.x, cam.translation.y) == pytest.approx((x, y))
            assert _rotate(cam.rotation, (0.0, 0.0, 1.0)) == pytest.approx(
                [math.cos(yaw), math.sin(yaw), 0.0], abs=1e-9)  # looking along the view
            assert _rotate(cam.rotation, (0.0, 1.0, 0.0)) == pytest.approx(
                [0.0, 0.0, -1.0], abs=1e-9)  # image down is world down
        else:
            assert len(msg.transforms) == 1

    # The trajectory and the keyframes, whole, at the first row's time.
    [(t, trajectory)] = messages["/memory/trajectory"]
    assert t == _ns(rows[0]["t"]) and trajectory.frame_id == "map"
    assert [c for p in trajectory.poses for c in (p.position.x, p.position.y)] == \
        pytest.approx([c for r in posed for c in (r["x"], r["y"])])
    [(_, keyframes)] = messages["/memory/keyframes"]
    assert [c for p in keyframes.poses for c in (p.position.x, p.position.y)] == \
        pytest.approx([c for r in camera for c in (r["x"], r["y"])])

    # Notes: a Log each, and a label where the posed one was said.
    assert [(m.message, m.name) for _, m in messages["/memory/notes"]] == [
        (NOTE, "events"), ("The charger is unplugged.", "events")]
    [(t, labels)] = messages["/memory/notes/labels"]
    assert t == _ns(notes[0]["t"])
    [entity] = labels.entities
    assert entity.frame_id == "map" and entity.texts[0].text == NOTE
    assert (entity.texts[0].pose.position.x, entity.texts[0].pose.position.y) == (1.5, 2.0)

    # The named place: a disc of its radius with its name.
    [(t, places)] = messages["/memory/places"]
    assert t == _ns(rows[0]["t"])
    [place] = places.entities
    assert place.id == "place-kitchen" and place.texts[0].text == "kitchen (1.5 m)"
    disc = place.cylinders[0]
    assert (disc.pose.position.x, disc.pose.position.y) == (3.0, 1.0)
    assert (disc.size.x, disc.size.y) == (3.0, 3.0)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None).isoformat()


def test_after_and_before_restrict_the_window(memory, tmp_path):
    rows = _rows(memory)
    t0 = rows[0]["t"]
    after = math.floor(t0) + 3.0  # a whole second: exact as ISO-8601
    # A row's own time: the bound holds it (inclusive, as a search's 'before').
    before = [r["t"] for r in rows if r["stream"] == "camera" and r["t"] <= t0 + 8.0][-1]
    out = tmp_path / "window.mcap"
    # --after as an ISO-8601 time (UTC), --before as seconds since the epoch.
    done = run("memory-export", "--mcap", out, "--memory-dir", memory, "--after",
               _iso(after), "--before", repr(before))
    assert done.returncode == 0, done.stderr
    _, messages = read_mcap(out)
    inside = [r for r in rows if after <= r["t"] <= before]
    want = {"/memory/camera/image": [r for r in inside if r["stream"] == "camera"],
            "/memory/lidar/points": [r for r in inside if r["stream"] == "lidar"],
            "/memory/tf": [r for r in inside if r["x"] is not None],
            "/memory/notes": [r for r in inside if r["stream"] == "events"]}
    assert len(want["/memory/camera/image"]) > 10 and len(want["/memory/notes"]) == 1
    assert want["/memory/camera/image"][-1]["t"] == before
    for topic, expected in want.items():
        assert [t for t, _ in messages[topic]] == [_ns(r["t"]) for r in expected], topic
    [(t, trajectory)] = messages["/memory/trajectory"]
    assert t == _ns(after) and len(trajectory.poses) == len(want["/memory/tf"])
    assert "1 places" in done.stdout  # places are the memory's names now: in every window

    # A window with no rows writes nothing and says so.
    later = tmp_path / "later.mcap"
    done = run("memory-export", "--mcap", later, "--memory-dir", memory, "--after",
               repr(rows[-1]["t"] + 60))
    assert done.returncode == 1 and not later.exists()
    assert done.stderr.startswith("memory-export: nothing to export: no rows between")


def _one_line_error(done: subprocess.CompletedProcess, status: int, words: str) -> None:
    assert done.returncode == status, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("memory-export: ") and words in lines[0], \
        done.stderr


def test_what_cannot_be_exported_is_one_line_and_no_file(memory, tmp_path):
    out = tmp_path / "out.mcap"
    missing = tmp_path / "no-such-memory"
    _one_line_error(run("memory-export", "--mcap", out, "--memory-dir", missing), 2,
                    f"no memory directory at {missing}")
    assert not missing.exists()  # looked at, not created
    bare = tmp_path / "bare"
    bare.mkdir()
    _one_line_error(run("memory-export", "--mcap", out, "--memory-dir", bare), 2,
                    "holds no memory (no memory.db)")
    assert list(bare.iterdir()) == []
    # Without --memory-dir: $AGENT_MEMORY_DIR, else ./agent_memory (absent here).
    _one_line_error(run("memory-export", "--mcap", out, cwd=tmp_path), 2,
                    "no memory directory at agent_memory")

    from memory_node.core.store.sqlite_store import SqliteObservationStore

    empty = tmp_path / "empty"
    SqliteObservationStore(empty / "memory.db").close()
    _one_line_error(run("memory-export", "--mcap", out, "--memory-dir", empty), 1,
                    "nothing to export: the memory at")

    _one_line_error(run("memory-export", "--mcap", tmp_path, "--memory-dir", memory), 2,
                    "is a directory")
    _one_line_error(run("memory-export", "--mcap", tmp_path / "nowhere" / "out.mcap",
                        "--memory-dir", memory), 2, "no directory")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    _one_line_error(run("memory-export", "--mcap", a_file / "out.mcap", "--memory-dir", memory),
                    2, "cannot write")
    _one_line_error(run("memory-export", "--mcap", out, "--memory-dir", memory, "--after",
                        "yesterday"), 2, "--after must be seconds since the epoch or an ISO")
    _one_line_error(run("memory-export", "--mcap", out, "--memory-dir", memory, "--after",
                        "1764460900", "--before", "1764460800"), 2, "is later than --before")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "bare", "empty"]


def test_a_missing_or_outside_blob_is_passed_over_and_said(memory, tmp_path):
    copy = tmp_path / "memory"
    shutil.copytree(memory, copy)
    camera = [r for r in _rows(copy) if r["stream"] == "camera"]
    (copy / camera[3]["ref"]).unlink()
    # A reference out of the memory directory (a hand-edited database) is never read.
    lidar = [r for r in _rows(copy) if r["stream"] == "lidar"]
    secret = tmp_path / "secret.npy"
    np.save(secret, np.zeros((4, 3), np.float32))
    with sqlite3.connect(copy / "memory.db") as con:
        con.execute("UPDATE observations SET ref = ? WHERE id = ?",
                    ("../secret.npy", lidar[2]["id"]))
    out = tmp_path / "out.mcap"
    done = run("memory-export", "--mcap", out, "--memory-dir", copy)
    assert done.returncode == 0, done.stderr
    assert "skipped: 1 camera blobs missing, 1 lidar blobs outside the memory" in done.stdout
    _, messages = read_mcap(out)
    assert [t for t, _ in messages["/memory/camera/image"]] == [
        _ns(r["t"]) for i, r in enumerate(camera) if i != 3]
    assert [t for t, _ in messages["/memory/lidar/points"]] == [
        _ns(r["t"]) for i, r in enumerate(lidar) if i != 2]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a real full disk needs root to mount a tmpfs (CI runs as root)")
def test_a_full_disk_leaves_the_old_file_and_no_partial_one(memory, tmp_path):
    """Into a 200 kB tmpfs (the export is about 1 MB): the write fails, the command says so
    in one line, and OUT keeps what it held."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=200k tmpfs {disk} && echo previous > {disk}/out.mcap "
              f"&& {' '.join(_command('memory-export'))} --mcap {disk}/out.mcap --memory-dir "
              f"{memory}; echo rc=$?; ls -A {disk}; cat {disk}/out.mcap")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.stdout.splitlines() == ["rc=1", "out.mcap", "previous"], done.stderr
    [line] = done.stderr.splitlines()
    assert line == f"memory-export: cannot write {disk}/out.mcap: No space left on device"


def test_ctrl_c_stops_at_the_next_row_and_leaves_the_old_file(memory, tmp_path):
    """SIGINT while a blob is being read (a FIFO holds the export there until the signal
    has been sent): exit 130, one line, OUT as it was, no temporary file."""
    copy = tmp_path / "memory"
    shutil.copytree(memory, copy)
    camera = [r for r in _rows(copy) if r["stream"] == "camera"]
    fifo = copy / camera[4]["ref"]
    fifo.unlink()
    os.mkfifo(fifo)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.mcap"
    out.write_text("previous")
    proc = subprocess.Popen(
        [*_command("memory-export"), "--mcap", str(out), "--memory-dir", str(copy)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while True:  # opening the FIFO to write succeeds once the export reads from it
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        os.write(fd, b"\xff\xd8\xff not a whole JPEG")
        os.close(fd)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stdout == "" and stderr == f"memory-export: interrupted; {out} not written\n"
    assert out.read_text() == "previous" and list(out_dir.iterdir()) == [out]
