"""The pose-history index answers visits as the exact scan of every posed row does.

Property: over random trajectories (walks with pauses, jumps, pauses longer than the gap
threshold, rows of equal time, rows written out of time order, rows without a pose, rows
archived by compaction and rows deleted outright), visits to random circles in random windows
from the index's excerpt are the exact scan's: the same visits with the same start, end and
duration, and the same gaps. The excerpt holds no approximation, so "the same" is equality.
"""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest
from engine_support import T0, FakeClock, PoseBox, make_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_node.core.store import pose_index
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose, View, view_covers
from memory_node.core.visits import find_visits, find_visits_in


def _trajectory(seed: int, n: int) -> list[Observation]:
    """A robot-like walk: steps of ~0.1-0.5 s, pauses, long silences, teleports (a new map
    origin), duplicate times, and a few rows without a pose."""
    rng = np.random.default_rng(seed)
    t, x, y = T0, 0.0, 0.0
    rows = []
    for i in range(n):
        u = rng.random()
        if u < 0.04:
            t += float(rng.uniform(5, 120))  # a silence, often longer than the gap threshold
        elif u < 0.08:
            pass  # the same time as the previous row (another stream's keyframe)
        else:
            t += float(rng.uniform(0.05, 3.0))
        if rng.random() < 0.02:
            x, y = float(rng.uniform(-8, 8)), float(rng.uniform(-8, 8))  # a jump
        else:
            x += float(rng.normal(0, 0.4))
            y += float(rng.normal(0, 0.4))
        pose = None if rng.random() < 0.05 else Pose(x, y)
        stream = ("odom", "camera", "lidar")[i % 3]
        view = None
        if stream == "camera" and pose is not None:  # the camera a little ahead of the pose
            yaw = float(rng.uniform(-math.pi, math.pi))
            view = View(x + 0.3 * math.cos(yaw), y + 0.3 * math.sin(yaw), yaw,
                        float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.5, 5.0)))
        rows.append(Observation(stream=stream, t=t, pose=pose, view=view))
    return rows


def _store(path, rows: list[Observation], seed: int) -> SqliteObservationStore:
    """The rows written in batches in a shuffled order (an import beside the recorder, late
    camera frames), some archived and some deleted afterwards."""
    rng = np.random.default_rng(seed + 1)
    store = SqliteObservationStore(path)
    order = np.arange(len(rows))
    if rng.random() < 0.5:
        cut = rng.integers(0, len(rows) + 1)
        order = np.concatenate([order[cut:], order[:cut]])  # two halves, the later first
    for i in range(0, len(order), 16):
        if rng.random() < 0.3:
            chunk = order[i:i + 16]
            order[i:i + 16] = chunk[rng.permutation(len(chunk))]
    for i in range(0, len(order), 16):
        batch = [rows[j] for j in order[i:i + 16]]
        store.insert(batch, [None] * len(batch))
    ids = [o.id for o in rows]
    archived = [i for i in ids if rng.random() < 0.2]
    store.archive(archived, "test")
    gone = [i for i in ids if rng.random() < 0.05]
    with store._wlock:  # a budget's downsampling: rows removed outright, kept or archived
        store._w.executemany("DELETE FROM observations WHERE id = ?", [(i,) for i in gone])
        store._w.executemany("DELETE FROM archive WHERE id = ?", [(i,) for i in gone])
    return store


def _same(store, centre, radius, gap_s, t_min, t_max, now):
    lo = None if t_min is None else t_min - gap_s
    hi = None if t_max is None else t_max + gap_s
    exact = find_visits(store.pose_track(lo, hi), centre, radius, gap_s, t_min, t_max, now)
    excerpt = store.pose_excerpt(centre, radius, lo, hi)
    assert excerpt is not None
    got = find_visits_in(excerpt, centre, radius, gap_s, t_min, t_max, now)
    assert got == exact
    return exact, excerpt


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(0, 400),
       queries=st.lists(st.tuples(st.floats(-6, 6), st.floats(-6, 6), st.floats(0.05, 6),
                                  st.sampled_from([4.0, 10.0, 30.0]),
                                  st.one_of(st.none(), st.floats(-50, 900)),
                                  st.one_of(st.none(), st.floats(0, 1000)),
                                  st.floats(0, 1100)), min_size=1, max_size=8))
