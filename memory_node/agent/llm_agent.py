"""A minimal tool-calling loop: an LLM behind an OpenAI-compatible endpoint answers a question
using the memory skills. The demo's `--llm` flag uses it; agent frameworks have their own loop
and only need `openai_tool_specs` / `call_openai_tool`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memory_node.agent.client import MemoryClient
from memory_node.agent.prompt import MEMORY_PROMPT_SECTION, prepend_pose
from memory_node.agent.skills import call_openai_tool, openai_tool_specs

SYSTEM_PROMPT = (
    "You are the assistant of a quadruped robot exploring a home. Answer briefly and concretely."
    "\n\n" + MEMORY_PROMPT_SECTION
)


@dataclass
class TurnResult:
    answer: str
    tool_calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)


def run_turn(chat: Any, client: MemoryClient, question: str,
             history: list[dict[str, Any]] | None = None, max_steps: int = 6,
             on_tool: Callable[[str, dict[str, Any], str], None] | None = None) -> TurnResult:
    """Ask `question` (with the per-turn pose line prepended); run the tools the model calls
    until it answers in text. `chat` is a `memory_node.core.llm.ChatClient`."""
    messages: list[dict[str, Any]] = history if history is not None else []
    if not messages:
        messages.append({"role": "system", "content": SYSTEM_PROMPT})
    messages.append({"role": "user", "content": prepend_pose(question, client)})
    result = TurnResult(answer="")
    for _ in range(max_steps):
        reply = chat.chat(messages, tools=openai_tool_specs(client))
        calls = reply.get("tool_calls") or []
        messages.append({"role": "assistant", "content": reply.get("content") or "",
                         **({"tool_calls": calls} if calls else {})})
        if not calls:
            result.answer = (reply.get("content") or "").strip()
            return result
        for call in calls:
            fn = call.get("function") or {}
            name, raw = fn.get("name", ""), fn.get("arguments") or "{}"
            answer = call_openai_tool(client, name, raw)
            try:
                args = json.loads(raw) if isinstance(raw, str) else dict(raw)
            except ValueError:
                args = {"_raw": raw}
            result.tool_calls.append((name, args, answer))
            if on_tool is not None:
                on_tool(name, args, answer)
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                             "content": answer})
    result.answer = "(no answer after the tool-call limit)"
    return result
