"""The sample recording reads back as a coherent rosbag2 that matches its ground truth."""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from rosbags.interfaces import QosDurability
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from memory_node.sim import generate as gen
from memory_node.sim.floorplan import build_flat
from memory_node.sim.generate import generate_sample, main, payload_digest
from memory_node.sim.trajectory import TourBuilder, Trajectory, build_tour, compose

DURATION = 30.0
SEED = 7
TYPESTORE = get_typestore(Stores.ROS2_KILTED)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> gen.SampleInfo:
    return generate_sample(tmp_path_factory.mktemp("sample"), seed=SEED, duration_s=DURATION)


@pytest.fixture(scope="module")
def messages(sample: gen.SampleInfo) -> dict[str, list[tuple[int, Any]]]:
    """topic -> [(bag timestamp ns, deserialized message)] in bag order."""
    out: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    with Reader(sample.bag_dir) as reader:
        for conn, stamp, raw in reader.messages():
            out[conn.topic].append((stamp, TYPESTORE.deserialize_cdr(raw, conn.msgtype)))
    return dict(out)


def _ns(stamp: Any) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def _yaw(q: Any) -> float:
    return math.atan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z))


def _pose(tf: Any) -> np.ndarray:
    t = tf.transform.translation
    return np.array([t.x, t.y, _yaw(tf.transform.rotation)])


def _wrap(a: np.ndarray) -> np.ndarray:
    return (a + np.pi) % (2 * np.pi) - np.pi


def test_topics_types_and_counts(sample: gen.SampleInfo) -> None:
    gt = sample.ground_truth
    with Reader(sample.bag_dir) as reader:
        types = {c.topic: c.msgtype for c in reader.connections}
        counts = {c.topic: c.msgcount for c in reader.connections}
        qos = {c.topic: c.ext.offered_qos_profiles for c in reader.connections}
    assert types == {
        "/camera/image_raw": "sensor_msgs/msg/Image",
        "/camera/camera_info": "sensor_msgs/msg/CameraInfo",
        "/lidar/points": "sensor_msgs/msg/PointCloud2",
        "/odom": "nav_msgs/msg/Odometry",
        "/tf": "tf2_msgs/msg/TFMessage",
        "/tf_static": "tf2_msgs/msg/TFMessage",
    }
    for topic, rate in [
        ("/camera/image_raw", 12),
        ("/lidar/points", 8),
        ("/odom", 20),
        ("/tf", 20),
    ]:
        assert abs(counts[topic] - rate * DURATION) <= 0.1 * rate * DURATION, topic
        assert gt["topics"][topic]["count"] == counts[topic]
        assert gt["topics"][topic]["rate_hz"] == rate
    assert counts["/tf_static"] == 1
    # a replayer can latch the static transforms
    assert qos["/tf_static"][0].durability == QosDurability.TRANSIENT_LOCAL
    assert qos["/tf"][0].durability == QosDurability.VOLATILE


def test_stamps_increase_and_equal_header_stamps(
    messages: dict[str, list[tuple[int, Any]]],
) -> None:
    for topic, items in messages.items():
        stamps = [s for s, _ in items]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), topic
        assert stamps[0] >= gen.EPOCH_NS
        assert stamps[-1] <= gen.EPOCH_NS + int(DURATION * 1e9)
        for stamp, msg in items:
            if topic in ("/tf", "/tf_static"):
                assert {_ns(t.header.stamp) for t in msg.transforms} == {stamp}
            else:
                assert _ns(msg.header.stamp) == stamp


