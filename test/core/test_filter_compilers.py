"""Property test: the robot's compilers of a RowFilter select exactly the rows RowFilter.matches
passes — SQLite's WHERE (candidates and ordered, live and archived rows) and the numpy mask
over an index's (t, x, y) columns (`row_mask`, and `ExactIndex.filter_positions`, the
planner's path). The PostgreSQL compiler is held to the same reference in
test/fleet/test_filter_compilers_fleet.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from filter_support import Stored, fill_store, row_filters
from hypothesis import HealthCheck, example, given, settings

from memory_node.core.store.sqlite_store import SqliteObservationStore
from memory_node.core.types import RowFilter
from memory_node.core.vectors import ExactIndex
from memory_node.core.vectors.exact import row_mask
from memory_node.core.vectors.index_cache import row_meta

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Stored:
    root = tmp_path_factory.mktemp("filters")
    rows = fill_store(root, "r1", seed=7)
    store = SqliteObservationStore(root / "memory.db")
    yield Stored(store, rows)
    store.close()


@pytest.fixture(scope="module")
def columns(stored) -> tuple[np.ndarray, np.ndarray, ExactIndex]:
    """Every row's (t, x, y) as an index keeps them (NaN: no pose), in an in-memory index."""
    rows = stored.rows
    ids = np.array([r.obs.id for r in rows], np.int64)
    meta = np.array([row_meta(r.obs.t, *((r.obs.pose.x, r.obs.pose.y) if r.obs.pose
                                         else (None, None))) for r in rows])
    idx = ExactIndex(2)
    vecs = np.tile(np.array([1.0, 0.0], np.float32), (len(ids), 1))
    for lo in range(0, len(ids), 50):  # in batches, times out of order: the lazy time order
        idx.add(ids[lo:lo + 50], vecs[lo:lo + 50], meta[lo:lo + 50])
    return ids, meta, idx


def test_the_rows_cover_the_cases(stored):
    """The generated rows hold what the filters must tell apart (else the test proves little)."""
    rows = [r.obs for r in stored.rows]
    assert any(o.pose is None for o in rows) and any(o.view and not o.pose for o in rows)
    assert any(o.archived for o in rows) and not all(o.archived for o in rows)
    values = [v for o in rows for v in o.tags.values()]
    for kind in (bool, int, float, str, list, type(None)):
        assert any(type(v) is kind for v in values), kind


@SETTINGS
@given(filt=row_filters())
# Found by this test: the place box dropped a row float64 puts in the disc (a centre 1e-170
# off a row at the origin: the squared distance rounds to 0).
@example(filt=RowFilter(near=(5e-324, 0.0), radius=0.0))
@example(filt=RowFilter(near=(0.0, 1e-170), radius=0.0, seen_near=True))
@example(filt=RowFilter(near=(0.0, 1e-170), radius=0.0, include_archived=True))
def test_sqlite_selects_what_matches_passes(stored, filt: RowFilter):
    store, rows = stored.store, stored.rows
    want = {r.obs.id for r in rows if filt.matches(r.obs)}
    got = set(store.candidates(filt).ids.tolist())
    assert got == want, stored.explain(got, want, lambda r: r.obs.id)
    ordered = store.ordered(filt, "-time", len(rows) + 1)
    assert len(ordered) == len(want) and {o.id for o in ordered} == want
    archived = {r.obs.id for r in rows if r.obs.archived}
    assert all(o.archived == (o.id in archived) for o in ordered)


@SETTINGS
@given(filt=row_filters())
@example(filt=RowFilter(near=(5e-324, 0.0), radius=0.0))
def test_numpy_mask_selects_what_matches_passes(columns, stored, filt: RowFilter):
    ids, meta, idx = columns
    rows = stored.rows
    # The mask decides time and the disc; streams are chosen per index, the rest is SQL's.
    own = RowFilter(t_min=filt.t_min, t_max=filt.t_max, near=filt.near, radius=filt.radius,
                    include_archived=True)
    want = {r.obs.id for r in rows if own.matches(r.obs)}
    masked = set(ids[row_mask(filt, meta)].tolist())
    assert masked == want, stored.explain(masked, want, lambda r: r.obs.id)
    pos = idx.filter_positions(filt.t_min, filt.t_max, filt.near, filt.radius)
    got = idx.ids_at(pos).tolist()
    assert len(got) == len(set(got)) and set(got) == want
