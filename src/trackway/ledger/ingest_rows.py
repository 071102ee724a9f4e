"""What an ingest stores from a spool's lines: events as read and checked, metric points as rows to upsert.

Shared by the ingest over SQLAlchemy (`ledger/ingest.py`) and a script's own ingester over sqlite3
(`ledger/script_ingest.py`), so that both read the same lines alike and store the same rows; no
SQLAlchemy here.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import chain, islice, repeat
from typing import Any

from trackway.spool import METRICS_PREFIX

UPSERT_POINTS = (
    "INSERT INTO metric_points (series_id, step, value, attempt_number, logged_at) VALUES ({p}, {p}, {p}, {p}, {p}) "
    "ON CONFLICT (series_id, step) DO UPDATE SET value = excluded.value, "
    "attempt_number = excluded.attempt_number, logged_at = excluded.logged_at "
    "WHERE excluded.attempt_number >= metric_points.attempt_number"
)
_SERIES_STEP = operator.itemgetter(0, 1)
INT32 = 2**31


@dataclass
class PointRows:
    """What to upsert, and what the ingest records beside it."""

    rows: Iterable[tuple]  # (series_id, step, value, attempt_number, logged_at), in primary-key order
    points: int
    low: int  # the lowest and highest step written: the attempt's first_step and last_step grow to them
    high: int
    lowest: dict[int, int]  # series id: its lowest step written (its kept rollups from there on are dropped)


def metrics_rank(name: str) -> int:
    """The rank whose metrics file `name` is (`metrics-r<N>.jsonl`); 0 for any other name, as before ranks were kept."""
    number = name.removeprefix(f"{METRICS_PREFIX}r").removesuffix(".jsonl")
    return int(number) if number.isdigit() and len(number) < 10 else 0


def keys_of(batches: list) -> set[str]:
    return {key for keys, *_ in batches for key in keys}


def point_rows(batches: list, ids: Mapping[str, int], attempt_number: int) -> PointRows | None:
    """The rows of decoded lines `batches` (keys, steps, times, values) whose series ids are `ids`; None when empty."""
    number = repeat(attempt_number)
    series: dict[int, list[tuple[list, list, list]]] = {}  # series id: its (steps, values, times) per line
    ordered = True  # every series' steps strictly ascending through the lines, as one process logs them
    low = high = None
    for keys, steps, times, values in batches:
        if not steps:
            continue
        low = min(steps) if low is None else min(low, min(steps))
        high = max(steps) if high is None else max(high, max(steps))
        ascending = all(map(operator.lt, steps, islice(steps, 1, None)))
        for key, column in zip(keys, values):
            parts = series.setdefault(ids[key], [])
            ordered = ordered and ascending and (not parts or parts[-1][0][-1] < steps[0])
            parts.append((steps, column, times))
    if not series:
        return None
    # In primary-key order, inserts append to each series instead of hopping across the tree.
    rows = chain.from_iterable(
        zip(repeat(series_id), steps, column, number, times)
        for series_id in sorted(series) for steps, column, times in series[series_id]
    )
    if not ordered:
        # Sorted, stably: a step logged twice keeps its last value last, and the upsert keeps that one.
        rows = sorted(rows, key=_SERIES_STEP)
    lowest = {
        series_id: min(steps[0] if ordered else min(steps) for steps, _, _ in parts)
        for series_id, parts in series.items()
    }
    points = sum(len(steps) for parts in series.values() for steps, _, _ in parts)
    return PointRows(rows, points, low, high, lowest)


def decode_event(line: bytes) -> dict[str, Any]:
    """One event line as the SDK writes it; ValueError (naming the field) for anything else."""
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    _require_int(record, "seq", 0, INT32)
    _require_int(record, "rank", 0, INT32, optional=True)
    if not isinstance(record.get("kind"), str) or not record["kind"]:
        raise ValueError("field 'kind': expected a non-empty string")
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise ValueError("field 't': expected a unix time")
    datetime.fromtimestamp(float(t), timezone.utc)  # a time out of range raises here, not in the INSERT
    _check_kind_fields(record)
    return record


def _check_kind_fields(record: dict[str, Any]) -> None:
    """The fields that ingesting an event of this kind reads, checked before anything is written."""
    kind = record["kind"]
    if kind == "checkpoint_committed":
        # Checked against the columns they land in: PostgreSQL refuses an over-long string.
        _require_str(record, "name", 64)
        _require_str(record, "path", None)
        _require_str(record, "state", 16, optional=True)
        _require_str(record, "parent", 64, optional=True)
        _require_int(record, "step", -(2**63), 2**63)
        _require_int(record, "size_bytes", 0, 2**63, optional=True)
        if record.get("metrics") is not None and not isinstance(record["metrics"], dict):
            raise ValueError("field 'metrics': expected an object or null")
        if record.get("committed_at") is not None:
            _require_str(record, "committed_at", 64)
            datetime.fromisoformat(record["committed_at"])
    elif kind == "started" and record.get("resume_from") is not None and not isinstance(record["resume_from"], str):
        raise ValueError("field 'resume_from': expected a string or null")
    elif kind == "init_config" and not isinstance(record.get("config"), dict):
        raise ValueError("field 'config': expected an object")
    elif kind == "checkpoint_uploaded":
        _require_str(record, "url", None)
        _require_int(record, "step", -(2**63), 2**63)
    elif kind == "checkpoint_restored":
        if record.get("name") is not None and not isinstance(record["name"], str):
            raise ValueError("field 'name': expected a string or null")
        if record.get("step") is not None:
            _require_int(record, "step", -(2**63), 2**63)
        skipped = record.get("fallback_from") or []
        if not isinstance(skipped, list) or not all(
            isinstance(item, dict) and isinstance(item.get("name"), str) for item in skipped
        ):
            raise ValueError("field 'fallback_from': expected a list of objects with a 'name'")


def _require_str(record: dict[str, Any], name: str, longest: int | None, optional: bool = False) -> None:
    value = record.get(name)
    if value is None and optional:
        return
    if not isinstance(value, str) or (longest is not None and len(value) > longest):
        raise ValueError(f"field {name!r}: expected a string" + (f" of at most {longest} characters" if longest else ""))


def _require_int(record: dict[str, Any], name: str, low: int, high: int, optional: bool = False) -> None:
    value = record.get(name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise ValueError(f"field {name!r}: expected an integer in [{low}, {high})")
