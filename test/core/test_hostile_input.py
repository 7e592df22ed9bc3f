"""Hostile and malformed requests: each is a `bad_request` with a short answer, at most one log
line, a log that grows by a few hundred bytes at most, and stored data left byte-identical."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from engine_support import FakeClock, PoseBox, make_engine

from memory_node.core.types import Pose

BIG = "1" + "0" * 400  # an integer literal no float can hold (1e400 written out)
HUGE = "1" + "0" * 5000  # more digits than Python converts by default (4300)
DEEP = "[" * 700 + "]" * 700
DEEP_OBJ = '{"a": ' * 700 + "1" + "}" * 700
LOG_BUDGET = 300  # bytes one request may add to the log

# (service, payload): every one must be refused as bad_request.
MALFORMED = [
    # numbers that overflow a float, in every numeric field
    ("search", '{"near_x": %s, "near_y": 0}' % BIG),
    ("search", '{"near_x": 0, "near_y": -%s}' % BIG),
    ("search", '{"near_x": 1, "near_y": 0, "radius": %s}' % BIG),
    ("search", '{"after": %s}' % BIG),
    ("search", '{"before": -%s}' % BIG),
    ("search", '{"after_seconds_ago": %s}' % BIG),
    ("search", '{"before_seconds_ago": %s}' % BIG),
    ("search", '{"semantic_query": "door", "min_score": %s}' % BIG),
    ("search", '{"tags": {"brightness": {"gt": %s}}}' % BIG),
    ("search", '{"tags": {"brightness": {"lte": -%s}}}' % BIG),
    ("save", '{"note": "x", "tags": {"a": %s}}' % BIG),
    ("save", '{"note": "x", "tags": {"a": 1%s.5}}' % ("0" * 400)),
    # integers beyond the 4300-digit conversion limit
    ("search", '{"k": %s}' % HUGE),
    ("search", '{"tags": {"a": %s}}' % HUGE),
    ("save", '{"note": "x", "tags": {"a": %s}}' % HUGE),
    # tag integers beyond 64 bits
    ("search", '{"tags": {"a": %d}}' % 2**64),
    ("search", '{"tags": {"a": %d}}' % (-2**63 - 1)),
    ("search", '{"tags": {"a": {"gt": %d}}}' % 2**64),
    ("save", '{"note": "x", "tags": {"a": %d}}' % 2**64),
    ("save", '{"note": "x", "tags": {"a": [1, %d]}}' % 2**63),
    # lone surrogates, raw and escaped, in queries, notes and tags
    ("search", "\ud800 where is the door"),
    ("search", '{"semantic_query": "\\ud800"}'),
    ("search", '{"semantic_query": "door \ud800"}'),
    ("search", '{"tags": {"person": "\\udfff"}}'),
    ("save", '{"note": "x", "tags": {"person": "\\ud800"}}'),
    ("save", '{"note": "x", "tags": {"colors": ["red", "\\ud800"]}}'),
    ("save", "met someone \udc80"),
    # nesting 700 deep
    ("save", '{"note": "x", "tags": {"a": %s}}' % DEEP),
    ("search", '{"tags": {"a": %s}}' % DEEP),
    ("search", '{"semantic_query": %s}' % DEEP),
    ("search", '{"stream": %s}' % DEEP),
    ("save", '{"note": %s}' % DEEP),
    ("search", DEEP_OBJ),
    ("save", '{"note": "x", "tags": %s}' % DEEP_OBJ),
]

# NUL in every text field (ROS cuts a String at NUL; the engine refuses it everywhere).
WITH_NUL = [
    ("search", "where is\x00 the door"),
    ("search", '{"semantic_query": "door\\u0000red"}'),
    ("search", '{"semantic_query": "door\x00red"}'),
    ("search", '{"stream": "events\\u0000"}'),
    ("search", '{"tags": {"person": "Bob\\u0000"}}'),
    ("search", '{"order_by": "-brightness\\u0000"}'),
    ("search", '{"after": "2025-11-30T00:00:00\\u0000"}'),
    ("save", "Met Bob\x00 at the door"),
    ("save", '{"note": "Met Bob\\u0000 at the door"}'),
    ("save", '{"note": "Met Bob", "tags": {"person": "Bob\\u0000Alice"}}'),
    ("save", '{"note": "Met Bob", "tags": {"colors": ["red\\u0000"]}}'),
]


class LogBytes(logging.Handler):
    """Formats every record as a log file would (tracebacks included) and counts it."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def size(self) -> int:
        return sum(len(s.encode("utf-8", "backslashreplace")) + 1 for s in self.lines)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "mem"
    eng = make_engine(root, FakeClock(), PoseBox(Pose(1.0, 2.0)))
    eng.save('{"note": "Met Bob at the front door", "tags": {"person": "Bob"}}')
    eng.add_observation("camera", eng.clock() - 5, Pose(1, 2), {"brightness": 0.5}, "a door")
    yield eng, root
    eng.close()


