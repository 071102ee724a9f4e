"""The attempt's spool: what a training process said, kept on local disk until the ledger ingests it.

The SDK writes here and nothing else, so training never waits on the ledger; the supervisor
(or, for a script run alone, the SDK's own ingester) reads from here into the ledger.

    spool/
      metrics-r0.jsonl   lines of rank 0's points, columnar, one per set of keys per slice (see below);
                         metrics-r1.jsonl and on: each other rank's, ingested into that rank's series
      events.jsonl       one line per event: {"seq", "t", "kind", "rank", ...} (started, preemption_notice, ...)
      heartbeat.json     rank 0's, replaced atomically: {"t", "rank", "step", "progress_t", "pid", ...};
                         "closed": true once its process finished writing
      heartbeat-r1.json  and on: each other rank's, the same fields (the supervisor compares their steps)
      termination.json   the attempt's own note on why it ends: {"reason", "message", "step", ...}
      quarantine.jsonl   written by the ingester: a copy of each line it could not read (see below)
      lost-bytes.jsonl   written by an executor that copies the spool over a channel that can lose
                         (Kubernetes' pod log): each byte range of a file here that never arrived

Every file here is created with mode 0600: a script can log or note a secret.

A metrics line holds up to a few thousand steps that share one set of keys. The SDK writes
format 2, whose columns are little-endian binary in base64, so that neither writing nor reading
does Python work per value:

    {"v": 2, "keys": ["loss", "lr"], "n": 3,
     "steps": "<n int64>", "times": "<n float64>", "values": ["<n float64>", ...]}

Format 1 (no "v": {"keys", "steps", "times", "values"} as JSON numbers) is what earlier SDKs
wrote; it is still read. Values may be NaN or infinite; times are unix seconds.

Readers take only complete lines (ending in a newline), so a line torn by a crash mid-write is
never ingested (a writer that finds its metrics file ending in a torn line ends that line
first, so that its own first line is not merged into it); a reader remembers the byte offset
it reached, and ingesting twice is harmless.
`append_lines` writes all of its bytes or, on an error (a full disk), takes back what it wrote
when no other process appended after it, so a failed append leaves no torn line to merge with
the next one.

A line the ingester cannot read (torn by hand, garbage bytes, JSON of the wrong shape) is
skipped, copied to `quarantine.jsonl` as {"file", "offset", "error", "line", "line_base64"}, and
recorded as an attempt event `spool_line_quarantined`; the lines after it are ingested as usual.
A retried ingest may copy a line twice; ("file", "offset") names it.

An executor that brings the spool back from where the attempt ran may lose part of it on the way
(a pod's log is the one channel back from a pod, and a line of it can be spoiled or lost). Such a
range is never passed over in silence: `record_lost_bytes` stands blanks in for it (a newline,
spaces, a newline: every later byte keeps its offset, the ingester skips a blank line and
quarantines the parts of a line the gap cut), and appends {"file", "from", "to", "why"} to
`lost-bytes.jsonl` (`record_lost_copy`: a copy of a file replaced whole, {..., "whole": true}),
which the ingester records as an attempt event `spool_bytes_lost`. What those
bytes held (events, points) is then not known, and a reader of the attempt is told so.

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
import binascii
import functools
import hashlib
import json
import math
import operator
import os
import sys
import tempfile
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from pathlib import Path
from typing import Any

from trackway.private_dir import make_private_dir

METRICS_PREFIX = "metrics-"
EVENTS_FILE = "events.jsonl"
HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_PREFIX = "heartbeat-"  # heartbeat-r<N>.json: rank N's, for every rank but 0
NOTE_FILE = "termination.json"
QUARANTINE_FILE = "quarantine.jsonl"
LOST_FILE = "lost-bytes.jsonl"
# Written here, on the machine that ingests, never copied from where the attempt ran.
LOCAL_ONLY_FILES = frozenset({QUARANTINE_FILE, LOST_FILE})
FALLBACK_ENV = "TRACKWAY_SPOOL_FALLBACK"
FALLBACK_DIR_NAME = "trackway-spool-fallback"
FALLBACK_PREFIX = "fallback/"  # how the ingester names a fallback file in its cursors and events
FILE_MODE = 0o600

_INT64 = 2**63
_NUMBER_TYPES = {float, int, type(None)}
_KEY_MAX = 200  # metric_series.key


def metrics_file(spool_dir: Path, rank: int) -> Path:
    return spool_dir / f"{METRICS_PREFIX}r{rank}.jsonl"


def heartbeat_file(spool_dir: Path, rank: int) -> Path:
    """Rank 0's heartbeat keeps the name every reader knew before ranks had their own."""
    return spool_dir / (HEARTBEAT_FILE if rank == 0 else f"{HEARTBEAT_PREFIX}r{rank}.json")