def test_frames_and_static_transforms(messages: dict[str, list[tuple[int, Any]]]) -> None:
    ((stamp, static),) = messages["/tf_static"]
    assert stamp == gen.EPOCH_NS
    edges = {(t.header.frame_id, t.child_frame_id) for t in static.transforms}
    assert edges == {
        ("base_link", "camera_link"),
        ("camera_link", "camera_optical_frame"),
        ("base_link", "lidar"),
    }
    _, tf = messages["/tf"][0]
    assert [(t.header.frame_id, t.child_frame_id) for t in tf.transforms] == [
        ("map", "odom"),
        ("odom", "base_link"),
    ]
    _, odom = messages["/odom"][0]
    assert (odom.header.frame_id, odom.child_frame_id) == ("odom", "base_link")
    _, img = messages["/camera/image_raw"][0]
    assert img.header.frame_id == "camera_optical_frame" and img.encoding == "rgb8"
    assert (img.width, img.height) == (320, 240) and img.step == 3 * img.width
    _, cloud = messages["/lidar/points"][0]
    assert cloud.header.frame_id == "lidar"
    assert [(f.name, f.offset, f.datatype) for f in cloud.fields] == [
        ("x", 0, 7),
        ("y", 4, 7),
        ("z", 8, 7),
        ("intensity", 12, 7),
    ]


def test_same_seed_same_bytes_other_seed_differs(sample: gen.SampleInfo, tmp_path: Path) -> None:
    again = generate_sample(tmp_path / "again", seed=SEED, duration_s=DURATION)
    other = generate_sample(tmp_path / "other", seed=SEED + 1, duration_s=DURATION)
    assert not again.reused
    assert again.ground_truth_path.read_bytes() == sample.ground_truth_path.read_bytes()
    assert payload_digest(again.bag_dir) == payload_digest(sample.bag_dir)
    assert payload_digest(other.bag_dir) != payload_digest(sample.bag_dir)
    assert other.ground_truth["odometry"] != sample.ground_truth["odometry"]
    # the world and the tour do not depend on the seed, only noise and drift do
    assert other.ground_truth["path"] == sample.ground_truth["path"]


def test_tf_tree_gives_ground_truth_pose(
    sample: gen.SampleInfo, messages: dict[str, list[tuple[int, Any]]]
) -> None:
    path = {round((p["t"] - gen.EPOCH_S) * 1e3): p for p in sample.ground_truth["path"]}
    traj = Trajectory(build_tour(), DURATION)
    matched = 0
    for stamp, msg in messages["/tf"]:
        map_odom, odom_base = (_pose(t) for t in msg.transforms)
        map_base = compose(map_odom, odom_base)[0]
        t_rel = (stamp - gen.EPOCH_NS) / 1e9
        truth = traj.pose(np.array([t_rel]))[0]
        assert np.hypot(*(map_base[:2] - truth[:2])) < 0.01
        assert abs(_wrap(np.array(map_base[2] - truth[2]))) < 0.01
        p = path.get(round(t_rel * 1e3))
        if p is not None:  # the published ground-truth path agrees too
            assert math.hypot(map_base[0] - p["x"], map_base[1] - p["y"]) < 0.01
            matched += 1
    assert matched >= len(sample.ground_truth["path"]) - 1


