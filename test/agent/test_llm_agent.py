"""The tool-calling loop against a local server speaking the chat-completions protocol with
tool calls: the model asks for a memory tool, gets its answer, then replies in text."""

from __future__ import annotations

import json

from chat_server import ChatServer
from engine_support import FakeClock, PoseBox, make_engine
from secret_guard import LLM_API_KEY

from memory_node.agent.client import EngineClient
from memory_node.agent.llm_agent import run_turn
from memory_node.core.llm import ChatClient, LLMSettings
from memory_node.core.types import Pose


def tool_calling_model(body):
    if body["messages"][-1]["role"] == "user":
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {
                "name": "query_agent_memory",
                "arguments": json.dumps({"semantic_query": "who did I greet at the door"})}}]}
    seen = body["messages"][-1]["content"]
    return {"role": "assistant", "content": "You greeted Alice." if "Alice" in seen else "Nobody."}


def test_model_calls_a_memory_tool_then_answers(tmp_path):
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(Pose(0.5, 2.0)))
    try:
        with ChatServer(tool_calling_model) as srv:
            eng.save("Met Alice at the front door.")
            chat = ChatClient(LLMSettings(srv.base_url, LLM_API_KEY, "gpt-5.5"))
            seen = []
            result = run_turn(chat, EngineClient(eng), "Who did I greet at the door?",
                              on_tool=lambda *a: seen.append(a))
        assert result.answer == "You greeted Alice."
        [(name, args, answer)] = result.tool_calls
        assert name == "query_agent_memory" and "Met Alice" in answer and seen
        first = srv.requests[0]["body"]
        assert {t["function"]["name"] for t in first["tools"]} >= {"remember", "query_memory"}
        assert first["messages"][0]["role"] == "system"
        assert first["messages"][1]["content"].startswith("[Current pose: x=0.50, y=2.00")
        tool_msg = srv.requests[1]["body"]["messages"][-1]
        assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_1"
    finally:
        eng.close()
