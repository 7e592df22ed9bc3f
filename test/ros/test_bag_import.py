"""memory-import on real bags, as a user runs it (a subprocess, real signals): the dry run, the
rows and the summary, idempotence, several bags as one recording, Ctrl-C and SIGKILL then
resume, and bad input refused with nothing stored.

The bag is the package's sample flat, 60 s of it (generated once, ~8 s); each import of it
takes a few seconds. No ROS graph is involved: memory-import needs none.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from memory_node.sim.generate import generate_sample

DURATION_S = 60.0
POSE_TOL_M = 0.15  # a TF pose against the ground-truth path at its stamp (as the e2e tests)


def _exe() -> list[str]:
    exe = Path(sys.executable).parent / "memory-import"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "memory_node.ros.bag_import"]


def run_import(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*_exe(), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def rows(memory: Path) -> list[tuple[str, float, float | None, float | None, str | None]]:
    """(stream, t, x, y, pose source) of every sensor row, in time order."""
    db = memory / "memory.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return [tuple(r) for r in con.execute(
            "SELECT stream, t, x, y, pose_source FROM observations WHERE stream IN "
            "('camera', 'lidar', 'odom') ORDER BY t, stream")]


def count_rows(memory: Path) -> int:
    try:
        with sqlite3.connect(f"file:{memory / 'memory.db'}?mode=ro", uri=True,
                             timeout=5) as con:
            return int(con.execute("SELECT count(*) FROM observations").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return generate_sample(tmp_path_factory.mktemp("sample"), seed=7, duration_s=DURATION_S)


@pytest.fixture(scope="module")
def reference(sample, tmp_path_factory):
    """One uninterrupted import of the sample: (store, completed process)."""
    memory = tmp_path_factory.mktemp("reference") / "memory"
    done = run_import(sample.bag_dir, "--memory-dir", memory)
    assert done.returncode == 0, done.stderr
    return memory, done


def _path_at(truth: dict, t: float) -> tuple[float, float]:
    path = truth["path"]
    ts = np.array([p["t"] for p in path])
    return (float(np.interp(t, ts, [p["x"] for p in path])),
            float(np.interp(t, ts, [p["y"] for p in path])))


def test_dry_run_says_what_would_be_recorded(sample, tmp_path):
    done = run_import(sample.bag_dir, "--dry-run")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "camera  /camera/image_raw (Image):" in out and "recorded" in out
    assert "lidar   /lidar/points (PointCloud2):" in out
    assert "odom    /odom (Odometry):" in out
    assert "map <- base_link connected (map <- odom <- base_link)" in out
    assert "no zero stamps" in out
    # A configuration naming topics the bag lacks: what it has of that type instead.
    cfg = tmp_path / "other.yaml"
    cfg.write_text("memory_recorder:\n  ros__parameters:\n    lidar_topic: /point_cloud2\n"
                   "    camera_topic: /go2/camera\n")
    done = run_import(sample.bag_dir, "--dry-run", "--config", cfg)
    assert done.returncode == 0, done.stderr
    assert "no /point_cloud2; PointCloud2 topics: /lidar/points" in done.stdout
    assert "no /go2/camera; Image topics: /camera/image_raw" in done.stdout
    assert list(tmp_path.iterdir()) == [cfg]  # nothing stored anywhere


def _rewrite(src: Path, dst: Path, change) -> None:
    """A copy of a bag with each message passed through change(topic, msg, t_ns) -> msg."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    from memory_node.ros.replay import open_reader

    reader = open_reader(src)
    writer = Writer(dst, version=Writer.VERSION_LATEST, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    try:
        ts = reader.typestore
        conns = {c.id: writer.add_connection(c.topic, c.msgtype, typestore=ts)
                 for c in reader.connections}
        for conn, t_ns, raw in reader.messages():
            msg = change(conn.topic, reader.deserialize(raw, conn.msgtype), t_ns)
            writer.write(conns[conn.id], t_ns, ts.serialize_cdr(msg, conn.msgtype))
    finally:
        writer.close()
        reader.close()


def test_dry_run_reports_zero_stamps_and_a_clock_far_from_the_headers(sample, tmp_path):
    def change(topic, msg, _t):
        if topic == "/odom":
            msg.header.stamp.sec, msg.header.stamp.nanosec = 0, 0
        elif topic == "/lidar/points":
            msg.header.stamp.sec += 3600  # a lidar whose clock is an hour ahead
        return msg

    bag = tmp_path / "stamps"
    _rewrite(Path(sample.bag_dir), bag, change)
    done = run_import(bag, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "/odom: 50 of the first 50 messages have a zero stamp" in done.stdout
    assert "/lidar/points: header stamps are +3600.0 s from the bag's clock" in done.stdout


def test_import_stores_posed_keyframes_and_ends_with_the_summary(sample, reference):
    memory, done = reference
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("memory-import: done: "), done.stdout
    got = rows(memory)
    for stream in ("camera", "lidar", "odom"):
        n = sum(r[0] == stream for r in got)
        assert n > 10
        assert f"{stream} {n} rows (" in last
    assert "pose sources: tf " in last and "TF problems: none" in last
    for stream, t, x, y, _ in got:
        gx, gy = _path_at(sample.ground_truth, t)
        assert abs(x - gx) < POSE_TOL_M and abs(y - gy) < POSE_TOL_M, (stream, t, x, y)
    # Progress on a pipe: plain lines, not a bar's carriage returns.
    assert "\r" not in done.stderr


def _described(memory: Path) -> list[tuple]:
    """Every camera row as stored: stamp, pose, text, tags, view and the JPEG's bytes."""
    with sqlite3.connect(memory / "memory.db") as con:
        out = []
        for t, x, y, text, tags, ref, *view in con.execute(
                "SELECT o.t, o.x, o.y, o.text, o.tags, o.ref, v.x, v.y, v.yaw, v.range "
                "FROM observations o LEFT JOIN views v ON v.id = o.id "
                "WHERE o.stream = 'camera' ORDER BY o.t"):
            out.append((t, x, y, text, tags, (memory / ref).read_bytes(), *view))
    return out


def test_describing_on_several_threads_stores_what_one_thread_does(sample, reference,
                                                                   tmp_path):
    """--threads only changes how fast: frames described ahead, on three threads, are the
    rows (texts, tags, views, images) that one thread stores, in the same order."""
    memory, _ = reference  # the default: the CPUs this test may use
    one = tmp_path / "one"
    done = run_import(sample.bag_dir, "--memory-dir", one, "--threads", "1")
    assert done.returncode == 0, done.stderr
    three = tmp_path / "three"
    done = run_import(sample.bag_dir, "--memory-dir", three, "--threads", "3")
    assert done.returncode == 0, done.stderr
    want = _described(one)
    assert len(want) > 10 and any("person" in row[3] for row in want)
    assert _described(three) == want
    assert _described(memory) == want
    bad = run_import(sample.bag_dir, "--memory-dir", tmp_path / "bad", "--threads", "0")
    assert bad.returncode == 2 and "--threads must be at least 1" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_memory_import_needs_no_ros_runtime(sample, reference, tmp_path):
    """memory-import runs where rclpy and the ROS message packages cannot be imported (a
    laptop with the bags and pip only): the same rows as the reference import."""
    memory = tmp_path / "memory"
    code = ("import sys\n"
            "for name in ('rclpy', 'rcl_interfaces', 'builtin_interfaces', 'std_msgs',\n"
            "             'sensor_msgs', 'geometry_msgs', 'tf2_msgs', 'nav_msgs'):\n"
            "    sys.modules[name] = None  # import fails\n"
            "from memory_node.ros.bag_import import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(sample.bag_dir), "--memory-dir",
                           str(memory), "--config", "memory.yaml"], capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert rows(memory) == rows(reference[0])


def test_the_same_bag_twice_adds_nothing(sample, reference, tmp_path):
    memory, _ = reference
    before = rows(memory)
    again = run_import(sample.bag_dir, "--memory-dir", memory)
    assert again.returncode == 0, again.stderr
    assert "already imported" in again.stdout.strip().splitlines()[-1]
    assert rows(memory) == before
    # Even without the mark of a finished import (a crash right before it was written), the
    # keyframes stored are recognised and nothing is stored twice.
    with sqlite3.connect(memory / "memory.db") as con:
        con.execute("DELETE FROM meta WHERE key LIKE 'import/%'")
    again = run_import(sample.bag_dir, "--memory-dir", memory)
    assert again.returncode == 0, again.stderr
    assert "stored before" in again.stdout
    assert rows(memory) == before


def test_a_recording_split_in_two_bags_imports_as_one(sample, reference, tmp_path):
    """rosbag2 splits long recordings into several files; given together they are one."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    from memory_node.ros.replay import open_reader

    reader = open_reader(Path(sample.bag_dir))
    middle = (reader.start_time + reader.end_time) // 2
    writers = []
    for i in range(2):
        w = Writer(tmp_path / f"part{i}", version=Writer.VERSION_LATEST,
                   storage_plugin=StoragePlugin.MCAP)
        w.open()
        writers.append((w, {c.id: w.add_connection(c.topic, c.msgtype,
                                                    typestore=reader.typestore)
                            for c in reader.connections}))
    for conn, t_ns, raw in reader.messages():
        w, conns = writers[t_ns >= middle]
        w.write(conns[conn.id], t_ns, raw)
    for w, _ in writers:
        w.close()
    reader.close()
    memory = tmp_path / "memory"
    done = run_import(tmp_path / "part1", tmp_path / "part0", "--memory-dir", memory)
    assert done.returncode == 0, done.stderr
    assert rows(memory) == rows(reference[0])


def _interrupt_and_resume(sample, memory: Path, sig: int) -> tuple[int, int]:
    """Start an import, send `sig` once some rows are stored; (rows then, exit status)."""
    proc = subprocess.Popen([*_exe(), str(sample.bag_dir), "--memory-dir", str(memory)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while count_rows(memory) < 40 and proc.poll() is None:
            assert time.monotonic() < deadline, "no rows stored"
            time.sleep(0.02)
        assert proc.poll() is None, "the import finished before it could be interrupted"
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert out.strip().splitlines()[-1].startswith("memory-import: interrupted"), out
        assert "Traceback" not in err
    return count_rows(memory), proc.returncode


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_an_interrupted_import_continues_where_it_stopped(sample, reference, tmp_path, sig):
    memory = tmp_path / "memory"
    stored, _ = _interrupt_and_resume(sample, memory, sig)
    partial = rows(memory)
    assert 40 <= stored < len(rows(reference[0]))
    done = run_import(sample.bag_dir, "--memory-dir", memory)
    assert done.returncode == 0, done.stderr
    assert "stored before" in done.stdout
    final = rows(memory)
    assert set(partial) <= set(final)  # nothing acknowledged was lost
    assert final == rows(reference[0])  # and nothing twice: as one uninterrupted import


def test_bad_input_is_refused_and_stores_nothing(sample, reference, tmp_path):
    memory, _ = reference
    before = rows(memory)
    missing = run_import(tmp_path / "no_such_bag", "--memory-dir", memory)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    topics = run_import(sample.bag_dir, "--memory-dir", memory, "--topics", "/nope")
    assert topics.returncode == 2 and "not in the bag: /nope" in topics.stderr
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("memory_recorder:\n  ros__parameters:\n    min_distance: far\n")
    bad = run_import(sample.bag_dir, "--memory-dir", memory, "--config", cfg)
    assert bad.returncode == 2 and "min_distance" in bad.stderr
    window = run_import(sample.bag_dir, "--memory-dir", memory, "--start", "9999")
    assert window.returncode == 2 and "past the end" in window.stderr
    assert rows(memory) == before
    fresh = tmp_path / "fresh"
    assert run_import(tmp_path / "no_such_bag", "--memory-dir", fresh).returncode == 2
    # A configuration none of whose topics the bag has: said, and no store made.
    cfg.write_text("memory_recorder:\n  ros__parameters:\n    camera_topic: /a\n"
                   "    lidar_topic: /b\n/**:\n  ros__parameters:\n    odom_topic: /c\n")
    nothing = run_import(sample.bag_dir, "--memory-dir", fresh, "--config", cfg)
    assert nothing.returncode == 2 and "none of the configured topics" in nothing.stderr
    assert "lidar: no /b in the bags; PointCloud2 topics: /lidar/points" in nothing.stderr
    assert not fresh.exists()


def test_start_duration_and_topics_select_what_is_imported(sample, tmp_path):
    memory = tmp_path / "memory"
    done = run_import(sample.bag_dir, "--memory-dir", memory, "--start", "20", "--duration",
                      "15", "--topics", "/odom", "/tf", "/tf_static")
    assert done.returncode == 0, done.stderr
    got = rows(memory)
    assert got and {r[0] for r in got} == {"odom"}
    t0 = sample.ground_truth["epoch"]
    assert all(t0 + 19.5 <= r[1] <= t0 + 35.5 for r in got), (got[0], got[-1])
    assert all(r[4] == "tf" for r in got)