def test_odometry_drifts_and_map_to_odom_corrects_it(
    messages: dict[str, list[tuple[int, Any]]],
) -> None:
    traj = Trajectory(build_tour(), DURATION)
    start = traj.pose(np.array([0.0]))
    errors, corrections = [], []
    for (stamp, odom), (_, tf) in zip(messages["/odom"], messages["/tf"], strict=True):
        p = odom.pose.pose
        o = np.array([p.position.x, p.position.y, _yaw(p.orientation)])
        np.testing.assert_allclose(o, _pose(tf.transforms[1]), atol=1e-9)
        truth = traj.pose(np.array([(stamp - gen.EPOCH_NS) / 1e9]))
        errors.append(np.hypot(*(compose(start, o)[0, :2] - truth[0, :2])))
        corrections.append(_pose(tf.transforms[0]))
    errors_a = np.array(errors)
    n = len(errors_a)
    assert errors_a[0] < 1e-9
    assert errors_a[-1] > 0.05  # odometry alone is off by several centimetres at the end
    assert errors_a[-n // 4 :].mean() > errors_a[n // 10 : n // 4].mean()  # and it grows
    moved = np.hypot(*(corrections[-1][:2] - corrections[0][:2]))
    assert moved > 0.02  # map->odom is not a constant: it absorbs the drift


def _luma(img: Any) -> float:
    rgb = img.data.reshape(img.height, img.width, 3).astype(np.float32)
    return float((rgb @ np.array([0.299, 0.587, 0.114], dtype=np.float32)).mean())


def test_window_frames_are_the_brightest(
    sample: gen.SampleInfo, messages: dict[str, list[tuple[int, Any]]]
) -> None:
    gt = sample.ground_truth
    lumas = {s: _luma(m) for s, m in messages["/camera/image_raw"]}
    median = float(np.median(list(lumas.values())))
    facing = [
        v
        for s, v in lumas.items()
        if any(w["t_start"] <= s / 1e9 <= w["t_end"] for w in gt["views"]["window"])
    ]
    assert len(facing) >= 10
    assert np.mean(facing) > 1.25 * median
    brightest = max(lumas, key=lambda s: lumas[s])
    traj = Trajectory(build_tour(), DURATION)
    x, y, _ = traj.pose(np.array([(brightest - gen.EPOCH_NS) / 1e9]))[0]
    assert math.hypot(x - gt["window"]["x"], y - gt["window"]["y"]) < 3.0
    assert gt["views"]["brightest"][0]["mean_luma"] == pytest.approx(lumas[brightest], abs=0.01)


def _people_detector() -> Any:
    if not hasattr(cv2, "HOGDescriptor"):
        pytest.fail(
            f"OpenCV {cv2.__version__} has no HOGDescriptor (OpenCV 5 moved it out of the main "
            "modules): install opencv-contrib-python-headless, or opencv-python-headless<5"
        )
    hog = cv2.HOGDescriptor()
    hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())
    return hog


def test_person_is_detected_by_hog_only_while_present(
    sample: gen.SampleInfo, messages: dict[str, list[tuple[int, Any]]]
) -> None:
    gt = sample.ground_truth
    hog = _people_detector()
    expected = {round(p["t"] * 1e3): p for p in gt["views"]["person_frames"]}
    hits = expected_n = false_pos = empty_n = 0
    for stamp, msg in messages["/camera/image_raw"]:
        img = msg.data.reshape(msg.height, msg.width, 3)
        key = round(stamp / 1e6)
        p = expected.get(key)
        if p is not None and not p["detectable"]:
            continue
        rects, _ = hog.detectMultiScale(img, winStride=(8, 8))
        if p is not None:
            u0, _, u1, _ = p["bbox"]
            centre = (u0 + u1) / 2
            expected_n += 1
            hits += any(x <= centre <= x + w for x, _, w, _ in rects)
        else:
            assert not (
                gt["person"]["t_start"] <= stamp / 1e9 < gt["person"]["t_end"] and key in expected
            )
            empty_n += 1
            false_pos += len(rects) > 0
    assert expected_n >= 10
    assert hits / expected_n >= 0.75, f"HOG found the person in {hits}/{expected_n} frames"
    assert empty_n > 100
    assert false_pos / empty_n <= 0.02, f"HOG fired on {false_pos}/{empty_n} empty frames"


def test_person_frames_lie_inside_the_person_window(sample: gen.SampleInfo) -> None:
    gt = sample.ground_truth
    frames = gt["views"]["person_frames"]
    assert frames
    assert all(gt["person"]["t_start"] <= f["t"] < gt["person"]["t_end"] for f in frames)
    assert gt["epoch"] < gt["person"]["t_start"] < gt["person"]["t_end"] < gt["epoch"] + DURATION
    # the door is seen both while the person is there and after they left
    door_views = gt["views"]["front_door"]
    assert any(v["t_start"] < gt["person"]["t_end"] for v in door_views)
    assert any(v["t_start"] >= gt["person"]["t_end"] for v in door_views)


def _segment_distance(p: np.ndarray, a: tuple[float, float], b: tuple[float, float]) -> np.ndarray:
    a_, e = np.array(a), np.array(b) - np.array(a)
    s = np.clip(((p - a_) @ e) / (e @ e), 0.0, 1.0)
    return np.hypot(*(p - a_ - s[:, None] * e).T)


