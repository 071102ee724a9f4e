"""How long a SQLite connection waits for another process's lock: $TRACKWAY_SQLITE_BUSY_TIMEOUT, else 30 s."""

from __future__ import annotations

import os

from trackway.errors import InputError
from trackway.validation import finite

SQLITE_BUSY_TIMEOUT_S = 30.0
BUSY_TIMEOUT_ENV = "TRACKWAY_SQLITE_BUSY_TIMEOUT"
MAX_BUSY_TIMEOUT_S = 3600.0


def sqlite_busy_timeout() -> float:
    """The SQLite busy timeout in seconds: $TRACKWAY_SQLITE_BUSY_TIMEOUT, else 30."""
    text = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not text:
        return SQLITE_BUSY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{BUSY_TIMEOUT_ENV} {text!r}: expected a number of seconds from 0 to {MAX_BUSY_TIMEOUT_S:g}") from None
    return finite(value, BUSY_TIMEOUT_ENV, 0.0, MAX_BUSY_TIMEOUT_S, "seconds")
