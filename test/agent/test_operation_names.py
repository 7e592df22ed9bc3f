"""One name per operation: the engine and every client answer the same `ask_*` (models) and
JSON-text names, and the in-process client's answers are the engine's."""

from __future__ import annotations

import inspect
import json

import pytest
from engine_support import FakeClock, PoseBox, make_engine

from memory_node.agent.client import EngineClient, MemoryClient
from memory_node.agent.ros_client import RosClient
from memory_node.core.contract import ErrorAnswer, SearchAnswer, SearchQuery
from memory_node.core.engine import MemoryEngine, dumps
from memory_node.core.types import Pose
from memory_node.fleet.engine import FleetEngine

OPERATIONS = ("search", "save", "compact", "streams")
NAMES = {*OPERATIONS, *(f"ask_{op}" for op in OPERATIONS)}
# The names one operation had before: gone from the engine and the clients.
RETIRED = {"answer_search", "answer_save", "answer_compact", "answer_streams", "run_query",
           "remember", "save_note", "run_compaction", "list_streams"}
# The fleet engine is the engine over another store: a subclass that kept an old name would
# define a method nothing calls any more.
HOLDERS = (MemoryEngine, FleetEngine, MemoryClient, EngineClient, RosClient)


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


@pytest.mark.parametrize("cls", HOLDERS, ids=lambda c: c.__name__)
def test_engine_and_clients_answer_the_same_operation_names(cls):
    public = _public(cls)
    assert public >= NAMES
    assert {n for n in public if n.startswith("ask_")} == {f"ask_{op}" for op in OPERATIONS}
    assert not public & RETIRED
    for name in NAMES:
        params = list(inspect.signature(getattr(cls, name)).parameters)
        # search and save take one request (text, or a model for ask_*); the others none
        assert len(params) == (2 if name.removeprefix("ask_") in ("search", "save") else 1)


def test_the_in_process_client_answers_the_engines_models_and_text(tmp_path):
    engine = make_engine(tmp_path / "mem", FakeClock(), PoseBox(Pose(2.0, 1.0)))
    client = EngineClient(engine)
    try:
        saved = client.ask_save('{"note": "The charger is behind the sofa."}')
        assert not isinstance(saved, ErrorAnswer) and saved.pose.x == 2.0
        text = '{"stream": "events", "semantic_query": "where is the charger", "k": 1}'
        for query in (text, SearchQuery.model_validate(json.loads(text))):
            mine = client.ask_search(query)
            assert isinstance(mine, SearchAnswer)
            assert mine.results[0].id == saved.id
            theirs = engine.ask_search(query)
            assert mine.model_dump(exclude={"took_ms"}) == theirs.model_dump(exclude={"took_ms"})
        refused = client.ask_search('{"k": 0}')
        assert isinstance(refused, ErrorAnswer) and refused.error.code == "bad_request"
        assert json.loads(client.search('{"k": 0}')) == json.loads(dumps(refused))
    finally:
        engine.close()