def read_heartbeats(spool_dir: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """Every rank's last heartbeat that can be read, by rank."""
    # One listing, not a glob of Paths: the supervisor asks this of every running attempt it watches.
    try:
        with os.scandir(spool_dir) as entries:
            names = [entry.name for entry in entries]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    beats = {}
    ranked = f"{HEARTBEAT_PREFIX}r"
    for name in names:
        if name == HEARTBEAT_FILE:
            rank = 0
        elif name.startswith(ranked) and name.endswith(".json"):
            number = name[len(ranked):-len(".json")]
            rank = int(number) if number.isdigit() and len(number) < 10 else None
        else:
            continue
        beat = read_json(os.path.join(spool_dir, name)) if rank is not None else None
        if beat is not None:
            beats[rank] = beat
    return beats


class MetricBatch:
    """Steps that share one set of keys, as columns: what one metrics line holds."""

    __slots__ = ("keys", "steps", "times", "columns")

    def __init__(self, keys: tuple[str, ...], steps: array, times: array, columns: list[array]):
        self.keys = keys
        self.steps = steps  # array('q')
        self.times = times  # array('d')
        self.columns = columns  # one array('d') per key, as long as `steps`

    @property
    def points(self) -> int:
        return len(self.keys) * len(self.steps)

    def line(self) -> bytes:
        """The batch as one format-2 metrics line (see the module docstring)."""
        keys = json.dumps(list(self.keys), separators=(",", ":")).encode()
        return b"".join((
            b'{"v":2,"keys":', keys, b',"n":', str(len(self.steps)).encode(),
            b',"steps":"', _base64(self.steps), b'","times":"', _base64(self.times),
            b'","values":["', b'","'.join(map(_base64, self.columns)), b'"]}\n',
        ))


_STEP, _TIME, _METRICS = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)
_BIG_ENDIAN = sys.byteorder != "little"


def metric_batches(rows: Sequence[tuple[int, float, Mapping[str, Any]]]) -> list[MetricBatch]:
    """Columns for a slice of (step, time, metrics) rows, one batch per distinct set of keys.

    Rows that share their keys and hold numbers (floats, ints, bools, anything with `__float__`:
    a tensor is read here) go through C loops only: no Python work per value. Anything else
    (mixed keys, a value that is not a number, a step that is not an integer) takes a slower
    path with the same result: a value that is not a number is left out of its row, a row left
    with no number is left out, and so are keys that cannot name a series and steps that are not
    integers within ±2^63.
    """
    rows = rows if isinstance(rows, list) else list(rows)
    if not rows:
        return []
    metrics = list(map(_METRICS, rows))
    keys = tuple(metrics[0])
    if list(map(len, metrics)).count(len(keys)) == len(metrics):
        # Every row has as many keys as the first: the same keys, unless a column finds one missing.
        batch = _columns(keys, rows, metrics)
        if batch is not None:
            return [batch] if keys else []
    return _grouped(rows, metrics)


def _columns(keys: tuple, rows: list, metrics: list) -> MetricBatch | None:
    """The batch of rows that all hold `keys`, or None when one lacks a key or holds what is not a number."""
    if not all(key.__class__ is str and 0 < len(key) <= _KEY_MAX for key in keys):
        return None
    try:
        steps = array("q", map(_STEP, rows))
        columns = [array("d", map(operator.itemgetter(key), metrics)) for key in keys]
    except Exception:  # noqa: BLE001 - a missing key, a string, a tensor of many elements: the slow path decides
        return None
    return MetricBatch(keys, steps, array("d", map(_TIME, rows)), columns)


