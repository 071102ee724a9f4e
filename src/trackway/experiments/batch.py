"""Experiment batches: a wave of hypotheses against one baseline, a shared GPU-hour budget, a few in flight at once.

An agent (or a person) rarely tests one idea at a time: `experiment batch` records every hypothesis
as an experiment of its own (each refused or accepted as `experiment new` would), then starts them
`max_running` at a time as earlier ones end, each gated by its own test run. The batch's budget is
shared: each member starts only while the batch has GPU-hours left (its members' ended attempts
plus what their unfinished runs may still take), and its full run is held to what was left when it
started (its test plan's budget_gpu_hours). A batch whose budget is spent starts no more members
and says how many it left unstarted.

The supervisor moves batches on (supervision.AdvanceExperiments), so a batch goes on after the
command that made it returns.
"""

from __future__ import annotations

import json
import tomllib
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import and_, delete, func, select, update

from trackway.errors import InputError
from trackway.experiments.launch import TestPlan, default_test_steps, logging_interval, planned_steps
from trackway.experiments.records import ExperimentStatus, resolve_experiment, update_experiment
from trackway.ledger import Ledger
from trackway.ledger.schema import attempts, experiment_batches, experiments, runs
from trackway.settings import Settings
from trackway.taxonomy import RunState

RUNNING, DONE = "running", "done"
IN_FLIGHT = (ExperimentStatus.TESTING.value, ExperimentStatus.RUNNING.value, ExperimentStatus.ANALYZING.value)
MAX_HYPOTHESES = 100


@dataclass(frozen=True)
class Hypothesis:
    """One member to record: what `experiment new` takes, minus what the batch shares."""

    title: str
    hypothesis: str
    overrides: list[str] = field(default_factory=list)
    criteria: list[str] = field(default_factory=list)


def read_file(path: str) -> tuple[list[Hypothesis], dict[str, Any]]:
    """A hypotheses file: shared `expect`, `budget_gpu_hours`, `max_running`, then `[[hypothesis]]` tables."""
    from trackway.validation import existing_file

    existing_file(path, "--from-file", "a TOML file of [[hypothesis]] tables")
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: expected a TOML file of [[hypothesis]] tables: {exc}") from None
    known = {"hypothesis", "expect", "budget_gpu_hours", "max_running"}
    for key in doc:
        if key not in known:
            raise InputError(f"{path}: {key}: unknown key; expected {', '.join(sorted(known))}")
    shared = _texts(doc.get("expect", []), f"{path}: expect")
    tables = doc.get("hypothesis")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise InputError(f"{path}: hypothesis: expected one or more [[hypothesis]] tables with title, hypothesis and set")
    found = []
    for number, table in enumerate(tables, 1):
        where = f"{path}: [[hypothesis]] {number}"
        for key in table:
            if key not in ("title", "hypothesis", "set", "expect"):
                raise InputError(f"{where}: {key}: unknown key; expected title, hypothesis, set, expect")
        for key in ("title", "hypothesis"):
            if not isinstance(table.get(key), str) or not table[key].strip():
                raise InputError(f"{where}: {key}: expected a non-empty string")
        found.append(Hypothesis(table["title"], table["hypothesis"], _texts(table.get("set", []), f"{where}: set"),
                                shared + _texts(table.get("expect", []), f"{where}: expect")))
    return found, {key: doc[key] for key in ("budget_gpu_hours", "max_running") if key in doc}


def from_flags(texts: list[str], shared_expect: list[str]) -> list[Hypothesis]:
    """`--hypothesis 'KEY=VALUE: statement'` each: the change before the colon, the statement after it."""
    found = []
    for text in texts:
        change, colon, statement = text.partition(":")
        if not colon or "=" not in change or not statement.strip():
            raise InputError(f"--hypothesis {text!r}: expected KEY=VALUE: statement, e.g. "
                             "'train.lr=0.2: a higher learning rate converges sooner'")
        found.append(Hypothesis(f"{change.strip()}", statement.strip(), [change.strip()], list(shared_expect)))
    return found


