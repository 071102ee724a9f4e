"""Ingesting an attempt's spool into the ledger: metric points, events, heartbeats, checkpoint commits.

Each rank's metrics file (`metrics-r<N>.jsonl`) goes into that rank's series: (run, key, rank).

Idempotent: each spool file's byte offset is stored with the rows read from it, in one
transaction, and points are upserted on (series, step), so ingesting twice, or again after a
crash between reading and committing, stores every point once.

Safe under concurrency: two processes may ingest the same attempt at once (two supervisors, a
foreground submit beside a supervisor). The write transaction first locks the attempt's row
(PostgreSQL; SQLite's single writer already serializes), so the second reads the offsets the
first committed; and an offset is saved by an upsert that never moves it backwards.

A range of a spool file that never arrived from where the attempt ran (`lost-bytes.jsonl`, see
`trackway.spool`) is recorded as a `spool_bytes_lost` event, once per range.

A line that cannot be read (see `trackway.spool`) is quarantined: skipped, copied beside the
spool, and recorded as a `spool_line_quarantined` event in the same transaction that moves the
offset past it, keyed by (file, offset) so that it is recorded once however often it is read.
Also read: the fallback directories a writer that could not write its spool used.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, RowMapping, case, func, select, update

from trackway.ledger import rollups
from trackway.ledger.attempt_lock import lock_attempt
from trackway.ledger.ingest_rows import INT32 as _INT32
from trackway.ledger.ingest_rows import UPSERT_POINTS, decode_event, keys_of, metrics_rank, point_rows
from trackway.ledger.schema import attempt_events, attempts, checkpoints, metric_series, spool_cursors
from trackway.ledger.script_config import merge_script_config
from trackway.ledger.store import Ledger, dialect_insert
from trackway.redaction import redact, redact_structure
from trackway.spool import (
    EVENTS_FILE,
    FALLBACK_PREFIX,
    HEARTBEAT_FILE,
    LOST_FILE,
    METRICS_PREFIX,
    NOTE_FILE,
    decode_lost_bytes,
    decode_metric_line,
    fallback_dir_names,
    quarantine_line,
    read_complete_lines_at,
    read_json,
)

PREVIEW_CHARS = 200


@dataclass
class IngestReport:
    points: int = 0
    events: int = 0
    note: dict[str, Any] | None = None
    checkpoints: list[str] = field(default_factory=list)
    quarantined: int = 0
    lost: int = 0


@dataclass(frozen=True)
class _Source:
    """One file the ingester reads: its cursor name in `spool_cursors`, its path, and what it holds."""

    cursor: str
    path: Path
    kind: str  # "metrics", "events" or "lost" (the ranges of the spool's files that never arrived)

    @property
    def metrics(self) -> bool:
        return self.kind == "metrics"

    @property
    def rank(self) -> int:
        """The rank whose metrics file this is (`metrics-r<N>.jsonl`); 0 for any other name, as before ranks were kept."""
        return metrics_rank(self.path.name)

    @property
    def shown(self) -> str:
        """How events name it: the spool file's name, or a fallback file's full path."""
        return self.path.name if not self.cursor.startswith(FALLBACK_PREFIX) else str(self.path)


def spool_dir_of(attempt: RowMapping) -> Path:
    return Path(attempt["state_dir"]) / "spool"


def ingest_attempt(ledger: Ledger, attempt: RowMapping,
                   read_offsets: dict[str, dict[str, int]] | None = None, secrets: Sequence[str] = (),
                   fallbacks: Container[str] | None = None) -> IngestReport:
    """Bring everything new in `attempt`'s spool (and its fallback files) into the ledger.

    `read_offsets` (attempt id → how far each file was read, kept by a caller that ingests the same
    attempts again and again: the supervisor) spares a quiet spool the ledger read. Offsets only
    grow, so a copy that another process has overtaken can only take a quiet spool for a busy one,
    and the write transaction, which reads them again under the attempt's lock, then finds it quiet.
    `secrets`: the run's own secret values (`redaction.known_values`), masked wherever an event repeats them.
    `fallbacks`: the fallback directories there are (`spool.fallback_dirs_present`, listed after the
    attempt was last seen writing), so that one listing stands for a looking in each of a burst's spools.
    """
    attempt_id = attempt["attempt_id"]
    # A string path: a burst of ends meets a thousand spools in one tick, most holding nothing new.
    spool = os.path.join(attempt["state_dir"], "spool")
    there = _listed(spool)
    present = there[1] if there is not None else ()
    report = IngestReport(note=read_json(os.path.join(spool, NOTE_FILE)) if NOTE_FILE in present else None)
    sources = _sources(spool, there, fallbacks)
    beat = read_json(os.path.join(spool, HEARTBEAT_FILE)) if HEARTBEAT_FILE in present else None
    known = read_offsets.get(attempt_id) if read_offsets is not None else None
    if known is not None and not _has_news(sources, known, attempt, beat):
        return report  # the common case on a busy supervisor: not even a read transaction
    with ledger.read() as conn:
        offsets = _offsets(conn, attempt_id)
    if read_offsets is not None:
        read_offsets[attempt_id] = offsets
    if not _has_news(sources, offsets, attempt, beat):
        return report  # no write transaction at all
    with ledger.write() as conn:
        lock_attempt(conn, attempt_id)
        offsets = _offsets(conn, attempt_id)
        read = dict(offsets)
        for source in sources:
            located, end = read_complete_lines_at(source.path, offsets.get(source.cursor, 0))
            if not located:
                continue
            read[source.cursor] = end
            decoded = _decode_lines(conn, attempt, source, located, report, secrets)
            if source.metrics:
                report.points += _ingest_metric_lines(conn, attempt, decoded, source.rank)
            elif source.kind == "lost":
                report.lost += _ingest_lost(conn, attempt, source, decoded)
            else:
                events, committed = _ingest_events(conn, attempt, decoded, secrets)
                report.events += events
                report.checkpoints += committed
            _save_offset(conn, attempt_id, source.cursor, end)
        _ingest_heartbeat(conn, attempt, beat)
    if read_offsets is not None:
        read_offsets[attempt_id] = read  # committed
    return report


def _sources(spool: str, there: tuple[list[str], frozenset[str]] | None,
             fallbacks: Container[str] | None = None) -> list[_Source]:
    """The spool's metrics and events files, then those of any fallback directory that exists.

    `there`: what `_listed` found in the spool. Only the files there now: one that appears later is
    read by a later pass, from where its cursor says (nothing read yet: its start). `fallbacks`: see
    `ingest_attempt`; None looks in each candidate directory.
    """
    sources = _sources_in(Path(spool), "", there) if there is not None and there[1] else []
    if fallbacks is not None and not fallbacks:
        return sources  # none there at all: not worth a digest of this spool's path to name its own
    for name in fallback_dir_names(spool):
        if fallbacks is not None and name not in fallbacks:
            continue
        found = _listed(name)
        if found is None:
            continue
        directory = Path(name)
        # Named by a digest of the directory: stable, and short enough for spool_cursors.file.
        sources += _sources_in(directory, f"{FALLBACK_PREFIX}{zlib.crc32(str(directory).encode()):08x}/", found)
    return sources


def _sources_in(directory: Path, prefix: str, there: tuple[list[str], frozenset[str]] | None) -> list[_Source]:
    if there is None:
        return []
    metrics, names = there
    sources = [_Source(prefix + name, directory / name, "metrics") for name in metrics]
    if EVENTS_FILE in names:
        sources.append(_Source(prefix + EVENTS_FILE, directory / EVENTS_FILE, "events"))
    if LOST_FILE in names and not prefix:  # the executor writes it in the spool, never in a fallback directory
        sources.append(_Source(LOST_FILE, directory / LOST_FILE, "lost"))
    return sources


def _listed(directory: str | os.PathLike) -> tuple[list[str], frozenset[str]] | None:
    """The names of the metrics files in `directory`, sorted, and of every file there; None when it is no directory.

    One os.scandir, not a Path per file asked after: a burst of ends reads a thousand spools in one
    tick, most of them holding nothing new, many not there at all.
    """
    if not os.access(directory, os.F_OK):
        return None  # asked first: many attempts have no spool, and a failed scandir costs an exception
    try:
        with os.scandir(directory) as entries:
            names = frozenset(entry.name for entry in entries)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return sorted(name for name in names if name.startswith(METRICS_PREFIX) and name.endswith(".jsonl")), names


def _offsets(conn: Connection, attempt_id: str) -> dict[str, int]:
    query = select(spool_cursors.c.file, spool_cursors.c.byte_offset).where(spool_cursors.c.attempt_id == attempt_id)
    return {row.file: row.byte_offset for row in conn.execute(query)}


def spool_offsets(conn: Connection, attempt_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """`_offsets` of many attempts in one query per chunk of ids: every attempt asked is in the answer."""
    from trackway.ledger.bulk import chunks

    found: dict[str, dict[str, int]] = {attempt_id: {} for attempt_id in attempt_ids}
    for part in chunks(list(attempt_ids)):
        query = select(spool_cursors.c.attempt_id, spool_cursors.c.file, spool_cursors.c.byte_offset).where(
            spool_cursors.c.attempt_id.in_(part))
        for row in conn.execute(query):
            found[row.attempt_id][row.file] = row.byte_offset
    return found


def _has_news(sources: list[_Source], offsets: dict[str, int], attempt: RowMapping, beat: dict | None) -> bool:
    for source in sources:
        try:
            if source.path.stat().st_size > offsets.get(source.cursor, 0):
                return True
        except FileNotFoundError:
            continue
    at = _beat_time(beat)
    if at is not None:
        last = attempt["last_heartbeat_at"]
        return last is None or at > last
    return False


def _save_offset(conn: Connection, attempt_id: str, name: str, offset: int) -> None:
    """Store how far `name` was read; a concurrent ingester that got further is never moved back."""
    statement = dialect_insert(conn)(spool_cursors).values(attempt_id=attempt_id, file=name, byte_offset=offset)
    furthest = func.greatest if conn.dialect.name == "postgresql" else func.max
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=["attempt_id", "file"],
            set_={"byte_offset": furthest(spool_cursors.c.byte_offset, statement.excluded.byte_offset)},
        )
    )


# -- reading lines, quarantining the unreadable -------------------------------------------------------


def _decode_lines(conn: Connection, attempt: RowMapping, source: _Source, located: list[tuple[int, bytes]],
                  report: IngestReport, secrets: Sequence[str] = ()) -> list:
    """What each line says; a line that cannot be read is quarantined instead, and the rest go on."""
    decode = {"metrics": decode_metric_line, "events": decode_event, "lost": decode_lost_bytes}[source.kind]
    decoded = []
    for offset, line in located:
        if not line.strip():
            continue  # an empty line says nothing and loses nothing
        try:
            decoded.append(decode(line) if source.kind != "lost" else (offset, decode(line)))
        except Exception as exc:  # noqa: BLE001 - whatever a line holds, it must not stop the others
            _quarantine(conn, attempt, source, offset, line, _error_text(exc), secrets)
            report.quarantined += 1
    return decoded


def _error_text(exc: Exception) -> str:
    """One line saying what was wrong with a line."""
    if isinstance(exc, json.JSONDecodeError):
        text = f"not JSON: {exc.msg} at character {exc.pos}"
    elif isinstance(exc, UnicodeDecodeError):
        text = f"not UTF-8 text: byte {exc.start} is {exc.object[exc.start:exc.start + 1]!r}"
    elif isinstance(exc, ValueError) and str(exc):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:300]


def _quarantine(conn: Connection, attempt: RowMapping, source: _Source, offset: int, line: bytes, error: str,
                secrets: Sequence[str] = ()) -> None:
    """Copy the line beside the spool and record the event that says so, once per (file, offset)."""
    spool = spool_dir_of(attempt)
    try:
        copied: str | None = str(quarantine_line(spool, source.shown, offset, line, error))
        copy_error = None
    except OSError as exc:  # the line is still in its spool file; the event says where
        copied, copy_error = None, f"{exc.strerror or exc}"
    preview = redact(line[: 4 * 1024].decode("utf-8", "replace"), secrets)[:PREVIEW_CHARS]
    now = datetime.now(timezone.utc)
    payload = {
        "kind": "spool_line_quarantined", "t": now.timestamp(), "file": source.shown, "offset": offset,
        "error": error, "preview": preview, "quarantine_file": copied,
    }
    if copy_error:
        payload["copy_error"] = copy_error
    rank, seq = ingester_event_key(source.cursor, offset)
    statement = dialect_insert(conn)(attempt_events).values(
        attempt_id=attempt["attempt_id"], rank=rank, seq=seq, kind="spool_line_quarantined", at=now,
        payload=json.dumps(payload),
    )
    conn.execute(statement.on_conflict_do_nothing(index_elements=["attempt_id", "rank", "seq"]))


def _ingest_lost(conn: Connection, attempt: RowMapping, source: _Source, ranges: list[tuple[int, dict]]) -> int:
    """One `spool_bytes_lost` event per range of a spool file that never arrived, keyed by where the range is said."""
    now = datetime.now(timezone.utc)
    rows = []
    for offset, lost in ranges:
        rank, seq = ingester_event_key(source.cursor, offset)
        payload = {"kind": "spool_bytes_lost", "t": now.timestamp(), **lost, "held": _held(lost["file"])}
        rows.append({"attempt_id": attempt["attempt_id"], "rank": rank, "seq": seq, "kind": "spool_bytes_lost",
                     "at": now, "payload": json.dumps(payload)})
    if rows:
        statement = dialect_insert(conn)(attempt_events).on_conflict_do_nothing(
            index_elements=["attempt_id", "rank", "seq"])
        conn.execute(statement, rows)
    return len(rows)


def _held(name: str) -> str:
    """What a spool file's lost bytes held, as a reader is told it: explain reads this, not the spool's file names."""
    if name == EVENTS_FILE:
        return "events"
    if name.startswith(METRICS_PREFIX):
        return "metric points"
    return "the attempt's note" if name == NOTE_FILE else "lines"


def ingester_event_key(cursor: str, offset: int) -> tuple[int, int]:
    """(rank, seq) of the event about the line at `offset` of `cursor`: one per line, never anyone else's.

    SDK events have rank >= 0 and the supervisor's rank -1 (`SUPERVISOR_RANK`); the ingester's
    ranks are below -1. Both columns are 32-bit, so the file and the offset's high bits go into
    the rank and its low 31 bits into seq.
    """
    high, low = divmod(offset, _INT32)
    return -2 - ((_file_code(cursor) << 16) | min(high, 0xFFFF)), low


def _file_code(cursor: str) -> int:
    """A number under 2^14 for each spool file name: the usual names get their own, others a checksum."""
    if cursor == EVENTS_FILE:
        return 0
    rank = cursor.removeprefix(f"{METRICS_PREFIX}r").removesuffix(".jsonl")
    if cursor.startswith(f"{METRICS_PREFIX}r") and rank.isdigit() and int(rank) < 4000:
        return 1 + int(rank)
    return 4096 + zlib.crc32(cursor.encode()) % 12288


# -- metrics ---------------------------------------------------------------------------------------------


def _series_ids(conn: Connection, run_id: str, rank: int, keys: set[str]) -> dict[str, int]:
    known = {
        row.key: row.series_id
        for row in conn.execute(
            select(metric_series.c.key, metric_series.c.series_id)
            .where(metric_series.c.run_id == run_id, metric_series.c.rank == rank)
        )
    }
    missing = keys - known.keys()
    if not missing:
        return known
    statement = dialect_insert(conn)(metric_series).on_conflict_do_nothing(index_elements=["run_id", "key", "rank"])
    conn.execute(statement, [{"run_id": run_id, "key": key, "rank": rank} for key in sorted(missing)])
    return _series_ids(conn, run_id, rank, set())


def _ingest_metric_lines(conn: Connection, attempt: RowMapping, batches: list, rank: int = 0) -> int:
    if not batches:
        return 0
    ids = _series_ids(conn, attempt["run_id"], rank, keys_of(batches))
    made = point_rows(batches, ids, attempt["attempt_number"])
    if made is None:
        return 0
    placeholder = "%s" if conn.dialect.name == "postgresql" else "?"
    rollups.lock(conn, made.lowest)
    cursor = conn.connection.cursor()  # the DBAPI's executemany takes the rows as they are made, one at a time
    try:
        cursor.executemany(UPSERT_POINTS.format(p=placeholder), made.rows)
    finally:
        cursor.close()
    # A chart's kept min/max blocks from the lowest step written on no longer equal their points.
    rollups.invalidate(conn, made.lowest)
    first, last = attempts.c.first_step, attempts.c.last_step
    conn.execute(
        update(attempts)
        .where(attempts.c.attempt_id == attempt["attempt_id"])
        .values(
            first_step=case((first.is_(None) | (first > made.low), made.low), else_=first),
            last_step=case((last.is_(None) | (last < made.high), made.high), else_=last),
        )
    )
    return made.points


# -- events ----------------------------------------------------------------------------------------------


def _ingest_events(conn: Connection, attempt: RowMapping, records: list[dict[str, Any]],
                   secrets: Sequence[str] = ()) -> tuple[int, list[str]]:
    if not records:
        return 0, []
    rows = [
        {
            "attempt_id": attempt["attempt_id"],
            "rank": int(r.get("rank") or 0),
            "seq": r["seq"],
            "kind": r["kind"][:64],
            "at": datetime.fromtimestamp(float(r["t"]), timezone.utc),
            # A script can put a token in a note or an event; the ledger is read by everyone.
            "payload": json.dumps(redact_structure(r, secrets)),
        }
        for r in records
    ]
    statement = dialect_insert(conn)(attempt_events).on_conflict_do_nothing(index_elements=["attempt_id", "rank", "seq"])
    conn.execute(statement, rows)
    committed = []
    for record in records:
        kind = record["kind"]
        if kind in ("checkpoint_committed", "checkpoint_restored"):
            # Imported here: it brings the checkpoint store's modules, which most ingests (and a short
            # script's ingester, whose start-up its finish() waits for) never need.
            from trackway.ledger.checkpoint_mirror import mirror_checkpoint, mirror_restored
        if kind == "checkpoint_committed":
            mirror_checkpoint(conn, attempt["run_id"], attempt["attempt_id"], record)
            committed.append(record["name"])
        elif kind == "started" and record.get("resume_from") and not attempt["resumed_from_checkpoint"]:
            # Only when nothing set it: a later checkpoint_restored says what was really restored.
            conn.execute(
                update(attempts)
                .where(attempts.c.attempt_id == attempt["attempt_id"], attempts.c.resumed_from_checkpoint.is_(None))
                .values(resumed_from_checkpoint=record["resume_from"])
            )
        elif kind == "checkpoint_uploaded":
            # The copy that outlives the machine: the ledger's row points at it from now on.
            conn.execute(
                update(checkpoints)
                .where(checkpoints.c.run_id == attempt["run_id"], checkpoints.c.step == record["step"])
                .values(path=record["url"], updated_at=datetime.now(timezone.utc))
            )
        elif kind == "checkpoint_restored":
            mirror_restored(conn, attempt["run_id"], attempt["attempt_id"], record)
        elif kind == "init_config":
            # Read fresh: an earlier event in this batch (or an earlier pass) may have merged already.
            current = conn.execute(select(attempts).where(attempts.c.attempt_id == attempt["attempt_id"])).mappings().one()
            merge_script_config(conn, current, record["config"])
    if committed:
        count = conn.execute(
            select(func.count()).where(
                attempt_events.c.attempt_id == attempt["attempt_id"], attempt_events.c.kind == "checkpoint_committed"
            )
        ).scalar_one()
        conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"]).values(checkpoints_committed=count))
    return len(rows), committed


def _beat_time(beat: dict[str, Any] | None) -> datetime | None:
    """When the heartbeat file says it was written; None for a missing or unreadable one."""
    t = (beat or {}).get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    try:
        return datetime.fromtimestamp(float(t), timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def _ingest_heartbeat(conn: Connection, attempt: RowMapping, beat: dict[str, Any] | None) -> None:
    at = _beat_time(beat)
    if at is None:
        return
    conn.execute(
        update(attempts)
        .where(
            attempts.c.attempt_id == attempt["attempt_id"],
            (attempts.c.last_heartbeat_at.is_(None)) | (attempts.c.last_heartbeat_at < at),
        )
        .values(last_heartbeat_at=at)
    )
