"""Ingesting an attempt's spool into the ledger: metric points, events, heartbeats, checkpoint commits.

Idempotent: each spool file's byte offset is stored with the rows read from it, in one
transaction, and points are upserted on (series, step), so ingesting twice, or again after a
crash between reading and committing, stores every point once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, RowMapping, case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from trackway.ledger.schema import attempt_events, attempts, checkpoints, metric_series, spool_cursors
from trackway.ledger.store import Ledger
from trackway.spool import (
    EVENTS_FILE,
    HEARTBEAT_FILE,
    METRICS_PREFIX,
    NOTE_FILE,
    decode_metric_line,
    read_complete_lines,
    read_json,
)

_UPSERT_POINTS = (
    "INSERT INTO metric_points (series_id, step, value, attempt_number, logged_at) VALUES ({p}, {p}, {p}, {p}, {p}) "
    "ON CONFLICT (series_id, step) DO UPDATE SET value = excluded.value, "
    "attempt_number = excluded.attempt_number, logged_at = excluded.logged_at "
    "WHERE excluded.attempt_number >= metric_points.attempt_number"
)


@dataclass
class IngestReport:
    points: int = 0
    events: int = 0
    note: dict[str, Any] | None = None
    checkpoints: list[str] = field(default_factory=list)


def spool_dir_of(attempt: RowMapping) -> Path:
    return Path(attempt["state_dir"]) / "spool"


def _insert(conn: Connection):
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


def ingest_attempt(ledger: Ledger, attempt: RowMapping) -> IngestReport:
    """Bring everything new in `attempt`'s spool into the ledger."""
    spool = spool_dir_of(attempt)
    report = IngestReport(note=read_json(spool / NOTE_FILE))
    if not spool.is_dir():
        return report
    beat = read_json(spool / HEARTBEAT_FILE)
    with ledger.read() as conn:
        if not _has_news(spool, _offsets(conn, attempt["attempt_id"]), attempt, beat):
            return report  # the common case on a busy supervisor: no write transaction at all
    with ledger.write() as conn:
        offsets = _offsets(conn, attempt["attempt_id"])
        for path in sorted(spool.glob(f"{METRICS_PREFIX}*.jsonl")):
            lines, end = read_complete_lines(path, offsets.get(path.name, 0))
            if lines:
                report.points += _ingest_metric_lines(conn, attempt, lines)
                _save_offset(conn, attempt["attempt_id"], path.name, end, path.name in offsets)
        lines, end = read_complete_lines(spool / EVENTS_FILE, offsets.get(EVENTS_FILE, 0))
        if lines:
            report.events, report.checkpoints = _ingest_events(conn, attempt, lines)
            _save_offset(conn, attempt["attempt_id"], EVENTS_FILE, end, EVENTS_FILE in offsets)
        _ingest_heartbeat(conn, attempt, beat)
    return report


def _offsets(conn: Connection, attempt_id: str) -> dict[str, int]:
    query = select(spool_cursors.c.file, spool_cursors.c.byte_offset).where(spool_cursors.c.attempt_id == attempt_id)
    return {row.file: row.byte_offset for row in conn.execute(query)}


def _has_news(spool: Path, offsets: dict[str, int], attempt: RowMapping, beat: dict[str, Any] | None) -> bool:
    for path in [*spool.glob(f"{METRICS_PREFIX}*.jsonl"), spool / EVENTS_FILE]:
        try:
            if path.stat().st_size > offsets.get(path.name, 0):
                return True
        except FileNotFoundError:
            continue
    if beat and "t" in beat:
        last = attempt["last_heartbeat_at"]
        return last is None or datetime.fromtimestamp(float(beat["t"]), timezone.utc) > last
    return False


def _save_offset(conn: Connection, attempt_id: str, name: str, offset: int, known: bool) -> None:
    if known:
        conn.execute(
            update(spool_cursors)
            .where(spool_cursors.c.attempt_id == attempt_id, spool_cursors.c.file == name)
            .values(byte_offset=offset)
        )
    else:
        conn.execute(spool_cursors.insert().values(attempt_id=attempt_id, file=name, byte_offset=offset))


def _series_ids(conn: Connection, run_id: str, keys: set[str]) -> dict[str, int]:
    known = {
        row.key: row.series_id
        for row in conn.execute(
            select(metric_series.c.key, metric_series.c.series_id).where(metric_series.c.run_id == run_id)
        )
    }
    missing = keys - known.keys()
    if not missing:
        return known
    statement = _insert(conn)(metric_series).on_conflict_do_nothing(index_elements=["run_id", "key"])
    conn.execute(statement, [{"run_id": run_id, "key": key} for key in sorted(missing)])
    return _series_ids(conn, run_id, set())


