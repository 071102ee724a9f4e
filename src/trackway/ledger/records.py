"""Runs and attempts in the ledger: create, address, update and list them.

A run is addressed by its id or its unique name; an attempt as `RUN/N` (N from 1).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, RowMapping, func, insert, select, update

from trackway.errors import NotFound
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


def redacted_evidence(evidence_json: str, secrets: Sequence[str] = ()) -> str:
    """Termination evidence with secret shapes, and the run's own `secrets`, hidden; still valid JSON.

    Evidence quotes what the process printed (log lines, the SDK note's message, an executor's
    error), and the ledger is readable by everyone who can run `trackway sql`: a script that
    prints its token must not publish it there. The strings inside the structure are redacted,
    not the serialized text, so the JSON stays parseable. `secrets`: values the run is known to
    hold (`redaction.known_values`), masked wherever they appear.
    """
    try:
        evidence = json.loads(evidence_json)
    except ValueError:
        return redact(evidence_json, secrets)
    return json.dumps(redact_structure(evidence, secrets), ensure_ascii=False)


def get_attempt(conn: Connection, attempt_id: str) -> RowMapping:
    row = conn.execute(select(attempts).where(attempts.c.attempt_id == attempt_id)).mappings().first()
    if row is None:
        raise NotFound(f"attempt {attempt_id!r}: not in the ledger")
    return row


def active_attempts(conn: Connection) -> list[RowMapping]:
    """Attempts that have not ended: what a supervisor pass has to look at."""
    unfinished = [state.value for state in AttemptState if not state.is_terminal()]
    # Sorted here, not in SQL: `ORDER BY attempt_id` lets SQLite walk the primary key over the whole
    # history instead of reading the few unfinished rows through the state index.
    rows = conn.execute(select(attempts).where(attempts.c.state.in_(unfinished))).mappings()
    return sorted(rows, key=lambda row: row["attempt_id"])


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
    started_at = attempt["started_at"] or ended_at
    wall = max(0.0, (ended_at - started_at).total_seconds())
    gpus = max(1, attempt["gpu_count"] or 0)
    gpu_seconds = wall * gpus
    useful = split_useful_seconds(conn, attempt["attempt_id"], reason, started_at, ended_at) * gpus
    changed = conn.execute(
        update(attempts)
        .where(attempts.c.attempt_id == attempt["attempt_id"], attempts.c.state != AttemptState.ENDED.value)
        .values(
            state=AttemptState.ENDED.value,
            ended_at=ended_at,
            gpu_seconds=gpu_seconds,
            useful_gpu_seconds=useful,
            wasted_gpu_seconds=gpu_seconds - useful,
            cost_usd=gpu_seconds / 3600 * cost_per_gpu_hour,
            exit_code=exit_code,
            signal=signal,
            termination_reason=reason.value,
            termination_evidence=redacted_evidence(evidence_json, secrets),
        )
    ).rowcount
    if not changed:
        return None
    update_run(
        conn,
        attempt["run_id"],
        state=run_state_for(reason).value,
        termination_reason=reason.value,
        ended_at=ended_at,
    )
    return gpu_seconds


def split_useful_seconds(conn: Connection, attempt_id: str, reason: TerminationReason, started_at, ended_at) -> float:
    """Wall seconds of an attempt that were not wasted.

    A completed attempt's time is all useful. Otherwise, work after the attempt's last committed
    checkpoint is lost or redone by the next attempt, so only the time up to that commit counts;
    an attempt that committed nothing was all waste.
    """
    wall = max(0.0, (ended_at - started_at).total_seconds())
    if reason is TerminationReason.COMPLETED:
        return wall
    last_commit = conn.execute(
        select(func.max(checkpoints.c.committed_at)).where(checkpoints.c.attempt_id == attempt_id)
    ).scalar()
    if last_commit is None:
        return 0.0
    return min(wall, max(0.0, (last_commit - started_at).total_seconds()))
