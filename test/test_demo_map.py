"""The demo's top-down picture (demo_out/memory_map.png) reads in metres: round ticks labelled
on both axes, a scale bar of a round length, the frame's name; drawn from a real store."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose
from memory_node.demo import MapView, draw_map, scale_bar_m, tick_step, ticks
from memory_node.session import Sample


@pytest.mark.parametrize(("lo", "hi", "most", "want"), [
    (0.0, 10.0, 10, [float(i) for i in range(11)]),
    (-1.5, 11.0, 12, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
    (-1.5, 11.0, 6, [0.0, 5.0, 10.0]),
    (0.05, 0.47, 5, [0.1, 0.2, 0.3, 0.4]),
    (-12.0, -7.0, 5, [-12.0, -11.0, -10.0, -9.0, -8.0, -7.0]),
    (-230.0, 480.0, 8, [-200.0, -100.0, 0.0, 100.0, 200.0, 300.0, 400.0]),
])
def test_ticks_are_round_metres_within_the_range(lo, hi, most, want):
    got = ticks(lo, hi, most)
    assert got == pytest.approx(want)
    assert len(got) <= most + 1 and all(lo <= v <= hi for v in got)
    mantissa = tick_step(hi - lo, most) / 10 ** np.floor(np.log10(tick_step(hi - lo, most)))
    assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-9


@pytest.mark.parametrize(("span", "bar"), [(12.5, 2.0), (3.0, 0.5), (100.0, 20.0),
                                           (9.0, 1.0), (50.0, 10.0)])
def test_the_scale_bar_is_a_round_length_within_a_fifth_of_the_width(span, bar):
    assert scale_bar_m(span) == pytest.approx(bar)


def _dark(pixel) -> bool:
    return int(np.max(pixel)) < 140


def test_the_axes_are_drawn_where_their_metres_are():
    view = MapView(-1.5, 6.5, -2.0, 4.0, scale=50.0)
    img = view.canvas()
    assert img.shape == (view.top + 300 + view.bottom + view.legend,
                         max(view.left + 400 + view.right, view.min_width), 3)
    drawn = view.draw_axes(img, "odom")
    assert drawn["x_ticks"] == pytest.approx([-1, 0, 1, 2, 3, 4, 5, 6])
    assert drawn["y_ticks"] == pytest.approx([-2, -1, 0, 1, 2, 3, 4])
    bottom = view.top + view.plot_h
    for x in drawn["x_ticks"]:  # a tick mark under the plot at each x value
        u, _ = view.px(x, 0.0)
        assert _dark(img[bottom + 3, u]), x
    for y in drawn["y_ticks"]:  # and left of it at each y value
        _, v = view.px(0.0, y)
        assert _dark(img[v, view.left - 3]), y
    b0, b1, yb = drawn["scale_bar_px"]
    assert drawn["scale_bar_m"] == pytest.approx(1.0)  # 8 m wide: 1 m
    assert b1 - b0 == round(1.0 * view.scale)
    assert all(_dark(img[yb, u]) for u in range(b0, b1 + 1))
    # Labels were written: ink beside the ticks and in the top-left corner (the frame name).
    assert (img[bottom + 8:bottom + 22, view.left:view.left + view.plot_w] < 140).any()
    assert (img[view.top + 6:view.top + 22, view.left + 8:view.left + 80] < 140).any()


def test_draw_map_writes_the_plan_with_axes(tmp_path):
    truth = {"path": [{"t": 0.0, "x": 0.5, "y": 0.5}, {"t": 5.0, "x": 3.5, "y": 2.0}],
             "rooms": {"hall": {"box": [0.0, 0.0, 4.0, 3.0]}},
             "front_door": {"x": 0.0, "y": 1.0}, "window": {"x": 4.0, "y": 2.5}}
    memory = tmp_path / "memory"
    store = SqliteObservationStore(memory / "memory.db")
    rows = [Observation("camera", 100.0 + i, Pose(0.5 + i, 0.5 + 0.5 * i, frame="map"),
                        {"brightness": 0.2 * i}) for i in range(4)]
    store.insert(rows, [None] * len(rows))
    store.close()
    png = draw_map(tmp_path / "memory_map.png", Sample(tmp_path, truth), memory,
                   hits=[{"pose": {"x": 2.5, "y": 1.5}}], notes=[{"pose": {"x": 1.0, "y": 1.0}}])
    img = cv2.imread(str(png))
    view = MapView(-1.5, 5.5, -1.5, 4.5)  # the extents plus draw_map's 1.5 m margin
    assert img.shape[:2] == view.size
    bare = view.canvas()
    view.draw_axes(bare, "map")
    # The axes are those of the bare drawing (its tick marks and scale bar pixels)...
    b0, b1, yb = view.draw_axes(view.canvas(), "map")["scale_bar_px"]
    assert np.array_equal(img[yb, b0:b1 + 1], bare[yb, b0:b1 + 1])
    # ...and each keyframe is a dot where its pose is.
    for obs in rows:
        assert obs.pose is not None
        u, v = view.px(obs.pose.x, obs.pose.y)
        assert not np.array_equal(img[v, u], bare[v, u])