def _ingest_metric_lines(conn: Connection, attempt: RowMapping, lines: list[bytes]) -> int:
    batches = [decode_metric_line(line) for line in lines]
    ids = _series_ids(conn, attempt["run_id"], {key for keys, *_ in batches for key in keys})
    number = attempt["attempt_number"]
    rows: list[tuple] = []
    low = high = None
    for keys, steps, times, values in batches:
        if not steps:
            continue
        low = min(steps) if low is None else min(low, min(steps))
        high = max(steps) if high is None else max(high, max(steps))
        attempt_numbers = [number] * len(steps)
        for key, column in zip(keys, values):
            rows.extend(zip([ids[key]] * len(steps), steps, column, attempt_numbers, times))
    if not rows:
        return 0
    # Sorted by the primary key, inserts append to each series instead of hopping across the tree.
    rows.sort(key=lambda row: (row[0], row[1]))
    placeholder = "%s" if conn.dialect.name == "postgresql" else "?"
    conn.exec_driver_sql(_UPSERT_POINTS.format(p=placeholder), rows)
    first, last = attempts.c.first_step, attempts.c.last_step
    conn.execute(
        update(attempts)
        .where(attempts.c.attempt_id == attempt["attempt_id"])
        .values(
            first_step=case((first.is_(None) | (first > low), low), else_=first),
            last_step=case((last.is_(None) | (last < high), high), else_=last),
        )
    )
    return len(rows)


def _ingest_events(conn: Connection, attempt: RowMapping, lines: list[bytes]) -> tuple[int, list[str]]:
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line that is not JSON was not written by the SDK; keep going
    if not records:
        return 0, []
    rows = [
        {
            "attempt_id": attempt["attempt_id"],
            "rank": int(r.get("rank", 0)),
            "seq": int(r["seq"]),
            "kind": str(r["kind"])[:64],
            "at": datetime.fromtimestamp(float(r["t"]), timezone.utc),
            "payload": json.dumps(r),
        }
        for r in records
    ]
    statement = _insert(conn)(attempt_events).on_conflict_do_nothing(index_elements=["attempt_id", "rank", "seq"])
    conn.execute(statement, rows)
    committed = []
    for record in records:
        if record["kind"] == "checkpoint_committed":
            mirror_checkpoint(conn, attempt["run_id"], attempt["attempt_id"], record)
            committed.append(record["name"])
        elif record["kind"] == "started" and record.get("resume_from") and not attempt["resumed_from_checkpoint"]:
            conn.execute(
                update(attempts)
                .where(attempts.c.attempt_id == attempt["attempt_id"], attempts.c.resumed_from_checkpoint.is_(None))
                .values(resumed_from_checkpoint=record["resume_from"])
            )
    if committed:
        count = conn.execute(
            select(func.count()).where(
                attempt_events.c.attempt_id == attempt["attempt_id"], attempt_events.c.kind == "checkpoint_committed"
            )
        ).scalar_one()
        conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"]).values(checkpoints_committed=count))
    return len(rows), committed


def mirror_checkpoint(conn: Connection, run_id: str, attempt_id: str | None, record: dict[str, Any]) -> None:
    """Upsert the ledger's row for one checkpoint from what storage (or the SDK's event) says."""
    committed_at = record.get("committed_at")
    values = {
        "name": record["name"],
        "state": record.get("state", "committed"),
        "path": record["path"],
        "size_bytes": record.get("size_bytes"),
        "attempt_id": attempt_id,
        "parent": record.get("parent"),
        "metrics": json.dumps(record.get("metrics")) if record.get("metrics") is not None else None,
        "committed_at": datetime.fromisoformat(committed_at) if isinstance(committed_at, str) else committed_at,
        "updated_at": datetime.now(timezone.utc),
    }
    statement = _insert(conn)(checkpoints).values(run_id=run_id, step=int(record["step"]), **values)
    conn.execute(statement.on_conflict_do_update(index_elements=["run_id", "step"], set_=values))


def _ingest_heartbeat(conn: Connection, attempt: RowMapping, beat: dict[str, Any] | None) -> None:
    if not beat or "t" not in beat:
        return
    at = datetime.fromtimestamp(float(beat["t"]), timezone.utc)
    conn.execute(
        update(attempts)
        .where(
            attempts.c.attempt_id == attempt["attempt_id"],
            (attempts.c.last_heartbeat_at.is_(None)) | (attempts.c.last_heartbeat_at < at),
        )
        .values(last_heartbeat_at=at)
    )


SUPERVISOR_RANK = -1  # attempt_events rows the supervisor wrote, not a training process


def add_supervisor_event(conn: Connection, attempt_id: str, kind: str, payload: dict[str, Any]) -> bool:
    """Record what the supervisor noticed about an attempt, once per kind; False if already recorded."""
    mine = (attempt_events.c.attempt_id == attempt_id) & (attempt_events.c.rank == SUPERVISOR_RANK)
    if conn.execute(select(attempt_events.c.seq).where(mine, attempt_events.c.kind == kind)).first() is not None:
        return False
    seq = conn.execute(select(func.coalesce(func.max(attempt_events.c.seq), -1)).where(mine)).scalar_one() + 1
    now = datetime.now(timezone.utc)
    conn.execute(
        attempt_events.insert().values(
            attempt_id=attempt_id, rank=SUPERVISOR_RANK, seq=seq, kind=kind, at=now,
            payload=json.dumps({"kind": kind, "t": now.timestamp(), **payload}),
        )
    )
    return True