def test_lidar_points_lie_on_walls(
    sample: gen.SampleInfo, messages: dict[str, list[tuple[int, Any]]]
) -> None:
    plan = build_flat()
    outlines = [(f.a, f.b) for f in plan.wall_faces()] + [(f.a, f.b) for f in plan.prop_faces()]
    traj = Trajectory(build_tour(), DURATION)
    stamp, cloud = messages["/lidar/points"][-1]  # the robot stands still at the door
    pts = cloud.data.view("<f4").reshape(-1, 4)
    level = pts[np.abs(pts[:, 2]) < 1e-3]
    assert 300 <= len(level) <= 360
    base = traj.pose(np.array([(stamp - gen.EPOCH_NS) / 1e9]))
    sensor = compose(base, np.array([gen.LIDAR_XYZ[0], gen.LIDAR_XYZ[1], 0.0]))[0]
    world = compose(sensor, np.column_stack([level[:, :2], np.zeros(len(level))]))[:, :2]
    dist = np.min([_segment_distance(world, a, b) for a, b in outlines], axis=0)
    assert np.percentile(dist, 95) < 0.03 and dist.max() < 0.06
    # the beam towards the front-door wall (x = 0) measures the lidar's own x
    bearing = np.arctan2(world[:, 1] - sensor[1], world[:, 0] - sensor[0])
    west = np.argmin(np.abs(_wrap(bearing - math.pi)))
    assert world[west, 0] == pytest.approx(0.0, abs=0.04)
    assert sample.ground_truth["person"]["t_end"] < stamp / 1e9  # nobody stands in the way


def test_ground_truth_contents(sample: gen.SampleInfo) -> None:
    gt = sample.ground_truth
    plan = build_flat()
    assert set(gt["rooms"]) == {"hallway", "kitchen", "living_room", "bedroom"}
    for name in ("front_door", "window", "sofa", "kitchen_counter", "fridge", "bed", "plant"):
        assert name in gt["landmarks"]
    assert gt["landmarks"]["front_door"]["color"] == "red"
    assert gt["front_door"]["room"] == "hallway" and gt["window"]["room"] == "living_room"
    path = np.array([[p["x"], p["y"]] for p in gt["path"]])
    assert len(path) == int(DURATION * 2) + 1
    assert all(plan.is_free(x, y, 0.2) for x, y in path)
    assert {plan.room_at(x, y) for x, y in path} == set(gt["rooms"])
    assert gt["final"]["revisit"] and gt["final"]["distance"] <= 0.5
    assert gt["revisits"]
    for r in gt["revisits"]:
        assert r["earlier_t"] < r["t"] and r["distance"] <= 0.5
    assert len(gt["never_visited"]) == 5
    for p in gt["never_visited"]:
        assert np.hypot(*(path - [p["x"], p["y"]]).T).min() > 1.5
        assert plan.is_free(p["x"], p["y"])
    assert set(gt["frames"]) == {
        "map",
        "odom",
        "base_link",
        "camera_link",
        "camera_optical_frame",
        "lidar",
    }
    assert json.loads(sample.ground_truth_path.read_text()) == gt


def test_reuse_force_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny"
    assert main([str(out), "--duration", "3", "--seed", "3"]) == 0
    assert "generated" in capsys.readouterr().out
    assert main([str(out), "--duration", "3", "--seed", "3"]) == 0
    assert "reused" in capsys.readouterr().out
    assert main([str(out), "--duration", "3", "--seed", "4"]) == 2  # other arguments: refuse
    info = generate_sample(out, seed=4, duration_s=3.0, force=True)
    assert not info.reused and info.ground_truth["seed"] == 4
    # an interrupted run (no ground truth file) is regenerated, not reused
    info.ground_truth_path.unlink()
    assert not generate_sample(out, seed=4, duration_s=3.0).reused


def test_sqlite3_format(tmp_path: Path) -> None:
    info = generate_sample(tmp_path / "sq", seed=SEED, duration_s=4.0, fmt="sqlite3")
    assert info.ground_truth["bag"]["format"] == "sqlite3"
    assert list(info.bag_dir.glob("*.db3"))
    with Reader(info.bag_dir) as reader:
        counts = {c.topic: c.msgcount for c in reader.connections}
        _, _, raw = next(
            iter(
                reader.messages(
                    connections=[c for c in reader.connections if c.topic == "/camera/image_raw"]
                )
            )
        )
    assert counts["/odom"] == 81 and counts["/camera/image_raw"] == 48
    img = TYPESTORE.deserialize_cdr(raw, "sensor_msgs/msg/Image")
    assert (img.width, img.height, img.encoding) == (320, 240, "rgb8")


