"""Moving experiments through their states: start, the gate after the test run, the verdict after the full run.

`advance()` is called by every supervisor tick (supervisor/loop.py), so an experiment goes on
while nobody watches: the background supervisor gates the test run, submits the full run, and
concludes with a verdict once the full run and its evaluations are done. Each transition is a
conditional update from the state it leaves, so two supervisors never submit the same full run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import RowMapping, func, select

from trackway.errors import InputError, TrackwayError
from trackway.experiments import gate
from trackway.experiments.launch import TestPlan, environ_of_run, full_spec, launch, planned_steps, record, test_spec
from trackway.experiments.records import (
    ExperimentStatus,
    driven_experiments,
    loads,
    resolve_experiment,
    update_experiment,
)
from trackway.experiments.verdict import judge
from trackway.ledger import Ledger
from trackway.ledger.records import resolve_run
from trackway.ledger.schema import attempts, checkpoints, evaluations, run_eval_specs
from trackway.receipts.submitted_env import MissingSecrets
from trackway.settings import Settings
from trackway.taxonomy import Approval, RunState

TESTING, RUNNING, ANALYZING = ExperimentStatus.TESTING.value, ExperimentStatus.RUNNING.value, ExperimentStatus.ANALYZING.value


@dataclass
class Started:
    experiment_id: str
    run_id: str
    kind: str
    attempt_id: str | None


@dataclass
class Progress:
    """What one `advance()` did, one line per experiment moved."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (experiment id, what happened)

    def say(self, experiment_id: str, message: str) -> None:
        self.lines.append((experiment_id, message))


def start(ledger: Ledger, settings: Settings, ref: str, plan: TestPlan, executor, started_by: str,
          again: bool = False) -> Started:
    """Submit the experiment's test run (or, with `skip_test`, its full run): a planned experiment's, or with `again`
    a new test run of one stopped before its full run (the earlier test runs and their checks stay on record)."""
    with ledger.read() as conn:
        experiment = resolve_experiment(conn, ref)
    status = experiment["status"]
    experiment_id = experiment["experiment_id"]
    stopped = ExperimentStatus.STOPPED.value
    if again:
        if status != stopped or experiment["full_run_id"] is not None:
            raise InputError(f"experiment {ref!r}: is {status}"
                             + (f" with its full run {experiment['full_run_id']}" if experiment["full_run_id"] else "")
                             + "; --again starts a new test run of an experiment stopped before its full run")
    elif status != ExperimentStatus.PLANNED.value:
        how = (f" (`trackway experiment start {experiment_id} --again` runs a new test run)"
               if status == stopped and experiment["full_run_id"] is None else
               f" (`trackway experiment new --from {experiment_id}` plans the next one)")
        raise InputError(f"experiment {ref!r}: is {status}; only a planned experiment can be started{how}")
    kind = "full" if plan.skip_test else "test"
    earlier = earlier_test_runs(experiment) if again else []
    spec = (full_spec(ledger, settings, experiment) if plan.skip_test
            else test_spec(ledger, settings, experiment, plan, number=len(earlier) + 1))
    before = {"status": status, "stop_reason": experiment["stop_reason"], "test_run_id": experiment["test_run_id"],
              "test_checks": experiment["test_checks"], "estimate": experiment["estimate"],
              "test_plan": experiment["test_plan"], "skip_test": experiment["skip_test"],
              "started_at": experiment["started_at"], "concluded_at": experiment["concluded_at"]}
    planned = {**plan.to_json(), "earlier_test_runs": earlier} if again else plan.to_json()
    with ledger.write() as conn:
        claimed = update_experiment(
            conn, experiment_id, expected_status=status,
            status=RUNNING if plan.skip_test else TESTING, skip_test=plan.skip_test,
            test_plan=json.dumps(planned), started_at=datetime.now(timezone.utc),
            stop_reason=None, concluded_at=None, test_run_id=None, test_checks=None, estimate=None,
        )
    if not claimed:
        raise InputError(f"experiment {ref!r}: was started by someone else meanwhile")
    try:
        run_id = record(ledger, settings, spec, experiment, planned)
    except BaseException:
        with ledger.write() as conn:  # nothing was recorded: it is as it was
            update_experiment(conn, experiment_id, **before)
        raise
    with ledger.write() as conn:
        update_experiment(conn, experiment_id, **{f"{kind}_run_id": run_id})
    if spec.approval == Approval.AWAITING.value:
        return Started(experiment_id, run_id, kind, None)  # `trackway approve` starts it
    # A launch that fails is recorded on the run's attempt; the gate then reads how the run ended.
    attempt_id = launch(ledger, settings, run_id, executor, started_by)
    return Started(experiment_id, run_id, kind, attempt_id)


