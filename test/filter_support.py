"""Shared by the filter-compiler property tests (test/core and test/fleet): generated rows as a
robot's store holds them, and generated RowFilters, to run through RowFilter.matches and each
compiler of the filter.

Coordinates, times, radii and tag numbers are mostly on a 0.5 grid, so rows land exactly on a
disc's edge, a time bound or a range bound often; the rest are arbitrary floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose, RowFilter, View

T0 = 1_700_000_000.0
STREAMS = ("camera", "events", "odom")
TAG_KEYS = ("person", "brightness", "colors", "n", "label")
STRINGS = ("red", "green", "1", "true", "")
NUMBERS = (-1, 0, 1, 2, -0.5, 0.0, 0.5, 1.0, 2.5)
WORLD = "map"  # the frame a robot's own map is
OTHER = "lab"  # a second frame: another map


@dataclass
class StoredRow:
    """A generated row, as stored: the Observation (id, view and archived flag set) and the
    robot and map a fleet store holds it under."""

    obs: Observation
    robot: str
    map_id: str | None


@dataclass(repr=False)
class Stored:
    """A store and the rows it holds (a short repr: hypothesis prints it with a failure)."""

    store: Any
    rows: list[StoredRow]

    def __repr__(self) -> str:
        return f"<{len(self.rows)} stored rows>"

    def explain(self, got: set, want: set, key: Any) -> str:
        """The rows a compiler selected that matches() does not pass, and the other way."""
        by_key = {key(r): r for r in self.rows}
        extra = [by_key[k] for k in sorted(got - want)]
        missing = [by_key[k] for k in sorted(want - got)]
        return f"selected but not matching: {extra}; matching but not selected: {missing}"


def _grid(rng: np.random.Generator, lo: float, hi: float) -> float:
    if rng.random() < 0.8:
        return float(np.round(rng.uniform(lo, hi) * 2) / 2)
    return float(rng.uniform(lo, hi))


def _scalar(rng: np.random.Generator) -> Any:
    kind = rng.integers(4)
    if kind == 0:
        return bool(rng.random() < 0.5)
    if kind == 1:
        return NUMBERS[rng.integers(len(NUMBERS))]
    if kind == 2:
        return STRINGS[rng.integers(len(STRINGS))]
    return round(float(rng.uniform(-3, 3)), 3)


def _tags(rng: np.random.Generator) -> dict[str, Any]:
    tags: dict[str, Any] = {}
    for key in TAG_KEYS:
        roll = rng.random()
        if roll < 0.35:
            continue  # missing
        if roll < 0.42:
            tags[key] = None
        elif roll < 0.6:
            tags[key] = [None if rng.random() < 0.1 else _scalar(rng)
                         for _ in range(rng.integers(4))]
        else:
            tags[key] = _scalar(rng)
    return tags


def make_rows(rng: np.random.Generator, n: int) -> list[Observation]:
    """`n` rows of mixed streams: poses (some None, some on another map's frame), camera
    views (some without a pose), tags of every JSON type a save accepts, times out of order."""
    rows = []
    for i in range(n):
        stream = STREAMS[i % len(STREAMS)]
        pose = None
        if rng.random() > 0.15:
            frame = OTHER if rng.random() < 0.2 else WORLD
            pose = Pose(_grid(rng, -6, 6), _grid(rng, -6, 6), frame=frame)
        view = None
        if stream == "camera" and rng.random() < 0.7:
            vx, vy = (pose.x, pose.y) if pose is not None else (_grid(rng, -6, 6),
                                                                _grid(rng, -6, 6))
            view = View(vx, vy, float(rng.uniform(-math.pi, math.pi)),
                        float(rng.uniform(0.3, 2.2)), float(rng.uniform(0.5, 6.0)))
        rows.append(Observation(stream=stream, t=T0 + _grid(rng, 0, 200), pose=pose,
                                tags=_tags(rng), view=view))
    # At the origin, where float64 squares of tiny differences round to 0.
    rows[0].pose = Pose(0.0, 0.0, frame=WORLD)
    rows[1].view = View(0.0, 0.0, 0.0, 1.0, 3.0)
    return rows


def fill_store(root: Path, robot: str, seed: int, n: int = 300) -> list[StoredRow]:
    """A real SQLite store at root/memory.db holding `n` generated rows, a sixth of them
    archived through the store's own archive; the rows as the fleet will hold them."""
    rng = np.random.default_rng(seed)
    rows = make_rows(rng, n)
    store = SqliteObservationStore(root / "memory.db")
    try:
        store.insert(rows, [None] * len(rows))
        gone = [o.id for o in rows if rng.random() < 1 / 6]
        assert store.archive(gone, "thinned") == len(gone)
    finally:
        store.close()
    out = []
    for obs in rows:
        obs.archived = obs.id in gone
        out.append(StoredRow(obs, robot, row_map(robot, obs)))
    return out


def row_map(robot: str, obs: Observation) -> str | None:
    """The map memory-sync files a row under: its pose's frame's map (the world frame is the
    robot's map, `<robot>/<frame>` otherwise), the robot's map for a view without a pose, and
    none for a row without either. Every robot here is synced with map id "home"."""
    if obs.pose is not None:
        return "home" if obs.pose.frame == WORLD else f"{robot}/{obs.pose.frame}"
    return "home" if obs.view is not None else None


_grid_num = st.integers(-14, 14).map(lambda k: k / 2)
_coord = st.one_of(_grid_num, st.floats(-7, 7))
_number = st.one_of(st.sampled_from(NUMBERS), st.floats(-3, 3))
_range = st.dictionaries(st.sampled_from(("gt", "gte", "lt", "lte")), _number, min_size=1,
                         max_size=2)
_want = st.one_of(st.none(), st.booleans(), st.sampled_from(NUMBERS), st.sampled_from(STRINGS),
                  _range)
_time = st.one_of(st.integers(-2, 402).map(lambda k: T0 + k / 2), st.floats(T0 - 1, T0 + 201))
_span = st.one_of(st.integers(-4, 400).map(lambda k: k / 2), st.floats(-1, 200))


@st.composite
def row_filters(draw: st.DrawFn, fleet: bool = False) -> RowFilter:
    """A RowFilter of any mix of fields; `fleet` adds robots and map_id."""
    near = draw(st.one_of(st.none(), st.tuples(_coord, _coord)))
    radius = draw(st.one_of(st.sampled_from((0.0, 0.5, 1.0, 2.5, 5.0)), st.floats(0, 9)))
    streams = draw(st.one_of(st.none(), st.lists(st.sampled_from(STREAMS), max_size=2,
                                                 unique=True).map(tuple)))
    robots, map_id = None, None
    if fleet:
        robots = draw(st.one_of(st.none(), st.lists(st.sampled_from(("r1", "r2", "r9")),
                                                    max_size=2, unique=True).map(tuple)))
        map_id = draw(st.one_of(st.none(), st.sampled_from(("home", "r1/lab", "elsewhere"))))
    t_min = draw(st.one_of(st.none(), _time))
    # An end after the start mostly (a window that holds rows), sometimes before (empty).
    t_max = draw(st.one_of(st.none(), _time if t_min is None else _span.map(lambda d: t_min + d)))
    tags = draw(st.one_of(st.just({}),
                          st.dictionaries(st.sampled_from(TAG_KEYS), _want, max_size=2)))
    return RowFilter(
        streams=streams, near=near, radius=radius, t_min=t_min, t_max=t_max, tags=tags,
        seen_near=draw(st.booleans()), include_archived=draw(st.booleans()),
        robots=robots, map_id=map_id)
