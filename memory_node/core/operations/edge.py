"""The contract's edge: every request answers its typed model or an ErrorAnswer, never raises,
and leaves as one line of JSON text."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic_core import to_json

from memory_node.core.contract import ErrorAnswer, Reply
from memory_node.core.disk import disk_full_text, is_disk_full
from memory_node.core.errors import BadRequest, ContractError, InternalError, Unavailable
from memory_node.core.operations.host import Host

log = logging.getLogger(__name__)


def origin(exc: BaseException) -> str:
    """file:line where an exception was raised (its innermost traceback frame)."""
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"


def dumps(answer: Any) -> str:
    """An answer (a model, or its dict) as the JSON text the services send: one line, UTF-8,
    compact, a NaN or infinity as null (always valid JSON). Serialized by pydantic-core, not
    `json`: a model straight to text, with no Python dict in between (several times faster:
    bench/results/NOTES.md, finding 19)."""
    if isinstance(answer, dict):
        return to_json(answer, inf_nan_mode="null").decode()
    if isinstance(answer, Reply):
        return answer.json_text()
    return answer.model_dump_json()


def guard(host: Host, fn: Callable[[], Any], what: str) -> Any:
    """Run one request: its typed answer with took_ms, or an ErrorAnswer; never raises."""
    t0 = time.perf_counter()
    try:
        if host.backend is None:
            raise Unavailable("the memory store is closed")
        out = fn()
    except ContractError as exc:
        if exc.message.startswith("disk full"):
            host.disk_log("disk_full", f"{what} failed: {exc.message:.300s}")
        elif not isinstance(exc, BadRequest):
            log.warning("%s failed: %.300s", what, exc.message)
        return ErrorAnswer.of(exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - a request never takes the node down
        if is_disk_full(exc, host.config.root):
            message = (f"disk full: {what} could not be written ({disk_full_text(exc)}); "
                       "nothing was changed")
            host.disk_log("disk_full", f"{what} failed: {message}")
            return ErrorAnswer.of(Unavailable.code, message)
        # One line per failed request, whatever it sent (a traceback of a deep recursion
        # is hundreds of kilobytes); the traceback itself at debug level.
        log.error("%s failed unexpectedly: %s: %.200s (at %s)", what, type(exc).__name__,
                  exc, origin(exc))
        log.debug("%s: traceback", what, exc_info=True)
        return ErrorAnswer.of(InternalError.code, f"{what} failed: {type(exc).__name__}")
    took = round((time.perf_counter() - t0) * 1000, 3)
    if isinstance(out, dict):
        out["took_ms"] = took
    else:
        out.took_ms = took
    return out