def earlier_test_runs(experiment) -> list[dict[str, Any]]:
    """The experiment's test runs before its current one, oldest first, each with its plan, checks and why it stopped
    (kept in its test plan, so a new test run never hides what the earlier ones showed)."""
    plan = loads(experiment, "test_plan", {}) or {}
    earlier = list(plan.get("earlier_test_runs") or [])
    if experiment["test_run_id"] or experiment["stop_reason"]:
        earlier.append({
            "run_id": experiment["test_run_id"], "stop_reason": experiment["stop_reason"],
            "max_steps": plan.get("max_steps"), "checks": loads(experiment, "test_checks", []) or [],
            "started_at": experiment["started_at"].isoformat() if experiment["started_at"] else None,
            "stopped_at": experiment["concluded_at"].isoformat() if experiment["concluded_at"] else None,
        })
    return earlier


def advance(ledger: Ledger, settings: Settings, executor_for: Callable[[str], Any]) -> Progress:
    """One pass over the experiments in flight: gate ended test runs, conclude ended full runs."""
    progress = Progress()
    with ledger.read() as conn:
        driven = driven_experiments(conn)
    for experiment in driven:
        try:
            if experiment["status"] == TESTING:
                _after_test(ledger, settings, experiment, executor_for, progress)
            else:
                _after_full(ledger, experiment, progress)
        except TrackwayError as exc:
            progress.say(experiment["experiment_id"], f"not moved on yet: {exc}")
    return progress


def stop(ledger: Ledger, ref: str, reason: str, cancel: Callable[[str], Any]) -> RowMapping:
    """End the experiment as stopped with `reason`, cancelling its unfinished runs."""
    with ledger.read() as conn:
        experiment = resolve_experiment(conn, ref)
    if ExperimentStatus(experiment["status"]).is_final():
        raise InputError(f"experiment {ref!r}: already {experiment['status']}; nothing to stop")
    for run_id in (experiment["test_run_id"], experiment["full_run_id"]):
        if run_id:
            with ledger.read() as conn:
                state = resolve_run(conn, run_id)["state"]
            if not RunState(state).is_terminal():
                cancel(run_id)
    with ledger.write() as conn:
        update_experiment(conn, experiment["experiment_id"], status=ExperimentStatus.STOPPED.value,
                          stop_reason=reason, concluded_at=datetime.now(timezone.utc))
    return experiment


# -- the gate -------------------------------------------------------------------------------------


