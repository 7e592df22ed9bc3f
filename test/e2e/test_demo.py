"""The README's first command, end to end: the demo replays the sample flat, its scripted
agent passes every ground-truth check, the picture is written, and with a model configured
(here a local server speaking the chat-completions protocol) the model drives the same tools."""

from __future__ import annotations

import json

import cv2
from chat_server import ChatServer

from memory_node.core.llm import ChatClient, LLMSettings
from memory_node.demo import QUESTIONS, run_demo


def scripted_model(body):
    """Asks memory once per question, then answers with what the tool returned."""
    last = body["messages"][-1]
    if last["role"] == "user":
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function", "function": {
                "name": "query_agent_memory",
                "arguments": json.dumps({"semantic_query": last["content"][-60:]})}}]}
    return {"role": "assistant", "content": "From memory: " + last["content"][:80]}


def test_demo_passes_its_ground_truth_checks(tmp_path):
    lines: list[str] = []
    with ChatServer(scripted_model) as srv:
        chat = ChatClient(LLMSettings(srv.base_url, "sk-demo-key", "gpt-5.5"))
        result = run_demo(tmp_path, rate=3.0, echo=lines.append, llm=chat)
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
