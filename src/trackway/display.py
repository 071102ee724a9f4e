"""People-facing values: short hashes, UTC times with an age, compute hours, and words where a value is missing.

Everything here returns text a person reads; none of it returns `None`, and none of it depends on
the CLI (the supervisor's `explain` uses it too). Full values belong in `--json`, not here.
"""

from __future__ import annotations

import json
import signal
from datetime import datetime, timezone
from typing import Any

SHORT_HASH = 12  # hex digits: unique in any ledger a person reads, and never wrapped on a terminal
NOT_RECORDED = "not recorded"


def short_hash(digest: str | None, missing: str = NOT_RECORDED) -> str:
    """The first SHORT_HASH hex digits of `digest`, or `missing` when there is none."""
    return digest[:SHORT_HASH] if digest else missing


def text_or(value: Any, missing: str = NOT_RECORDED) -> str:
    """`value` as text, or `missing` for None or an empty string (never the word `None`)."""
    return missing if value is None or value == "" else str(value)


def as_stored(value: Any) -> str:
    """A config value exactly as stored: JSON text (0.05 stays 0.05, a string keeps its quotes)."""
    return json.dumps(value, ensure_ascii=False)


def utc(moment: datetime | None, missing: str = NOT_RECORDED) -> str:
    """`moment` in UTC to the second: `2026-11-24 12:13:00 UTC`."""
    if moment is None:
        return missing
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(moment: datetime, now: datetime) -> str:
    """How long before `now` `moment` was, in the largest unit that says it: `45 s ago`, `2 d ago`."""
    seconds = (now - moment).total_seconds()
    if seconds < 0:
        return "in the future (clocks disagree)"
    if seconds < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def when(moment: datetime | None, now: datetime, missing: str = NOT_RECORDED) -> str:
    """`2026-11-24 12:13:00 UTC (2 d ago)`."""
    return missing if moment is None else f"{utc(moment)} ({age(moment, now)})"


def span(seconds: float | None, missing: str = NOT_RECORDED) -> str:
    """A duration people read: `0.4 s`, `12 s`, `3 min 20 s`, `2 h 5 min`."""
    if seconds is None:
        return missing
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def compute_unit(gpu_count: int | None) -> str:
    """`GPU` when the attempt had GPUs; else `CPU`: the ledger then counts wall seconds on one CPU."""
    return "GPU" if gpu_count else "CPU"


def compute_unit_of(gpu_counts) -> str:
    """The unit of a sum over attempts: `GPU` when every one had GPUs, `CPU` when none did, else `compute`
    (GPU-hours and CPU-hours added together, said as such)."""
    counts = [bool(count) for count in gpu_counts]
    if counts and all(counts):
        return "GPU"
    return "compute" if any(counts) else "CPU"


def hours(seconds: float | None, gpu_count: int | None, missing: str = NOT_RECORDED) -> str:
    """`0.125 GPU-hours (7 min 30 s)`, or CPU-hours for an attempt that used no GPU; small values keep
    enough digits not to read as zero."""
    if seconds is None:
        return missing
    value = seconds / 3600
    digits = 2 if value >= 1 else 4 if value >= 0.001 else 6
    return f"{value:.{digits}f} {compute_unit(gpu_count)}-hours ({span(seconds)})"


def signal_text(number: int | None) -> str:
    """`SIGTERM (15)`, or `no signal`."""
    if number is None:
        return "no signal"
    try:
        return f"{signal.Signals(number).name} ({number})"
    except ValueError:
        return f"signal {number}"


def exit_text(code: int | None) -> str:
    return "no exit code" if code is None else f"exit code {code}"


def steps_text(first: int | None, last: int | None) -> str:
    """The steps an attempt logged, as logged: `0..5`, or `none logged`."""
    if first is None and last is None:
        return "none logged"
    if first is None or first == last:
        return f"{last}"
    return f"{first}..{text_or(last, '?')}"


def size_text(size: int | None) -> str:
    """`812 bytes`, `1.5 MiB (1,572,864 bytes)`."""
    if size is None:
        return "size not recorded"
    if size < 1024:
        return f"{size:,} bytes"
    value, unit = float(size), "bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit} ({size:,} bytes)"


def gpus_text(count: int | None, model: str | None, ids: str | None) -> str:
    """`no GPU`, `2 × NVIDIA H100 80GB HBM3 (ids 0,1)`."""
    if not count:
        return "no GPU"
    shown = f"{count} × {model}" if model else f"{count} GPU(s), model not recorded"
    return shown + (f" (ids {ids})" if ids else "")


def code_text(repo: str | None, branch: str | None, commit: str | None, dirty_sha256: str | None) -> str:
    """Where the code came from, in one line: `git@…:lm.git @ main 1a2b3c4d5e6f, no uncommitted changes`."""
    if not repo:
        return "not a git repository"
    at = f"{branch or 'detached HEAD'} {short_hash(commit, 'before the first commit')}"
    diff = f"uncommitted diff {short_hash(dirty_sha256)}" if dirty_sha256 else "no uncommitted changes"
    return f"{repo} @ {at}, {diff}"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")

