"""What happened in the ledger after a moment, as events: what the event stream sends and notifications tell.

    attempt_started, attempt_ended, checkpoint_committed, evaluation_finished, watcher_fired, experiment_concluded,
    expectation_settled (a run's own `--expect` criterion met, or no longer able to be)

Each is read from the row that records it (by its timestamp), with a key that names it once, so a
reader that asks again over an overlapping window can drop what it already has.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import select

from trackway.ledger.supervisor_events import SUPERVISOR_RANK
from trackway.ledger.schema import attempt_events, attempts, checkpoints, eval_metrics, evaluations, experiments, runs

Happening = tuple[datetime, str, str, dict[str, Any]]  # (time, kind, key, data)


def happened(conn, after: datetime, watcher_kinds: tuple[str, ...]) -> list[Happening]:
    """Every event after `after`, oldest first: (time, kind, key, data); `watcher_kinds`: the supervisor events that are alarms."""
    out: list[Happening] = []
    for row in conn.execute(select(attempts.c.attempt_id, attempts.c.run_id, attempts.c.started_at, attempts.c.resource)
                            .where(attempts.c.started_at > after)).mappings():
        out.append((row["started_at"], "attempt_started", row["attempt_id"],
                    {"attempt_id": row["attempt_id"], "run_id": row["run_id"], "resource": row["resource"]}))
    for row in conn.execute(select(attempts.c.attempt_id, attempts.c.run_id, attempts.c.ended_at,
                                   attempts.c.termination_reason, attempts.c.retry_decision,
                                   attempts.c.termination_evidence, runs.c.kind, runs.c.name)
                            .join(runs, runs.c.run_id == attempts.c.run_id)
                            .where(attempts.c.ended_at > after)).mappings():
        decision = json.loads(row["retry_decision"]) if row["retry_decision"] else None
        evidence = json.loads(row["termination_evidence"]) if row["termination_evidence"] else {}
        out.append((row["ended_at"], "attempt_ended", row["attempt_id"],
                    {"attempt_id": row["attempt_id"], "run_id": row["run_id"], "run_name": row["name"],
                     "kind": row["kind"], "termination_reason": row["termination_reason"], "decision": decision,
                     "evidence": (evidence.get("lines") or [None])[-1]}))
    for row in conn.execute(select(checkpoints.c.run_id, checkpoints.c.step, checkpoints.c.name,
                                   checkpoints.c.committed_at, checkpoints.c.attempt_id)
                            .where(checkpoints.c.committed_at > after)).mappings():
        out.append((row["committed_at"], "checkpoint_committed", f"{row['run_id']}/{row['name']}",
                    {"run_id": row["run_id"], "step": row["step"], "name": row["name"], "attempt_id": row["attempt_id"]}))
    for row in conn.execute(select(evaluations.c.eval_id, evaluations.c.run_id, evaluations.c.checkpoint_step,
                                   evaluations.c.spec_name, evaluations.c.state, evaluations.c.ended_at)
                            .where(evaluations.c.ended_at > after)).mappings():
        metrics = dict(conn.execute(select(eval_metrics.c.metric, eval_metrics.c.mean)
                                    .where(eval_metrics.c.eval_id == row["eval_id"])).all())
        out.append((row["ended_at"], "evaluation_finished", row["eval_id"],
                    {"eval_id": row["eval_id"], "run_id": row["run_id"], "step": row["checkpoint_step"],
                     "spec": row["spec_name"], "state": row["state"], "metrics": metrics}))
    for row in conn.execute(select(attempt_events.c.attempt_id, attempt_events.c.kind, attempt_events.c.at,
                                   attempt_events.c.payload)
                            .where(attempt_events.c.at > after, attempt_events.c.rank == SUPERVISOR_RANK,
                                   attempt_events.c.kind.in_(watcher_kinds))).mappings():
        message = json.loads(row["payload"]).get("message")
        out.append((row["at"], "watcher_fired", f"{row['attempt_id']}/{row['kind']}",
                    {"attempt_id": row["attempt_id"], "watcher": row["kind"], "message": message}))
    for row in conn.execute(select(experiments.c.experiment_id, experiments.c.title, experiments.c.status,
                                   experiments.c.verdict, experiments.c.stop_reason, experiments.c.verdict_detail,
                                   experiments.c.full_run_id, experiments.c.concluded_at)
                            .where(experiments.c.concluded_at > after)).mappings():
        detail = json.loads(row["verdict_detail"]) if row["verdict_detail"] else {}
        out.append((row["concluded_at"], "experiment_concluded", row["experiment_id"],
                    {"experiment_id": row["experiment_id"], "title": row["title"], "status": row["status"],
                     "verdict": row["verdict"], "why": detail.get("why") or row["stop_reason"],
                     "run_id": row["full_run_id"]}))
    for row in conn.execute(select(runs.c.run_id, runs.c.name, runs.c.expect_verdict)
                            .where(runs.c.expect_judged_at > after, runs.c.expect_verdict.is_not(None))).mappings():
        for index, judged in enumerate(json.loads(row["expect_verdict"]).get("criteria") or []):
            settled = judged.get("settled_at")
            if not settled or datetime.fromisoformat(settled) <= after:
                continue
            out.append((datetime.fromisoformat(settled), "expectation_settled",
                        f"{row['run_id']}/{index}/{judged['state']}",
                        {"run_id": row["run_id"], "run_name": row["name"], "criterion": judged["criterion"],
                         "state": judged["state"], "why": judged.get("why"), "step": judged.get("step")}))
    out.sort(key=lambda e: e[0])
    return out
