"""The HTTP safety rules memory-mcp --http and memory-view share.

- A bearer token is compared in constant time (`hmac.compare_digest`), and never logged.
- DNS rebinding: a page on an attacker's domain that re-points its name at 127.0.0.1 reaches a
  local server with its own name in `Host`, and its own origin in `Origin`. `host_allowed`
  accepts only loopback names, IP literals (no DNS involved), this machine's own names and
  the bind address; `origin_allowed` only an origin whose host is the request's own `Host`.
- Binding anything but a loopback address needs a token (`needs_token`).
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_HOSTS", "BearerTokenMiddleware", "bearer_token", "header", "host_allowed",
           "is_loopback", "needs_token", "origin_allowed", "token_matches"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def needs_token(bind_host: str) -> bool:
    """Whether serving on `bind_host` must require a token (anything but loopback)."""
    return not is_loopback(bind_host)


def token_matches(given: bytes | str | None, expected: bytes | str) -> bool:
    """Constant-time comparison; an empty or missing token never matches."""
    if not given or not expected:
        return False
    a = given.encode() if isinstance(given, str) else given
    b = expected.encode() if isinstance(expected, str) else expected
    return hmac.compare_digest(a, b)


def header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value)
    return None


def bearer_token(scope: dict[str, Any]) -> bytes | None:
    """The credential of `Authorization: Bearer <token>`, or None."""
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(b" ")
    return credential.strip() if scheme.lower() == b"bearer" else None


def _split_host(value: str) -> str:
    """The host part of a Host header or netloc ("[::1]:8080" -> "::1")."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def _own_names() -> set[str]:
    names = set()
    try:
        name = socket.gethostname().lower()
        names |= {name, f"{name}.local", socket.getfqdn().lower()}
    except OSError:
        pass
    return {n for n in names if n}


def host_allowed(host_header: bytes | None, bind_host: str,
                 extra: Iterable[str] = ()) -> bool:
    """Whether a request's Host names this server rather than some other domain."""
    if not host_header:
        return False
    host = _split_host(host_header.decode("latin-1"))
    if not host:
        return False
    if is_loopback(host) or host == _split_host(bind_host):
        return True
    try:
        ipaddress.ip_address(host)
        return True  # an IP literal involves no DNS: no rebinding
    except ValueError:
        pass
    return host in _own_names() or host in {h.lower() for h in extra}


def origin_allowed(origin: bytes | None, host_header: bytes | None) -> bool:
    """No Origin (not a browser's cross-origin request), or an origin on this very host."""
    if origin is None:
        return True
    text = origin.decode("latin-1").strip()
    if text == "null" or not host_header:
        return False
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and \
        parts.netloc.lower() == host_header.decode("latin-1").strip().lower()


class BearerTokenMiddleware:
    """ASGI middleware: HTTP requests without `Authorization: Bearer <token>` get 401.

    A shared secret for one agent host on a trusted network; use TLS in front of it (a
    reverse proxy) whenever the port is reachable from elsewhere.
    """

    def __init__(self, app: Any, token: str) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self.app = app
        self._expected = token.encode()

    def _authorised(self, scope: dict[str, Any]) -> bool:
        return token_matches(bearer_token(scope), self._expected)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self._authorised(scope):
            from starlette.responses import JSONResponse

            response = JSONResponse(
                {"error": "unauthorized",
                 "message": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                status_code=401, headers={"WWW-Authenticate": 'Bearer realm="memory-mcp"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