def _grouped(rows: list, metrics: list) -> list[MetricBatch]:
    """Batches for rows whose keys differ: runs of equal keys gathered per set of keys, in order."""
    keysets = list(map(tuple, metrics))
    starts = [0, *compress(range(1, len(rows)), map(operator.ne, keysets[1:], keysets[:-1])), len(rows)]
    groups: dict[tuple, tuple[list, list]] = {}
    for begin, end in zip(starts, starts[1:]):
        group = groups.setdefault(keysets[begin], ([], []))
        group[0].extend(rows[begin:end])
        group[1].extend(metrics[begin:end])
    batches: list[MetricBatch] = []
    for keys, (group_rows, group_metrics) in groups.items():
        batch = _columns(keys, group_rows, group_metrics) if keys else None
        batches.extend([batch] if batch is not None else _row_by_row(group_rows))
    return batches


def _row_by_row(rows: list) -> list[MetricBatch]:
    """The slow path: each value converted on its own, rows regrouped by the keys that hold numbers."""
    groups: dict[tuple[str, ...], tuple[list[int], list[float], list[list[float]]]] = {}
    for step, at, metrics in rows:
        step = _as_step(step)
        if step is None:
            continue
        numeric = {}
        for key, value in metrics.items():
            number = _as_number(value)
            if number is not None and key.__class__ is str and 0 < len(key) <= _KEY_MAX:
                numeric[key] = number
        if not numeric:
            continue
        keys = tuple(numeric)
        group = groups.get(keys)
        if group is None:
            group = groups[keys] = ([], [], [[] for _ in keys])
        group[0].append(step)
        group[1].append(at)
        for column, number in zip(group[2], numeric.values()):
            column.append(number)
    return [
        MetricBatch(keys, array("q", steps), array("d", times), [array("d", column) for column in columns])
        for keys, (steps, times, columns) in groups.items()
    ]


def _as_step(step: Any) -> int | None:
    try:
        number = operator.index(step)
    except TypeError:
        if not (isinstance(step, float) and step.is_integer()):
            return None
        number = int(step)
    return number if -_INT64 <= number < _INT64 else None


def _as_number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except Exception:  # noqa: BLE001 - whatever a value's __float__ raises, it is not a number
        return None


def _base64(column: array) -> bytes:
    if _BIG_ENDIAN:
        column = array(column.typecode, column)
        column.byteswap()
    return binascii.b2a_base64(column, newline=False)


def encode_metric_rows(rows: Iterable[tuple[int, float, dict[str, Any]]]) -> list[bytes]:
    """Lines for a batch of (step, time, metrics): one columnar line per distinct set of keys."""
    return [batch.line() for batch in metric_batches(list(rows))]


def decode_metric_line(line: bytes) -> tuple[list[str], list[int], list[float], list[list[float | None]]]:
    """One metrics line's columns; ValueError (one line, naming the field) when it is not what an SDK writes."""
    batch = json.loads(line)
    if isinstance(batch, dict) and "v" in batch:
        if batch["v"] != 2:
            raise ValueError(f"field 'v': metrics line format {batch['v']!r} is not one this version reads (1 or 2)")
        return _decode_binary(batch)
    if not isinstance(batch, dict):
        raise ValueError(f"expected a JSON object with keys, steps, times, values; got {type(batch).__name__}")
    missing = [name for name in ("keys", "steps", "times", "values") if name not in batch]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    keys, steps, times, values = batch["keys"], batch["steps"], batch["times"], batch["values"]
    for name, column in (("keys", keys), ("steps", steps), ("times", times), ("values", values)):
        if not isinstance(column, list):
            raise ValueError(f"field {name!r}: expected a list, got {type(column).__name__}")
    _check_keys(keys)
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


def _check_keys(keys: list) -> None:
    if not all(isinstance(key, str) and 0 < len(key) <= _KEY_MAX for key in keys):
        raise ValueError(f"field 'keys': expected names of 1 to {_KEY_MAX} characters")


