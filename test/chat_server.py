"""A local HTTP server speaking the chat-completions protocol, for tests of everything that
calls an LLM (compaction summaries, the tool-calling loop, the demo's --llm): the test gives
the function that turns a request body into the assistant message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memory_node.sim.chat_endpoint import Answer, ChatEndpoint, completion

Reply = Callable[[dict[str, Any]], dict[str, Any]]


class ChatServer(ChatEndpoint):
    """`with ChatServer(reply) as srv:` — srv.base_url for LLMSettings; srv.requests holds
    each request's path, Authorization header and JSON body."""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        super().__init__()

    def answer(self, body: dict[str, Any], request: Any = None) -> Answer:
        self.requests.append({"path": request.path, "body": body,
                              "auth": request.headers["Authorization"]})
        return 200, completion(self.reply(body), id="chat-1", object="chat.completion",
                               model=body.get("model"))