def _after_test(ledger: Ledger, settings: Settings, experiment, executor_for, progress: Progress) -> None:
    experiment_id = experiment["experiment_id"]
    if experiment["test_run_id"] is None:
        return  # `start` is between claiming and recording its run
    with ledger.read() as conn:
        test_run = resolve_run(conn, experiment["test_run_id"])
        if not RunState(test_run["state"]).is_terminal():
            return
        plan = loads(experiment, "test_plan", {})
        # The load here says something only of a test run that ran here.
        load = gate.load_per_core() if test_run["executor"] == "local" else None
        checks = gate.check_test_run(conn, test_run["run_id"], experiment["baseline_run_id"], plan, load)
    checks.append(_same_code(settings, experiment, test_run))
    failed = gate.failed(checks)
    estimate = _estimate(ledger, experiment, test_run) if not failed else None
    over = _over_budget(plan.get("budget_gpu_hours"), estimate)
    values: dict[str, Any] = {"test_checks": json.dumps([c.to_json() for c in checks])}
    if estimate is not None:
        values["estimate"] = json.dumps(estimate)
    if failed or over:
        why = (f"the test run failed {', '.join(c.name for c in failed)}" if failed else over)
        with ledger.write() as conn:
            if update_experiment(conn, experiment_id, expected_status=TESTING, status=ExperimentStatus.STOPPED.value,
                                 stop_reason=why, concluded_at=datetime.now(timezone.utc), **values):
                progress.say(experiment_id, f"stopped before the full run: {why}")
        return
    with ledger.write() as conn:
        if not update_experiment(conn, experiment_id, expected_status=TESTING, status=RUNNING, **values):
            return  # another supervisor took it
    try:
        spec = full_spec(ledger, settings, experiment, environ=environ_of_run(ledger, settings, test_run["run_id"]))
        run_id = record(ledger, settings, spec, experiment, plan)
    except (TrackwayError, OSError, MissingSecrets) as exc:
        with ledger.write() as conn:
            update_experiment(conn, experiment_id, status=ExperimentStatus.STOPPED.value,
                              stop_reason=f"the full run could not be submitted: {exc}",
                              concluded_at=datetime.now(timezone.utc))
        progress.say(experiment_id, f"stopped: the full run could not be submitted: {exc}")
        return
    with ledger.write() as conn:
        update_experiment(conn, experiment_id, full_run_id=run_id)
    if spec.approval == Approval.AWAITING.value:
        progress.say(experiment_id, f"test run passed every check; full run {run_id} recorded, waiting for a "
                                    f"person's approval (`trackway approve {run_id}`): {spec.approval_note}")
        return
    progress.say(experiment_id, f"test run passed every check; full run {run_id} submitted")
    try:
        launch(ledger, settings, run_id, executor_for(_executor_name(settings, spec)),
               started_by=f"experiment {experiment_id}: the test run passed every check")
    except TrackwayError as exc:
        # Recorded on the attempt by start_attempt; the verdict will read how the full run ended.
        progress.say(experiment_id, f"full run {run_id} did not start: {exc}")


def _executor_name(settings: Settings, spec) -> str:
    from trackway.supervisor.submit import preview_placement

    return settings.resource(preview_placement(settings, spec).resource).executor


def _same_code(settings: Settings, experiment, test_run) -> gate.Check:
    """The full run would capture the work tree as it is now: it must be the code the test run ran. A code-change
    experiment's runs each clone its commit: the test run must have run that commit, and the full run will."""
    from trackway.receipts.code import capture_code

    code = next((c for c in json.loads(experiment["changes"]) if c.get("key") == "code" and c.get("commit")), None)
    if code is not None:
        ran = test_run["code_commit"]
        if ran == code["commit"] and not test_run["code_dirty_sha256"]:
            return gate.Check("same_code", True, f"commit {ran[:12]} ({code['ref']}), cloned for each run: the full "
                                                 "run runs it too")
        return gate.Check("same_code", False, f"the test run ran commit {str(ran)[:12]}, not the experiment's "
                                              f"{code['commit'][:12]} ({code['ref']})")

    try:
        now = capture_code(Path(experiment["workdir"]), home=settings.home)
    except TrackwayError as exc:
        return gate.Check("same_code", False, f"cannot read the code again: {exc}")
    if now.commit is None and test_run["code_commit"] is None:
        return gate.Check("same_code", None, "not in a git work tree: nothing to compare")
    if (now.commit, now.dirty_sha256) == (test_run["code_commit"], test_run["code_dirty_sha256"]):
        return gate.Check("same_code", True, f"commit {str(now.commit)[:12]}"
                          + (" with the same uncommitted diff" if now.dirty_sha256 else ", clean"))
    return gate.Check("same_code", False, "the code changed since the test run (commit "
                      f"{str(test_run['code_commit'])[:12]} → {str(now.commit)[:12]}, or its uncommitted diff); "
                      "what runs in full must be what was tested: start a new experiment")


