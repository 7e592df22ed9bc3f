"""A local HTTP server speaking the chat-completions protocol, for tests of everything that
calls an LLM (compaction summaries, the tool-calling loop, the demo's --llm): the test gives
the function that turns a request body into the assistant message."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

Reply = Callable[[dict[str, Any]], dict[str, Any]]


class ChatServer:
    """`with ChatServer(reply) as srv:` — srv.base_url for LLMSettings; srv.requests holds
    each request's path, Authorization header and JSON body."""

    def __init__(self, reply: Reply):
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body,
                                       "auth": self.headers["Authorization"]})
                message = outer.reply(body)
                data = json.dumps({"id": "chat-1", "object": "chat.completion",
                                   "model": body.get("model"),
                                   "choices": [{"index": 0, "message": message,
                                                "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def __enter__(self) -> ChatServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
