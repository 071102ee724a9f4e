"""A script's own ingester on a SQLite ledger, over `sqlite3` alone: register its run, ingest its spool, record its end.

The ingester that `trackway.init()` starts for a script run alone (sdk/standalone.py) must be
ready by the script's `finish()`, which a short script calls milliseconds after `init()` returns;
importing SQLAlchemy alone costs more than a whole `init()`. On a SQLite ledger at the newest
migration, this module writes what registration.py, ingest.py and `records.record_attempt_end`
write for such a script, the same rows (tests/ledger/test_script_ingest.py holds them equal),
with the same lines read alike (`ingest_rows`). What it does not handle it declines before
writing anything (`Declined`), and the caller uses those modules instead:

- an event whose ingest does more than store it (a checkpoint, a resumed-from, a script's config),
- a line that cannot be read (ingest.py quarantines it), a fallback directory (a spool that was full),
- an end other than `completed` (its useful GPU time is read from the checkpoints).

Writes take SQLite's write lock up front (`BEGIN IMMEDIATE`), as store.py's do, and read the
spool's offsets inside that transaction: an ingest by another process (a supervisor, a
`trackway` command) is serialized with this one, and points are upserted, so nothing is stored twice.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zlib
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trackway.ledger.busy_timeout import sqlite_busy_timeout
from trackway.ledger.ingest_rows import UPSERT_POINTS, decode_event, keys_of, metrics_rank, point_rows
from trackway.ledger.reader import sqlite_file
from trackway.ledger.revision import HEAD_REVISION
from trackway.pending import read_pending
from trackway.receipts.submitted_config import recorded
from trackway.redaction import redact_structure
from trackway.spool import (
    EVENTS_FILE,
    HEARTBEAT_FILE,
    METRICS_PREFIX,
    decode_metric_line,
    fallback_dirs,
    read_complete_lines_at,
    read_json,
)
from trackway.taxonomy import AttemptState, RunState, TerminationReason

ROLLUP_WIDTHS = (256, 16384)  # rollups.LEVELS (a test holds the two equal)
# Events that ingest.py does more with than store them.
_MORE_THAN_STORED = frozenset({"checkpoint_committed", "checkpoint_uploaded", "checkpoint_restored", "init_config"})


class Declined(Exception):
    """Something this module leaves to the ingest over SQLAlchemy; nothing was written."""


def _text(value: datetime) -> str:
    """A time as SQLAlchemy's `UTCDateTime` stores it on SQLite: naive UTC, microseconds always shown."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


def _stored(value: Any) -> Any:
    return _text(value) if isinstance(value, datetime) else value


