"""RowFilter.matches: the written-down meaning of every filter field, case by case.

The stores' compilers are checked against it in test_filter_compilers.py; these are the edge
cases a user would notice, stated once.
"""

from __future__ import annotations

import math

from memory_node.core.types import Observation, Pose, RowFilter, View


def _obs(stream: str = "camera", t: float = 100.0, xy: tuple[float, float] | None = (0.0, 0.0),
         tags: dict | None = None, view: View | None = None,
         archived: bool = False) -> Observation:
    pose = None if xy is None else Pose(*xy)
    return Observation(stream=stream, t=t, pose=pose, tags=tags or {}, view=view,
                       archived=archived)


def test_no_fields_pass_every_live_row():
    assert RowFilter().matches(_obs())
    assert RowFilter().matches(_obs(xy=None, tags={"a": None}))


def test_streams_none_or_empty_are_all_streams():
    row = _obs(stream="events")
    assert RowFilter(streams=("events", "camera")).matches(row)
    assert not RowFilter(streams=("camera",)).matches(row)
    assert RowFilter(streams=()).matches(row)


def test_time_bounds_are_inclusive_and_an_empty_window_passes_nothing():
    row = _obs(t=100.0)
    assert RowFilter(t_min=100.0, t_max=100.0).matches(row)
    assert not RowFilter(t_min=100.000001).matches(row)
    assert not RowFilter(t_max=99.999999).matches(row)
    assert not RowFilter(t_min=101.0, t_max=99.0).matches(row)


def test_disc_boundary_is_inclusive():
    near = RowFilter(near=(0.0, 0.0), radius=5.0)
    assert near.matches(_obs(xy=(3.0, 4.0)))  # exactly 5 m away
    assert not near.matches(_obs(xy=(3.0, 4.000001)))
    assert RowFilter(near=(1.0, 1.0), radius=0.0).matches(_obs(xy=(1.0, 1.0)))


def test_a_row_without_pose_is_never_near():
    assert not RowFilter(near=(0.0, 0.0), radius=1e9).matches(_obs(xy=None))
    assert not RowFilter(near=(0.0, 0.0), radius=1e9, seen_near=True).matches(_obs(xy=None))


def test_seen_near_passes_a_camera_row_whose_view_covers_the_disc():
    # At (0, 0) looking along +x, 90 degrees wide, 5 m deep: (4, 0) is in view, (-4, 0) behind.
    view = View(0.0, 0.0, 0.0, math.pi / 2, 5.0)
    row = _obs(xy=(0.0, 0.0), view=view)
    ahead = RowFilter(near=(4.0, 0.0), radius=0.5)
    assert not ahead.matches(row)  # standing 4 m away is not near
    assert RowFilter(near=(4.0, 0.0), radius=0.5, seen_near=True).matches(row)
    assert not RowFilter(near=(-4.0, 0.0), radius=0.5, seen_near=True).matches(row)
    # A view without a pose still counts; a disc just past the view's range reached by its
    # radius does too.
    assert RowFilter(near=(4.0, 0.0), radius=0.5, seen_near=True).matches(
        _obs(xy=None, view=view))
    assert RowFilter(near=(5.4, 0.0), radius=0.5, seen_near=True).matches(row)
    assert not RowFilter(near=(5.6, 0.0), radius=0.5, seen_near=True).matches(row)


def test_seen_near_still_passes_rows_standing_in_the_disc():
    assert RowFilter(near=(0.0, 0.0), radius=1.0, seen_near=True).matches(
        _obs(stream="events", xy=(0.5, 0.5)))


def test_tag_equality_and_list_membership():
    row = _obs(tags={"person": "Bob", "colors": ["red", "white"], "n": 3})
    assert RowFilter(tags={"person": "Bob"}).matches(row)
    assert not RowFilter(tags={"person": "bob"}).matches(row)
    assert RowFilter(tags={"colors": "red"}).matches(row)
    assert not RowFilter(tags={"colors": "blue"}).matches(row)
    assert RowFilter(tags={"n": 3}).matches(row) and RowFilter(tags={"n": 3.0}).matches(row)
    assert not RowFilter(tags={"n": "3"}).matches(row)  # a string is not a number
    assert not RowFilter(tags={"missing": "Bob"}).matches(row)
    assert not RowFilter(tags={"person": "Bob", "colors": "blue"}).matches(row)  # all must


