"""The OpenAI-compatible chat client against a real local HTTP server on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cv2
import numpy as np
import pytest

from memory_node.core.embedders.describer import VLMDescriber
from memory_node.core.errors import Unavailable
from memory_node.core.llm import (
    DEFAULT_BASE_URL,
    ChatClient,
    LLMError,
    LLMSettings,
    resolve_llm_settings,
    safe_endpoint,
)

KEY = "sk-test-SECRET-0123456789abcdef"

Reply = tuple[int, Any]  # status, JSON body (or raw bytes)


@dataclass
class FakeChatServer:
    """Speaks enough of /chat/completions: records each request, answers from `replies`."""

    replies: list[Reply | Callable[[dict[str, Any]], Reply]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    delay: float = 0.0
    server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                fake.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                if fake.delay:
                    time.sleep(fake.delay)
                reply = fake.replies.pop(0) if fake.replies else (200, completion("ok"))
                status, payload = reply(body) if callable(reply) else reply
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                if status in (301, 302, 307):
                    self.send_header("Location", "/elsewhere/chat/completions")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()


def completion(text: Any, finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
    }


@pytest.fixture()
def chat() -> Iterator[FakeChatServer]:
    fake = FakeChatServer()
    fake.start()
    yield fake
    fake.stop()


def client_for(fake: FakeChatServer, **kw: Any) -> ChatClient:
    return ChatClient(LLMSettings(fake.base_url, KEY, "test-model"), **kw)


# -- settings -------------------------------------------------------------------------------


def test_no_key_means_no_settings() -> None:
    assert resolve_llm_settings({}) is None
    assert resolve_llm_settings({"VLM_BASE_URL": "http://127.0.0.1:9/v1"}) is None
    assert resolve_llm_settings({"OPENAI_API_KEY": "  "}) is None


def test_openai_defaults() -> None:
    s = resolve_llm_settings({"OPENAI_API_KEY": KEY})
    assert s == LLMSettings(DEFAULT_BASE_URL, KEY, "gpt-5.5")
    assert DEFAULT_BASE_URL == "https://api.openai.com/v1"


def test_vlm_variables_take_precedence() -> None:
    env = {
        "VLM_BASE_URL": "http://127.0.0.1:8000/v1",
        "VLM_API_KEY": "vlm-key",
        "VLM_MODEL": "qwen-vl",
        "OPENAI_BASE_URL": "https://example.invalid/v1",
        "OPENAI_API_KEY": KEY,
        "OPENAI_MODEL": "gpt-x",
    }
    assert resolve_llm_settings(env) == LLMSettings(
        "http://127.0.0.1:8000/v1", "vlm-key", "qwen-vl"
    )
    # Each setting falls back on its own.
    partial = resolve_llm_settings({"VLM_MODEL": "qwen-vl", "OPENAI_API_KEY": KEY})
    assert partial == LLMSettings(DEFAULT_BASE_URL, KEY, "qwen-vl")


def test_repr_masks_the_key() -> None:
    s = LLMSettings("https://user:pw@api.example.invalid/v1?token=abc", KEY, "m")
    for text in (repr(s), str(s), f"{s}", repr(ChatClient(LLMSettings(DEFAULT_BASE_URL, KEY)))):
        assert KEY not in text
        assert "pw" not in text and "token" not in text
    assert (
        safe_endpoint("https://user:pw@host.example:8443/v1?x=1#f") == "https://host.example:8443"
    )


# -- requests -------------------------------------------------------------------------------


def test_complete_sends_the_protocol(chat: FakeChatServer) -> None:
    chat.replies.append((200, completion("  A short summary.  ")))
    messages = [{"role": "user", "content": "Summarise: saw a red door."}]
    assert client_for(chat).complete(messages, max_tokens=50) == "A short summary."
    (req,) = chat.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    assert req["headers"]["Content-Type"] == "application/json"
    assert req["body"] == {"model": "test-model", "messages": messages, "max_tokens": 50}


def test_base_url_query_and_trailing_slash_are_kept(chat: FakeChatServer) -> None:
    settings = LLMSettings(chat.base_url + "/?api-version=2024-10-01", KEY, "m")
    ChatClient(settings).complete([{"role": "user", "content": "hi"}], temperature=0.2)
    (req,) = chat.requests
    assert req["path"] == "/v1/chat/completions?api-version=2024-10-01"
    assert req["body"]["temperature"] == 0.2


def test_content_parts_are_joined(chat: FakeChatServer) -> None:
    parts = [{"type": "text", "text": "red "}, {"type": "text", "text": "door"}]
    chat.replies.append((200, completion(parts)))
    assert client_for(chat).complete([{"role": "user", "content": "?"}]) == "red door"


@pytest.mark.parametrize("status", [401, 500])
def test_error_status_never_shows_the_key(chat: FakeChatServer, status: int) -> None:
    # A server that echoes the key back must not get it into our error text.
    chat.replies.append((status, {"error": {"message": f"bad key {KEY} for {chat.base_url}"}}))
    with pytest.raises(LLMError) as info:
        client_for(chat).complete([{"role": "user", "content": "hi"}])
    text = str(info.value)
    assert f"HTTP {status}" in text
    assert KEY not in text and "SECRET" not in text
    assert "127.0.0.1" in text
    assert isinstance(info.value, Unavailable) and info.value.code == "unavailable"


def test_token_field_is_switched_when_rejected(chat: FakeChatServer) -> None:
    msg = "Unsupported parameter: 'max_tokens' is not supported with this model."
    chat.replies.append((400, {"error": {"message": msg}}))
    client = client_for(chat)
    assert client.complete([{"role": "user", "content": "hi"}], max_tokens=77) == "ok"
    first, second = (r["body"] for r in chat.requests)
    assert first["max_tokens"] == 77 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 77 and "max_tokens" not in second
    client.complete([{"role": "user", "content": "again"}])  # remembered
    assert "max_completion_tokens" in chat.requests[-1]["body"]


def test_unusable_answers(chat: FakeChatServer) -> None:
    client = client_for(chat)
    msg = [{"role": "user", "content": "hi"}]
    chat.replies.append((200, b"<html>not json</html>"))
    with pytest.raises(LLMError, match="invalid JSON"):
        client.complete(msg)
    chat.replies.append((200, {"choices": []}))
    with pytest.raises(LLMError, match="choices"):
        client.complete(msg)
    chat.replies.append((200, completion("", finish_reason="length")))
    with pytest.raises(LLMError, match="max_tokens"):
        client.complete(msg)
    with pytest.raises(ValueError):
        client.complete([])


def test_redirect_is_refused(chat: FakeChatServer) -> None:
    chat.replies.append((302, {}))
    with pytest.raises(LLMError, match="redirect refused"):
        client_for(chat).complete([{"role": "user", "content": "hi"}])
    assert [r["path"] for r in chat.requests] == ["/v1/chat/completions"]


def test_unreachable_and_slow_endpoints(chat: FakeChatServer) -> None:
    closed = FakeChatServer()
    closed.start()
    url = closed.base_url
    closed.stop()
    with pytest.raises(LLMError, match="cannot reach") as info:
        ChatClient(LLMSettings(url, KEY, "m"), timeout=2).complete(
            [{"role": "user", "content": "x"}]
        )
    assert KEY not in str(info.value)
    chat.delay = 1.0
    with pytest.raises(LLMError) as slow:
        client_for(chat, timeout=0.2).complete([{"role": "user", "content": "x"}])
    assert KEY not in str(slow.value)


def test_bad_base_urls_are_rejected_without_echoing_secrets() -> None:
    with pytest.raises(LLMError, match="credentials") as info:
        ChatClient(LLMSettings("https://user:hunter2@proxy.example.invalid/v1", KEY, "m"))
    assert "hunter2" not in str(info.value)
    with pytest.raises(LLMError, match="http"):
        ChatClient(LLMSettings("ftp://host.example.invalid", KEY, "m"))


# -- images -------------------------------------------------------------------------------


def test_caption_image_sends_a_jpeg_data_url(chat: FakeChatServer) -> None:
    chat.replies.append((200, completion("A red door in a hallway.")))
    img = np.zeros((600, 1000, 3), dtype=np.uint8)
    img[:, :, 2] = 255
    text = client_for(chat).caption_image(img, "What is this?", max_side=500)
    assert text == "A red door in a hallway."
    (req,) = chat.requests
    (message,) = req["body"]["messages"]
    assert message["role"] == "user"
    prompt, image = message["content"]
    assert prompt == {"type": "text", "text": "What is this?"}
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    raw = np.frombuffer(base64.b64decode(url.split(",", 1)[1]), dtype=np.uint8)
    decoded = cv2.imdecode(raw, cv2.IMREAD_COLOR)
    assert decoded.shape == (300, 500, 3)  # longer side capped at max_side
    assert decoded[:, :, 2].mean() > 200  # still red (BGR preserved)


def test_vlm_describer_combines_tags_and_caption(chat: FakeChatServer) -> None:
    chat.replies.append((200, completion("A person\nstanding by a white wall.")))
    describer = VLMDescriber(client_for(chat), max_tokens=40)
    d = describer.describe(np.full((120, 160, 3), 250, dtype=np.uint8))
    assert d.text == "A person standing by a white wall."
    assert d.tags["colors"] == ["white"] and d.tags["brightness"] > 0.9
    assert describer.describer_id == "vlm:test-model"
    assert chat.requests[0]["body"]["max_tokens"] == 40
