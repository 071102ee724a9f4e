"""Checks shared by every entry point that takes numbers or names from a person.

Each check raises InputError with one line naming the field and the range or shape expected,
so that bad input is refused before it reaches a timer, a `timedelta` or an SQL column that
would overflow (SQLite and PostgreSQL overflow differently; neither says which option was wrong).
"""

from __future__ import annotations

import math
import re
import unicodedata
from pathlib import Path

from trackway.errors import InputError

# The widest text column a name, project or model family lands in (runs.name and friends).
MAX_TEXT = 200
# Ledger integer columns are 32-bit on PostgreSQL: attempt numbers, GPU counts.
MAX_INT32 = 2**31 - 1
# Steps are 64-bit everywhere.
MAX_STEP = 2**63 - 1
# GPUs one attempt may ask for: far above any single job, far below the 32-bit column.
MAX_GPUS = 100_000
# Nobody reads more rows than this through a terminal; 0 already means "all".
MAX_LIMIT = 1_000_000_000
TEN_YEARS_HOURS = 10 * 365 * 24

# What trackway's own identifiers look like: a name shaped like one would address two things.
RUN_ID = re.compile(r"^r[0-9a-f]{10}$")
EVAL_ID = re.compile(r"^ev[0-9a-f]{10}$")


def finite(
    value: float, field: str, low: float, high: float, unit: str, *, low_open: bool = False, note: str = ""
) -> float:
    """`value` if it is a real number within [low, high] (or (low, high] with low_open); `note` glosses `high`."""
    below = value <= low if low_open else value < low
    if not math.isfinite(value) or below or value > high:
        bound = f"above {low:g} and at most" if low_open else f"from {low:g} to"
        raise InputError(f"{field} {value:g}: expected a number of {unit} {bound} {high:g}{note}")
    return value


def whole(value: int, field: str, low: int, high: int, what: str = "") -> int:
    """`value` if it is a whole number within [low, high]."""
    if not low <= value <= high:
        raise InputError(f"{field} {value}: expected a whole number from {low}{what} to {high}")
    return value


def limit(value: int, field: str = "--limit") -> int:
    """A row limit: 0 (all) up to MAX_LIMIT."""
    return whole(value, field, 0, MAX_LIMIT, " (all)")


def printable_text(value: str, field: str, max_length: int = MAX_TEXT) -> str:
    """Free text that is stored and printed back: no control or invisible formatting characters.

    An escape sequence in a name rewrites the terminal of whoever lists runs; a bidi override
    makes a name read as another. Refused rather than cleaned, so what is stored is what was typed.
    """
    if not value.strip():
        raise InputError(f"{field} {value!r}: expected a non-empty text")
    if len(value) > max_length:
        raise InputError(f"{field}: expected at most {max_length} characters, got {len(value)}")
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        raise InputError(
            f"{field} {value!r}: expected printable text; it holds the control character U+{ord(bad):04X}"
        )
    return value


def run_name(value: str, field: str = "--name") -> str:
    """A run's name: it addresses the run wherever an id does (RUN, RUN/N, RUN@STEP), so it must not collide."""
    printable_text(value, field)
    if value != value.strip():
        # References are stripped before lookup: a padded name could never be addressed.
        raise InputError(f"{field} {value!r}: expected a name without leading or trailing spaces")
    if "/" in value or "@" in value:
        raise InputError(
            f"{field} {value!r}: expected a name without '/' or '@' (they address attempts and checkpoints)"
        )
    if RUN_ID.match(value) or EVAL_ID.match(value):
        raise InputError(
            f"{field} {value!r}: expected a name that does not look like a run or evaluation id "
            "(names and ids both address runs)"
        )
    return value


def attempt_ref(ref: str, field: str = "RUN/N") -> str:
    """`RUN` or `RUN/N` with N within what the ledger can hold; the lookup itself says what does not exist."""
    run_ref, slash, number_text = ref.rpartition("/")
    if slash and number_text.isdigit() and not 1 <= int(number_text) <= MAX_INT32:
        raise InputError(f"attempt {ref!r}: expected {field} with N a whole number from 1 to {MAX_INT32}")
    return ref


def checkpoint_ref(ref: str, field: str = "CHECKPOINT") -> str:
    """`RUN@STEP` (or `RUN@step-N`) with STEP within what the ledger can hold; the rest is the lookup's to judge."""
    _, at, step_text = ref.partition("@")
    digits = step_text[5:] if step_text.startswith("step-") else step_text
    if at and digits.isdigit() and int(digits) > MAX_STEP:
        raise InputError(f"{field} {ref!r}: expected RUN@STEP with STEP a whole number from 0 to {MAX_STEP}")
    return ref


def existing_file(value: str, field: str, what: str) -> str:
    """A path that names a file, refused with the option's name before any reader meets a directory."""
    path = Path(value).expanduser()
    if not path.exists():
        raise InputError(f"{field} {value}: no such file")
    if path.is_dir():
        raise InputError(f"{field} {value}: expected {what}, found a directory")
    return value