@pytest.fixture
def log_bytes():
    handler = LogBytes()
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


def stored(root):
    notes = {p.name: p.read_bytes() for p in (root / "notes").glob("*.md")}
    con = sqlite3.connect(root / "memory.db")
    try:
        rows = con.execute("SELECT id, stream, t, tags, text FROM observations "
                           "ORDER BY id").fetchall()
    finally:
        con.close()
    return rows, notes


@pytest.mark.parametrize(("service", "payload"), MALFORMED + WITH_NUL,
                         ids=[f"{s}-{i}" for i, (s, _) in enumerate(MALFORMED + WITH_NUL)])
def test_malformed_request_is_a_short_bad_request(engine, log_bytes, service, payload):
    eng, root = engine
    before = stored(root)
    answer = getattr(eng, service)(payload)
    out = json.loads(answer)
    assert out["ok"] is False and out["error"]["code"] == "bad_request", out
    assert out["error"]["message"] and len(answer) < 1000
    assert len(log_bytes.lines) <= 1 and log_bytes.size() <= LOG_BUDGET, log_bytes.lines
    assert stored(root) == before


def test_nul_is_named_in_the_answer(engine):
    eng, _ = engine
    for service, payload in WITH_NUL:
        message = json.loads(getattr(eng, service)(payload))["error"]["message"]
        assert "NUL" in message or "unknown stream" in message, (payload, message)


def test_numbers_within_64_bits_and_shallow_tags_still_work(engine):
    eng, _ = engine
    saved = json.loads(eng.save('{"note": "Counted the boxes in the store room", "tags": '
                                '{"boxes": %d, "sizes": [[1, 2], [3]]}}' % (2**63 - 1)))
    assert saved["ok"] is True, saved
    res = json.loads(eng.search('{"tags": {"boxes": %d}}' % (2**63 - 1)))
    assert [r["id"] for r in res["results"]] == [saved["id"]]
    res = json.loads(eng.search('{"near_x": 1e300, "near_y": 0, "radius": 1}'))
    assert res["ok"] is True and res["count"] == 0


def test_unexpected_failure_is_one_short_log_line(tmp_path, log_bytes):
    """A request that hits a real fault (a table dropped under the engine) answers `internal`
    with one log line, not a traceback per request."""
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox())
    try:
        eng.save("a note")
        con = sqlite3.connect(tmp_path / "m" / "memory.db")
        con.execute("DROP TABLE vector_log")
        con.commit()
        con.close()
        log_bytes.lines.clear()
        out = json.loads(eng.search('{"stream": "events"}'))
        assert out["ok"] is False and out["error"]["code"] == "internal"
        assert len(log_bytes.lines) == 1 and log_bytes.size() <= LOG_BUDGET, log_bytes.lines
        assert "vector_log" in log_bytes.lines[0]
    finally:
        eng.close()
