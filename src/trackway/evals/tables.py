"""What people read about evaluations, computed from the ledger: the per-checkpoint table, one evaluation, a comparison.

The CLI prints these; `--json` prints them as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, RowMapping, select

from trackway.errors import Ambiguous, InputError, NotFound
from trackway.evals.records import (
    COMPLETED,
    SEED_PENDING,
    evaluations_of_run,
    metrics_of,
    resolve_evaluation,
    seed_metrics_of,
    seeds_of,
    spec_record,
)
from trackway.ledger.records import list_attempts, resolve_run
from trackway.ledger.schema import eval_task_results, evaluations

# Config keys (by their last dotted segment) that give a run's total steps, for "progress %".
TOTAL_STEP_KEYS = ("steps", "max_steps", "total_steps", "num_steps", "train_steps", "num_train_steps", "max_iters")
# A task "passes" in an evaluation when at least this share of its samples (all seeds) is correct.
PASS_SHARE = 0.5


def total_steps(config: Mapping[str, Any] | None) -> int | None:
    found: list[int] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, str(k))
        elif key in TOTAL_STEP_KEYS and isinstance(node, int) and not isinstance(node, bool) and node > 0:
            found.append(node)

    walk(config or {}, "")
    return found[0] if len(set(found)) == 1 else None


def _total_steps_said_by_the_script(conn: Connection, run_id: str) -> int | None:
    """Total steps from the config an attempt ran with: the submitted one merged with what the script handed
    `trackway.init(config=...)` (ledger/script_config.py), the newest attempt first."""
    from trackway.ledger.blobs import get_blob

    for attempt in reversed(list_attempts(conn, run_id=run_id)):
        if not attempt["config_sha256"]:
            continue
        try:
            config = json.loads(get_blob(conn, attempt["config_sha256"]))
        except (NotFound, ValueError):
            continue
        found = total_steps(config if isinstance(config, Mapping) else None)
        if found:
            return found
    return None


def run_table(conn: Connection, run_ref: str, config: Mapping[str, Any] | None, spec_name: str | None = None) -> dict:
    """Every evaluation of a run's checkpoints: the table users keep by hand, per seed and aggregated."""
    run = resolve_run(conn, run_ref)
    total = total_steps(config) or _total_steps_said_by_the_script(conn, run["run_id"])
    rows = []
    for evaluation in evaluations_of_run(conn, run["run_id"], spec_name):
        step = int(evaluation["checkpoint_step"])
        rows.append({
            "eval_id": evaluation["eval_id"],
            "checkpoint": evaluation["checkpoint_name"],
            "step": step,
            "progress": (step / total) if total else None,
            "spec": evaluation["spec_name"],
            "state": evaluation["state"],
            "evaluator_version": evaluation["evaluator_version"],
            "task_set_sha256": evaluation["task_set_sha256"],
            "metrics": metrics_of(conn, evaluation["eval_id"]),
            "per_seed": {str(seed): values for seed, values in sorted(seed_metrics_of(conn, evaluation["eval_id"]).items())},
            "shown_metrics": spec_record(conn, evaluation)["metrics"],
        })
    return {"run_id": run["run_id"], "run_name": run["name"], "total_steps": total, "evaluations": rows}


