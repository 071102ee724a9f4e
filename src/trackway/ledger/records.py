"""Runs and attempts in the ledger: create, address, update and list them.

A run is addressed by its id or its unique name; an attempt as `RUN/N` (N from 1).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping, func, insert, select, update

from trackway.errors import NotFound
from trackway.ledger.bulk import chunks, rows_where_in, update_many
from trackway.ledger.reader import Reader
from trackway.ledger.schema import attempts, checkpoints, runs
from trackway.redaction import redact, redact_structure
from trackway.taxonomy import AttemptState, RunState, TerminationReason


def new_run_id() -> str:
    return "r" + secrets.token_hex(5)


def insert_run(conn: Connection, values: Mapping[str, Any]) -> str:
    run_id = values.get("run_id") or new_run_id()
    conn.execute(insert(runs).values(**{**values, "run_id": run_id}))
    return run_id


def update_run(conn: Connection, run_id: str, **values: Any) -> None:
    conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))


def name_taken(conn: Connection, name: str) -> bool:
    return conn.execute(select(runs.c.run_id).where(runs.c.name == name)).first() is not None


def resolve_run(conn: Connection, ref: str) -> dict:
    """The run whose id or unique name is `ref` (the query is `Reader.run`'s, one text for every caller)."""
    return Reader.over(conn).run(ref)


def resolve_attempt(conn: Connection, ref: str) -> dict:
    """The attempt addressed as `RUN/N`, or the latest attempt of `RUN`."""
    return Reader.over(conn).attempt(ref)


def attempt_count(conn: Connection, run_id: str) -> int:
    return Reader.over(conn).attempt_count(run_id)


def latest_attempt(conn: Connection, run_id: str) -> dict | None:
    return Reader.over(conn).latest_attempt(run_id)


def insert_attempt(conn: Connection, values: Mapping[str, Any]) -> str:
    attempt_id = f"{values['run_id']}/{values['attempt_number']}"
    conn.execute(insert(attempts).values(**{**values, "attempt_id": attempt_id}))
    return attempt_id


def update_attempt(conn: Connection, attempt_id: str, **values: Any) -> None:
    if values.get("termination_evidence") is not None:
        values["termination_evidence"] = redacted_evidence(values["termination_evidence"])
    conn.execute(update(attempts).where(attempts.c.attempt_id == attempt_id).values(**values))


def redacted_evidence(evidence: str | Mapping[str, Any], secrets: Sequence[str] = ()) -> str:
    """Termination evidence with secret shapes, and the run's own `secrets`, hidden; still valid JSON.

    Evidence quotes what the process printed (log lines, the SDK note's message, an executor's
    error), and the ledger is readable by everyone who can run `trackway sql`: a script that
    prints its token must not publish it there. The strings inside the structure are redacted,
    not the serialized text, so the JSON stays parseable. `secrets`: values the run is known to
    hold (`redaction.known_values`), masked wherever they appear. Given the record itself rather than
    its JSON, it is serialized once, after redaction.
    """
    if isinstance(evidence, str):
        try:
            evidence = json.loads(evidence)
        except ValueError:
            return redact(evidence, secrets)
    return json.dumps(redact_structure(evidence, secrets), ensure_ascii=False)


def get_attempt(conn: Connection, attempt_id: str) -> RowMapping:
    row = conn.execute(select(attempts).where(attempts.c.attempt_id == attempt_id)).mappings().first()
    if row is None:
        raise NotFound(f"attempt {attempt_id!r}: not in the ledger")
    return row


def active_attempts(conn: Connection) -> list[dict[str, Any]]:
    """Attempts that have not ended: what a supervisor pass has to look at."""
    unfinished = [state.value for state in AttemptState if not state.is_terminal()]
    # Sorted here, not in SQL: `ORDER BY attempt_id` lets SQLite walk the primary key over the whole
    # history instead of reading the few unfinished rows through the state index.
    rows = rows_where_in(conn, attempts, "state", unfinished)  # a tick over thousands reads them all
    return sorted(rows, key=lambda row: row["attempt_id"])


def unhanded_attempts(conn: Connection) -> list[RowMapping]:
    """Unfinished attempts no executor has taken yet (no job id): a launch under way, or one interrupted.

    The few of them, not every unfinished attempt: a tick asks on top of `active_attempts`.
    """
    unfinished = [state.value for state in AttemptState if not state.is_terminal()]
    return list(conn.execute(select(attempts).where(attempts.c.state.in_(unfinished),
                                                    attempts.c.executor_job_id.is_(None))).mappings())


def list_runs(
    conn: Connection, limit: int | None = 50, project: str | None = None, kinds: Sequence[str] | None = None
) -> list[dict]:
    """Newest runs first, each with its attempt count (counted for the listed runs only)."""
    return Reader.over(conn).runs(limit=limit, project=project, kinds=kinds)


def list_attempts(conn: Connection, run_id: str | None = None, limit: int | None = 100) -> list[dict]:
    return Reader.over(conn).attempts(run_id=run_id, limit=limit)


def run_state_for(reason: TerminationReason) -> RunState:
    """The state a run is left in when its latest attempt ended for `reason`."""
    if reason is TerminationReason.COMPLETED:
        return RunState.COMPLETED
    if reason is TerminationReason.USER_CANCELLED:
        return RunState.CANCELLED
    return RunState.FAILED


@dataclass(frozen=True)
class AttemptEndRecord:
    """One attempt's end as `record_attempt_ends` writes it (see `record_attempt_end` for the fields).

    Its evidence is redacted as the record is made (`redacted_evidence`: its JSON after), so that a
    caller that makes many before the write transaction does not redact them under the write lock.
    """

    attempt: Mapping[str, Any]
    ended_at: Any
    reason: TerminationReason
    evidence: str | Mapping[str, Any]  # its JSON, or the record itself; redacted JSON once made
    exit_code: int | None
    signal: int | None
    cost_per_gpu_hour: float
    secrets: Sequence[str] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", redacted_evidence(self.evidence, self.secrets))  # frozen: set once, here


def record_attempt_end(
    conn: Connection,
    attempt: Mapping[str, Any],
    *,
    ended_at,
    reason: TerminationReason,
    evidence_json: str,
    exit_code: int | None,
    signal: int | None,
    cost_per_gpu_hour: float,
    secrets: Sequence[str] = (),
) -> float | None:
    """Write an attempt's end and its run's state, once: returns gpu_seconds, or None if it was already ended.

    `secrets`: the run's own secret values, masked in the evidence (see `redacted_evidence`).
    """
    end = AttemptEndRecord(attempt, ended_at, reason, evidence_json, exit_code, signal, cost_per_gpu_hour, secrets)
    return record_attempt_ends(conn, [end]).get(attempt["attempt_id"])


def record_attempt_ends(conn: Connection, ends: Sequence[AttemptEndRecord]) -> dict[str, float]:
    """Write many attempts' ends and their runs' states in a few statements; gpu_seconds of each one written.

    An attempt already ended (another process recorded it first) is left as it is and is not in the
    result. Its rows are locked first (PostgreSQL), so two writers never both take one for open.
    Each end is what `record_attempt_end` writes: at most one end per run in one call.
    """
    rows = end_rows(conn, ends)
    write_end_rows(conn, rows)
    return rows.written


@dataclass
class EndRows:
    """The rows that record ends, before they are written: for a caller that adds to them (a retry decided at once)."""

    attempts: list[dict[str, Any]]  # one per attempt: its id and the columns its end sets
    runs: list[dict[str, Any]]  # one per run: its id and its state, reason and end
    written: dict[str, float]  # gpu_seconds of each attempt ended here


def end_rows(conn: Connection, ends: Sequence[AttemptEndRecord], still_open: set[str] | None = None) -> EndRows:
    """What `record_attempt_ends` writes, not written yet.

    `still_open`: the attempts among `ends` not ended yet, read under the write lock by the caller
    (rows locked, on PostgreSQL); None reads them here.
    """
    ids = [end.attempt["attempt_id"] for end in ends]
    open_now: set[str] = still_open if still_open is not None else set()
    last_commit: dict[str, Any] = {}
    for part in chunks(ids):
        asked = set(part)
        if still_open is None:
            open_now.update(conn.execute(
                select(attempts.c.attempt_id)
                .where(attempts.c.attempt_id.in_(part), attempts.c.state != AttemptState.ENDED.value)
                .with_for_update()).scalars())
        failed = [end.attempt["attempt_id"] for end in ends
                  if end.attempt["attempt_id"] in asked and end.reason is not TerminationReason.COMPLETED]
        if failed:
            last_commit.update((attempt_id, committed) for attempt_id, committed in conn.execute(
                select(checkpoints.c.attempt_id, func.max(checkpoints.c.committed_at))
                .where(checkpoints.c.attempt_id.in_(failed)).group_by(checkpoints.c.attempt_id)))
    rows = EndRows([], [], {})
    for end in ends:
        attempt = end.attempt
        attempt_id = attempt["attempt_id"]
        if attempt_id not in open_now:
            continue
        started_at = attempt["started_at"] or end.ended_at
        wall = max(0.0, (end.ended_at - started_at).total_seconds())
        gpus = max(1, attempt["gpu_count"] or 0)
        gpu_seconds = wall * gpus
        useful = _useful_seconds(end.reason, started_at, end.ended_at, last_commit.get(attempt_id)) * gpus
        rows.attempts.append({
            "attempt_id": attempt_id, "state": AttemptState.ENDED.value, "ended_at": end.ended_at,
            "gpu_seconds": gpu_seconds, "useful_gpu_seconds": useful, "wasted_gpu_seconds": gpu_seconds - useful,
            "cost_usd": gpu_seconds / 3600 * end.cost_per_gpu_hour, "exit_code": end.exit_code, "signal": end.signal,
            "termination_reason": end.reason.value,
            "termination_evidence": end.evidence,
        })
        rows.runs.append({"run_id": attempt["run_id"], "state": run_state_for(end.reason).value,
                          "termination_reason": end.reason.value, "ended_at": end.ended_at})
        rows.written[attempt_id] = gpu_seconds
    return rows


def write_end_rows(conn: Connection, rows: EndRows) -> None:
    """Write `end_rows`' rows (with what a caller added): one UPDATE for each set of columns its rows set."""
    for same in _by_columns(rows.attempts):
        update_many(conn, attempts, "attempt_id", same, unless=("state", AttemptState.ENDED.value))
    for same in _by_columns(rows.runs):
        update_many(conn, runs, "run_id", same)


def _by_columns(rows: list[dict[str, Any]]) -> Iterable[list[dict[str, Any]]]:
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        shapes.setdefault(tuple(row), []).append(row)
    return shapes.values()


def _useful_seconds(reason: TerminationReason, started_at, ended_at, last_commit) -> float:
    """Wall seconds of an attempt that were not wasted.

    A completed attempt's time is all useful. Otherwise, work after the attempt's last committed
    checkpoint (`last_commit`) is lost or redone by the next attempt, so only the time up to that
    commit counts; an attempt that committed nothing was all waste.
    """
    wall = max(0.0, (ended_at - started_at).total_seconds())
    if reason is TerminationReason.COMPLETED:
        return wall
    if last_commit is None:
        return 0.0
    return min(wall, max(0.0, (last_commit - started_at).total_seconds()))
