"""Metrics from log patterns: what a script without the SDK prints, read from its attempt's output.log.

A run submitted with `--metric-pattern REGEX` (or `[logs] metrics = [...]` in trackway.toml) has
each attempt's output.log read incrementally by the supervisor. Every line (stdout and stderr, as
the executor's shim timestamped them) is searched with each pattern; a match's named group `step`
is the step and every other named group a metric of that name:

    iter (?P<step>\\d+): loss (?P<loss>\\S+)      →  step 120, loss 3.2145

A pattern without a `step` group (a line training scripts print between steps, such as GPU memory)
gives its values the step of the last line a stepped pattern matched in the same attempt's log, so
at least one pattern must carry a step. A value printed before the attempt's first step has no step
to attach to and is not stored. A named group `gpu` is a device index, not a metric: the line's
other values are kept per device, under `NAME/gpuN`:

    GPU (?P<gpu>\\d+): (?P<gpu_mem_gb>[\\d.]+)GB / [\\d.]+GB allocated \\((?P<gpu_util>[\\d.]+)% utilization\\)
        →  gpu_mem_gb/gpu0 45.2, gpu_util/gpu0 32.0 at the last step seen

Series named `gpu_util` or `gpu_util/...` are what the `gpu_underused` watcher reads where NVML
cannot see the attempt's GPUs (another host, another executor).

Points land in the ledger exactly as SDK metrics do (the same upsert, on the run's step axis, the
attempt's first/last step updated), with the line's own timestamp as `logged_at`; a NaN or
infinite value is stored as null (on both backends alike). How far the log
was read is stored in `spool_cursors` (file `output.log`) in the same transaction as the points, so
a supervisor restart never counts a line twice, and two supervisors never both count it.

A non-finite value of a loss-named metric (`loss`, `*_loss`, `*/loss`) is reported back, so the
control loop ends the attempt (watcher kind `nan_in_log`, always stopping; reason `nan_loss`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import RowMapping, func, select

from trackway.errors import InputError
from trackway.ledger import Ledger
from trackway.ledger.attempt_lock import lock_attempt
from trackway.ledger.ingest import _ingest_metric_lines, _offsets, _save_offset
from trackway.ledger.schema import attempts, metric_points, metric_series
from trackway.redaction import redact
from trackway.spool import read_complete_lines_at

LOG_CURSOR = "output.log"  # the name of output.log's offset in spool_cursors
STEP_GROUP = "step"
GPU_UTIL = "gpu_util"  # the series name the gpu_underused watcher reads from logs
GPU_GROUP = "gpu"  # a device index: the line's values are kept per device, not as a metric
MAX_PATTERNS = 32
MAX_READ_BYTES = 16 << 20  # per tick: a log that grew by gigabytes is read over several ticks
_STAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_TRAILING = ",;:)]}'\""


def is_loss_name(key: str) -> bool:
    """`loss`, `val_loss`, `train/loss`: the metrics whose non-finite value ends an attempt."""
    return key == "loss" or key.endswith("_loss") or key.endswith("/loss")


def compile_patterns(patterns: Sequence[str], option: str = "--metric-pattern") -> list[re.Pattern[str]]:
    """Each pattern compiled; InputError (one line naming `option`) for a bad regex or no step to attach values to."""
    if len(patterns) > MAX_PATTERNS:
        raise InputError(f"{option}: at most {MAX_PATTERNS} patterns, got {len(patterns)}")
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise InputError(f"{option} {pattern!r}: expected a regular expression with named groups")
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise InputError(f"{option} {pattern!r}: not a valid regular expression: {exc}") from None
        if not set(regex.groupindex) - {STEP_GROUP, GPU_GROUP}:
            raise InputError(f"{option} {pattern!r}: expected at least one named group besides "
                             f"(?P<{STEP_GROUP}>...) and (?P<{GPU_GROUP}>...) for a metric")
        compiled.append(regex)
    if compiled and not any(STEP_GROUP in regex.groupindex for regex in compiled):
        shown = patterns[0] if len(patterns) == 1 else patterns
        raise InputError(
            f"{option} {shown!r}: expected a named group for the step in at least one pattern, e.g. "
            "'iter (?P<step>\\d+): loss (?P<loss>\\S+)' (a pattern without one takes the last step another matched)"
        )
    return compiled


def patterns_of(run: RowMapping) -> list[str]:
    """The log patterns a run was submitted with ([] for none, or a ledger written before they were kept)."""
    text = run.get("log_patterns") if hasattr(run, "get") else None
    return list(json.loads(text)) if text else []


def _number(text: str) -> float | None:
    text = text.strip().rstrip(_TRAILING).lstrip("(['\"")
    try:
        return float(text)
    except ValueError:
        return None


def _step(text: str) -> int | None:
    value = _number(text)
    if value is None or not math.isfinite(value) or value != int(value) or abs(value) >= 2**63:
        return None
    return int(value)


def parse_text(text: str, patterns: Sequence[re.Pattern[str]]) -> list[tuple[int | None, dict[str, float]]]:
    """(step, {metric: value}) for each pattern that matches `text` (the line without the shim's prefix).

    The step is None for a pattern without a step group: the caller gives it the last step seen.
    """
    found = []
    for regex in patterns:
        match = regex.search(text)
        if match is None:
            continue
        groups = match.groupdict()
        step = None
        if STEP_GROUP in groups:
            step = _step(groups.pop(STEP_GROUP) or "")
            if step is None:
                continue
        suffix = ""
        if GPU_GROUP in groups:
            device = _step(groups.pop(GPU_GROUP) or "")
            if device is None or device < 0:
                continue
            suffix = f"/gpu{device}"
        values = {key + suffix: v for key, raw in groups.items() if raw is not None and (v := _number(raw)) is not None}
        if values:
            found.append((step, values))
    return found


def split_log_line(line: bytes) -> tuple[float | None, str]:
    """(unix time, text) of one output.log line `STAMP TAG TEXT`; a line without the prefix is all text."""
    decoded = line.decode("utf-8", errors="replace").rstrip("\r")
    parts = decoded.split(" ", 2)
    if len(parts) == 3 and parts[1] in ("out", "err"):
        try:
            stamp = datetime.strptime(parts[0], _STAMP_FORMAT).replace(tzinfo=timezone.utc).timestamp()
            return stamp, parts[2]
        except ValueError:
            pass
    return None, decoded


@dataclass
class NonFiniteLoss:
    step: int
    key: str
    value: float
    line: str
    # When the last step before it was printed (unix seconds; the NaN's own line if none): a line is
    # stamped when the shim reads it, possibly after a save the script made right after printing it,
    # so what was written after the last good step is what may hold the diverged state.
    at: float | None = None

    def why(self) -> str:
        return f"{self.key} is {self.value} at step {self.step} in the log: {self.line[:300]}"


@dataclass
class LogReport:
    points: int = 0
    lines: int = 0
    last_step: int | None = None
    nan: NonFiniteLoss | None = None


def ingest_log_metrics(ledger: Ledger, attempt: RowMapping, patterns: Sequence[str], now: float | None = None) -> LogReport:
    """Read the new complete lines of `attempt`'s output.log and store the metrics they match."""
    report = LogReport()
    if not patterns:
        return report
    compiled = compile_patterns(patterns)
    log = Path(attempt["log_path"])
    try:
        size = log.stat().st_size
    except FileNotFoundError:
        return report
    with ledger.read() as conn:
        if size <= _offsets(conn, attempt["attempt_id"]).get(LOG_CURSOR, 0):
            return report
    with ledger.write() as conn:
        lock_attempt(conn, attempt["attempt_id"])
        offset = _offsets(conn, attempt["attempt_id"]).get(LOG_CURSOR, 0)
        located, end = _read_lines(log, offset)
        if not located:
            return report
        batches = []
        fallback_time = now if now is not None else datetime.now(timezone.utc).timestamp()
        good_until = None  # the stamp of the last line this batch read before a non-finite loss
        # Where a stepless value lands: the last step this attempt's log showed (the ledger holds it
        # across ticks, and a resumed attempt starts with none of its own).
        last_seen = _attempt_last_step(conn, attempt["attempt_id"])
        for _, line in located:
            report.lines += 1
            stamp, text = split_log_line(line)
            for step, values in parse_text(text, compiled):
                if step is None:
                    if last_seen is None:
                        continue  # before the attempt's first step: nothing to attach it to
                    step = last_seen
                else:
                    last_seen = step
                keys = sorted(values)
                # Non-finite values are stored as null, as SQLite would anyway (and JSON cannot say NaN);
                # the line itself is the evidence of the attempt's end.
                stored = [[values[k] if math.isfinite(values[k]) else None] for k in keys]
                batches.append((keys, [step], [stamp or fallback_time], stored))
                report.last_step = step if report.last_step is None else max(report.last_step, step)
                if report.nan is None:
                    bad = next((k for k in keys if is_loss_name(k) and not math.isfinite(values[k])), None)
                    if bad is not None:
                        before = good_until if good_until is not None else _last_logged_at(conn, attempt)
                        report.nan = NonFiniteLoss(step, bad, values[bad], redact(text.strip()),
                                                   before if before is not None else stamp or fallback_time)
                    else:
                        good_until = stamp or fallback_time
        report.points = _ingest_metric_lines(conn, attempt, batches)
        _save_offset(conn, attempt["attempt_id"], LOG_CURSOR, end)
    return report


def logged_gpu_utilization(conn, attempt: RowMapping, since: float) -> list[float]:
    """The newest `gpu_util` value (%) of each `gpu_util[/...]` series this attempt logged after `since` (unix s).

    What the script itself said about its GPUs (a log pattern, or `run.log`): the watchers' reading
    where NVML cannot see them. [] when it said nothing recent.
    """
    rows = conn.execute(
        select(metric_series.c.series_id)
        .where(metric_series.c.run_id == attempt["run_id"],
               (metric_series.c.key == GPU_UTIL) | metric_series.c.key.like(f"{GPU_UTIL}/%"))
    ).scalars().all()
    found = []
    for series_id in rows:
        value = conn.execute(
            select(metric_points.c.value)
            .where(metric_points.c.series_id == series_id,
                   metric_points.c.attempt_number == attempt["attempt_number"],
                   metric_points.c.logged_at >= since)
            .order_by(metric_points.c.step.desc())
            .limit(1)
        ).scalar()
        if value is not None:
            found.append(float(value))
    return found


def _attempt_last_step(conn, attempt_id: str) -> int | None:
    return conn.execute(select(attempts.c.last_step).where(attempts.c.attempt_id == attempt_id)).scalar()


def _last_logged_at(conn, attempt: RowMapping) -> float | None:
    """When this attempt's latest point already in the ledger was logged."""
    return conn.execute(
        select(func.max(metric_points.c.logged_at))
        .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
        .where(metric_series.c.run_id == attempt["run_id"], metric_points.c.attempt_number == attempt["attempt_number"])
    ).scalar()


def _read_lines(path: Path, offset: int) -> tuple[list[tuple[int, bytes]], int]:
    """Complete lines after `offset`, at most about MAX_READ_BYTES of them (the rest next time)."""
    located, end = read_complete_lines_at(path, offset)
    if end - offset <= MAX_READ_BYTES:
        return located, end
    kept, position = [], offset
    for start, line in located:
        if start - offset > MAX_READ_BYTES and kept:
            break
        kept.append((start, line))
        position = start + len(line) + 1
    return kept, position
