"""Validation of search/save payloads: every malformed input is a clear bad_request."""

from __future__ import annotations

import pytest

from memory_node.core.errors import BadRequest
from memory_node.core.query import parse_save, parse_search

STREAMS = {"camera", "lidar", "odom", "events", "summaries"}
NOW = 1_000_000.0


def search(raw: str):
    return parse_search(raw, now=NOW, known_streams=STREAMS, k_default=5, k_max=50,
                        max_bytes=65536)


def test_plain_text_is_a_semantic_query_over_everything():
    req = search("  red door ")
    assert req.semantic_query == "red door"
    assert req.streams is None and req.order_by == "score" and req.k == 5


def test_json_fields_become_absolute_filters():
    req = search('{"stream": "camera", "semantic_query": "door", "near_x": 1, "near_y": -2,'
                 ' "radius": 3, "after_seconds_ago": 600, "before_seconds_ago": 60,'
                 ' "tags": {"person": true, "brightness": {"gte": 0.5}}, "k": 7}')
    assert req.streams == ("camera",)
    assert req.near == (1.0, -2.0) and req.radius == 3.0
    assert req.t_min == NOW - 600 and req.t_max == NOW - 60
    assert req.tags == {"person": True, "brightness": {"gte": 0.5}}
    assert req.k == 7 and req.order_by == "score"


def test_absolute_times_accept_iso_and_combine_with_relative_ones():
    req = search('{"after": "1970-01-12T13:46:20Z", "after_seconds_ago": 10}')
    assert req.t_min == NOW - 10  # the later of the two bounds wins
    req = search('{"before": 999000.5}')
    assert req.t_max == 999000.5


def test_defaults_without_semantic_query_are_newest_first():
    req = search("{}")
    assert req.order_by == "-time" and not req.has_filters


def test_k_above_the_cap_is_capped_not_refused():
    req = search('{"k": 1000}')
    assert req.k == 50 and req.k_capped


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("", "empty search query"),
        ("{not json", "malformed JSON"),
        ("[1, 2]", "is a JSON list"),  # JSON, but not a search: refused, not searched for
        ("42", "is a JSON number"),
        ("null", "is JSON null"),
        ("[kitchen] door", None),  # not JSON: words
        ('"red door"', None),  # a JSON string is its text
        ('{"radius": NaN, "near_x": 0, "near_y": 0}', "NaN"),
        ('{"near_x": Infinity, "near_y": 0}', "Infinity"),
        ('{"near_x": 1e999, "near_y": 0}', "finite"),
        ('{"near_x": 1}', "together"),
        ('{"near_x": 0, "near_y": 0, "radius": -1}', "> 0"),
        ('{"near_x": "1", "near_y": 0}', "must be a number"),
        ('{"stream": "kitchen"}', "unknown stream 'kitchen'"),
        ('{"stream": 5}', "'stream' must be"),
        ('{"k": 0}', "positive integer"),
        ('{"k": -3}', "positive integer"),
        ('{"k": 2.5}', "positive integer"),
        ('{"k": true}', "positive integer"),
        ('{"after_seconds_ago": -5}', ">= 0"),
        ('{"after": "yesterday"}', "ISO-8601"),
        ('{"order_by": "score"}', "needs a 'semantic_query'"),
        ('{"order_by": "brightness; DROP TABLE"}', "order_by"),
        ('{"tags": {"bad key": 1}}', "tag name"),
        ('{"tags": {"b": {"between": 1}}}', "takes only"),
        ('{"tags": [1]}', "'tags' must be an object"),
        ('{"semantic_quary": "typo"}',
         "unknown field 'semantic_quary' in the search query; did you mean 'semantic_query'?"),
        ('{"radius": 3}', "'radius' needs a centre"),
        ('{"stream": "camra"}', "did you mean 'camera'?"),
        ('{"near": "kitchen", "near_x": 0, "near_y": 0}', "one centre"),
        ('{"near_here": "yes"}', "true or false"),
        ('{"near_here": true, "near_x": 0, "near_y": 0}', "not both"),
    ],
)
def test_malformed_searches_name_what_is_wrong(raw, fragment):
    if fragment is None:
        assert search(raw).semantic_query == raw.strip('"')
        return
    with pytest.raises(BadRequest) as err:
        search(raw)
    assert fragment in err.value.message


def test_huge_query_is_refused():
    with pytest.raises(BadRequest, match="70000 bytes; the limit is 65536 bytes"):
        search("x" * 70000)


def test_save_plain_and_json():
    assert parse_save(" Met Bob ", max_bytes=100).text == "Met Bob"
    req = parse_save('{"note": "Met Bob", "tags": {"person": "Bob", "colors": ["red"]}}',
                     max_bytes=1000)
    assert req.text == "Met Bob" and req.tags == {"person": "Bob", "colors": ["red"]}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("   ", "empty note"),
        ('{"note": 5}', "'note' must be a string"),
        ('{"note": "x", "tags": {"t": NaN}}', "NaN"),
        ('{"note": "x", "color": "red"}', "unknown field 'color' in the note"),
        ('{"note": "x", "radius": 2}', "'radius' goes with 'place'"),
        ('{"note": "x", "place": "kitchen"}', "not both"),
        ("[\"a note\"]", "is a JSON list"),
        ('{"note": "x"', "malformed JSON"),
        ("a\x00b", "NUL"),
    ],
)
def test_malformed_saves(raw, fragment):
    with pytest.raises(BadRequest) as err:
        parse_save(raw, max_bytes=1000)
    assert fragment in err.value.message


def test_ten_megabyte_note_is_refused():
    with pytest.raises(BadRequest, match="limit is 32768 bytes"):
        parse_save("x" * 10_000_000, max_bytes=32768)
