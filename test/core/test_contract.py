"""The contract models: docs/design.md's field tables are the models', every field it names is
in them, and the engine answers each mistake with a short, useful message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from engine_support import T0, FakeClock, make_engine

from memory_node.core.contract import SaveNote, SearchQuery, field_table
from memory_node.core.types import Pose

DOCS = Path(__file__).resolve().parents[2] / "docs" / "design.md"


@pytest.mark.parametrize(("marker", "model"), [("search-fields", SearchQuery),
                                               ("save-fields", SaveNote)])
def test_design_doc_field_tables_are_the_models(marker, model):
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(f"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", text, re.S)
    assert found, f"docs/design.md lacks the {marker} table"
    assert found[1] == field_table(model), (
        "docs/design.md's field table differs from the model: regenerate it with "
        "`python -m memory_node.core.contract`")


def test_every_design_field_is_in_the_models():
    search = {"stream", "semantic_query", "near_x", "near_y", "radius", "near_here",
              "after_seconds_ago", "before_seconds_ago", "after", "before", "tags",
              "order_by", "k", "near", "seen_near", "include_archived", "robot", "map",
              "visits"}
    assert search <= set(SearchQuery.model_fields)
    assert {"note", "tags", "place", "radius", "x", "y", "remove"} == set(SaveNote.model_fields)


@pytest.fixture
def eng(tmp_path):
    engine = make_engine(tmp_path / "mem", FakeClock(T0 + 100))
    engine.add_observation("camera", T0, Pose(0, 0), {"brightness": 0.8, "people": 2,
                                                     "person": True, "colors": ["red"]},
                           "bright")
    engine.add_observation("odom", T0, Pose(0, 0), {"speed": 0.3})
    yield engine
    engine.close()


def error(eng, query) -> str:
    out = json.loads(eng.search(query if isinstance(query, str) else json.dumps(query)))
    assert out["ok"] is False and out["error"]["code"] == "bad_request", out
    return out["error"]["message"]


@pytest.mark.parametrize(("query", "message"), [
    ({"stream": "camera", "order_by": "-brightnes"},
     "unknown order_by '-brightnes' in camera; did you mean '-brightness'? Valid: score, "
     "time, -time, or a numeric tag with or without '-': brightness, people."),
    ({"stream": "camera", "tags": {"persn": True}},
     "unknown tag 'persn' in camera; did you mean 'person'? Valid: brightness, colors, "
     "people, person."),
    ({"stream": "odom", "tags": {"brightness": {"gt": 0.1}}}, "unknown tag 'brightness' in odom"),
    ({"stream": "camera", "order_by": "colors"},
     "order_by 'colors': tag 'colors' holds no numbers in camera. Numeric tags: brightness, "
     "people."),
    ({"radius": 3}, "'radius' needs a centre"),
    ({"near": "kitchen"}, "unknown place 'kitchen'. Valid: none yet."),
    ({"robot": "go2-1"}, "'robot' is not supported by this memory"),
    ("[1, 2]", "search query is a JSON list"),
    ({"sematic_query": "door"}, "did you mean 'semantic_query'?"),
])
def test_mistakes_are_answered_with_the_choices(eng, query, message):
    assert message in error(eng, query)


def test_valid_tag_searches_are_unchanged(eng):
    out = json.loads(eng.search(json.dumps({"stream": "camera", "order_by": "-people"})))
    assert out["ok"] and out["count"] == 1
    # Tags the engine writes itself are always valid filters, before any row has them.
    out = json.loads(eng.search(json.dumps({"stream": "events", "tags": {"repeats": 2}})))
    assert out["ok"] and out["count"] == 0
    # A tag written by another process after the catalogue was read is found in the rows.
    eng.add_observation("camera", T0 + 1, Pose(0, 0), {"faces": 1}, "a face")
    out = json.loads(eng.search(json.dumps({"stream": "camera", "order_by": "-faces"})))
    assert out["ok"] and out["results"][0]["tags"] == {"faces": 1}


def test_removing_an_unknown_place_names_the_places(eng):
    out = json.loads(eng.save(json.dumps({"place": "kitchn", "remove": True})))
    assert out["error"]["code"] == "bad_request"
    assert "unknown place 'kitchn'" in out["error"]["message"]
    json.loads(eng.save(json.dumps({"place": "kitchen", "x": 1.0, "y": 2.0})))
    out = json.loads(eng.save(json.dumps({"place": "kitchn", "remove": True})))
    assert "did you mean 'kitchen'?" in out["error"]["message"]


def _answer_classes() -> list[type]:
    from memory_node.core.contract import Answer

    found, todo = [], [Answer]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            todo.append(sub)
    return sorted({c for c in found if c.omit_if_none}, key=lambda c: c.__name__)


@pytest.mark.parametrize("model", _answer_classes(), ids=lambda c: c.__name__)
def test_unset_optional_answer_fields_are_left_out_of_the_json(model):
    """A field an answer leaves unset (its `omit_if_none`) is absent from the JSON, not
    null; set, it is there; every other field is there even when null."""
    from memory_node.core.engine import dumps

    required = {name: _sample(f.annotation) for name, f in model.model_fields.items()
                if f.is_required()}
    bare = json.loads(dumps(model(**required)))
    assert not set(model.omit_if_none) & set(bare)
    assert set(model.model_fields) - set(model.omit_if_none) <= set(bare)
    for name in model.omit_if_none:
        value = _sample(model.model_fields[name].annotation)
        assert name in json.loads(dumps(model(**required, **{name: value}))), name


def _sample(annotation) -> object:
    """A valid value of a field's type (the first choice of a union or literal)."""
    from typing import Literal, Union, get_args, get_origin

    from pydantic import BaseModel

    origin = get_origin(annotation)
    if origin in (Union, type(int | None)):
        choices = [a for a in get_args(annotation) if a is not type(None)]
        return _sample(choices[0])
    if origin is Literal:
        return get_args(annotation)[0]
    if origin in (list, dict):
        return origin()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation(**{n: _sample(f.annotation) for n, f in
                             annotation.model_fields.items() if f.is_required()})
    return {bool: True, int: 1, float: 1.5, str: "x"}[annotation]


def test_an_answer_with_a_field_from_a_newer_server_keeps_it_and_took_ms_last():
    from memory_node.core.contract import SearchAnswer, read_answer
    from memory_node.core.engine import dumps

    text = ('{"ok": true, "results": [{"id": 3, "stream": "camera", "t": 1.0, "pose": '
            '{"source": "none", "quality": "good"}, "tags": {}, "text": "", "ref": null, '
            '"lens": "wide"}], "count": 1, "took_ms": 0.5, "cursor": "abc"}')
    answer = read_answer(text, SearchAnswer)
    assert isinstance(answer, SearchAnswer)
    out = json.loads(dumps(answer))
    assert list(out) == ["ok", "results", "count", "cursor", "took_ms"]
    item = out["results"][0]
    assert item["lens"] == "wide" and item["pose"]["quality"] == "good"
    assert "robot" not in item and "archived" not in item and "age_s" not in item["pose"]


def test_an_omitted_field_must_be_declared():
    from typing import ClassVar

    from memory_node.core.contract import Answer

    with pytest.raises(TypeError, match="undeclared"):
        class Broken(Answer):  # noqa: F841 - defining it is the test
            omit_if_none: ClassVar[frozenset[str]] = frozenset({"nowhere"})
            here: int = 0
