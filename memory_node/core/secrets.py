"""Secrets out of everything the package prints or logs.

A value that can hold a secret (a URL with a password or a `password=` query, an API key, a
token) is masked wherever it is shown: the start line that names each parameter's origin,
error messages, logs, pages. Console output and `~/.ros/log` are readable by every user of
the machine, so a refusal to take a password on the command line is worth nothing if the line
before it prints that password.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"

# Words that make a parameter, option or field name a secret's (`vlm_api_key`, `auth_token`),
# matched as whole words of the name so that `max_tokens` is not one.
_SECRET_WORDS = frozenset({"password", "passwd", "pwd", "secret", "token", "apikey",
                           "credential", "credentials"})
_SECRET_PAIRS = ("api_key", "access_key", "private_key")

# scheme://user:PASSWORD@host -> scheme://user:***@host (the user name stays: it says who).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*):(?P<pw>[^\s/@]*)@")
# key=value pairs in queries, libpq keyword strings and environment dumps.
_KEY_VALUE = re.compile(
    r"(?P<key>\b(?:password|passwd|pwd|api[_-]?key|apikey|access[_-]?token|token|secret|"
    r"client[_-]?secret)['\"]?\s*[=:]\s*)(?P<q>['\"]?)(?P<value>[^\s&;,'\"]+)",
    re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
# Provider-style keys that carry their own prefix (sk-..., sk-proj-...).
_PREFIXED_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")


def is_secret_name(name: str) -> bool:
    """Whether a parameter or field of this name holds a secret as a whole."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    joined = "_".join(words)
    return bool(_SECRET_WORDS.intersection(words)) or any(p in joined for p in _SECRET_PAIRS)


def mask_secrets(text: str) -> str:
    """`text` with every secret it recognisably holds replaced by ***: URL passwords,
    `password=`/`token=`/`api_key=` values, bearer tokens and sk- keys."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _KEY_VALUE.sub(lambda m: f"{m['key']}{m['q']}{MASK}", text)
    text = _BEARER.sub(lambda m: f"{m['head']}{MASK}", text)
    return _PREFIXED_KEY.sub(f"sk-{MASK}", text)


def mask_value(name: str, value: Any) -> str:
    """A named value as it may be shown: *** for a secret's name (when set), else the value
    with any secret inside it masked."""
    shown = str(value)
    if is_secret_name(name) and shown not in ("", "''"):
        return MASK
    return mask_secrets(shown)


class SecretFilter(logging.Filter):
    """A logging filter that masks secrets in each record's message (on a handler, it sees
    every record the handler writes, from any logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


def mask_log_handlers(logger: logging.Logger | None = None) -> None:
    """Put a SecretFilter on each handler of `logger` (default the root logger, and the
    last-resort handler that writes warnings to stderr when nothing configured logging), once."""
    handlers = list((logger or logging.getLogger()).handlers)
    if logger is None and logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())
