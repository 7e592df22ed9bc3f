"""OpenAI-compatible chat client for compaction summaries and image captions.

Standard library only (urllib), so the core needs no HTTP dependency. The API key goes into
the Authorization header and nowhere else: not into reprs, log lines or exception text. Errors
name the endpoint as scheme://host[:port] only.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_node.core.errors import Unavailable

DEFAULT_MODEL = "gpt-5.5"
DEFAULT_BASE_URL = "https://api.openai.com/v1"  # the vendor's documented API address
_MAX_ERROR_CHARS = 300
_KEYLIKE = re.compile(r"\b(sk|rk|pk|key)[-_][A-Za-z0-9_\-]{8,}")


class LLMError(Unavailable):
    """The LLM endpoint failed or answered something unusable; the text never holds the key."""


@dataclass(frozen=True)
class LLMSettings:
    """Where and how to reach the chat endpoint. `repr` masks the key."""

    base_url: str
    api_key: str = field(repr=False)
    model: str = DEFAULT_MODEL

    def __repr__(self) -> str:
        return (
            f"LLMSettings(base_url={safe_endpoint(self.base_url)!r}, api_key='***', "
            f"model={self.model!r})"
        )

    __str__ = __repr__


def resolve_llm_settings(env: Mapping[str, str] | None = None) -> LLMSettings | None:
    """Settings from VLM_* then OPENAI_* (each of BASE_URL, API_KEY, MODEL on its own).

    None when no key is set: callers then report the LLM step as unavailable and call nothing.
    """
    env = os.environ if env is None else env

    def pick(suffix: str) -> str | None:
        for prefix in ("VLM_", "OPENAI_"):
            value = (env.get(prefix + suffix) or "").strip()
            if value:
                return value
        return None

    key = pick("API_KEY")
    if key is None:
        return None
    return LLMSettings(
        base_url=pick("BASE_URL") or DEFAULT_BASE_URL,
        api_key=key,
        model=pick("MODEL") or DEFAULT_MODEL,
    )


def safe_endpoint(url: str) -> str:
    """scheme://host[:port] of a URL: no userinfo, path, query or fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid url>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme or '?'}://{host}{port}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: following one would resend the Authorization header elsewhere."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str):
        return None


