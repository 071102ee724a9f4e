"""What follows an evaluation attempt's end: store the seed's results, aggregate the seeds, escalate, finish.

Called by the supervisor inside the transaction that records the attempt's end, so an end and
its results are written together or not at all:

    inference run ends ──► completed, outputs committed: the seed's scoring run is queued (the seed goes on)
                      └► otherwise, as any seed attempt's end below
    seed attempt ends ──► completed: raw outputs (compressed blob), per-task (n, c), pass@k per seed,
                          │          seeds aggregated (mean, std, min, max)
                          ├► evaluator_crash with a retry queued: nothing yet (the next attempt runs)
                          └► any other end, or the budget spent: the seed failed
    every queued seed ended ──► escalation pending: judge the first seeds; clear → queue the rest
                           └──► otherwise the evaluation is completed (every seed completed) or failed

A seed whose evaluator or task set changed before it launched ends here too: it continues as the
evaluation of the new versions (`continue_as_new_evaluation`), and its old evaluation finishes with
what its own versions produced.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from sqlalchemy import Connection, RowMapping, delete, insert, select, update

from trackway.evals.launch import PinnedCheckpoint, VersionChange, eval_key, queue_scoring, queue_seeds
from trackway.evals.outputs import EvaluatorOutput
from trackway.evals.phases import CommittedOutputs
from trackway.evals.passk import summarize, task_set_pass_at_k
from trackway.evals.records import (
    COMPLETED,
    FAILED,
    IN_FLIGHT,
    SEED_COMPLETED,
    SEED_FAILED,
    new_eval_id,
    seed_metrics_of,
)
from trackway.evals.spec import spec_from_record
from trackway.ledger.blobs import get_blob, put_blob
from trackway.ledger.records import latest_attempt, resolve_run
from trackway.ledger.schema import (
    eval_metrics,
    eval_seed_metrics,
    eval_task_results,
    evaluation_seeds,
    evaluations,
    runs,
)
from trackway.settings import Settings
from trackway.taxonomy import RunState, TerminationReason


def after_eval_attempt(
    conn: Connection,
    settings: Settings,
    eval_run_id: str,
    reason: TerminationReason,
    retrying: bool,
    output: EvaluatorOutput | None,
    committed: CommittedOutputs | None = None,
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
    if (seed_row["inference_run_id"] == eval_run_id and reason is TerminationReason.COMPLETED
            and committed is not None and committed.ok and committed.path is not None):
        # Inference is done and its outputs committed: the seed goes on as its scoring run, on the scorer's resource.
        evaluation = conn.execute(select(evaluations).where(evaluations.c.eval_id == seed_row["eval_id"])).mappings().one()
        scoring_run_id = queue_scoring(conn, settings, evaluation, int(seed_row["seed"]), committed.path, now)
        conn.execute(update(evaluation_seeds).where(key).values(
            eval_run_id=scoring_run_id, inference_outputs=committed.path,
            inference_manifest_sha256=committed.manifest_sha256))
        return
    if reason is TerminationReason.COMPLETED and output is not None and output.ok:
        _store_seed_results(conn, seed_row, output)
        conn.execute(update(evaluation_seeds).where(key).values(
            state=SEED_COMPLETED, termination_reason=reason.value, ended_at=now, samples=output.samples,
            tasks=len(output.counts), outputs_sha256=put_blob(conn, output.raw, "eval_outputs"),
            failures=json.dumps(output.failures, ensure_ascii=False),
            judge_answers_sha256=(put_blob(conn, output.judge_answers, "eval_judge_answers")
                                  if output.judge_answers is not None else None)))
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


def _generation(pinned: PinnedCheckpoint, spec, change: VersionChange) -> str | None:
    """The new evaluation's generation key (two phases), read from the inference files now."""
    from trackway.errors import InputError
    from trackway.evals.launch import inference_key

    if not spec.two_phase:
        return None
    try:
        return inference_key(pinned, spec, spec.inference_version(), change.after[1])
    except InputError:
        return None


def _judge(spec) -> str | None:
    """The new evaluation's judge as pinned now (JSON), as request_evaluation records it."""
    from trackway.errors import InputError
    from trackway.receipts.canonical import canonical_json

    try:
        judge = spec.judge_identity()
    except InputError:
        return None
    return canonical_json(judge).decode() if judge is not None else None


def continue_as_new_evaluation(conn: Connection, settings: Settings, eval_run_id: str, change: VersionChange) -> str:
    """Move a seed whose evaluator changed to the evaluation of the new versions (found or made); its id.

    The new evaluation gets a seed run of its own (queued for the supervisor); the old seed run
    ends failed, its last attempt saying where the seed went, and the old evaluation finishes with
    what its own versions produced.
    """
    from trackway.ledger.supervisor_events import add_supervisor_event

    now = datetime.now(timezone.utc)
    seed_row = conn.execute(select(evaluation_seeds).where(evaluation_seeds.c.eval_run_id == eval_run_id)).mappings().one()
    old = conn.execute(select(evaluations).where(evaluations.c.eval_id == seed_row["eval_id"])).mappings().one()
    run = resolve_run(conn, old["run_id"])
    spec = spec_from_record(json.loads(get_blob(conn, old["spec_sha256"])))
    pinned = PinnedCheckpoint(old["run_id"], int(old["checkpoint_step"]), old["checkpoint_name"],
                              old["checkpoint_path"], old["checkpoint_manifest_sha256"])
    key = eval_key(pinned, spec, *change.after)
    seed = int(seed_row["seed"])
    target = conn.execute(select(evaluations).where(evaluations.c.eval_key == key)).mappings().first()
    if target is None:
        values = {k: old[k] for k in ("run_id", "checkpoint_step", "checkpoint_name", "checkpoint_path",
                                      "checkpoint_manifest_sha256", "spec_name", "spec_sha256", "decoding",
                                      "primary_metric", "trigger")}
        values.update(eval_id=new_eval_id(), evaluator_version=change.after[0], task_set_sha256=change.after[1],
                      eval_key=key, state=IN_FLIGHT, escalation=None, created_at=now,
                      inference_key=_generation(pinned, spec, change), judge=_judge(spec))
        conn.execute(insert(evaluations).values(**values))
        target = values
    have = set(conn.execute(select(evaluation_seeds.c.seed).where(
        evaluation_seeds.c.eval_id == target["eval_id"])).scalars())
    if seed not in have:
        queue_seeds(conn, settings, target, run, [seed], now)
        conn.execute(update(evaluations).where(evaluations.c.eval_id == target["eval_id"])
                     .values(state=IN_FLIGHT, ended_at=None))
    last = latest_attempt(conn, eval_run_id)
    message = (f"the {change.text()} since evaluation {old['eval_id']} was requested: this seed is not run again "
               f"under it; it continues as evaluation {target['eval_id']}")
    if last is not None:
        add_supervisor_event(conn, last["attempt_id"], "evaluator_changed", {
            "message": message, "from": old["eval_id"], "to": target["eval_id"],
            "before": list(change.before), "after": list(change.after)})
    conn.execute(update(runs).where(runs.c.run_id == eval_run_id)
                 .values(state=RunState.FAILED.value, not_before=None, ended_at=now))
    conn.execute(update(evaluation_seeds).where(evaluation_seeds.c.eval_run_id == eval_run_id)
                 .values(state=SEED_FAILED, ended_at=now,
                         termination_reason=seed_row["termination_reason"] or (last or {}).get("termination_reason")))
    advance(conn, settings, old["eval_id"], now)
    return str(target["eval_id"])