def test_visits_from_the_index_equal_the_exact_scan(tmp_path_factory, seed, n, queries):
    rows = _trajectory(seed, n)
    store = _store(tmp_path_factory.mktemp("pose") / "memory.db", rows, seed)
    try:
        for cx, cy, radius, gap_s, a, length, now in queries:
            t_min = None if a is None else T0 + a
            t_max = None if length is None or t_min is None else t_min + length
            _same(store, (cx, cy), radius, gap_s, t_min, t_max, T0 + now)
    finally:
        store.close()


def test_the_excerpt_reads_only_the_circle_s_neighbourhood(tmp_path):
    """A robot pacing a 12 m x 8 m loop for hours: a visits question about one spot reads
    the passes by it, not the hours; the answer is still the exact scan's."""
    store = SqliteObservationStore(tmp_path / "memory.db")
    ts = np.arange(0.0, 4 * 3600.0, 0.5)
    a = ts * 0.8 / 31.4 * 2 * np.pi
    rows = [Observation(stream="odom", t=T0 + float(t), pose=Pose(6 * np.cos(v), 4 * np.sin(v)))
            for t, v in zip(ts, a, strict=True)]
    for i in range(0, len(rows), 500):
        store.insert(rows[i:i + 500], [None] * len(rows[i:i + 500]))
    (visits, _gaps), excerpt = _same(store, (6.0, 0.0), 1.0, 30.0, None, None, T0 + 4 * 3600)
    assert len(visits) > 300  # one per lap
    assert len(excerpt.track) < len(rows) / 3
    store.close()


def test_the_index_is_a_cache_rebuilt_from_the_rows(tmp_path):
    """Dropped (or from an older memory_node that had none), the index is built again from
    the rows when the store opens, and a store that is opened again keeps it."""
    path = tmp_path / "memory.db"
    store = SqliteObservationStore(path)
    rows = _trajectory(3, 300)
    store.insert(rows, [None] * len(rows))
    before = store.pose_excerpt((0.0, 0.0), 2.0)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE pose_cells")
    conn.execute("DROP TRIGGER pose_track_ins")
    conn.close()
    store = SqliteObservationStore(path)
    after = store.pose_excerpt((0.0, 0.0), 2.0)
    assert after is not None and before is not None
    assert np.array_equal(after.track, before.track) and after.gaps == before.gaps
    assert pose_index.is_current(store._w)
    store.close()


def test_engine_visits_answer_is_the_exact_scan_s(tmp_path):
    """Through the engine's search: the answer from the index (radius 1.5) equals the answer
    computed from the whole track, and a circle too big for the index takes the whole track."""
    rows = _trajectory(11, 600)
    clock = FakeClock(max(o.t for o in rows) + 5)  # now: just after the last row
    eng = make_engine(tmp_path / "m", clock, PoseBox(None), visit_gap_s=30)
    for o in rows:
        eng.add_observation(o.stream, o.t, o.pose, {})
    store = eng.store
    for q in ({"near_x": 0.5, "near_y": -0.5, "radius": 1.5},
              {"near_x": 1.0, "near_y": 1.0, "radius": 3.0, "after_seconds_ago": 1500},
              {"near_x": 0.0, "near_y": 0.0, "radius": 40.0}):
        got = json.loads(eng.search(json.dumps({"visits": True, **q})))
        assert got["ok"]
        t_min = None if "after_seconds_ago" not in q else clock() - q["after_seconds_ago"]
        spans, _ = find_visits(store.pose_track(None if t_min is None else t_min - 30),
                               (q["near_x"], q["near_y"]), q["radius"], 30.0, t_min,
                               None if t_min is None else clock(), now=clock())
        assert got["count"] == len(spans)
        assert got["total_s"] == pytest.approx(round(sum(v.duration for v in spans), 3))
        assert [(v["start"], v["end"]) for v in got["visits"]] == \
            [(round(v.start, 3), round(v.end, 3)) for v in spans][-len(got["visits"]):]
    eng.close()


