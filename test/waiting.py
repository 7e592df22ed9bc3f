"""Condition waits for tests: poll what a user would see until it holds, instead of sleeping a
fixed time that is too short on a loaded machine and too long on an idle one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 30.0,
               interval: float = 0.05) -> T:
    """The first truthy value of `predicate()` within `timeout` seconds; fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:g} s waiting for {what}")
        time.sleep(interval)
