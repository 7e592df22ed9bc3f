"""Named places, visits, what was seen over there, and compaction that keeps the answers:
issue 14's questions (how long, how often, where is 'the kitchen', what did I see there)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from engine_support import T0, FakeClock, PoseBox, make_engine

from memory_node.core.ingest import CameraFrame
from memory_node.core.types import Pose, View


def search(eng, **q):
    return json.loads(eng.search(json.dumps(q)))


def save(eng, **q):
    return json.loads(eng.save(json.dumps(q)))


# ---- named places ----------------------------------------------------------------------------

def test_a_named_place_is_a_search_centre_that_survives_restarts(tmp_path):
    clock, pose = FakeClock(), PoseBox(Pose(3.0, 4.0, yaw=0.3))
    eng = make_engine(tmp_path / "m", clock, pose)
    named = save(eng, place="Kitchen", radius=1.5)
    assert named["ok"] and named["place"] == {"name": "Kitchen", "x": 3.0, "y": 4.0,
                                              "radius": 1.5, "frame": "map"}
    eng.add_observation("odom", T0 + 1, Pose(3.5, 4.0), {"speed": 0.1})
    eng.add_observation("odom", T0 + 2, Pose(5.0, 4.0), {"speed": 0.1})  # 2 m away
    hits = search(eng, stream="odom", near="kitchen")  # any case; the place's radius
    assert [r["pose"]["x"] for r in hits["results"]] == [3.5]
    assert search(eng, stream="odom", near="kitchen", radius=2.5)["count"] == 2
    eng.close()
    md = "".join(p.read_text() for p in (tmp_path / "m" / "notes").glob("*.md"))
    assert "· places ·" in md and "Place 'Kitchen'" in md
    eng = make_engine(tmp_path / "m", clock, pose)
    streams = json.loads(eng.streams())
    assert streams["places"] == [named["place"]]
    # A place is not an observation: it is neither a stream nor a search result.
    assert "places" not in {s["name"] for s in streams["streams"]}
    assert all(r["stream"] == "odom" for r in search(eng, semantic_query="kitchen")["results"])
    eng.close()


def test_places_are_moved_renamed_and_removed(tmp_path):
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(None))
    # No pose: naming "here" is unavailable, naming a given point works.
    out = save(eng, place="dock")
    assert out["error"]["code"] == "unavailable" and "give x and y" in out["error"]["message"]
    save(eng, place="dock", x=1.0, y=1.0)
    save(eng, place="dock", x=2.0, y=1.0)  # naming it again moves it, radius kept
    save(eng, place="charging dock", x=2.0, y=1.0, radius=1.0)  # rename: new name...
    gone = save(eng, place="dock", remove=True)  # ... and the old one removed
    assert gone["removed"] is True and gone["place"]["name"] == "dock"
    places = json.loads(eng.streams())["places"]
    assert places == [{"name": "charging dock", "x": 2.0, "y": 1.0, "radius": 1.0,
                       "frame": None}]
    out = search(eng, near="dock")
    assert out["error"]["code"] == "bad_request"
    assert "unknown place 'dock'. Valid: charging dock." in out["error"]["message"]
    # Hand edits and other processes: the registry re-reads the notes when they change.
    root = tmp_path / "m"
    eng2 = make_engine(root, FakeClock(), PoseBox(None))
    save(eng2, place="porch", x=-1.0, y=0.0)
    assert [p["name"] for p in json.loads(eng.streams())["places"]] == ["charging dock",
                                                                         "porch"]
    eng2.close()
    eng.close()


def test_place_saves_are_checked(tmp_path):
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(Pose(0, 0)))
    for bad, words in [({"place": "x", "note": "n"}, "not both"),
                       ({"place": "x", "x": 1.0}, "together"),
                       ({"place": "a\nb"}, "one line"),
                       ({"place": "x", "radius": 0}, "radius")]:
        out = save(eng, **bad)
        assert out["error"]["code"] == "bad_request" and words in out["error"]["message"]
    assert json.loads(eng.streams())["places"] == []
    eng.close()


# ---- visits ----------------------------------------------------------------------------------

def walk(eng, points, t0=T0, dt=1.0, stream="odom"):
    """Odometry keyframes along `points` (x, y), one every dt seconds."""
    for i, (x, y) in enumerate(points):
        eng.add_observation(stream, t0 + i * dt, Pose(x, y), {"speed": 0.5})


def line(x0, x1, n):
    return [(x, 0.0) for x in np.linspace(x0, x1, n)]


def test_visits_answer_how_long_how_often_and_when(tmp_path):
    clock = FakeClock(T0 + 1000)
    eng = make_engine(tmp_path / "m", clock, PoseBox(Pose(0, 0)))
    # Out along x from -5 to 5 (11 s), back (11 s), out again: three passes of the circle
    # r=1 around the origin, each 2 s long (the crossings are interpolated).
    path = line(-5, 5, 11) + line(5, -5, 11)[1:] + line(-5, 5, 11)[1:]
    walk(eng, path)
    out = search(eng, visits=True, near_x=0.0, near_y=0.0, radius=1.0)
    assert out["ok"] and out["count"] == 3, out
    assert set(out) >= {"visits", "count", "total_s", "first", "last"}
    assert [v["duration_s"] for v in out["visits"]] == pytest.approx([2.0, 2.0, 2.0])
    assert out["total_s"] == pytest.approx(6.0)
    assert out["first"] == pytest.approx(T0 + 4.0) and out["last"] == pytest.approx(T0 + 26.0)
    assert "notes" not in out  # the pose history is complete
    # A time window: only the second pass; a named place works the same.
    save(eng, place="origin", x=0.0, y=0.0, radius=1.0)
    out = search(eng, visits=True, near="origin", after=T0 + 8, before=T0 + 20)
    assert out["count"] == 1 and out["first"] == pytest.approx(T0 + 14.0)
    # Never there.
    out = search(eng, visits=True, near_x=0.0, near_y=3.0, radius=1.0)
    assert out["count"] == 0 and out["first"] is None and out["total_s"] == 0
    eng.close()


@pytest.mark.parametrize("duration", [30.0, 150.0])
def test_visits_of_the_sample_path_are_the_tours_own(duration):
    """find_visits over the sample flat's true path (20 Hz, as a dense pose history) finds the
    visits the question set's ground truth solves from the tour's segments, for every place
    it names: the same count, and times within 0.05 s (one sample), because find_visits
    interpolates a crossing on the straight line between two samples, which is exact on a
    move and off by less than a sample where the path turns between them at the edge."""
    from memory_node.core.visits import find_visits
    from memory_node.sim import generate as gen

    world = gen._build_world(7, duration)
    t = np.arange(0.0, duration + 1e-9, 0.05)
    pose = world.traj.pose(t)
    track = np.column_stack([t + gen.EPOCH_S, pose[:, 0], pose[:, 1]])
    places, _ = gen._places(world)
    assert len(places) >= 12
    for name, p in places.items():
        truth = gen._true_visits(world, p["x"], p["y"], p["radius"])
        found, gaps = find_visits(track, (p["x"], p["y"]), p["radius"], gap_s=1.0)
        assert truth and not gaps, name
        assert len(found) == len(truth), (name, found, truth)
        np.testing.assert_allclose([(v.start, v.end) for v in found], truth, atol=0.05,
                                   rtol=0, err_msg=name)


def test_a_gap_in_the_pose_history_splits_a_visit_and_is_reported(tmp_path):
    eng = make_engine(tmp_path / "m", FakeClock(T0 + 1000), PoseBox(None), visit_gap_s=30)
    walk(eng, [(0.0, 0.0)] * 5)                 # T0 .. T0+4 at the origin
    walk(eng, [(0.0, 0.0)] * 5, t0=T0 + 100)    # nothing for 96 s, then there again
    out = search(eng, visits=True, near_x=0.0, near_y=0.0, radius=1.0)
    assert out["count"] == 2 and out["total_s"] == pytest.approx(8.0)
    assert any("no pose history" in n and "96 s" in n for n in out["notes"])
    # A window with no pose at all says so.
    out = search(eng, visits=True, near_x=0.0, near_y=0.0, radius=1.0, after=T0 + 300,
                 before=T0 + 400)
    assert out["count"] == 0 and "no pose history in this time window" in out["notes"][0]
    eng.close()


def test_visits_need_a_place_and_near_here_uses_the_current_pose(tmp_path):
    pose = PoseBox(Pose(5.0, 0.0))
    eng = make_engine(tmp_path / "m", FakeClock(T0 + 100), pose)
    walk(eng, line(-5, 5, 11))
    out = search(eng, visits=True)
    assert out["error"]["code"] == "bad_request" and "needs a place" in out["error"]["message"]
    out = search(eng, visits=True, near_here=True, radius=0.5)
    assert out["count"] == 1 and out["last"] == pytest.approx(T0 + 10)
    eng.close()


# ---- what was seen over there ----------------------------------------------------------------

def test_seen_near_finds_an_object_only_ever_seen_from_across_the_room(tmp_path):
    """A recording (rendered frames of the sample flat) where the window is only ever seen
    from more than the search radius away: a plain radius search finds nothing there,
    seen_near finds the frames that show it, and only those."""
    from memory_node.sim.floorplan import build_flat
    from memory_node.sim.generate import CAMERA
    from memory_node.sim.render import Renderer

    plan = build_flat()
    window = plan.feature("window").center
    renderer = Renderer(plan, CAMERA)
    hfov = math.radians(CAMERA.hfov_deg)
    eng = make_engine(tmp_path / "m", FakeClock(T0 + 100), PoseBox(None))
    frames, truth = [], {}
    # Standing 2.1 m and more from the window: looking at it, then away from it.
    for i, (x, y, yaw) in enumerate([(6.4, 6.1, math.atan2(8.0 - 6.1, 7.3 - 6.4)),
                                     (5.5, 6.0, 0.9), (6.4, 6.1, -math.pi / 2),
                                     (4.6, 6.7, math.pi), (8.5, 4.5, -math.pi / 2)]):
        img, info = renderer.render(x, y, yaw, None)
        frames.append(CameraFrame(T0 + i, Pose(x, y, yaw=yaw), img,
                                  view=View(x, y, yaw, hfov, 6.0)))
        truth[T0 + i] = info.window_fraction > 0.05
    eng.add_stream_rows("camera", frames)
    wx, wy = float(window[0]), float(window[1])
    near = search(eng, stream="camera", near_x=wx, near_y=wy, radius=1.5, k=10)
    assert near["count"] == 0  # the robot never stood within 1.5 m of the window
    seen = search(eng, stream="camera", near_x=wx, near_y=wy, radius=1.5, seen_near=True,
                  k=10)
    assert {r["t"] for r in seen["results"]} == {t for t, shows in truth.items() if shows}
    assert seen["count"] == 2
    # With a semantic query the same filter holds (filters before ranking).
    ranked = search(eng, stream="camera", semantic_query="bright white light", near_x=wx,
                    near_y=wy, radius=1.5, seen_near=True, k=10)
    assert {r["t"] for r in ranked["results"]} == {r["t"] for r in seen["results"]}
    eng.close()


# ---- compaction keeps the answers ------------------------------------------------------------

def test_compaction_keeps_extremes_visit_ends_and_noted_frames(tmp_path):
    """Many frames of one cell, recorded a day before the wall clock: compaction counts ages
    from the recording, keeps the brightest frame, the frame a note names and each visit's
    first and last frame; the rest is archived and still searchable with include_archived."""
    clock = FakeClock(T0 + 600)
    eng = make_engine(tmp_path / "m", clock, PoseBox(Pose(0.2, 0.2)), retention_s=120,
                      thin_cell_s=300, fold_similarity=2.0)
    bright = [0.3 + 0.01 * i for i in range(30)]
    bright[17] = 0.674  # the brightest, in the middle of a visit
    for i, b in enumerate(bright):
        text = "a red bicycle leaning on the wall" if i == 5 else f"an empty corridor {i}"
        eng.add_observation("camera", T0 + 2 * i, Pose(0.2, 0.3), {"brightness": b}, text)
    eng.mark_recording_clock(simulated=True)  # what the recorder does under use_sim_time
    for i in range(3):  # later rows: the recording ends at T0 + 590
        eng.add_observation("odom", T0 + 588 + i, Pose(5, 5), {"speed": 0.0})
    noted = search(eng, stream="camera", order_by="time", k=4)["results"][3]
    eng.save(f"Frame #{noted['id']} shows the broken lamp.")
    before = search(eng, stream="camera", order_by="-brightness", k=1)["results"][0]
    clock.t = T0 + 86400 * 2  # the wall clock, two days on: "store" counts from the note
    out = json.loads(eng.compact())
    assert out["ok"] and out["clock"] == "store" and out["now"] == pytest.approx(T0 + 600)
    # kept: the brightest, the noted, the first (also the darkest) and the last (the newest)
    assert out["thinned"] == 30 - 4, out
    assert out["kept"]["extreme_tag"] == 2 and out["kept"]["note_reference"] == 1
    assert out["kept"]["visit_first_last"] == 2 and out["kept"]["cell_newest"] == 1
    after = search(eng, stream="camera", order_by="-brightness", k=1)["results"][0]
    assert after["id"] == before["id"] and after["tags"]["brightness"] == 0.674
    assert search(eng, stream="camera", k=100)["count"] == 4
    assert noted["id"] in {r["id"] for r in search(eng, stream="camera", k=100)["results"]}
    # Archived rows: found with include_archived, marked, by filter and by meaning.
    everything = search(eng, stream="camera", k=100, include_archived=True)
    assert everything["count"] == 30
    assert sum(1 for r in everything["results"] if r.get("archived")) == 26
    hit = search(eng, stream="camera", semantic_query="bicycle", include_archived=True, k=1)
    assert hit["results"][0]["text"] == "a red bicycle leaning on the wall"
    assert hit["results"][0]["archived"] is True
    assert search(eng, stream="camera", semantic_query="bicycle", k=1)["results"][0]["text"] \
        != "a red bicycle leaning on the wall"
    assert hit["results"][0]["score"] > 0.4
    near = search(eng, stream="camera", near_x=0.2, near_y=0.3, radius=0.5,
                  include_archived=True, k=100)
    assert near["count"] == 30
    # Visits read archived poses too: thinning does not shorten the pose history.
    eng.close()


def test_compaction_on_the_node_clock_when_asked(tmp_path):
    clock = FakeClock(T0 + 86400 * 2)
    eng = make_engine(tmp_path / "m", clock, PoseBox(None), retention_s=120,
                      compact_clock="clock")
    eng.mark_recording_clock(simulated=True)
    for i in range(5):
        eng.add_observation("odom", T0 + i, Pose(0.1, 0.1), {"speed": 0.0})
    out = json.loads(eng.compact())
    assert out["clock"] == "clock" and out["now"] == pytest.approx(T0 + 86400 * 2)
    assert out["thinned"] == 3  # first and last of the one visit stay (speed is all alike)
    visits = search(eng, visits=True, near_x=0.0, near_y=0.0, radius=1.0)
    assert visits["count"] == 1 and visits["total_s"] == pytest.approx(4.0)
    eng.close()


def test_a_keyframes_view_reaches_the_wall_it_faces():
    from memory_node.core.views import forward_yaw, mounted, view_range

    # A wall 3 m ahead (x = 3), points every 10 cm; the view 90° wide along +x.
    wall = np.array([[3.0, y] for y in np.arange(-5, 5, 0.1)])
    assert view_range(wall, 0.0, 0.0, 0.0, math.radians(90), 8.0) == pytest.approx(4.1, abs=0.2)
    assert view_range(wall, 0.0, 0.0, math.pi, math.radians(90), 8.0) == 8.0  # facing away
    assert view_range(None, 0.0, 0.0, 0.0, 1.0, 6.0) == 6.0
    # An optical frame looks along its z axis: camera_link -> optical is (-.5, .5, -.5, .5).
    optical = np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0]], float)
    assert forward_yaw(optical, optical=True) == pytest.approx(0.0)
    assert forward_yaw(np.eye(3), optical=False) == pytest.approx(0.0)
    x, y, yaw = mounted(Pose(1.0, 1.0, yaw=math.pi / 2), (0.3, 0.0, 0.0))
    assert (x, y, yaw) == pytest.approx((1.0, 1.3, math.pi / 2))


def test_a_robot_standing_at_its_newest_pose_is_still_there(tmp_path):
    """A standing robot keeps a keyframe only every max_interval: 8 s after its newest pose
    inside the circle it is still there; a day later it is not known to be."""
    clock = FakeClock(T0 + 12)
    eng = make_engine(tmp_path / "m", clock, PoseBox(None))
    walk(eng, [(-3.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (0.0, 0.0)], dt=1.0)  # last pose T0 + 3
    out = search(eng, visits=True, near_x=0.0, near_y=0.0, radius=1.0)
    assert out["count"] == 1 and out["last"] == pytest.approx(T0 + 12)
    assert out["total_s"] == pytest.approx(12 - 1.0)
    clock.t = T0 + 86400
    out = search(eng, visits=True, near_x=0.0, near_y=0.0, radius=1.0)
    assert out["last"] == pytest.approx(T0 + 3) and out["total_s"] == pytest.approx(2.0)
    eng.close()
