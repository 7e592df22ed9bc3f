"""A local chat-completions endpoint (the OpenAI-compatible protocol) on 127.0.0.1: the one
HTTP server behind the package's stand-ins for an LLM or VLM (memory-eval's caption oracle,
the caption benchmark, the tests). Each stand-in decides only its answers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

# (HTTP status, JSON payload), or None: close the connection unanswered (a dead endpoint).
Answer = tuple[int, dict[str, Any]] | None
_Endpoint = TypeVar("_Endpoint", bound="ChatEndpoint")


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def completion(message: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A chat-completions answer carrying one assistant message."""
    return {**fields, "choices": [{"index": 0, "finish_reason": "stop", "message": message}]}


def error(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


class ChatEndpoint:
    """`with StandIn(...) as ep:` serves on a free port until the block ends; `ep.base_url`
    is what VLM_BASE_URL / OPENAI_BASE_URL take. Subclasses implement `answer`."""

    def __init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = outer.answer(body, self)
                if reply is None:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                code, payload = reply
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    def answer(self, body: dict[str, Any], request: BaseHTTPRequestHandler) -> Answer:
        """The reply to one request (`request` has its path and headers)."""
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self: _Endpoint) -> _Endpoint:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
