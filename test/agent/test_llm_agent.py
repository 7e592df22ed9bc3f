"""The tool-calling loop against a local server speaking the chat-completions protocol with
tool calls: the model asks for a memory tool, gets its answer, then replies in text."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from engine_support import FakeClock, PoseBox, make_engine

from memory_node.agent.client import EngineClient
from memory_node.agent.llm_agent import run_turn
from memory_node.core.llm import ChatClient, LLMSettings
from memory_node.core.types import Pose


class ToolCallingModel(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ToolCallingModel.bodies.append(body)
        if body["messages"][-1]["role"] == "user":
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function", "function": {
                    "name": "query_agent_memory",
                    "arguments": json.dumps({"semantic_query": "who did I greet at the door"})}}]}
        else:
            seen = body["messages"][-1]["content"]
            message = {"role": "assistant",
                       "content": "You greeted Alice." if "Alice" in seen else "Nobody."}
        data = json.dumps({"choices": [{"index": 0, "message": message,
                                        "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_model_calls_a_memory_tool_then_answers(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), ToolCallingModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    eng = make_engine(tmp_path / "m", FakeClock(), PoseBox(Pose(0.5, 2.0)))
    try:
        eng.save("Met Alice at the front door.")
        chat = ChatClient(LLMSettings(f"http://127.0.0.1:{server.server_port}/v1", "sk-x",
                                      "gpt-5.5"))
        seen = []
        result = run_turn(chat, EngineClient(eng), "Who did I greet at the door?",
                          on_tool=lambda *a: seen.append(a))
        assert result.answer == "You greeted Alice."
        [(name, args, answer)] = result.tool_calls
        assert name == "query_agent_memory" and "Met Alice" in answer and seen
        first = ToolCallingModel.bodies[0]
        assert {t["function"]["name"] for t in first["tools"]} >= {"remember", "query_memory"}
        assert first["messages"][0]["role"] == "system"
        assert first["messages"][1]["content"].startswith("[Current pose: x=0.50, y=2.00")
        tool_msg = ToolCallingModel.bodies[1]["messages"][-1]
        assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_1"
    finally:
        eng.close()
        server.shutdown()