def _decode_binary(batch: dict) -> tuple[list[str], list[int], list[float], list[list[float]]]:
    keys, count, values = batch.get("keys"), batch.get("n"), batch.get("values")
    if not isinstance(keys, list):
        raise ValueError("field 'keys': expected a list")
    _check_keys(keys)
    if count.__class__ is not int or count < 0:
        raise ValueError("field 'n': expected the number of steps")
    if not isinstance(values, list) or len(values) != len(keys):
        raise ValueError("field 'values': expected one column per key")
    steps = _binary_column(batch.get("steps"), "steps", "q", count)
    times = _binary_column(batch.get("times"), "times", "d", count)
    if not all(map(math.isfinite, times)):
        raise ValueError("field 'times': expected finite unix times")
    return keys, steps, times, [_binary_column(text, "values", "d", count) for text in values]


def _binary_column(text: Any, name: str, typecode: str, count: int) -> list:
    if not isinstance(text, str):
        raise ValueError(f"field {name!r}: expected base64 text")
    try:
        raw = binascii.a2b_base64(text, strict_mode=True)
    except ValueError as exc:  # binascii.Error is one; so is text that is not ASCII
        raise ValueError(f"field {name!r}: not base64 ({exc})") from None
    if len(raw) != 8 * count:
        raise ValueError(f"field {name!r}: expected {count} values of 8 bytes, got {len(raw)} bytes")
    column = array(typecode)
    column.frombytes(raw)
    if _BIG_ENDIAN:
        column.byteswap()
    return column.tolist()


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


def end_torn_line(path: Path) -> None:
    """End the line a killed writer left unfinished at the end of `path`, so that the next append starts its own."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
    except OSError:  # no file, or an empty one
        return
    try:
        append_lines(path, [b"\n"])
    except OSError:
        pass  # a full disk: the torn line and the next one are quarantined together, as before


def _take_back(fd: int, start: int, written: int) -> None:
    """Remove the head of a failed append, so the retry does not follow a torn line."""
    try:
        # Another rank appending to the shared events file after us would lose its line to a
        # truncate; then the torn head stays, and the ingester quarantines what it merges into.
        if os.fstat(fd).st_size == start + written:
            os.ftruncate(fd, start)
    except OSError:
        pass


def write_json_atomic(path: Path, payload: dict[str, Any], fsync: bool = True, replace: bool = True) -> bool:
    """Replace `path` with `payload` so that a reader sees the old or the new content, never half of one.

    With `replace=False` an existing `path` is kept (the link that would create it fails atomically):
    returns whether this call wrote it.
    """
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
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True
    except OSError:
        # A full disk must not also fill up with half-written temporaries.
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as file:
            payload = json.loads(file.read())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def read_complete_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines after byte `offset`, and the offset after the last of them."""
    lines, end = read_complete_lines_at(path, offset)
    return [line for _, line in lines], end


def read_complete_lines_at(path: Path, offset: int, limit: int | None = None) -> tuple[list[tuple[int, bytes]], int]:
    """(byte offset, line) for each complete line after `offset`, and the offset after the last of them.

    `limit`: read about that many bytes at most (a line longer than it is still read whole).
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(-1 if limit is None else limit)
            if limit is not None and len(data) == limit and b"\n" not in data:
                data += f.read()
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


# -- bytes lost on the way -------------------------------------------------------------------------


def record_lost_bytes(spool_dir: Path, name: str, upto: int, why: str) -> tuple[int, int] | None:
    """Say that spool file `name`'s bytes from its present end to `upto` never arrived, blanks standing in.

    The range (`from`, `to`) recorded, or None when the file already reaches `upto`. The blanks keep
    each byte that arrives later at its own offset; see the module's docstring.
    """
    path = spool_dir / name
    spool_dir.mkdir(parents=True, exist_ok=True)
    start = path.stat().st_size if path.exists() else 0
    if start >= upto:
        return None
    length = upto - start
    blanks = b"\n" if length == 1 else b"\n" + b" " * (length - 2) + b"\n"
    append_lines(spool_dir / LOST_FILE, [json.dumps({"file": name, "from": start, "to": upto, "why": why}).encode()
                                         + b"\n"], fsync=True)
    append_lines(path, [blanks])
    return start, upto


def record_lost_copy(spool_dir: Path, name: str, size: int, why: str) -> None:
    """Say that a copy of `name`, a file replaced whole (`size` bytes), never arrived; the file is left as it is."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    append_lines(spool_dir / LOST_FILE, [json.dumps({"file": name, "from": 0, "to": max(size, 1), "why": why,
                                                     "whole": True}).encode() + b"\n"], fsync=True)


