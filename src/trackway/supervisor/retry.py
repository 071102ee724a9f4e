"""Applying the retry policy to a run whose attempt just ended: the decision, written down, and the queue.

A decision to resume leaves the run `queued` with `not_before` (the backoff); the control loop
launches it when due (see `start_attempt(from_queue=True)` for why it is launched only once).
"""

from __future__ import annotations

import json
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import Connection, RowMapping, func, select, update

from trackway.ledger.schema import attempts, runs
from trackway.settings import Settings
from trackway.supervisor.policy import AttemptOutcome, Decision, RetryPolicy, decide, load_policy, memory_fingerprint
from trackway.taxonomy import AttemptState, RunState, TerminationReason


def run_policy(settings: Settings, run: RowMapping) -> RetryPolicy:
    """trackway.toml's [retry], then the run's own --retry-policy."""
    own = tomllib.loads(run["retry_policy"]) if run["retry_policy"] else {}
    return load_policy(None, _merge(settings.retry, own))


def _merge(base: dict, top: dict) -> dict:
    reasons = {name: dict(body) for name, body in (base.get("reasons") or {}).items()}
    for name, body in (top.get("reasons") or {}).items():
        reasons.setdefault(name, {}).update(body)
    return {**base, **top, "reasons": reasons}


def effective_config_path(settings: Settings, run_id: str) -> Path | None:
    """The config the run's next attempt gets: the newest attempt's (after `resume --set`), else the run's."""
    run_dir = settings.runs_dir / run_id
    per_attempt = sorted(
        (int(p.parent.name), p) for p in run_dir.glob("attempts/*/config.json") if p.parent.name.isdigit()
    )
    if per_attempt:
        return per_attempt[-1][1]
    path = run_dir / "config.json"
    return path if path.is_file() else None


def run_config(settings: Settings, run_id: str) -> dict | None:
    path = effective_config_path(settings, run_id)
    return json.loads(path.read_text()) if path is not None else None


def next_fingerprint(settings: Settings, run: RowMapping) -> str:
    return memory_fingerprint(run_config(settings, run["run_id"]), run["resource"], run["gpus"])


def decide_after_end(conn: Connection, settings: Settings, run: RowMapping, attempt_id: str) -> Decision:
    """Decide what follows `attempt_id`'s end, store the decision on it, and queue a retry if resuming."""
    rows = list(
        conn.execute(
            select(attempts).where(attempts.c.run_id == run["run_id"]).order_by(attempts.c.attempt_number)
        ).mappings()
    )
    history = [
        AttemptOutcome(
            reason=TerminationReason(row["termination_reason"]),
            committed_checkpoint=bool(row["checkpoints_committed"]),
            memory_fingerprint=row["memory_fingerprint"],
        )
        for row in rows
        if row["termination_reason"]
    ]
    spent = conn.execute(
        select(func.coalesce(func.sum(attempts.c.gpu_seconds), 0.0)).where(attempts.c.run_id == run["run_id"])
    ).scalar_one()
    decision = decide(
        run_policy(settings, run),
        history,
        next_memory_fingerprint=next_fingerprint(settings, run),
        run_gpu_seconds=float(spent),
    )
    conn.execute(
        update(attempts).where(attempts.c.attempt_id == attempt_id).values(retry_decision=json.dumps(decision.as_record()))
    )
    if decision.action == "resume":
        conn.execute(
            update(runs)
            .where(runs.c.run_id == run["run_id"])
            .values(
                state=RunState.QUEUED.value,
                ended_at=None,
                not_before=datetime.now(timezone.utc) + timedelta(seconds=decision.delay_s),
            )
        )
    return decision


def due_retries(conn: Connection, now: datetime) -> list[str]:
    """Queued runs whose attempts all ended (retries; first attempts are started by their submitter), due now."""
    has_attempt = select(attempts.c.run_id).where(attempts.c.run_id == runs.c.run_id).exists()
    unfinished = (
        select(attempts.c.run_id)
        .where(attempts.c.run_id == runs.c.run_id, attempts.c.state != AttemptState.ENDED.value)
        .exists()
    )
    query = (
        select(runs.c.run_id)
        .where(runs.c.state == RunState.QUEUED.value, has_attempt, ~unfinished)
        .where((runs.c.not_before.is_(None)) | (runs.c.not_before <= now))
        .order_by(runs.c.not_before)
    )
    return list(conn.execute(query).scalars())


def read_policy_file(path: str | None) -> str | None:
    """The text of a --retry-policy file, validated now so that bad input is refused before anything is recorded."""
    if not path:
        return None
    load_policy(path)
    return Path(path).read_text()
