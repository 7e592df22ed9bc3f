"""The README's first command, end to end: the demo replays the sample flat, its scripted
agent passes every ground-truth check, the picture is written, and with a model configured
(here a local server speaking the chat-completions protocol) the model drives the same tools."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import cv2

from memory_node.core.llm import ChatClient, LLMSettings
from memory_node.demo import QUESTIONS, run_demo


class ScriptedModel(BaseHTTPRequestHandler):
    """Asks memory once per question, then answers with what the tool returned."""

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = body["messages"][-1]
        if last["role"] == "user":
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function", "function": {
                    "name": "query_agent_memory",
                    "arguments": json.dumps({"semantic_query": last["content"][-60:]})}}]}
        else:
            message = {"role": "assistant", "content": "From memory: " + last["content"][:80]}
        data = json.dumps({"choices": [{"index": 0, "message": message}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_demo_passes_its_ground_truth_checks(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), ScriptedModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lines: list[str] = []
    try:
        chat = ChatClient(LLMSettings(f"http://127.0.0.1:{server.server_port}/v1", "sk-demo",
                                      "gpt-5.5"))
        result = run_demo(tmp_path, rate=3.0, echo=lines.append, llm=chat)
    finally:
        server.shutdown()
    text = "\n".join(lines)
    checks = result["turns"].checks
    assert result["ok"], text
    assert len(checks) >= 5 and all(ok for _, ok, _ in checks)
    assert result["remembered"], "the note at the door was never written"
    assert "Met Alice" in text and "check: the door note is recalled: OK" in text
    img = cv2.imread(str(result["png"]))
    assert img is not None and img.shape[0] > 300 and img.shape[1] > 300
    for q in QUESTIONS:
        assert f"[llm] user: {q}" in text
    assert text.count("gpt-5.5: From memory:") == len(QUESTIONS)