def test_the_question_set_covers_every_kind_with_answers(sample: gen.SampleInfo,
                                                         tmp_path: Path) -> None:
    """Issue 14: at least 40 questions of the five kinds, each with an answer, a tolerance
    where one applies, and a structured form memory-eval maps to skill calls; an older
    ground truth without them gains them on reuse, without touching the bag."""
    gt = sample.ground_truth
    qs = gt["questions"]
    assert len(qs) >= 40 and len({q["id"] for q in qs}) == len(qs)
    kinds = {k: [q for q in qs if q["kind"] == k] for k in gen.QUESTION_KINDS}
    assert all(len(v) >= 8 for v in kinds.values()), {k: len(v) for k, v in kinds.items()}
    for q in qs:
        assert q["question"].endswith("?") and q["ask"]["type"]
        assert q["answer"] is not None
        if q["kind"] in ("where", "when", "how_long"):
            assert q["tolerance"] > 0
        if q["ask"].get("place"):
            assert q["ask"]["place"] in gt["places"]
    # Yes/no questions with both answers, so "always yes" cannot score well.
    assert {q["answer"] for q in kinds["yes_no"]} == {True, False}
    # The kitchen is entered once, for about 14 s of the 150 s tour (time-scaled here).
    assert next(q for q in qs if q["id"] == "count-kitchen")["answer"] == 1
    kitchen = next(q for q in qs if q["id"] == "how-long-kitchen")["answer"]
    assert 10 < kitchen * 150 / DURATION < 20
    # Reuse of an older sample adds the set.
    old = tmp_path / "old"
    shutil.copytree(sample.out_dir, old)
    stale = {k: v for k, v in gt.items() if k not in ("questions", "places",
                                                       "questions_version")}
    (old / gen.GROUND_TRUTH_NAME).write_text(json.dumps(stale))
    again = gen.generate_sample(old, seed=gt["seed"], duration_s=gt["duration"])
    assert again.reused and again.ground_truth["questions"] == qs


def test_tour_within_solves_moves_turns_and_pauses_exactly() -> None:
    """The question set's visits come from the tour's own segments: a move is in a circle
    while its straight line is, a pause or a turn inside joins the moves around it into one
    visit, a move that only touches the circle is not in it, and a recording of another
    length scales the times."""
    b = TourBuilder(0.0, 0.0, 0.0)
    b.go(10.0, 0.0).wait(3.0).go(0.0, 0.0)  # 20 s out, 3 s still, a half turn (pi s), 20 s back
    tour = b.tour
    back = 23.0 + math.pi  # when the walk back starts

    def within(x: float, y: float, r: float, of: Any = tour) -> np.ndarray:
        return np.array(of.within(x, y, r)).reshape(-1, 2)

    # A chord 1.6 m long (0.6 m off the line, r 1), crossed at 0.5 m/s both ways.
    np.testing.assert_allclose(within(5.0, 0.6, 1.0),
                               [[8.4, 11.6], [back + 8.4, back + 11.6]], atol=1e-9)
    # In, standing, turning, out: one visit.
    np.testing.assert_allclose(within(10.0, 0.0, 1.0), [[18.0, back + 2.0]], atol=1e-9)
    np.testing.assert_allclose(within(10.0, 0.0, 0.1), [[19.8, back + 0.2]], atol=1e-9)
    assert within(5.0, 1.0, 1.0).size == 0  # touched, never entered
    assert within(20.0, 0.0, 1.0).size == 0
    slow = Trajectory(tour, 2 * tour.duration)
    np.testing.assert_allclose(within(10.0, 0.0, 1.0, slow), [[36.0, 2 * back + 4.0]],
                               atol=1e-9)