class ScriptLedger:
    """One sqlite3 connection to a SQLite ledger at the newest migration, for one script's run."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    @classmethod
    def open(cls, db_url: str) -> ScriptLedger:
        """The ledger at `db_url`; Declined when it is not a SQLite file at the newest migration."""
        path = sqlite_file(db_url)
        if path is None or not path.exists():
            raise Declined("not an existing SQLite ledger")
        timeout = sqlite_busy_timeout()
        conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            # As store.py sets every connection up.
            conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.Error:
            conn.close()
            raise
        if row is None or row[0] != HEAD_REVISION:
            conn.close()
            raise Declined("the ledger is not at the newest migration")
        return cls(conn)

    def close(self) -> None:
        self.conn.close()

    def _write(self, work) -> Any:
        """`work(conn)` in one write transaction: committed when it returns, rolled back when it raises."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    # -- registration (registration.register_pending) ------------------------------------------------

    def register(self, path: Path) -> bool:
        """Register the run in the pending file `path` (once), then remove the file; False when it is gone."""
        try:
            pending = read_pending(path)
        except FileNotFoundError:
            return False
        run, attempt, blobs = pending["run"], pending["attempt"], pending["blobs"]

        def work(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run["run_id"],)).fetchone() is not None:
                return
            shas = {kind: self._put_blob(conn, _recorded(kind, data), kind) if data is not None else None
                    for kind, data in blobs.items()}
            _insert(conn, "runs", {**run, "config_sha256": shas.get("config"), "code_dirty_sha256": shas.get("git_diff")})
            _insert(conn, "attempts", {
                **attempt,
                "attempt_id": f"{attempt['run_id']}/{attempt['attempt_number']}",
                "config_sha256": shas.get("config"),
                "environment_sha256": shas.get("environment"),
                "code_dirty_sha256": shas.get("git_diff"),
            })

        self._write(work)
        path.unlink(missing_ok=True)
        return True

    @staticmethod
    def _put_blob(conn: sqlite3.Connection, content: bytes, kind: str) -> str:
        digest = hashlib.sha256(content).hexdigest()
        conn.execute(
            "INSERT INTO blobs (sha256, kind, size, compression, content, created_at) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (sha256) DO NOTHING",
            (digest, kind, len(content), "zlib", zlib.compress(content, 6), _text(datetime.now(timezone.utc))),
        )
        return digest

    # -- ingest (ingest.ingest_attempt) ----------------------------------------------------------------

    def ingest(self, attempt_id: str, spool: Path, limit: int | None = None) -> int:
        """Bring what is new in the attempt's spool into the ledger; the points stored. Declined: nothing written.

        `limit`: about how many bytes of each file to read (a slice of a backlog); everything when None.
        """
        if any(directory.is_dir() for directory in fallback_dirs(spool)):
            raise Declined("a fallback directory holds lines")
        sources = [(p.name, p, True) for p in sorted(spool.glob(f"{METRICS_PREFIX}*.jsonl"))]
        sources.append((EVENTS_FILE, spool / EVENTS_FILE, False))
        beat = read_json(spool / HEARTBEAT_FILE)
        if not self._has_news(attempt_id, sources, beat):
            return 0  # a quiet spool takes no write lock
        return self._write(lambda conn: self._ingest(conn, attempt_id, sources, beat, limit))

    def _has_news(self, attempt_id: str, sources: list, beat: dict | None) -> bool:
        offsets = dict(self.conn.execute("SELECT file, byte_offset FROM spool_cursors WHERE attempt_id = ?", (attempt_id,)))
        for name, path, _ in sources:
            try:
                if path.stat().st_size > offsets.get(name, 0):
                    return True
            except FileNotFoundError:
                continue
        at = _beat_time(beat)
        if at is None:
            return False
        row = self.conn.execute("SELECT last_heartbeat_at FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
        return row is None or row[0] is None or at > row[0]

    def _ingest(self, conn: sqlite3.Connection, attempt_id: str, sources: list, beat: dict | None,
                limit: int | None) -> int:
        found = conn.execute("SELECT run_id, attempt_number FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
        if found is None:
            raise Declined("the attempt is not registered")
        run_id, number = found
        offsets = dict(conn.execute("SELECT file, byte_offset FROM spool_cursors WHERE attempt_id = ?", (attempt_id,)))
        points = 0
        for name, path, metrics in sources:
            located, end = read_complete_lines_at(path, offsets.get(name, 0), limit)
            if not located:
                continue
            try:
                decoded = [(decode_metric_line if metrics else decode_event)(line) for _, line in located if line.strip()]
            except Exception as exc:  # noqa: BLE001 - a line to quarantine: ingest.py does that
                raise Declined(f"a line of {name} cannot be read") from exc
            if metrics:
                points += self._points(conn, attempt_id, run_id, number, decoded, metrics_rank(name))
            else:
                self._events(conn, attempt_id, decoded)
            conn.execute(
                "INSERT INTO spool_cursors (attempt_id, file, byte_offset) VALUES (?, ?, ?) "
                "ON CONFLICT (attempt_id, file) DO UPDATE SET byte_offset = max(spool_cursors.byte_offset, excluded.byte_offset)",
                (attempt_id, name, end),
            )
        at = _beat_time(beat)
        if at is not None:
            conn.execute(
                "UPDATE attempts SET last_heartbeat_at = ? WHERE attempt_id = ? "
                "AND (last_heartbeat_at IS NULL OR last_heartbeat_at < ?)", (at, attempt_id, at),
            )
        return points

    @staticmethod
    def _points(conn: sqlite3.Connection, attempt_id: str, run_id: str, number: int, batches: list, rank: int) -> int:
        keys = keys_of(batches)
        if not keys:
            return 0
        select = "SELECT key, series_id FROM metric_series WHERE run_id = ? AND rank = ?"
        ids = dict(conn.execute(select, (run_id, rank)))
        missing = sorted(keys - ids.keys())
        if missing:
            conn.executemany(
                "INSERT INTO metric_series (run_id, key, rank) VALUES (?, ?, ?) ON CONFLICT (run_id, key, rank) DO NOTHING",
                [(run_id, key, rank) for key in missing],
            )
            ids = dict(conn.execute(select, (run_id, rank)))
        made = point_rows(batches, ids, number)
        if made is None:
            return 0
        conn.executemany(UPSERT_POINTS.format(p="?"), made.rows)
        conn.executemany(
            "DELETE FROM metric_rollups WHERE series_id = ? AND width = ? AND bucket >= ?",
            [(series_id, width, step // width) for series_id, step in made.lowest.items() for width in ROLLUP_WIDTHS],
        )
        conn.execute(
            "UPDATE attempts SET "
            "first_step = CASE WHEN first_step IS NULL OR first_step > ? THEN ? ELSE first_step END, "
            "last_step = CASE WHEN last_step IS NULL OR last_step < ? THEN ? ELSE last_step END "
            "WHERE attempt_id = ?", (made.low, made.low, made.high, made.high, attempt_id),
        )
        return made.points

    @staticmethod
    def _events(conn: sqlite3.Connection, attempt_id: str, records: list[dict[str, Any]]) -> None:
        for record in records:
            if record["kind"] in _MORE_THAN_STORED or (record["kind"] == "started" and record.get("resume_from")):
                raise Declined(f"a {record['kind']} event")
        conn.executemany(
            "INSERT INTO attempt_events (attempt_id, rank, seq, kind, at, payload) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (attempt_id, rank, seq) DO NOTHING",
            [
                (attempt_id, int(r.get("rank") or 0), r["seq"], r["kind"][:64],
                 _text(datetime.fromtimestamp(float(r["t"]), timezone.utc)), json.dumps(redact_structure(r, ())))
                for r in records
            ],
        )

    # -- the end (records.record_attempt_end) ----------------------------------------------------------

    def record_end(self, attempt_id: str, reason: TerminationReason, evidence_json: str, exit_code: int | None,
                   cost_per_gpu_hour: float, secrets: Sequence[str] = (), ended_at: datetime | None = None) -> bool:
        """Record a completed attempt's end (now, unless `ended_at`) and its run's, once; whether this call recorded it."""
        if reason is not TerminationReason.COMPLETED:
            raise Declined(f"an end as {reason.value}")
        ended_at = ended_at or datetime.now(timezone.utc)

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT run_id, started_at, gpu_count FROM attempts WHERE attempt_id = ?",
                               (attempt_id,)).fetchone()
            if row is None:
                raise Declined("the attempt is not registered")
            run_id, started, gpu_count = row
            started_at = datetime.fromisoformat(started).replace(tzinfo=timezone.utc) if started else ended_at
            wall = max(0.0, (ended_at - started_at).total_seconds())
            gpu_seconds = wall * max(1, gpu_count or 0)
            evidence = json.dumps(redact_structure(json.loads(evidence_json), secrets), ensure_ascii=False)
            changed = conn.execute(
                "UPDATE attempts SET state = ?, ended_at = ?, gpu_seconds = ?, useful_gpu_seconds = ?, "
                "wasted_gpu_seconds = ?, cost_usd = ?, exit_code = ?, signal = NULL, termination_reason = ?, "
                "termination_evidence = ? WHERE attempt_id = ? AND state != ?",
                (AttemptState.ENDED.value, _text(ended_at), gpu_seconds, gpu_seconds, 0.0,
                 gpu_seconds / 3600 * cost_per_gpu_hour, exit_code, reason.value, evidence, attempt_id,
                 AttemptState.ENDED.value),
            ).rowcount
            if changed:
                conn.execute("UPDATE runs SET state = ?, termination_reason = ?, ended_at = ? WHERE run_id = ?",
                             (RunState.COMPLETED.value, reason.value, _text(ended_at), run_id))
            return bool(changed)

        return self._write(work)


def _insert(conn: sqlite3.Connection, table: str, values: dict[str, Any]) -> None:
    columns = list(values)
    conn.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        [_stored(values[column]) for column in columns],
    )


def _recorded(kind: str, data: bytes) -> bytes:
    """As registration.py stores a blob: the config with its secret values masked."""
    return recorded(json.loads(data)) if kind == "config" else data


def _beat_time(beat: dict[str, Any] | None) -> str | None:
    t = (beat or {}).get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    try:
        return _text(datetime.fromtimestamp(float(t), timezone.utc))
    except (OverflowError, OSError, ValueError):
        return None