def _estimate(ledger: Ledger, experiment, test_run) -> dict[str, Any]:
    """The full run's wall hours and GPU-hours, from the test run: its start-up plus the planned steps at its rate.

    The rate is steps per second while the test run was logging, so the start-up it paid once
    (imports, data, the first compile) is not multiplied by the planned steps.
    """
    from trackway.experiments.criteria import Missing, Quantity
    from trackway.experiments.quantities import RunNumbers

    with ledger.read() as conn:
        gpu_seconds, last_step, first, ended = conn.execute(
            select(func.sum(attempts.c.gpu_seconds), func.max(attempts.c.last_step),
                   func.min(attempts.c.started_at), func.max(attempts.c.ended_at))
            .where(attempts.c.run_id == test_run["run_id"])
        ).one()
        try:
            rate = RunNumbers(conn, test_run["run_id"]).step_rate(Quantity("throughput"))
        except Missing:
            rate = None
    planned = planned_steps(ledger, experiment)
    wall_s = (ended - first).total_seconds() if first and ended else None
    said: dict[str, Any] = {"test_steps": last_step, "test_gpu_hours": (gpu_seconds or 0.0) / 3600,
                            "test_wall_hours": wall_s / 3600 if wall_s is not None else None,
                            "steps_per_second": rate, "startup_seconds": None,
                            "planned_steps": planned, "gpu_hours": None, "wall_hours": None}
    if not (planned and last_step and rate and wall_s):
        return said
    startup = max(0.0, wall_s - last_step / rate)
    wall_hours = (startup + planned / rate) / 3600
    said.update(startup_seconds=startup, wall_hours=wall_hours,
                gpu_hours=wall_hours * ((gpu_seconds or 0.0) / wall_s if wall_s > 0 else 0.0))
    return said


def _over_budget(budget: float | None, estimate: dict[str, Any] | None) -> str | None:
    if budget is None or estimate is None:
        return None
    if estimate["gpu_hours"] is None:
        return (f"--budget-gpu-hours {budget:g}: the full run's GPU-hours cannot be estimated "
                "(the config names no step count, or the test run logged no step)")
    if estimate["gpu_hours"] > budget:
        return (f"the full run would take about {estimate['gpu_hours']:.3g} GPU-hours ({estimate['planned_steps']} "
                f"planned steps at the test run's {estimate['steps_per_second']:.3g} steps/s, plus its "
                f"{estimate['startup_seconds']:.0f} s start-up), over the budget of {budget:g}")
    return None


# -- the verdict ----------------------------------------------------------------------------------


def _after_full(ledger: Ledger, experiment, progress: Progress) -> None:
    experiment_id = experiment["experiment_id"]
    if experiment["full_run_id"] is None:
        return
    with ledger.read() as conn:
        full_run = resolve_run(conn, experiment["full_run_id"])
        if not RunState(full_run["state"]).is_terminal():
            return
        # The baseline's too: a criterion on `baseline.eval.<metric>` must not read a half-evaluated baseline.
        pending = evaluations_pending(conn, full_run["run_id"]) + evaluations_pending(conn, experiment["baseline_run_id"])
    if pending:
        if experiment["status"] == RUNNING:
            with ledger.write() as conn:
                if update_experiment(conn, experiment_id, expected_status=RUNNING, status=ANALYZING):
                    progress.say(experiment_id, f"full run {full_run['state']}; waiting for {pending} evaluation(s)")
        return
    with ledger.read() as conn:
        judged = judge(conn, loads(experiment, "criteria", []), full_run, experiment["baseline_run_id"], experiment_id)
    with ledger.write() as conn:
        if update_experiment(conn, experiment_id, expected_status=experiment["status"],
                             status=ExperimentStatus.CONCLUDED.value, verdict=judged.verdict.value,
                             verdict_detail=json.dumps(judged.to_json()), concluded_at=datetime.now(timezone.utc)):
            progress.say(experiment_id, f"concluded: {judged.verdict.value}: {judged.why}")


def evaluations_pending(conn, run_id: str) -> int:
    """Evaluations of `run_id` in flight, plus committed checkpoints its specs have not looked at yet."""
    running = conn.execute(
        select(func.count()).where(evaluations.c.run_id == run_id, evaluations.c.state == "running")
    ).scalar()
    newest = select(func.max(checkpoints.c.step)).where(
        checkpoints.c.run_id == run_id, checkpoints.c.committed_at.is_not(None)
    ).scalar_subquery()
    unseen = conn.execute(
        select(func.count()).where(
            run_eval_specs.c.run_id == run_id, run_eval_specs.c.trigger != "on_demand",
            func.coalesce(run_eval_specs.c.considered_step, -1) < newest,
        )
    ).scalar()
    return int(running or 0) + int(unseen or 0)
