"""The attempt's spool: what a training process said, kept on local disk until the ledger ingests it.

The SDK writes here and nothing else, so training never waits on the ledger; the supervisor
(or, for a script run alone, the SDK's own ingester) reads from here into the ledger.

    spool/
      metrics-r0.jsonl   one line per flush of rank 0: {"keys", "steps", "times", "values"} (columnar)
      events.jsonl       one line per event: {"seq", "t", "kind", ...} (started, preemption_notice, ...)
      heartbeat.json     replaced atomically: {"t", "step", "pid"}
      termination.json   the attempt's own note on why it ends: {"reason", "message", "step", ...}
      quarantine.jsonl   written by the ingester: a copy of each line it could not read (see below)

Every file here is created with mode 0600: a script can log or note a secret.

Readers take only complete lines (ending in a newline), so a line torn by a crash mid-write is
never ingested; a reader remembers the byte offset it reached, and ingesting twice is harmless.
`append_lines` writes all of its bytes or, on an error (a full disk), takes back what it wrote
when no other process appended after it, so a failed append leaves no torn line to merge with
the next one.

A line the ingester cannot read (torn by hand, garbage bytes, JSON of the wrong shape) is
skipped, copied to `quarantine.jsonl` as {"file", "offset", "error", "line", "line_base64"}, and
recorded as an attempt event `spool_line_quarantined`; the lines after it are ingested as usual.
A retried ingest may copy a line twice; ("file", "offset") names it.

When the spool cannot be written (ENOSPC, EIO, a read-only remount), the SDK's writer keeps the
unwritten lines in memory and retries on every flush. When what it holds passes a bound, and at
the end of the process if the spool is still unwritable, it appends them to the attempt's
fallback directory instead:

    <root>/trackway-spool-fallback/<sha256 of the spool directory's absolute path, 24 hex>/
      metrics-r0.jsonl, events.jsonl   the same line formats as the spool
      origin.json                      {"spool_dir": ...}, for a person who finds the directory

<root> is $TRACKWAY_SPOOL_FALLBACK when set (and then only it), else the temporary directory
(`tempfile.gettempdir()`, i.e. $TMPDIR or /tmp), else /dev/shm: the first whose directory can be
created, owned by this user. The ingester derives the same directories from the attempt's spool
path and reads their files as `fallback/<name>` with cursors of their own; points are upserted on
(series, step) and events on (attempt, rank, seq), so a line present in both places is stored once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

METRICS_PREFIX = "metrics-"
EVENTS_FILE = "events.jsonl"
HEARTBEAT_FILE = "heartbeat.json"
NOTE_FILE = "termination.json"
QUARANTINE_FILE = "quarantine.jsonl"
FALLBACK_ENV = "TRACKWAY_SPOOL_FALLBACK"
FALLBACK_DIR_NAME = "trackway-spool-fallback"
FALLBACK_PREFIX = "fallback/"  # how the ingester names a fallback file in its cursors and events
FILE_MODE = 0o600

_INT64 = 2**63
_NUMBER_TYPES = {float, int, type(None)}
_KEY_MAX = 200  # metric_series.key


def metrics_file(spool_dir: Path, rank: int) -> Path:
    return spool_dir / f"{METRICS_PREFIX}r{rank}.jsonl"


def as_float(value: Any) -> float | None:
    """A metric value as a float (tensors included, via their own `__float__`); None when it is not a number."""
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def encode_metric_batches(rows: Iterable[tuple[int, float, dict[str, Any]]]) -> list[tuple[bytes, int]]:
    """(line, points in it) for a batch of (step, time, metrics): one columnar line per distinct set of keys."""
    groups: dict[tuple[str, ...], tuple[list[int], list[float], list[list[float | None]]]] = {}
    for step, at, metrics in rows:
        numeric = {k: as_float(v) for k, v in metrics.items()}
        keys = tuple(k for k, v in numeric.items() if v is not None)
        if not keys:
            continue
        group = groups.get(keys)
        if group is None:
            group = groups[keys] = ([], [], [[] for _ in keys])
        group[0].append(step)
        group[1].append(at)
        for column, key in zip(group[2], keys):
            column.append(numeric[key])
    return [
        (
            json.dumps({"keys": list(keys), "steps": steps, "times": times, "values": values}).encode() + b"\n",
            len(keys) * len(steps),
        )
        for keys, (steps, times, values) in groups.items()
    ]


def encode_metric_rows(rows: Iterable[tuple[int, float, dict[str, Any]]]) -> list[bytes]:
    """Lines for a batch of (step, time, metrics): one columnar line per distinct set of keys."""
    return [line for line, _ in encode_metric_batches(rows)]


def decode_metric_line(line: bytes) -> tuple[list[str], list[int], list[float], list[list[float | None]]]:
    """One metrics line's columns; ValueError (one line, naming the field) when it is not what the SDK writes."""
    batch = json.loads(line)
    if not isinstance(batch, dict):
        raise ValueError(f"expected a JSON object with keys, steps, times, values; got {type(batch).__name__}")
    missing = [name for name in ("keys", "steps", "times", "values") if name not in batch]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    keys, steps, times, values = batch["keys"], batch["steps"], batch["times"], batch["values"]
    for name, column in (("keys", keys), ("steps", steps), ("times", times), ("values", values)):
        if not isinstance(column, list):
            raise ValueError(f"field {name!r}: expected a list, got {type(column).__name__}")
    if not all(isinstance(key, str) and 0 < len(key) <= _KEY_MAX for key in keys):
        raise ValueError(f"field 'keys': expected names of 1 to {_KEY_MAX} characters")
    if len(values) != len(keys) or len(times) != len(steps):
        raise ValueError("fields 'keys'/'values' and 'steps'/'times' must have equal lengths")
    if steps:
        # Checked by type sets, not per item in Python: ingestion reads ~10^6 points per second.
        if set(map(type, steps)) != {int} or min(steps) <= -_INT64 or max(steps) >= _INT64:
            raise ValueError("field 'steps': expected integers within ±2^63")
        if not set(map(type, times)) <= {float, int} or not all(map(math.isfinite, (min(times), max(times)))):
            raise ValueError("field 'times': expected finite unix times")
    for column in values:
        if not isinstance(column, list) or len(column) != len(steps):
            raise ValueError("field 'values': expected one list per key, as long as 'steps'")
        kinds = set(map(type, column))
        if not kinds <= _NUMBER_TYPES:
            raise ValueError("field 'values': expected numbers or null")
        if int in kinds and any(type(v) is int and abs(v) >= _INT64 for v in column):
            raise ValueError("field 'values': integer out of range")
    return keys, steps, times, values