class ChatClient:
    """POSTs to {base_url}/chat/completions with Bearer auth and returns the reply text."""

    def __init__(self, settings: LLMSettings, timeout: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(settings.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            shown = safe_endpoint(settings.base_url)
            raise LLMError(f"LLM base URL must be http(s)://host[/path], got {shown}")
        if parts.username or parts.password:
            raise LLMError("LLM base URL must not hold credentials; put the key in VLM_API_KEY")
        if not settings.api_key or any(c in settings.api_key for c in "\r\n"):
            raise LLMError("LLM API key is empty or holds a line break")
        path = parts.path.rstrip("/") + "/chat/completions"
        self._url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
        self.settings = settings
        self.timeout = timeout
        self.endpoint = safe_endpoint(settings.base_url)
        # OpenAI's own API wants max_completion_tokens for current models; most compatible
        # servers (vLLM, llama.cpp, Ollama) know max_tokens. A 400 naming the field flips it.
        host = (parts.hostname or "").lower()
        openai = host == "openai.com" or host.endswith(".openai.com")
        self._token_field = "max_completion_tokens" if openai else "max_tokens"
        self._opener = urllib.request.build_opener(_NoRedirect())

    def __repr__(self) -> str:
        return f"ChatClient({self.settings!r}, timeout={self.timeout})"

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int = 1024,
        **extra: Any,
    ) -> str:
        """The assistant's reply to `messages`; `extra` goes into the body (e.g. temperature)."""
        if not messages:
            raise ValueError("messages must not be empty")
        body: dict[str, Any] = {"model": self.settings.model, "messages": list(messages)}
        body.update(extra)
        body[self._token_field] = int(max_tokens)
        try:
            return self._post(body)
        except _TokenFieldRejected:
            other = "max_tokens" if self._token_field != "max_tokens" else "max_completion_tokens"
            body[other] = body.pop(self._token_field)
            self._token_field = other
            try:
                return self._post(body)
            except _TokenFieldRejected as exc:
                raise LLMError(
                    f"LLM endpoint {self.endpoint} answered HTTP 400: {exc.detail}"
                ) from None

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 1024,
        **extra: Any,
    ) -> dict[str, Any]:
        """One chat completion with optional function tools: the assistant message as a dict
        (`content`, and `tool_calls` when the model wants tools run)."""
        if not messages:
            raise ValueError("messages must not be empty")
        body: dict[str, Any] = {"model": self.settings.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        body.update(extra)
        body[self._token_field] = int(max_tokens)
        try:
            payload = self._post_json(body)
        except _TokenFieldRejected:
            other = "max_tokens" if self._token_field != "max_tokens" else "max_completion_tokens"
            body[other] = body.pop(self._token_field)
            self._token_field = other
            payload = self._post_json(body)
        try:
            message = payload["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise LLMError(
                f"LLM endpoint {self.endpoint} answered without choices[0].message") from None
        if not isinstance(message, dict):
            raise LLMError(f"LLM endpoint {self.endpoint} answered a malformed message")
        return message

    def caption_image(
        self,
        image_bgr: np.ndarray,
        prompt: str = "Describe this image in one short sentence.",
        max_tokens: int = 300,
        max_side: int = 768,
        jpeg_quality: int = 85,
    ) -> str:
        """A caption from a vision model: the image goes as a JPEG data URL in a user message."""
        import cv2

        from memory_node.core.pixels import as_bgr_uint8

        img = as_bgr_uint8(image_bgr)
        h, w = img.shape[:2]
        if max(h, w) > max_side:
            f = max_side / max(h, w)
            size = (max(1, round(w * f)), max(1, round(h * f)))
            img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
        if not ok:
            raise ValueError("cannot encode image as JPEG")
        url = "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")
        content = [
            {"type": "text", "text": prompt},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        return self.complete([{"role": "user", "content": content}], max_tokens=max_tokens)

    # -- transport -------------------------------------------------------------------------

    def _post(self, body: dict[str, Any]) -> str:
        return self._reply_text(self._post_json(body))

    def _post_json(self, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode("utf-8")
        req = urllib.request.Request(
            self._url,
            data=data,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                "Authorization": f"Bearer {self.settings.api_key}",
            },
        )
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = self._scrub(_error_detail(exc))
            if exc.code == 400 and self._token_field in detail and "max_" in detail:
                raise _TokenFieldRejected(detail) from None
            if 300 <= exc.code < 400:
                detail = "redirect refused (the key is never resent to another address)"
            raise LLMError(
                f"LLM endpoint {self.endpoint} answered HTTP {exc.code}: {detail}"
            ) from None
        except (
            urllib.error.URLError,
            http.client.HTTPException,
            TimeoutError,
            ConnectionError,
        ) as exc:
            reason = getattr(exc, "reason", exc)
            raise LLMError(
                f"cannot reach LLM endpoint {self.endpoint}: {self._scrub(str(reason))}"
            ) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise LLMError(f"LLM endpoint {self.endpoint} answered invalid JSON") from None

    def _reply_text(self, payload: Any) -> str:
        try:
            choice = payload["choices"][0]
            content = choice["message"].get("content")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise LLMError(
                f"LLM endpoint {self.endpoint} answered without choices[0].message"
            ) from None
        if isinstance(content, list):  # some servers answer with content parts
            content = "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        if not isinstance(content, str) or not content.strip():
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            hint = "; raise max_tokens" if reason == "length" else ""
            raise LLMError(
                f"LLM endpoint {self.endpoint} answered an empty message "
                f"(finish_reason={reason}){hint}"
            )
        return content.strip()

    def _scrub(self, text: str) -> str:
        """Remove the key (and anything key-like) from text bound for an exception."""
        key = self.settings.api_key
        if key:
            text = text.replace(key, "***")
        text = _KEYLIKE.sub("***", text)
        return text.replace(self._url, self.endpoint)[:_MAX_ERROR_CHARS]


class _TokenFieldRejected(Exception):
    """The server rejected the max-tokens field name; retried once with the other one."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read(4096)
    except Exception:
        raw = b""
    try:
        payload = json.loads(raw)
        err = payload.get("error", payload) if isinstance(payload, dict) else payload
        msg = err.get("message") if isinstance(err, dict) else err
        text = str(msg if msg is not None else payload)
    except ValueError:
        text = raw.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text or (exc.reason if isinstance(exc.reason, str) else "no detail")
