"""A local OpenAI-compatible chat endpoint for caption tests: `plan(n, body)` decides what the
n-th request (from 1) gets: ("ok", caption), (status, message) for an HTTP error, or "drop"
(the connection closes unanswered, as a dead endpoint's would). `gate` holds every request
until the test sets it (an endpoint slower than the recorder); `on_request` sees each request
(a test records its simulated time there)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Plan = Callable[[int, dict[str, Any]], Any]


def _default(n: int, body: dict[str, Any]) -> Any:
    return ("ok", f"caption {n}: a blue backpack on a wooden chair")


class VLMServer:
    def __init__(self, plan: Plan = _default):
        self.plan = plan
        self.gate = threading.Event()
        self.gate.set()
        self.count = 0
        self.bodies: list[dict[str, Any]] = []
        self.on_request: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.count += 1
                    n = outer.count
                    outer.bodies.append(body)
                if outer.on_request is not None:
                    outer.on_request(n)
                outer.gate.wait(30)
                what = outer.plan(n, body)
                if what == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, text = what
                if status == "ok":
                    data = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                                    "message": {"role": "assistant",
                                                                "content": text}}]}).encode()
                    code = 200
                else:
                    data = json.dumps({"error": {"message": text}}).encode()
                    code = int(status)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def __enter__(self) -> VLMServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()