def is_finite_number(value: Any) -> bool:
    number = as_float(value)
    return number is not None and math.isfinite(number)


def _open_private(path: Path, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)


def append_lines(path: Path, lines: Sequence[bytes], fsync: bool = False) -> None:
    """Append `lines` whole, or raise OSError having taken back what was written (when nobody appended since)."""
    if not lines:
        return
    data = b"".join(lines)
    fd = _open_private(path, os.O_WRONLY | os.O_APPEND)
    try:
        start = os.fstat(fd).st_size
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
            if fsync:
                os.fsync(fd)
        except OSError:
            _take_back(fd, start, written)
            raise
    finally:
        os.close(fd)


def _take_back(fd: int, start: int, written: int) -> None:
    """Remove the head of a failed append, so the retry does not follow a torn line."""
    try:
        # Another rank appending to the shared events file after us would lose its line to a
        # truncate; then the torn head stays, and the ingester quarantines what it merges into.
        if os.fstat(fd).st_size == start + written:
            os.ftruncate(fd, start)
    except OSError:
        pass


def write_json_atomic(path: Path, payload: dict[str, Any], fsync: bool = True) -> None:
    """Replace `path` with `payload` so that a reader sees the old or the new content, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps(payload).encode()
    try:
        fd = _open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        # A full disk must not also fill up with half-written temporaries.
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def read_complete_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines after byte `offset`, and the offset after the last of them."""
    lines, end = read_complete_lines_at(path, offset)
    return [line for _, line in lines], end


def read_complete_lines_at(path: Path, offset: int) -> tuple[list[tuple[int, bytes]], int]:
    """(byte offset, line) for each complete line after `offset`, and the offset after the last of them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    located = []
    position = offset
    for line in data[: end + 1].split(b"\n")[:-1]:
        located.append((position, line))
        position += len(line) + 1
    return located, offset + end + 1


# -- quarantine ------------------------------------------------------------------------------------


def quarantine_line(spool_dir: Path, file: str, offset: int, line: bytes, error: str) -> Path:
    """Copy a line the ingester could not read beside the spool (mode 0600); its path, or OSError."""
    text = line.decode("utf-8", "replace")
    record = {
        "file": file,
        "offset": offset,
        "error": error,
        "line": text,
        "line_base64": base64.b64encode(line).decode(),  # the exact bytes, whatever they were
    }
    path = spool_dir / QUARANTINE_FILE
    append_lines(path, [json.dumps(record).encode() + b"\n"], fsync=True)
    return path


# -- fallback --------------------------------------------------------------------------------------


def fallback_roots() -> list[Path]:
    """Where fallback directories may live, most preferred first (see the module docstring)."""
    chosen = os.environ.get(FALLBACK_ENV)
    if chosen:
        return [Path(chosen)]
    roots = [Path(tempfile.gettempdir()), Path("/dev/shm")]
    return list(dict.fromkeys(roots))


def fallback_dirs(spool_dir: Path) -> list[Path]:
    """The candidate fallback directories of the spool at `spool_dir`, most preferred first."""
    digest = hashlib.sha256(os.path.abspath(spool_dir).encode()).hexdigest()[:24]
    return [root / FALLBACK_DIR_NAME / digest for root in fallback_roots()]


def make_fallback_dir(spool_dir: Path) -> Path:
    """The first candidate fallback directory that can be made private to this user; OSError when none can."""
    errors = []
    for directory in fallback_dirs(spool_dir):
        try:
            directory.parent.parent.mkdir(parents=True, exist_ok=True)
            for private in (directory.parent, directory):
                private.mkdir(mode=0o700, exist_ok=True)
            _check_private(directory.parent)
            _check_private(directory)
            origin = directory / "origin.json"
            if not origin.exists():
                write_json_atomic(origin, {"spool_dir": os.path.abspath(spool_dir)}, fsync=False)
            return directory
        except OSError as exc:
            errors.append(f"{directory}: {exc.strerror or exc}")
    raise OSError(f"no fallback directory could be written ({'; '.join(errors)})")


def _check_private(directory: Path) -> None:
    """Refuse a directory another user made or can write: it is in a shared /tmp."""
    info = os.lstat(directory)
    if not os.path.isdir(directory) or os.path.islink(directory) or info.st_uid != os.getuid():
        raise PermissionError(f"{directory} is not a directory owned by this user")
    if info.st_mode & 0o022:
        raise PermissionError(f"{directory} can be written by other users")
