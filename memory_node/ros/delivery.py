"""Answers that reach their client even when discovery lags behind the request.

Fast DDS sends a service response only to a client whose response reader the server has
matched; a new client's first request can arrive before that match (discovery is slow on a
loaded machine), and the middleware then drops the answer after 100 ms with a RuntimeWarning
("failed to send response (timeout): client will not receive response"): the caller waits for
its whole timeout for an answer that was computed. `resend_until_delivered` wraps a service's
`send_response` so that such an answer is sent again until the match happens (bounded), and
says in one log line when it never does.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

SEND_FAILED = "failed to send response"
RESEND_FOR_S = 10.0  # how long an answer is re-sent to a client not matched yet
RESEND_PAUSE_S = 0.05

_sending = threading.local()
_installed = threading.Lock()
_hook_ready = False


def _install_hook() -> None:
    """Route the middleware's warning to the thread sending the answer (the warning is raised
    synchronously inside `send_response`); other warnings are shown as before."""
    global _hook_ready
    with _installed:
        if _hook_ready:
            return
        # Every occurrence, not once per location: each one is an answer not delivered.
        warnings.filterwarnings("always", message=SEND_FAILED, category=RuntimeWarning)
        shown = warnings.showwarning

        def showwarning(message: Warning | str, category: type[Warning], filename: str,
                        lineno: int, file: Any = None, line: str | None = None) -> None:
            if getattr(_sending, "active", False) and str(message).startswith(SEND_FAILED):
                _sending.failed = True
                return
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        _hook_ready = True


def resend_until_delivered(service: Any, logger: Any, resend_for_s: float = RESEND_FOR_S) -> None:
    """Make `service` re-send an answer the middleware could not deliver yet, for up to
    `resend_for_s`; each attempt itself waits up to the writer's blocking time for the match."""
    if getattr(service, "_resends_undelivered", False):
        return
    _install_hook()
    send = service.send_response  # the bound method of rclpy's Service
    name = getattr(service, "srv_name", "a service")

    def send_response(response: Any, header: Any) -> None:
        deadline = time.monotonic() + resend_for_s
        attempts = 0
        while True:
            attempts += 1
            _sending.active, _sending.failed = True, False
            try:
                send(response, header)
            finally:
                _sending.active = False
            if not _sending.failed:
                if attempts > 1:
                    logger.info(f"answer on {name} delivered at attempt {attempts}: the client "
                                "was discovered after its request arrived")
                return
            if time.monotonic() >= deadline:
                logger.warning(f"answer on {name} not delivered: the client's response reader "
                               f"was not matched within {resend_for_s:.0f} s (incompatible QoS, "
                               "or the client left)")
                return
            time.sleep(RESEND_PAUSE_S)

    service.send_response = send_response
    service._resends_undelivered = True
