"""Error types whose `code` is the one the JSON contract reports (docs/design.md)."""

from __future__ import annotations

from typing import Any


class ContractError(Exception):
    """Base of every error the engine turns into `{"ok": false, "error": {...}}`."""

    code = "internal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def to_response(self) -> dict[str, Any]:
        return {"ok": False, "error": {"code": self.code, "message": self.message}}


class BadRequest(ContractError):
    """The caller sent something malformed; nothing was changed."""

    code = "bad_request"


class NotActive(ContractError):
    """The service exists but is not active (lifecycle) yet."""

    code = "not_active"


class Unavailable(ContractError):
    """A backend the request needs (embedder, index, LLM, current pose) is not available."""

    code = "unavailable"


class InternalError(ContractError):
    code = "internal"


ERROR_CODES = ("bad_request", "not_active", "unavailable", "internal")
