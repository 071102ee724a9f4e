"""The attempt's spool: what a training process said, kept on local disk until the ledger ingests it.

The SDK writes here and nothing else, so training never waits on the ledger; the supervisor
(or, for a script run alone, the SDK's own ingester) reads from here into the ledger.

    spool/
      metrics-r0.jsonl   one line per flush of rank 0: {"keys", "steps", "times", "values"} (columnar)
      events.jsonl       one line per event: {"seq", "t", "kind", ...} (started, preemption_notice, ...)
      heartbeat.json     replaced atomically: {"t", "step", "pid"}
      termination.json   the attempt's own note on why it ends: {"reason", "message", "step", ...}

Readers take only complete lines (ending in a newline), so a line torn by a crash mid-write is
never ingested; a reader remembers the byte offset it reached, and ingesting twice is harmless.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

METRICS_PREFIX = "metrics-"
EVENTS_FILE = "events.jsonl"
HEARTBEAT_FILE = "heartbeat.json"
NOTE_FILE = "termination.json"


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


def encode_metric_rows(rows: Iterable[tuple[int, float, dict[str, Any]]]) -> list[bytes]:
    """Lines for a batch of (step, time, metrics): one columnar line per distinct set of keys."""
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
        json.dumps({"keys": list(keys), "steps": steps, "times": times, "values": values}).encode() + b"\n"
        for keys, (steps, times, values) in groups.items()
    ]


def decode_metric_line(line: bytes) -> tuple[list[str], list[int], list[float], list[list[float | None]]]:
    batch = json.loads(line)
    return batch["keys"], batch["steps"], batch["times"], batch["values"]


def is_finite_number(value: Any) -> bool:
    number = as_float(value)
    return number is not None and math.isfinite(number)


def append_lines(path: Path, lines: Sequence[bytes], fsync: bool = False) -> None:
    if not lines:
        return
    with open(path, "ab") as f:
        f.write(b"".join(lines))
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def write_json_atomic(path: Path, payload: dict[str, Any], fsync: bool = True) -> None:
    """Replace `path` with `payload` so that a reader sees the old or the new content, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(payload).encode())
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        payload = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def read_complete_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines after byte `offset`, and the offset after the last of them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[: end + 1].splitlines(), offset + end + 1
