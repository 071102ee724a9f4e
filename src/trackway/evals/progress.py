"""What follows an evaluation attempt's end: store the seed's results, aggregate the seeds, escalate, finish.

Called by the supervisor inside the transaction that records the attempt's end, so an end and
its results are written together or not at all:

    seed attempt ends ──► completed: raw outputs (compressed blob), per-task (n, c), pass@k per seed,
                          │          seeds aggregated (mean, std, min, max)
                          ├► evaluator_crash with a retry queued: nothing yet (the next attempt runs)
                          └► any other end, or the budget spent: the seed failed
    every queued seed ended ──► escalation pending: judge the first seeds; clear → queue the rest
                           └──► otherwise the evaluation is completed (every seed completed) or failed
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from sqlalchemy import Connection, RowMapping, delete, insert, select, update

from trackway.evals.launch import queue_seeds
from trackway.evals.outputs import EvaluatorOutput
from trackway.evals.passk import summarize, task_set_pass_at_k
from trackway.evals.records import (
    COMPLETED,
    FAILED,
    SEED_COMPLETED,
    SEED_FAILED,
    seed_metrics_of,
)
from trackway.ledger.blobs import put_blob
from trackway.ledger.records import resolve_run
from trackway.ledger.schema import (
    eval_metrics,
    eval_seed_metrics,
    eval_task_results,
    evaluation_seeds,
    evaluations,
)
from trackway.settings import Settings
from trackway.taxonomy import TerminationReason


def after_eval_attempt(
    conn: Connection,
    settings: Settings,
    eval_run_id: str,
    reason: TerminationReason,
    retrying: bool,
    output: EvaluatorOutput | None,
) -> None:
    seed_row = conn.execute(
        select(evaluation_seeds).where(evaluation_seeds.c.eval_run_id == eval_run_id)
    ).mappings().first()
    if seed_row is None:
        return  # a run of kind eval submitted by hand, outside any evaluation
    if retrying:
        return
    now = datetime.now(timezone.utc)
    key = (evaluation_seeds.c.eval_id == seed_row["eval_id"]) & (evaluation_seeds.c.seed == seed_row["seed"])
    if reason is TerminationReason.COMPLETED and output is not None and output.ok:
        _store_seed_results(conn, seed_row, output)
        conn.execute(update(evaluation_seeds).where(key).values(
            state=SEED_COMPLETED, termination_reason=reason.value, ended_at=now, samples=output.samples,
            tasks=len(output.counts), outputs_sha256=put_blob(conn, output.raw, "eval_outputs"),
            failures=json.dumps(output.failures, ensure_ascii=False)))
        _aggregate(conn, seed_row["eval_id"])
    else:
        conn.execute(update(evaluation_seeds).where(key).values(
            state=SEED_FAILED, termination_reason=reason.value, ended_at=now))
    advance(conn, settings, seed_row["eval_id"], now)


def _store_seed_results(conn: Connection, seed_row: RowMapping, output: EvaluatorOutput) -> None:
    eval_id, seed = seed_row["eval_id"], seed_row["seed"]
    conn.execute(delete(eval_task_results).where(eval_task_results.c.eval_id == eval_id, eval_task_results.c.seed == seed))
    conn.execute(
        insert(eval_task_results),
        [{"eval_id": eval_id, "seed": seed, "task_id": task[:200], "samples": n, "correct": c}
         for task, (n, c) in sorted(output.counts.items())],
    )
    conn.execute(delete(eval_seed_metrics).where(eval_seed_metrics.c.eval_id == eval_id, eval_seed_metrics.c.seed == seed))
    values = task_set_pass_at_k(list(output.counts.values()))
    conn.execute(
        insert(eval_seed_metrics),
        [{"eval_id": eval_id, "seed": seed, "metric": metric, "value": value} for metric, value in values.items()],
    )


def _aggregate(conn: Connection, eval_id: str) -> None:
    """Rewrite the evaluation's per-metric summary over every completed seed."""
    per_seed = seed_metrics_of(conn, eval_id)
    metrics = sorted({m for values in per_seed.values() for m in values}, key=lambda m: int(m.split("@")[1]))
    conn.execute(delete(eval_metrics).where(eval_metrics.c.eval_id == eval_id))
    rows = []
    for metric in metrics:
        # Only metrics every completed seed has: pass@k for a k some seed could not compute would mislead.
        values = [v[metric] for v in per_seed.values() if metric in v]
        if len(values) == len(per_seed):
            rows.append({"eval_id": eval_id, "metric": metric, **summarize(values).as_dict()})
    if rows:
        conn.execute(insert(eval_metrics), rows)


def advance(conn: Connection, settings: Settings, eval_id: str, now: datetime) -> None:
    """Once every queued seed of an evaluation ended: escalate, or finish it completed or failed."""
    evaluation = conn.execute(select(evaluations).where(evaluations.c.eval_id == eval_id)).mappings().one()
    seeds = list(conn.execute(select(evaluation_seeds).where(evaluation_seeds.c.eval_id == eval_id)).mappings())
    if any(s["state"] not in (SEED_COMPLETED, SEED_FAILED) for s in seeds):
        return
    escalation = json.loads(evaluation["escalation"]) if evaluation["escalation"] else None
    all_completed = all(s["state"] == SEED_COMPLETED for s in seeds)
    if escalation is not None and escalation.get("decided") is None:
        metric = escalation["condition"].split()[0]
        row = conn.execute(select(eval_metrics.c.mean).where(
            eval_metrics.c.eval_id == eval_id, eval_metrics.c.metric == metric)).first()
        value = row.mean if row is not None and all_completed else None
        cleared = value is not None and _holds(escalation["condition"], value)
        escalation.update(decided="escalated" if cleared and escalation["held_back"] else "held", value=value)
        conn.execute(update(evaluations).where(evaluations.c.eval_id == eval_id)
                     .values(escalation=json.dumps(escalation)))
        if cleared and escalation["held_back"]:
            run = resolve_run(conn, evaluation["run_id"])
            queue_seeds(conn, settings, evaluation, run, list(escalation["held_back"]), now)
            return
    conn.execute(update(evaluations).where(evaluations.c.eval_id == eval_id)
                 .values(state=COMPLETED if all_completed else FAILED, ended_at=now))


def _holds(condition: str, value: float) -> bool:
    from trackway.evals.spec import COMPARATORS

    _, op, threshold = condition.split()
    return COMPARATORS[op](value, float(threshold))