def evaluation_detail(conn: Connection, ref: str) -> dict:
    """One evaluation: its checkpoint, pinned versions, decoding, seeds (with attempts), metrics and failures."""
    evaluation = resolve_evaluation(conn, ref)
    spec = spec_record(conn, evaluation)
    per_seed = seed_metrics_of(conn, evaluation["eval_id"])
    seeds = []
    totals: dict[str, dict[str, float]] = {}
    for row in seeds_of(conn, evaluation["eval_id"]):
        attempts = [_attempt(a) for a in list_attempts(conn, row["eval_run_id"], limit=None)]
        seed = {
            "seed": int(row["seed"]),
            "eval_run_id": row["eval_run_id"],
            "state": row["state"] if row["state"] != SEED_PENDING else row["run_state"],
            "termination_reason": row["termination_reason"],
            "attempts": attempts,
            "samples": row["samples"],
            "tasks": row["tasks"],
            "metrics": per_seed.get(int(row["seed"]), {}),
            "outputs_sha256": row["outputs_sha256"],
            "failures": json.loads(row["failures"]) if row["failures"] else [],
        }
        if row["inference_run_id"] is not None:
            seed.update(_phases(conn, row, attempts, totals))
        seeds.append(seed)
    run = resolve_run(conn, evaluation["run_id"])
    return {
        "eval_id": evaluation["eval_id"],
        "run_id": run["run_id"],
        "run_name": run["name"],
        "checkpoint": evaluation["checkpoint_name"],
        "step": int(evaluation["checkpoint_step"]),
        "checkpoint_path": evaluation["checkpoint_path"],
        "checkpoint_manifest_sha256": evaluation["checkpoint_manifest_sha256"],
        "spec": evaluation["spec_name"],
        "spec_path": spec["path"],
        "command": spec["command"],
        "evaluator_version": evaluation["evaluator_version"],
        "task_set": spec.get("task_set"),
        "output_fields": spec.get("output") or {},
        "task_set_sha256": evaluation["task_set_sha256"],
        "decoding": json.loads(evaluation["decoding"]),
        "trigger": evaluation["trigger"],
        "state": evaluation["state"],
        "escalation": json.loads(evaluation["escalation"]) if evaluation["escalation"] else None,
        "created_at": evaluation["created_at"],
        "ended_at": evaluation["ended_at"],
        "metrics": metrics_of(conn, evaluation["eval_id"]),
        "seeds": seeds,
        # Two phases: each phase's spec, the judge as pinned, and what each phase's attempts cost over the seeds.
        **({"inference": spec["inference"], "scoring": spec["scoring"], "inference_key": evaluation["inference_key"],
            "phase_totals": totals} if "inference" in spec else {}),
        **({"judge": {**spec["judge"], **json.loads(evaluation["judge"])}} if evaluation["judge"] else {}),
    }


def _attempt(a: Mapping[str, Any]) -> dict:
    """An evaluation attempt as `eval show` tells it: its ending, where it ran, and what it held and cost."""
    return {"attempt_id": a["attempt_id"], "termination_reason": a["termination_reason"],
            "rule": json.loads(a["termination_evidence"])["rule"] if a["termination_evidence"] else None,
            "retry_decision": json.loads(a["retry_decision"]) if a["retry_decision"] else None,
            "resource": a.get("resource"), "gpus": a.get("gpus"), "state_dir": a.get("state_dir"),
            "started_at": a.get("started_at"), "ended_at": a.get("ended_at"),
            "gpu_seconds": a.get("gpu_seconds"), "cost_usd": a.get("cost_usd")}


def _phases(conn: Connection, row: Mapping[str, Any], scoring_attempts: list[dict],
            totals: dict[str, dict[str, float]]) -> dict:
    """A two-phase seed's runs, each with its attempts; the outputs it scored and the judge answers kept."""
    from trackway.ledger.blobs import get_blob

    phases: dict[str, dict] = {}
    runs_of = {"inference": row["inference_run_id"]}
    if row["eval_run_id"] != row["inference_run_id"]:
        runs_of["scoring"] = row["eval_run_id"]
    for phase, run_id in runs_of.items():
        run = resolve_run(conn, run_id)
        attempts = scoring_attempts if phase == "scoring" else [_attempt(a) for a in list_attempts(conn, run_id, limit=None)]
        phases[phase] = {"run_id": run_id, "run_name": run["name"], "state": run["state"], "resource": run["resource"],
                         "gpus": run["gpus"], "attempts": attempts}
        total = totals.setdefault(phase, {"attempts": 0, "gpu_seconds": 0.0, "cost_usd": 0.0})
        total["attempts"] += len(attempts)
        total["gpu_seconds"] += sum(a["gpu_seconds"] or 0.0 for a in attempts)
        total["cost_usd"] += sum(a["cost_usd"] or 0.0 for a in attempts)
    answers = None
    if row["judge_answers_sha256"]:
        answers = len([line for line in get_blob(conn, row["judge_answers_sha256"]).splitlines() if line.strip()])
    return {"phases": phases, "inference_outputs": row["inference_outputs"],
            "inference_manifest_sha256": row["inference_manifest_sha256"],
            "judge_answers_sha256": row["judge_answers_sha256"], "judge_answers": answers}


