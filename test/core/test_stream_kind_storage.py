"""A stream kind registered by the tests alone (test/stream_support.py) is stored, compacted and
evicted as the built-in sensor streams are, with no code of its own beyond its decoder:
ingestion, compaction and the disk budget read the registry (core/streams.py), not a list of
names."""

from __future__ import annotations

import json

from engine_support import T0, FakeClock, make_engine

from memory_node.core.ingest import SensorRow
from memory_node.core.types import Pose

HOUR = 3600.0
NOW = T0 + 3 * HOUR
MIB = 1024 * 1024


def _hour_of_readings(eng) -> list[int]:
    """A reading every 10 s for an hour, standing at one spot: the same words each time."""
    rows = [SensorRow(T0 + 10.0 * i, Pose(0.0, 0.0), {"range_m": 2.0}, "obstacle 2.00 m ahead")
            for i in range(360)]
    return eng.add_stream_rows("range", rows)


def _streams(eng) -> dict:
    answer = json.loads(eng.streams())
    assert answer["ok"], answer
    return {s["name"]: s for s in answer["streams"]}


def test_a_registered_kind_is_stored_searchable_and_thinned_like_a_sensor(range_stream,
                                                                         tmp_path):
    eng = make_engine(tmp_path / "m", FakeClock(NOW), compact_interval_s=0,
                      retention_s=HOUR, fold_similarity=2.0)
    try:
        ids = _hour_of_readings(eng)
        assert len(ids) == 360
        assert json.loads(eng.save("the robot waited by the wall"))["ok"]
        found = json.loads(eng.search(json.dumps({"stream": "range", "k": 1,
                                                  "semantic_query": "obstacle ahead"})))
        assert found["ok"] and found["results"][0]["text"] == "obstacle 2.00 m ahead"
        assert found["results"][0]["tags"]["range_m"] == 2.0
        done = json.loads(eng.compact())
        assert done["thinned"] > 300  # a cell keeps its newest, first and last readings
        left = _streams(eng)
        assert left["range"]["count"] == 360 - done["thinned"]
        assert left["events"]["count"] == 1
    finally:
        eng.close()


def test_the_disk_budget_removes_a_registered_kinds_rows_and_keeps_notes(range_stream,
                                                                         tmp_path):
    root = tmp_path / "m"
    eng = make_engine(root, FakeClock(NOW), compact_interval_s=0, fold_similarity=2.0)
    try:
        _hour_of_readings(eng)
        assert json.loads(eng.save("the robot waited by the wall"))["ok"]
        size = eng.disk.meter.total()
    finally:
        eng.close()
    eng = make_engine(root, FakeClock(NOW), compact_interval_s=0, fold_similarity=2.0,
                      disk_budget_mb=size * 0.5 / MIB)
    try:
        report = json.loads(eng.compact())["budget"]
        assert report["rows_removed"] > 0
        by_name = _streams(eng)
        assert by_name["range"]["evicted"] > 0
        assert by_name["events"]["count"] == 1 and by_name["events"]["evicted"] == 0
    finally:
        eng.close()
