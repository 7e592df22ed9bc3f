"""Rows by id from the SQLite store: what a search's results are read with, for a handful of
ids (point lookups) and for many (one IN list), live and archived."""

from __future__ import annotations

import pytest

from memory_node.core.store.rows import POINT_LOOKUPS_MAX
from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import Observation, Pose


@pytest.fixture
def store(tmp_path):
    st = SqliteObservationStore(tmp_path / "memory.db")
    rows = [Observation(stream="camera" if i % 2 else "lidar", t=100.0 + i,
                        pose=Pose(x=float(i), y=-float(i), yaw=0.5, frame="map") if i % 3
                        else None,
                        tags={"n": i, "person": i % 4 == 0}, text=f"row {i}", ref=f"f/{i}.jpg")
            for i in range(60)]
    ids = st.insert(rows, [None] * len(rows))
    yield st, ids
    st.close()


@pytest.mark.parametrize("count", [1, 5, POINT_LOOKUPS_MAX, POINT_LOOKUPS_MAX + 1, 50])
def test_rows_by_id_come_whole_whatever_the_order_and_count(store, count):
    st, ids = store
    want = list(reversed(ids[:count]))
    got = st.get(want)
    assert sorted(got) == sorted(want)
    for i, oid in enumerate(ids[:count]):
        row = got[oid]
        assert (row.id, row.t, row.text, row.ref) == (oid, 100.0 + i, f"row {i}", f"f/{i}.jpg")
        assert row.tags == {"n": i, "person": i % 4 == 0}
        assert row.stream == ("camera" if i % 2 else "lidar")
        if i % 3:
            assert row.pose == Pose(x=float(i), y=-float(i), yaw=0.5, frame="map")
        else:
            assert row.pose is None
        assert not row.archived


@pytest.mark.parametrize("count", [3, POINT_LOOKUPS_MAX + 4])
def test_unknown_and_repeated_ids_and_archived_rows(store, count):
    st, ids = store
    asked = ids[:count] + ids[:2] + [10_000_000, -1]
    assert sorted(st.get(asked)) == sorted(ids[:count])
    st.archive(ids[:2], "test")
    live = st.get(ids[:count])
    assert sorted(live) == sorted(ids[2:count])  # set aside: not a live row any more
    every = st.get(ids[:count], include_archived=True)
    assert sorted(every) == sorted(ids[:count])
    assert [every[i].archived for i in ids[:count]] == [True, True] + [False] * (count - 2)
    assert every[ids[0]].text == "row 0" and every[ids[1]].pose == Pose(x=1.0, y=-1.0, yaw=0.5,
                                                                         frame="map")