def find_evaluation(conn: Connection, ref: str, spec_name: str | None) -> RowMapping:
    """An evaluation by id, or the newest completed one of a checkpoint `RUN@STEP` (for `--spec`, if given)."""
    from trackway.evals.records import parse_checkpoint_ref

    if ref.startswith("ev") and "@" not in ref:
        try:
            return resolve_evaluation(conn, ref)
        except NotFound:
            pass
    run_ref, step = parse_checkpoint_ref(ref)
    run = resolve_run(conn, run_ref)
    query = select(evaluations).where(evaluations.c.run_id == run["run_id"], evaluations.c.state == COMPLETED)
    if spec_name:
        query = query.where(evaluations.c.spec_name == spec_name)
    candidates = list(conn.execute(query.order_by(evaluations.c.checkpoint_step, evaluations.c.created_at)).mappings())
    if step is None and candidates:
        step = max(int(c["checkpoint_step"]) for c in candidates)
    candidates = [c for c in candidates if int(c["checkpoint_step"]) == step]
    if not candidates:
        raise NotFound(f"{ref}: no completed evaluation of that checkpoint" + (f" with spec {spec_name!r}" if spec_name else ""))
    specs = sorted({c["spec_name"] for c in candidates})
    if len(specs) > 1:
        raise Ambiguous(f"{ref}: evaluated by several specs ({', '.join(specs)}); choose one with --spec")
    return candidates[-1]


def compare(conn: Connection, ref_a: str, ref_b: str, spec_name: str | None = None) -> dict:
    """Which tasks flipped between two evaluations of the same spec and task set.

    A task passes when at least half its samples (over all seeds) are correct; the per-task
    share is shown beside the verdict, so a flip from 0.45 to 0.55 reads as the coin toss it is.
    """
    a, b = find_evaluation(conn, ref_a, spec_name), find_evaluation(conn, ref_b, spec_name)
    if a["task_set_sha256"] != b["task_set_sha256"]:
        raise InputError(
            f"{ref_a} and {ref_b} were evaluated on different task sets ({a['task_set_sha256'][:19]} vs "
            f"{b['task_set_sha256'][:19]}): task flips between them mean nothing"
        )
    shares_a, shares_b = _task_shares(conn, a["eval_id"]), _task_shares(conn, b["eval_id"])
    gained, lost = [], []
    for task in sorted(set(shares_a) & set(shares_b)):
        before, after = shares_a[task], shares_b[task]
        if before < PASS_SHARE <= after:
            gained.append({"task_id": task, "before": before, "after": after})
        elif after < PASS_SHARE <= before:
            lost.append({"task_id": task, "before": before, "after": after})
    return {
        "a": {"eval_id": a["eval_id"], "checkpoint": a["checkpoint_name"], "step": int(a["checkpoint_step"]),
              "evaluator_version": a["evaluator_version"], "metrics": metrics_of(conn, a["eval_id"])},
        "b": {"eval_id": b["eval_id"], "checkpoint": b["checkpoint_name"], "step": int(b["checkpoint_step"]),
              "evaluator_version": b["evaluator_version"], "metrics": metrics_of(conn, b["eval_id"])},
        "same_evaluator": a["evaluator_version"] == b["evaluator_version"],
        "tasks_compared": len(set(shares_a) & set(shares_b)),
        "only_in_a": sorted(set(shares_a) - set(shares_b)),
        "only_in_b": sorted(set(shares_b) - set(shares_a)),
        "gained": gained,
        "lost": lost,
    }


def _task_shares(conn: Connection, eval_id: str) -> dict[str, float]:
    totals: dict[str, list[int]] = {}
    for row in conn.execute(select(eval_task_results).where(eval_task_results.c.eval_id == eval_id)).mappings():
        n_c = totals.setdefault(row["task_id"], [0, 0])
        n_c[0] += row["samples"]
        n_c[1] += row["correct"]
    return {task: c / n for task, (n, c) in totals.items() if n}