def _texts(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError(f"{where}: expected a string or a list of strings")
    return [v.strip() for v in value]


def new_batch(ledger: Ledger, settings: Settings, baseline: str, hypotheses: list[Hypothesis], cwd: Path,
              plan: TestPlan, max_running: int = 2, budget_gpu_hours: float | None = None,
              name: str | None = None) -> tuple[str, list[str]]:
    """Record the batch and one planned experiment per hypothesis (all or none); nothing starts yet."""
    from trackway import validation
    from trackway.experiments.define import ExperimentSpec, new_experiment

    if not hypotheses:
        raise InputError("--hypothesis/--from-file: expected at least one hypothesis")
    if len(hypotheses) > MAX_HYPOTHESES:
        raise InputError(f"--from-file: expected at most {MAX_HYPOTHESES} hypotheses, found {len(hypotheses)}")
    validation.whole(max_running, "--max-running", 1, MAX_HYPOTHESES)
    if budget_gpu_hours is not None:
        validation.finite(budget_gpu_hours, "--budget-gpu-hours", 0, 1e9, "GPU-hours", low_open=True)
    if name is not None:
        validation.run_name(name)
        with ledger.read() as conn:
            if conn.execute(select(experiment_batches.c.batch_id).where(experiment_batches.c.name == name)).first():
                raise InputError(f"--name {name!r}: a batch with that name exists; pick another")
    batch_id = "b" + uuid.uuid4().hex[:10]
    recorded: list[str] = []
    try:
        for number, member in enumerate(hypotheses, 1):
            try:
                made = new_experiment(ledger, settings, ExperimentSpec(
                    title=member.title, hypothesis=member.hypothesis, cwd=cwd, baseline=baseline,
                    overrides=list(member.overrides), criteria=list(member.criteria),
                    name=f"{name}-{number}" if name else None))
            except InputError as exc:
                raise InputError(f"hypothesis {number} ({member.title}): {exc}") from None
            recorded.append(made.experiment_id)
        with ledger.write() as conn:
            baseline_id = conn.execute(select(experiments.c.baseline_run_id).where(
                experiments.c.experiment_id == recorded[0])).scalar()
            conn.execute(experiment_batches.insert().values(
                batch_id=batch_id, name=name, baseline_run_id=baseline_id, budget_gpu_hours=budget_gpu_hours,
                max_running=max_running, plan=json.dumps(plan.to_json()), status=RUNNING,
                created_at=datetime.now(timezone.utc)))
            conn.execute(update(experiments).where(experiments.c.experiment_id.in_(recorded)).values(batch_id=batch_id))
    except BaseException:
        if recorded:  # planned only: nothing of them ran
            with ledger.write() as conn:
                conn.execute(delete(experiments).where(experiments.c.experiment_id.in_(recorded)))
        raise
    return batch_id, recorded


def resolve_batch(conn, ref: str):
    row = conn.execute(select(experiment_batches).where(
        (experiment_batches.c.batch_id == ref) | (experiment_batches.c.name == ref))).mappings().first()
    if row is None:
        from trackway.errors import NotFound

        raise NotFound(f"batch {ref!r}: no such batch (ids start with b; `trackway experiments --json` lists "
                       "experiments with their batch)")
    return row


def members(conn, batch_id: str) -> list:
    return list(conn.execute(select(experiments).where(experiments.c.batch_id == batch_id)
                             .order_by(experiments.c.created_at, experiments.c.experiment_id)).mappings())


def standing(conn, batch) -> dict[str, Any]:
    """GPU-hours the batch's runs spent (ended attempts with GPUs) and hold (unfinished runs: GPUs × time limit)."""
    rows = members(conn, batch["batch_id"])
    run_ids = [r for m in rows for r in _runs_of(m)]
    spent = conn.execute(select(func.coalesce(func.sum(attempts.c.gpu_seconds), 0.0)).where(
        attempts.c.run_id.in_(run_ids), attempts.c.gpu_count > 0)).scalar() if run_ids else 0.0
    unfinished = conn.execute(select(runs.c.gpus, runs.c.time_limit_s).where(and_(
        runs.c.run_id.in_(run_ids), runs.c.state.in_((RunState.QUEUED.value, RunState.RUNNING.value))))).all() \
        if run_ids else []
    held = sum((row.gpus or 0) * (row.time_limit_s or 0.0) for row in unfinished) / 3600
    budget = batch["budget_gpu_hours"]
    return {"spent_gpu_hours": float(spent or 0.0) / 3600, "held_gpu_hours": held,
            "left_gpu_hours": None if budget is None else max(budget - float(spent or 0.0) / 3600 - held, 0.0)}


def _runs_of(member) -> list[str]:
    earlier = [r["run_id"] for r in (json.loads(member["test_plan"] or "{}") or {}).get("earlier_test_runs") or []
               if r.get("run_id")]
    return earlier + [r for r in (member["test_run_id"], member["full_run_id"]) if r]


def advance_batches(ledger: Ledger, settings: Settings, executor_for: Callable[[str], Any]) -> list[tuple[str, str]]:
    """Start each running batch's next members while it has room and budget; close the batches that are done."""
    from trackway.experiments.progress import start

    said: list[tuple[str, str]] = []
    with ledger.read() as conn:
        batches = list(conn.execute(select(experiment_batches).where(experiment_batches.c.status == RUNNING)
                                    .order_by(experiment_batches.c.created_at)).mappings())
    for batch in batches:
        with ledger.read() as conn:
            rows = members(conn, batch["batch_id"])
            money = standing(conn, batch)
        planned = [m for m in rows if m["status"] == ExperimentStatus.PLANNED.value]
        in_flight = [m for m in rows if m["status"] in IN_FLIGHT]
        room = batch["max_running"] - len(in_flight)
        left = money["left_gpu_hours"]
        plan = json.loads(batch["plan"])
        for member in planned[:max(room, 0)]:
            if left is not None and left <= 0:
                break
            test_plan = _member_plan(ledger, member, plan, left)
            try:
                started = start(ledger, settings, member["experiment_id"], test_plan, executor_for,
                                started_by=f"experiment batch {batch['batch_id']}")
            except InputError as exc:
                # Stopped, not left planned: a member that cannot start would be tried again every tick.
                with ledger.write() as conn:
                    update_experiment(conn, member["experiment_id"], expected_status=ExperimentStatus.PLANNED.value,
                                      status=ExperimentStatus.STOPPED.value, stop_reason=f"not started: {exc}",
                                      concluded_at=datetime.now(timezone.utc))
                said.append((member["experiment_id"], f"not started: {exc}"))
                continue
            said.append((member["experiment_id"], f"batch {batch['batch_id']}: {started.kind} run {started.run_id} "
                                                   "submitted"))
            with ledger.read() as conn:
                left = standing(conn, batch)["left_gpu_hours"]
        with ledger.read() as conn:
            rows = members(conn, batch["batch_id"])
        still_planned = [m for m in rows if m["status"] == ExperimentStatus.PLANNED.value]
        if any(m["status"] in IN_FLIGHT for m in rows):
            continue
        if still_planned and (left is None or left > 0):
            continue  # room opens next tick
        note = None
        if still_planned:
            note = (f"the budget of {batch['budget_gpu_hours']:g} GPU-hours was spent: {len(still_planned)} "
                    f"hypothes{'i' if len(still_planned) == 1 else 'e'}s not started")
        with ledger.write() as conn:
            conn.execute(update(experiment_batches).where(experiment_batches.c.batch_id == batch["batch_id"],
                                                          experiment_batches.c.status == RUNNING)
                         .values(status=DONE, note=note, concluded_at=datetime.now(timezone.utc)))
        said.append((batch["batch_id"], f"batch done{': ' + note if note else ''}"))
    return said


def _member_plan(ledger: Ledger, member, plan: dict[str, Any], left: float | None) -> TestPlan:
    """The batch's test plan for one member: its own default test length, the full run held to what is left."""
    steps = plan.get("max_steps")
    if steps is None:
        steps, _ = default_test_steps(planned_steps(ledger, member),
                                      logging_interval(ledger, member["baseline_run_id"], plan.get("loss_key") or "loss"))
    given = plan.get("budget_gpu_hours")
    limits = [x for x in (given, left) if x is not None]
    fields = {k: v for k, v in plan.items() if k in TestPlan.__dataclass_fields__}
    return replace(TestPlan(**{**fields, "max_steps": steps}), budget_gpu_hours=min(limits) if limits else None)


def table(conn, batch) -> dict[str, Any]:
    """The batch as one table: each member's change, status, verdict and each criterion with its numbers."""
    rows = []
    for member in members(conn, batch["batch_id"]):
        detail = json.loads(member["verdict_detail"]) if member["verdict_detail"] else {}
        rows.append({
            "experiment_id": member["experiment_id"], "title": member["title"], "hypothesis": member["hypothesis"],
            "changes": json.loads(member["changes"]), "status": member["status"], "verdict": member["verdict"],
            "stop_reason": member["stop_reason"], "test_run_id": member["test_run_id"],
            "full_run_id": member["full_run_id"], "criteria": detail.get("criteria") or [],
        })
    return {"batch_id": batch["batch_id"], "name": batch["name"], "baseline_run_id": batch["baseline_run_id"],
            "status": batch["status"], "note": batch["note"], "budget_gpu_hours": batch["budget_gpu_hours"],
            "max_running": batch["max_running"], **standing(conn, batch), "experiments": rows}


def batch_of(conn, ref: str):
    """The batch `ref` names: a batch id or name, or one of its experiments."""
    from trackway.errors import NotFound

    try:
        return resolve_batch(conn, ref)
    except NotFound:
        member = resolve_experiment(conn, ref)
        if not member["batch_id"]:
            raise InputError(f"--batch {ref!r}: expected a batch, or an experiment of one; "
                             f"{member['experiment_id']} is an experiment of its own") from None
        return resolve_batch(conn, member["batch_id"])
