"""A local OpenAI-compatible chat endpoint for caption tests: `plan(n, body)` decides what the
n-th request (from 1) gets: ("ok", caption), (status, message) for an HTTP error, or "drop"
(the connection closes unanswered, as a dead endpoint's would). `gate` holds every request
until the test sets it (an endpoint slower than the recorder); `on_request` sees each request
(a test records its simulated time there)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from memory_node.sim.chat_endpoint import Answer, ChatEndpoint, assistant, completion, error

Plan = Callable[[int, dict[str, Any]], Any]


def _default(n: int, body: dict[str, Any]) -> Any:
    return ("ok", f"caption {n}: a blue backpack on a wooden chair")


class VLMServer(ChatEndpoint):
    def __init__(self, plan: Plan = _default):
        self.plan = plan
        self.gate = threading.Event()
        self.gate.set()
        self.count = 0
        self.bodies: list[dict[str, Any]] = []
        self.on_request: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        super().__init__()

    def answer(self, body: dict[str, Any], request: Any = None) -> Answer:
        with self._lock:
            self.count += 1
            n = self.count
            self.bodies.append(body)
        if self.on_request is not None:
            self.on_request(n)
        self.gate.wait(30)
        what = self.plan(n, body)
        if what == "drop":
            return None
        status, text = what
        if status == "ok":
            return 200, completion(assistant(text))
        return int(status), error(text)

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        super().__exit__(*exc)