def decode_lost_bytes(line: bytes) -> dict[str, Any]:
    """One line of `lost-bytes.jsonl`; ValueError (naming the field) for anything else."""
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if not isinstance(record.get("file"), str) or not record["file"]:
        raise ValueError("field 'file': expected a spool file's name")
    for field in ("from", "to"):
        if isinstance(record.get(field), bool) or not isinstance(record.get(field), int) or record[field] < 0:
            raise ValueError(f"field {field!r}: expected a byte offset")
    if record["to"] <= record["from"]:
        raise ValueError("field 'to': expected an offset past 'from'")
    return {"file": record["file"], "from": record["from"], "to": record["to"], "why": str(record.get("why") or "")[:300],
            "whole": record.get("whole") is True}


# -- fallback --------------------------------------------------------------------------------------


def fallback_roots() -> list[Path]:
    """Where fallback directories may live, most preferred first (see the module docstring)."""
    return [Path(root) for root in _root_names(os.environ.get(FALLBACK_ENV), tempfile.gettempdir())]


@functools.lru_cache(maxsize=8)
def _root_names(chosen: str | None, temporary: str) -> tuple[str, ...]:
    if chosen:
        return (str(Path(chosen)),)
    return tuple(dict.fromkeys(str(Path(root)) for root in (temporary, "/dev/shm")))


def fallback_dirs(spool_dir: Path) -> list[Path]:
    """The candidate fallback directories of the spool at `spool_dir`, most preferred first."""
    return [Path(name) for name in fallback_dir_names(spool_dir)]


def fallback_dir_names(spool_dir: str | os.PathLike) -> list[str]:
    """`fallback_dirs` as the strings of their paths: an ingester looks for those of a thousand ended attempts
    in one tick, where building the paths cost more than asking whether they exist."""
    digest = hashlib.sha256(os.path.abspath(spool_dir).encode()).hexdigest()[:24]
    return [os.path.join(parent, digest) for parent in _fallback_parents()]


def _fallback_parents() -> list[str]:
    """The directories that hold the fallback directories of every spool, one per candidate root."""
    return [os.path.join(root, FALLBACK_DIR_NAME)
            for root in _root_names(os.environ.get(FALLBACK_ENV), tempfile.gettempdir())]


def fallback_dirs_present() -> frozenset[str] | None:
    """Every fallback directory there is now (as `fallback_dir_names` spells it), from one listing per root.

    For an ingester about to look for those of many spools at once; None where a root could not be
    listed (not yours, say), so that it looks for each as before rather than miss one.
    """
    present: set[str] = set()
    for parent in _fallback_parents():
        try:
            names = os.listdir(parent)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        present.update(os.path.join(parent, name) for name in names)
    return frozenset(present)


def make_fallback_dir(spool_dir: Path) -> Path:
    """The first candidate fallback directory that can be made private to this user; OSError when none can."""
    errors = []
    for directory in fallback_dirs(spool_dir):
        try:
            directory.parent.parent.mkdir(parents=True, exist_ok=True)
            for private in (directory.parent, directory):
                make_private_dir(private)
            origin = directory / "origin.json"
            if not origin.exists():
                write_json_atomic(origin, {"spool_dir": os.path.abspath(spool_dir)}, fsync=False)
            return directory
        except OSError as exc:
            errors.append(f"{directory}: {exc.strerror or exc}")
    raise OSError(f"no fallback directory could be written ({'; '.join(errors)})")
