"""Submitting an experiment's runs: the short test run that gates, then the full run, each a normal trackway run.

The test run is kind `test`, gets `TRACKWAY_MAX_STEPS` (the SDK stops it there, completed) and
`TRACKWAY_RESTORE_CHECK=1` (the SDK reads its first checkpoint back), and a time limit (1 h by
default). The full run is kind `full`, with the experiment's config, and the eval specs of the
baseline (or the experiment's own) attached, so `eval.<metric>` compares like with like.

The full run gets the environment the test run was submitted with, whoever submits it (the
background supervisor, usually): what passed the gate is what runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select

from trackway.ledger import Ledger
from trackway.ledger.blobs import get_blob
from trackway.ledger.records import resolve_run
from trackway.ledger.schema import metric_points, metric_series, run_eval_specs
from trackway.ledger.store import make_private_dirs
from trackway.receipts import submitted_config
from trackway.receipts.canonical import canonical_json
from trackway.settings import Settings
from trackway.supervisor.trends import median
from trackway.taxonomy import Approval, RunKind

DEFAULT_TEST_HOURS = 1.0
TEST_STEP_SHARE = 10  # without --max-steps: a tenth of the planned steps...
TEST_STEPS_CAP = 200  # ...at most this many, unless the loss points need more
TEST_STEPS_UNKNOWN = 100  # when the config names no step count
TEST_LOSS_POINTS = 12  # the loss points the gate's trend test gets at the baseline's logging interval
TEST_STEPS_MIN = 50  # the least a test run gets when the logging interval is not known


@dataclass(frozen=True)
class TestPlan:
    """How `experiment start` tests before the full run, and the limits it holds the full run to."""

    max_steps: int
    time_limit_hours: float = DEFAULT_TEST_HOURS
    min_throughput: float | None = None
    budget_gpu_hours: float | None = None
    loss_key: str = "loss"
    skip_test: bool = False
    # Who started the experiment, credited as each of its runs' submitter (an agent's runs count against its cap
    # and budget: agents/guardrails.py), and why its full run waits for a person's approval (None: it does not).
    submitted_by: str | None = None
    full_run_approval: str | None = None
    # Where the test run goes when not where the full run will (experiment start --test-resource/--test-gpus).
    test_resource: str | None = None
    test_gpus: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"max_steps": self.max_steps, "time_limit_hours": self.time_limit_hours,
                "min_throughput": self.min_throughput, "budget_gpu_hours": self.budget_gpu_hours,
                "loss_key": self.loss_key, "skip_test": self.skip_test, "submitted_by": self.submitted_by,
                "full_run_approval": self.full_run_approval, "test_resource": self.test_resource,
                "test_gpus": self.test_gpus}


def planned_steps(ledger: Ledger, experiment) -> int | None:
    """The step count the experiment's config names (train.steps, max_steps, ...), if any."""
    from trackway.evals.tables import TOTAL_STEP_KEYS
    from trackway.receipts.config_diff import flatten

    config = experiment_config(ledger, experiment) or {}
    for key, value in flatten(config).items():
        if key.rsplit(".", 1)[-1] in TOTAL_STEP_KEYS and isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def default_test_steps(planned: int | None, log_every: int | None = None) -> tuple[int, str]:
    """The test run's steps without --max-steps, and the rule that gave them (said by `experiment start`).

    Long enough for the gate's trend test: TEST_LOSS_POINTS loss points at the baseline's logging
    interval, else at least TEST_STEPS_MIN steps; otherwise a tenth of the planned steps (at most
    TEST_STEPS_CAP); never more than the planned steps.
    """
    share = TEST_STEPS_UNKNOWN if planned is None else min(TEST_STEPS_CAP, planned // TEST_STEP_SHARE)
    share_said = (f"{TEST_STEPS_UNKNOWN} (the config names no step count)" if planned is None
                  else f"a tenth of the planned {planned} ({share}, at most {TEST_STEPS_CAP})")
    if log_every is not None:
        floor = TEST_LOSS_POINTS * log_every
        floor_said = (f"{TEST_LOSS_POINTS} loss points at the baseline's logging interval of {log_every} "
                      f"step{'s' if log_every > 1 else ''} ({floor})")
    else:
        floor = TEST_STEPS_MIN
        floor_said = f"{TEST_STEPS_MIN} (the baseline's logging interval is not known)"
    steps = max(share, floor)
    said = f"the larger of {share_said} and {floor_said}"
    if planned is not None and steps > planned:
        steps, said = planned, f"{said}, capped at the planned {planned}"
    return max(1, steps), said


def logging_interval(ledger: Ledger, run_id: str, key: str) -> int | None:
    """The median step gap between the run's logged `key` points (rank 0); None under 2 points."""
    with ledger.read() as conn:
        steps = sorted({s for (s,) in conn.execute(
            select(metric_points.c.step)
            .join(metric_series, metric_points.c.series_id == metric_series.c.series_id)
            .where(metric_series.c.run_id == run_id, metric_series.c.key == key, metric_series.c.rank == 0)
        ) if s is not None})
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    return max(1, int(median(gaps))) if gaps else None


def experiment_config(ledger: Ledger, experiment) -> dict | None:
    """The experiment's own config (the baseline's with the changes), or the baseline's effective one."""
    if experiment["config_sha256"]:
        with ledger.read() as conn:
            return json.loads(get_blob(conn, experiment["config_sha256"]))
    return None


def run_spec(ledger: Ledger, settings: Settings, experiment, kind: str, label: str | None = None, **extra: Any):
    """The RunSpec of one of the experiment's runs, named `<experiment>-<label or kind>`."""
    from trackway.supervisor.submit import RunSpec

    folder = experiment_dir(settings, experiment["experiment_id"])
    config_path = _given_config(ledger, experiment, folder) if experiment["config_sha256"] else None
    # A code-change experiment (`--branch`/`--commit`): each run clones exactly the commit it names.
    code = next((c for c in json.loads(experiment["changes"]) if c.get("key") == "code" and c.get("commit")), None)
    if code is not None:
        extra = {"repo_url": code["repo"], "code_commit": code["commit"], "repo_subdir": code.get("subdir") or None,
                 **extra}
    return RunSpec(
        command=_typed_command(experiment, folder),
        cwd=Path(experiment["workdir"]),
        name=f"{experiment['name'] or experiment['experiment_id']}-{label or kind}",
        project=experiment["project"],
        kind=kind,
        config_path=str(config_path) if config_path else None,
        data_paths=json.loads(experiment["data_paths"] or "[]"),
        **{"gpus": experiment["gpus"], "resource": experiment["resource_request"], **extra},
    )


def experiment_dir(settings: Settings, experiment_id: str) -> Path:
    """Where an experiment keeps what the ledger may not hold: its config file, its command as typed."""
    return settings.home / "experiments" / experiment_id


def _given_config(ledger: Ledger, experiment, folder: Path) -> Path:
    """The file of the experiment's config as given: kept in its folder when it was recorded (the ledger masks its
    secret values), or the ledger's for an experiment whose config hides nothing."""
    from trackway.errors import InputError

    path = folder / submitted_config.CONFIG_FILE
    with ledger.read() as conn:
        blob = get_blob(conn, experiment["config_sha256"])
    try:
        values = submitted_config.read(blob, path)
    except submitted_config.MissingConfig as exc:
        raise InputError(f"experiment {experiment['name'] or experiment['experiment_id']}: {exc}") from None
    make_private_dirs(folder)
    submitted_config.write_file(path, canonical_json(values))
    return path


def _typed_command(experiment, folder: Path) -> list[str]:
    """The experiment's command as typed: the ledger's form with the words it hides read back from its folder."""
    from trackway.errors import InputError
    from trackway.receipts import submitted_argv

    try:
        return submitted_argv.read(json.loads(experiment["command"]), folder).argv
    except submitted_argv.MissingArguments as exc:
        raise InputError(f"experiment {experiment['name'] or experiment['experiment_id']}: {exc}") from None


def test_spec(ledger: Ledger, settings: Settings, experiment, plan: TestPlan, number: int = 1):
    """The spec of the experiment's `number`th test run (`experiment start --again` makes the second, ...)."""
    return run_spec(
        ledger, settings, experiment, RunKind.TEST.value, label="test" if number == 1 else f"test-{number}",
        time_limit_hours=plan.time_limit_hours,
        env={"TRACKWAY_MAX_STEPS": str(plan.max_steps), "TRACKWAY_RESTORE_CHECK": "1"},
        **({"gpus": plan.test_gpus} if plan.test_gpus is not None else {}),
        **({"resource": plan.test_resource} if plan.test_resource else {}),
    )


def full_spec(ledger: Ledger, settings: Settings, experiment, environ: dict[str, str] | None = None):
    hours = experiment["time_limit_s"] / 3600 if experiment["time_limit_s"] else None
    return run_spec(ledger, settings, experiment, RunKind.FULL.value, time_limit_hours=hours, environ=environ)


def record(ledger: Ledger, settings: Settings, spec, experiment, plan: dict[str, Any] | None = None) -> str:
    """Record the run (a full run with its eval specs attached); return its id. Nothing is started yet.

    `plan` (the experiment's test plan as stored) credits the run to whoever started the experiment and, for
    a full run its agent's settings hold back, records it awaiting a person's approval (`spec.approval`).
    """
    from trackway.supervisor.submit import submit_run

    plan = plan or {}
    spec.submitted_by = plan.get("submitted_by")
    if spec.kind == RunKind.FULL.value and plan.get("full_run_approval"):
        spec.approval, spec.approval_note = Approval.AWAITING.value, plan["full_run_approval"]

    run_id = submit_run(ledger, settings, spec)
    if spec.kind == RunKind.FULL.value and experiment["eval_specs"]:
        now = datetime.now(timezone.utc)
        with ledger.write() as conn:
            for item in json.loads(experiment["eval_specs"]):
                conn.execute(run_eval_specs.insert().values(
                    run_id=run_id, name=item["name"], spec_sha256=item["spec_sha256"], trigger=item["trigger"],
                    created_at=now,
                ))
    return run_id


def launch(ledger: Ledger, settings: Settings, run_id: str, executor, started_by: str) -> str | None:
    """Start the recorded run's first attempt (None: a supervisor already did)."""
    from trackway.supervisor.launch import start_attempt

    return start_attempt(ledger, settings, run_id, executor, first=True, started_by=started_by)


def environ_of_run(ledger: Ledger, settings: Settings, run_id: str) -> dict[str, str] | None:
    """The variables `run_id` was submitted with (secrets read back), for the run that follows it."""
    from trackway.receipts import submitted_env

    with ledger.read() as conn:
        run = resolve_run(conn, run_id)
        if not run["environ_sha256"]:
            return None
        description = json.loads(get_blob(conn, run["environ_sha256"]))
    return submitted_env.restore(description, settings.runs_dir).variables


def preview(settings: Settings, spec) -> dict[str, Any]:
    """Where a run like `spec` would go now and why, with the chosen resource's free GPUs and queue."""
    from trackway.resources.availability import look_up
    from trackway.supervisor.submit import preview_placement

    selection = preview_placement(settings, spec)
    resource = settings.resource(selection.resource)
    row = look_up([resource], home=settings.home).get(resource.name)
    shown = {"kind": spec.kind, "resource": selection.resource, "qos": selection.qos, "why": selection.text()}
    if row is not None:
        shown.update(free_gpus=row.free_gpus, total_gpus=row.total_gpus, running_jobs=row.running_jobs,
                     pending_jobs=row.pending_jobs, reachable=row.reachable, error=row.error)
    return shown
