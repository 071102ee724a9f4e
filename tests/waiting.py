"""Waiting in a test for what another process does: poll until it is true; past a bound, the test has hung.

The bound is a hang guard, never a speed requirement: speed belongs in bench/.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.2) -> T:
    """`predicate()`'s first true answer, asked every `interval` s; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
