"""Evaluations in the ledger: attach specs to runs, address evaluations, and read what they found.

An evaluation is addressed by its id (`ev…`); a checkpoint as `RUN@STEP`, `RUN@step-00000050`
or `RUN` alone (its newest committed checkpoint).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from datetime import datetime, timezone

from sqlalchemy import Connection, RowMapping, func, insert, select

from trackway.errors import InputError
from trackway.evals.spec import EvalSpec
from trackway.ledger.blobs import put_blob
from trackway.ledger.reader import Reader
from trackway.ledger.schema import (
    attempts,
    eval_metrics,
    eval_seed_metrics,
    evaluations,
    run_eval_specs,
    runs,
)
from trackway.receipts.canonical import canonical_json
from trackway.taxonomy import AttemptState, RunKind, RunState

# An evaluation in flight holds its checkpoint; these are its states.
IN_FLIGHT = "running"
COMPLETED = "completed"
FAILED = "failed"
# A seed is pending until its run's last attempt ended; then it completed or failed.
SEED_PENDING = "pending"
SEED_COMPLETED = "completed"
SEED_FAILED = "failed"


def new_eval_id() -> str:
    return "ev" + secrets.token_hex(5)


def store_spec(conn: Connection, spec: EvalSpec) -> str:
    return put_blob(conn, canonical_json(spec.record()), "eval_spec")


def attach_specs(conn: Connection, run_id: str, specs: Sequence[EvalSpec]) -> None:
    """Record that `run_id`'s committed checkpoints are evaluated by `specs` (by their triggers)."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InputError(f"--eval: two specs are named {sorted(n for n in names if names.count(n) > 1)[0]!r}; names must differ")
    now = datetime.now(timezone.utc)
    for spec in specs:
        conn.execute(
            insert(run_eval_specs).values(
                run_id=run_id, name=spec.name, spec_sha256=store_spec(conn, spec), trigger=spec.trigger, created_at=now
            )
        )


def resolve_evaluation(conn: Connection, ref: str) -> dict:
    """The evaluation whose id is `ref`, or whose seed's run is `ref` (the query is `Reader.evaluation`'s)."""
    return Reader.over(conn).evaluation(ref)


def parse_checkpoint_ref(ref: str) -> tuple[str, int | None]:
    """`RUN@STEP` / `RUN@step-N` / `RUN` → (run reference, step or None for the newest)."""
    run_ref, sep, step_text = ref.partition("@")
    if not run_ref.strip():
        raise InputError(f"CHECKPOINT {ref!r}: expected RUN@STEP (e.g. tiny-lm@150), or RUN for its newest checkpoint")
    if not sep or step_text in ("", "latest"):
        return run_ref, None
    digits = step_text[5:] if step_text.startswith("step-") else step_text
    if not digits.isdigit():
        raise InputError(f"CHECKPOINT {ref!r}: expected RUN@STEP with STEP a whole number (e.g. {run_ref}@150)")
    return run_ref, int(digits)


def evaluations_of_run(conn: Connection, run_id: str, spec_name: str | None = None) -> list[dict]:
    return Reader.over(conn).evaluations_of_run(run_id, spec_name)


def seeds_of(conn: Connection, eval_id: str) -> list[dict]:
    return Reader.over(conn).seeds_of(eval_id)


def seed_metrics_of(conn: Connection, eval_id: str) -> dict[int, dict[str, float]]:
    found: dict[int, dict[str, float]] = {}
    for row in conn.execute(select(eval_seed_metrics).where(eval_seed_metrics.c.eval_id == eval_id)).mappings():
        found.setdefault(int(row["seed"]), {})[row["metric"]] = row["value"]
    return found


def metrics_of(conn: Connection, eval_id: str) -> dict[str, dict]:
    return Reader.over(conn).eval_metrics(eval_id)


def spec_record(conn: Connection, evaluation: RowMapping) -> dict:
    from trackway.ledger.blobs import get_blob

    return json.loads(get_blob(conn, evaluation["spec_sha256"]))


def pinned_checkpoints(conn: Connection, keep_all_evaluated: bool = False) -> dict[str, dict[int, str]]:
    """Checkpoints retention must keep for evaluations: run → step → why.

    An evaluation in flight pins the checkpoint it reads. Once evaluations have finished, the
    best checkpoint of each (run, spec) by the spec's first metric stays pinned, so "the real
    one" is never deleted; other evaluated checkpoints follow the retention policy (their
    results, raw outputs included, stay in the ledger), unless `keep_all_evaluated`
    (`[checkpoints] keep_evaluated = "all"`) pins every checkpoint an evaluation references.
    """
    pins: dict[str, dict[int, str]] = {}
    held = select(evaluations.c.run_id, evaluations.c.checkpoint_step, evaluations.c.eval_id, evaluations.c.state)
    if not keep_all_evaluated:
        held = held.where(evaluations.c.state == IN_FLIGHT)
    for row in conn.execute(held):
        why = "in flight" if row.state == IN_FLIGHT else row.state
        pins.setdefault(row.run_id, {}).setdefault(int(row.checkpoint_step), f"pinned by evaluation {row.eval_id} ({why})")
    finished = conn.execute(
        select(evaluations, eval_metrics.c.metric, eval_metrics.c.mean)
        .join(eval_metrics, eval_metrics.c.eval_id == evaluations.c.eval_id)
        .where(evaluations.c.state == COMPLETED, eval_metrics.c.metric == evaluations.c.primary_metric)
    ).mappings()
    best: dict[tuple[str, str], tuple[float, int, str]] = {}
    for row in finished:
        key = (row["run_id"], row["spec_name"])
        candidate = (row["mean"], int(row["checkpoint_step"]), row["metric"])
        if key not in best or candidate[:2] > best[key][:2]:
            best[key] = candidate
    for (run_id, spec_name), (mean, step, metric) in best.items():
        pins.setdefault(run_id, {}).setdefault(step, f"best {metric} by evaluation spec {spec_name} ({mean:.4f})")
    return pins


def running_eval_attempts(conn: Connection) -> int:
    query = (
        select(func.count())
        .select_from(attempts.join(runs, runs.c.run_id == attempts.c.run_id))
        # `state IN (unfinished)` reads the state index; `!= ended` would read every attempt ever made.
        .where(runs.c.kind == RunKind.EVAL.value,
               attempts.c.state.in_([state.value for state in AttemptState if not state.is_terminal()]))
    )
    return int(conn.execute(query).scalar_one())


def queued_eval_runs(conn: Connection, limit: int) -> list[tuple[str, str]]:
    """(run id, executor) of evaluation seeds waiting for their first attempt, oldest first."""
    if limit <= 0:
        return []
    has_attempt = select(attempts.c.run_id).where(attempts.c.run_id == runs.c.run_id).exists()
    query = (
        select(runs.c.run_id, runs.c.executor)
        .where(runs.c.kind == RunKind.EVAL.value, runs.c.state == RunState.QUEUED.value, ~has_attempt)
        .order_by(runs.c.created_at, runs.c.run_id)
        .limit(limit)
    )
    return [(row.run_id, row.executor) for row in conn.execute(query)]