def test_true_and_false_equal_one_and_zero():
    assert RowFilter(tags={"person": True}).matches(_obs(tags={"person": 1}))
    assert RowFilter(tags={"person": 1.0}).matches(_obs(tags={"person": True}))
    assert RowFilter(tags={"person": 0.0}).matches(_obs(tags={"person": False}))
    assert RowFilter(tags={"person": False}).matches(_obs(tags={"person": [0, "x"]}))
    assert not RowFilter(tags={"person": True}).matches(_obs(tags={"person": 2}))
    assert not RowFilter(tags={"person": True}).matches(_obs(tags={"person": "true"}))


def test_none_is_a_missing_or_null_tag():
    want = RowFilter(tags={"person": None})
    assert want.matches(_obs(tags={}))
    assert want.matches(_obs(tags={"person": None}))
    assert not want.matches(_obs(tags={"person": False}))
    assert not want.matches(_obs(tags={"person": []}))
    assert not want.matches(_obs(tags={"person": [None]}))


def test_a_range_passes_numbers_only_not_booleans():
    bright = RowFilter(tags={"brightness": {"gte": 0.5, "lt": 1.0}})
    assert bright.matches(_obs(tags={"brightness": 0.5}))
    assert not bright.matches(_obs(tags={"brightness": 1.0}))
    assert bright.matches(_obs(tags={"brightness": 0.75}))
    one = RowFilter(tags={"flag": {"gte": 1}})
    assert one.matches(_obs(tags={"flag": 1}))
    assert not one.matches(_obs(tags={"flag": True}))  # true is not a number here
    assert not one.matches(_obs(tags={"flag": "5"}))
    assert not one.matches(_obs(tags={"flag": [5]}))  # nor is a list of numbers
    assert not one.matches(_obs(tags={}))
    assert RowFilter(tags={"x": {"gt": -1}}).matches(_obs(tags={"x": 0}))
    assert not RowFilter(tags={"x": {"lte": -1}}).matches(_obs(tags={"x": 0}))


def test_archived_rows_pass_only_with_include_archived():
    row = _obs(archived=True)
    assert not RowFilter().matches(row)
    assert RowFilter(include_archived=True).matches(row)
    assert RowFilter(include_archived=True).matches(_obs())


def test_robots_keep_those_robots_rows():
    row = _obs()
    assert RowFilter(robots=("r1", "r2")).matches(row, robot="r2")
    assert not RowFilter(robots=("r1",)).matches(row, robot="r2")
    assert not RowFilter(robots=("r1",)).matches(row)  # a row of no robot is no robot's
    assert RowFilter(robots=()).matches(row, robot="r2")


def test_map_filters_only_with_near():
    row = _obs(xy=(1.0, 0.0))
    assert RowFilter(map_id="lab").matches(row, map_id="home")  # no near: nothing filtered
    on_home = RowFilter(near=(0.0, 0.0), radius=2.0, map_id="home")
    assert on_home.matches(row, map_id="home")
    assert not on_home.matches(row, map_id="lab")
    assert not on_home.matches(row)  # a row on no map is on no named map
    assert RowFilter(near=(0.0, 0.0), radius=2.0).matches(row, map_id="lab")  # any map
    view = View(0.0, 0.0, 0.0, math.pi / 2, 5.0)
    seen = RowFilter(near=(4.0, 0.0), radius=0.5, seen_near=True, map_id="home")
    assert seen.matches(_obs(xy=None, view=view), map_id="home")
    assert not seen.matches(_obs(xy=None, view=view), map_id="lab")


def test_a_centre_a_hair_off_a_row_squares_its_distance_to_zero():
    # A difference below 1.6e-162 squares to 0.0 in float64 (the PostgreSQL compiler once
    # raised "underflow" there instead): the row is in even a zero-radius disc.
    row = _obs(xy=(0.0, 0.0), view=View(0.0, 0.0, 0.0, 1.0, 5.0))
    assert RowFilter(near=(5e-324, 0.0), radius=0.0).matches(row)
    assert RowFilter(near=(0.0, 1e-170), radius=0.0, seen_near=True).matches(_obs(
        xy=None, view=View(0.0, 0.0, 0.0, 1.0, 5.0)))
    assert not RowFilter(near=(1e-160, 0.0), radius=0.0).matches(row)