def _brute_newest(store, filt, k):
    """The newest k kept rows passing the filter, by reading every row."""
    rows = store.rows()
    nx, ny = filt.near
    views = store.views_of([o.id for o in rows]) if filt.seen_near else {}

    def sees(o):
        v = views.get(o.id)
        return v is not None and view_covers(v.x, v.y, v.yaw, v.hfov, v.range, nx, ny,
                                             filt.radius)

    hit = [o for o in rows if (o.pose is not None
           and (o.pose.x - nx) * (o.pose.x - nx) + (o.pose.y - ny) * (o.pose.y - ny)
           <= filt.radius * filt.radius or sees(o))
           and (filt.streams is None or o.stream in filt.streams)
           and (filt.t_min is None or o.t >= filt.t_min)
           and (filt.t_max is None or o.t <= filt.t_max)]
    hit.sort(key=lambda o: (o.t, o.id), reverse=True)
    return [o.id for o in hit[:k]]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(0, 400),
       queries=st.lists(st.tuples(st.floats(-6, 6), st.floats(-6, 6), st.floats(0.05, 6),
                                  st.one_of(st.none(), st.floats(-50, 900)),
                                  st.one_of(st.none(), st.floats(0, 1000)),
                                  st.integers(1, 40),
                                  st.sampled_from([None, ("odom",), ("camera", "lidar")]),
                                  st.booleans()),
                        min_size=1, max_size=8))
def test_newest_rows_in_a_disc_read_through_the_index_equal_every_row_sorted(
        tmp_path_factory, seed, n, queries):
    """A place search newest first (`ordered` with `near`, or `seen_near`: rows whose camera
    view covers the disc too), read back in time through the index's buckets, returns the
    rows that sorting every row in the disc returns."""
    from memory_node.core.types import RowFilter

    store = _store(tmp_path_factory.mktemp("near") / "memory.db", _trajectory(seed, n), seed)
    try:
        for cx, cy, radius, a, length, k, streams, seen in queries:
            t_min = None if a is None else T0 + a
            t_max = None if length is None or t_min is None else t_min + length
            filt = RowFilter(streams=streams, near=(cx, cy), radius=radius, t_min=t_min,
                             t_max=t_max, seen_near=seen)
            got = [o.id for o in store.ordered(filt, "-time", k)]
            assert got == _brute_newest(store, filt, k)
    finally:
        store.close()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(0, 300), cx=st.floats(-6, 6),
       cy=st.floats(-6, 6), radius=st.floats(0.05, 6), batch=st.integers(1, 5))
def test_newest_ranges_cover_every_sample_in_the_disc_once(tmp_path_factory, seed, n, cx, cy,
                                                           radius, batch):
    """Read a few buckets per cell at a time, the ranges are disjoint, newest first, and every
    sample in the disc (kept or archived) lies in one of them."""
    store = _store(tmp_path_factory.mktemp("ranges") / "memory.db", _trajectory(seed, n), seed)
    try:
        with store._rlock:
            ranges = list(pose_index.newest_ranges(store._r, (cx, cy), radius, None, None,
                                                   batch=batch))
        for (a0, b0), (_a1, b1) in zip(ranges, ranges[1:], strict=False):
            assert a0 < b0 and b1 <= a0
        track = store.pose_track()
        inside = track[np.hypot(track[:, 1] - cx, track[:, 2] - cy) <= radius]
        for t in inside[:, 0]:
            assert sum(a <= t < b for a, b in ranges) == 1
    finally:
        store.close()
