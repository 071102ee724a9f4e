"""`trackway experiment new|start|show|report|stop` and `trackway experiments`: hypotheses under test, thin over experiments/."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from trackway.cli.end_line import decision_of, end_line
from trackway.cli.context import AppContext, app_context
from trackway.cli.jsonout import print_json, to_jsonable

FOLLOW_INTERVAL_S = 0.25
INTERRUPTED = 130

experiment_app = typer.Typer(
    help="Plan, start, show and report experiments: a hypothesis, a test run that gates the full run, a verdict.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

CRITERIA_HELP = (
    "What the hypothesis expects, checked on the full run (repeatable), e.g. 'final.loss <= baseline.final.loss * "
    "1.05', 'wall_hours <= 0.5 * baseline.wall_hours', 'eval.pass@1 > 0.05', 'steps_to(loss, baseline.final.loss) "
    "<= 0.5 * baseline.steps'. Quantities: final|best|min|max|mean|eval.<metric>, wall_hours, gpu_hours, cost_usd, "
    "throughput, steps, steps_to(<metric>, X), each also as baseline.<...>; + - * / ( ) abs(); one comparison."
)


@experiment_app.command("new", context_settings={"allow_interspersed_args": False})
def new(
    ctx: typer.Context,
    command: list[str] = typer.Argument(None, metavar="[-- COMMAND [ARGS]...]",
                                        help="The command to run (default: the baseline's), after `--`."),
    title: str = typer.Option(..., "--title", help="A short title, e.g. 'double the learning rate'."),
    hypothesis: str = typer.Option(..., "--hypothesis", help="The falsifiable statement under test."),
    baseline: str = typer.Option(None, "--baseline", help="The run (id or name) the hypothesis is measured against."),
    parent: str = typer.Option(
        None, "--from",
        help="The previous experiment: its full run becomes the baseline if it was supported, else its own baseline "
             "stays (its change is reverted); --baseline overrides.",
    ),
    overrides: list[str] = typer.Option([], "--set", help="Change a config key against the baseline's: --set train.lr=6e-3."),
    criteria: list[str] = typer.Option([], "--expect", help=CRITERIA_HELP),
    allow_multiple_changes: bool = typer.Option(
        False, "--allow-multiple-changes", help="Record more than one change as meant (refused otherwise)."),
    config: str = typer.Option(None, "--config", help="Start from this config file instead of the baseline's."),
    name: str = typer.Option(None, "--name", help="A unique name to address the experiment by."),
    project: str = typer.Option(None, "--project", help="The project (default: the baseline's)."),
    data: list[str] = typer.Option([], "--data", help="Data to hash into the runs' manifests (default: the baseline's)."),
    eval_specs: list[str] = typer.Option([], "--eval", help="Eval specs for the full run (default: the baseline's)."),
    no_evals: bool = typer.Option(False, "--no-evals", help="No evaluations of the full run (not the baseline's specs)."),
    gpus: int = typer.Option(None, "--gpus", "--full-gpus",
                             help="GPUs of the full run, and of the test run unless `start --test-gpus` (default: the "
                                  "baseline's)."),
    time_limit: float = typer.Option(None, "--time-limit", help="The full run's time limit in hours (default: the baseline's)."),
    branch: str = typer.Option(
        None, "--branch",
        help="The change is this branch's code (of the baseline's repository) against the commit the baseline ran: "
             "each run clones exactly its commit as it is now; the config and command stay the baseline's."),
    commit: str = typer.Option(None, "--commit", help="As --branch, for one commit (a hash, a prefix or a tag)."),
    resource: str = typer.Option(None, "--resource", "--full-resource",
                                 help="A declared resource or auto for the full run, and the test run unless `start "
                                      "--test-resource` (default: the baseline's request)."),
) -> None:
    """Record a hypothesis against a baseline run: its changes (computed) and expected outcomes; print its id."""
    from trackway.cli.render import console, err_console, say
    from trackway.receipts.config_diff import change_text
    from trackway.experiments.define import ExperimentSpec, new_experiment

    from trackway.errors import InputError

    if branch is not None and commit is not None:
        raise InputError("--branch/--commit: expected one of them, not both")
    app = app_context(ctx)
    recorded = new_experiment(app.ledger, app.settings, ExperimentSpec(
        title=title, hypothesis=hypothesis, cwd=Path.cwd(), baseline=baseline, parent=parent,
        command=list(command or []), config_path=config, overrides=list(overrides), criteria=list(criteria),
        allow_multiple_changes=allow_multiple_changes, name=name, project=project,
        data_paths=list(data) or None, eval_spec_paths=list(eval_specs), no_evals=no_evals, gpus=gpus, time_limit_hours=time_limit,
        resource=resource, code_ref=branch if branch is not None else commit,
        code_ref_kind="branch" if branch is not None else "commit",
    ))
    console.print(recorded.experiment_id, highlight=False)
    if recorded.baseline_note:
        say(err_console, recorded.baseline_note)
    say(err_console, f"baseline {recorded.baseline_run_id}; changes: "
        + ("; ".join(change_text(c) for c in recorded.changes) or "none in the config or command"))
    if not criteria:
        say(err_console, "no --expect: the verdict will be inconclusive; state what the hypothesis expects")
    err_console.print(app.hint(f"next: `trackway experiment start {recorded.experiment_id}`"), highlight=False)


@experiment_app.command("start")
def start(
    ctx: typer.Context,
    experiment: str = typer.Argument(..., help="A planned experiment (id or name), or with --again a stopped one."),
    max_steps: int = typer.Option(
        None, "--max-steps",
        help="The test run's steps, passed as TRACKWAY_MAX_STEPS (default: the larger of a tenth of the config's "
             "step count, at most 200 (100 when it names none), and 12 loss points at the baseline's logging "
             "interval (50 steps when not known); never more than the config's step count).",
    ),
    test_time_limit: float = typer.Option(1.0, "--test-time-limit", help="The test run's time limit in hours."),
    min_throughput: float = typer.Option(
        None, "--min-throughput", help="The test run's throughput must reach this (default: half the baseline's)."),
    budget_gpu_hours: float = typer.Option(
        None, "--budget-gpu-hours",
        help="Refuse a full run estimated (test-run rate × planned steps) above this many GPU-hours."),
    loss_key: str = typer.Option("loss", "--loss-key", help="The metric the test run's loss check reads."),
    test_resource: str = typer.Option(
        None, "--test-resource", help="A declared resource or auto for the test run alone (default: the full run's)."),
    test_gpus: int = typer.Option(None, "--test-gpus", help="GPUs of the test run alone (default: the full run's)."),
    skip_test: bool = typer.Option(False, "--skip-test", help="Submit the full run at once (recorded)."),
    detach: bool = typer.Option(False, "--detach", help="Return once submitted; a background supervisor goes on."),
    again: bool = typer.Option(
        False, "--again",
        help="Start a new test run of an experiment stopped before its full run (the earlier test runs stay on record)."),
) -> None:
    """Show where the runs would go, submit the test run, and (unless --detach) follow to the verdict (exit 0 iff concluded)."""
    from trackway import validation
    from trackway.cli.render import console, err_console, say
    from trackway.cli.supervise_cmd import ensure_background_supervisor
    from trackway.errors import InputError
    from trackway.experiments.launch import (
        TestPlan,
        default_test_steps,
        full_spec,
        logging_interval,
        planned_steps,
        preview,
        test_spec,
    )
    from trackway.experiments.progress import start as start_experiment
    from trackway.experiments.records import resolve_experiment
    from trackway.supervisor.launch import command_by

    if max_steps is not None:
        validation.whole(max_steps, "--max-steps", 1, validation.MAX_INT32)
    validation.finite(test_time_limit, "--test-time-limit", 0, validation.TEN_YEARS_HOURS, "hours", low_open=True)
    if min_throughput is not None:
        validation.finite(min_throughput, "--min-throughput", 0, 1e12, "units per second", low_open=True)
    if budget_gpu_hours is not None:
        validation.finite(budget_gpu_hours, "--budget-gpu-hours", 0, 1e9, "GPU-hours")
    validation.printable_text(loss_key, "--loss-key")
    if test_gpus is not None:
        validation.whole(test_gpus, "--test-gpus", 0, validation.MAX_GPUS)
    app = app_context(ctx)
    with app.ledger.read() as conn:
        record = resolve_experiment(conn, experiment)
    if max_steps is not None:
        rule = "--max-steps"
    else:
        max_steps, rule = default_test_steps(planned_steps(app.ledger, record),
                                             logging_interval(app.ledger, record["baseline_run_id"], loss_key))
    plan = TestPlan(
        max_steps=max_steps,
        time_limit_hours=test_time_limit, min_throughput=min_throughput, budget_gpu_hours=budget_gpu_hours,
        loss_key=loss_key, skip_test=skip_test,
        submitted_by=command_by(f"trackway experiment start {record['experiment_id']}"),
        test_resource=test_resource, test_gpus=test_gpus,
    )
    # Where each run would go, before anything is submitted.
    shown = []
    if not skip_test:
        try:
            shown.append(("test run", preview(app.settings, test_spec(app.ledger, app.settings, record, plan))))
        except InputError as exc:
            if test_resource is None and test_gpus is None:
                raise
            # The placement's words name submit's flags: what placed the test run apart here is start's.
            raise InputError(str(exc).replace("--resource", "--test-resource").replace("--gpus", "--test-gpus")) from None
    shown.append(("full run", preview(app.settings, full_spec(app.ledger, app.settings, record))))
    for label, where in shown:
        queue = ""
        if where.get("free_gpus") is not None and where.get("total_gpus"):
            queue = f" [{where['free_gpus']} of {where['total_gpus']} GPUs free"
            queue += f", {where['running_jobs']} running, {where['pending_jobs']} pending]" \
                if where.get("pending_jobs") is not None else "]"
        say(err_console, f"{label} → {where['resource']}{'/' + where['qos'] if where['qos'] else ''}: {where['why']}{queue}")
    if not skip_test:
        say(err_console, f"test run: {plan.max_steps} steps (TRACKWAY_MAX_STEPS: {rule}), time limit "
            f"{plan.time_limit_hours:g} h"
            + (f"; full run refused above {budget_gpu_hours:g} GPU-hours" if budget_gpu_hours is not None else ""))
    supervisor = app.supervisor()
    started = start_experiment(
        app.ledger, app.settings, record["experiment_id"], plan, supervisor.executor,
        started_by=command_by(f"trackway experiment start {record['experiment_id']}"), again=again,
    )
    console.print(started.run_id, highlight=False)
    say(err_console, f"{started.kind} run {started.run_id} submitted for {started.experiment_id}")
    if detach:
        ensure_background_supervisor(app)
        return
    raise typer.Exit(_follow(app, supervisor, started.experiment_id))


@experiment_app.command("batch")
def batch(
    ctx: typer.Context,
    baseline: str = typer.Option(..., "--baseline", help="The run (id or name) every hypothesis is measured against."),
    from_file: str = typer.Option(
        None, "--from-file",
        help="A TOML file of [[hypothesis]] tables (title, hypothesis, set, expect), with shared `expect`, "
             "`budget_gpu_hours` and `max_running` at its top."),
    hypotheses: list[str] = typer.Option(
        [], "--hypothesis", help="'KEY=VALUE: statement', the change before the colon (repeatable)."),
    criteria: list[str] = typer.Option([], "--expect", help="A criterion every hypothesis is judged by (repeatable)."),
    budget_gpu_hours: float = typer.Option(
        None, "--budget-gpu-hours", help="GPU-hours the whole batch may spend (test and full runs); over the file's."),
    max_running: int = typer.Option(None, "--max-running", help="Experiments in flight at once (default 2); over the file's."),
    test_time_limit: float = typer.Option(1.0, "--test-time-limit", help="Each test run's time limit in hours."),
    name: str = typer.Option(None, "--name", help="A unique name for the batch (its experiments are NAME-1, NAME-2, ...)."),
    detach: bool = typer.Option(False, "--detach", help="Return once the first ones are submitted."),
) -> None:
    """Test several hypotheses against one baseline: N experiments sharing a GPU-hour budget, started as room allows, one table of verdicts."""
    from dataclasses import replace

    from trackway import validation
    from trackway.cli.render import console, err_console, say
    from trackway.cli.supervise_cmd import ensure_background_supervisor
    from trackway.errors import InputError
    from trackway.experiments.batch import advance_batches, from_flags, new_batch, read_file
    from trackway.experiments.launch import TestPlan
    from trackway.supervisor.launch import command_by

    if bool(from_file) == bool(hypotheses):
        raise InputError("--from-file/--hypothesis: expected a hypotheses file or --hypothesis options, one of them")
    validation.finite(test_time_limit, "--test-time-limit", 0, validation.TEN_YEARS_HOURS, "hours", low_open=True)
    members, settings_of_file = read_file(from_file) if from_file else (from_flags(hypotheses, criteria), {})
    if from_file and criteria:
        members = [replace(m, criteria=[*m.criteria, *criteria]) for m in members]
    app = app_context(ctx)
    plan = TestPlan(max_steps=None, time_limit_hours=test_time_limit,  # type: ignore[arg-type]
                    submitted_by=command_by("trackway experiment batch"))
    batch_id, recorded = new_batch(
        app.ledger, app.settings, baseline, members, Path.cwd(), plan,
        max_running=max_running if max_running is not None else settings_of_file.get("max_running", 2),
        budget_gpu_hours=budget_gpu_hours if budget_gpu_hours is not None else settings_of_file.get("budget_gpu_hours"),
        name=name)
    console.print(batch_id, highlight=False)
    say(err_console, f"{len(recorded)} experiments recorded: {', '.join(recorded)}")
    supervisor = app.supervisor()
    for who, message in advance_batches(app.ledger, app.settings, supervisor.executor):
        say(err_console, f"{who}: {message}")
    if detach:
        err_console.print(app.hint(f"`trackway experiments --batch {batch_id}` shows the verdicts as they come"),
                          highlight=False)
        ensure_background_supervisor(app)
        return
    raise typer.Exit(_follow_batch(app, supervisor, batch_id))


def _follow_batch(app: AppContext, supervisor, batch_id: str) -> int:
    """Tick until the batch is done, saying each member's moves; then its table. 0 iff every member concluded."""
    from trackway.cli.render import err_console, say
    from trackway.cli.supervise_cmd import ensure_background_supervisor
    from trackway.experiments.batch import DONE, members, resolve_batch

    try:
        with err_console.status(f"batch {batch_id}", spinner="dots"):
            while True:
                supervisor.tick()
                with app.ledger.read() as conn:
                    record = resolve_batch(conn, batch_id)
                    mine = {m["experiment_id"] for m in members(conn, batch_id)}
                for who, message in supervisor.findings:
                    if who in mine or who == batch_id:
                        say(err_console, f"{who}: {message}")
                if record["status"] == DONE:
                    break
                time.sleep(FOLLOW_INTERVAL_S)
    except KeyboardInterrupt:
        err_console.print(app.hint(f"stopped following; batch {batch_id} goes on "
                                   f"(`trackway experiments --batch {batch_id}`)"), highlight=False)
        ensure_background_supervisor(app)
        return INTERRUPTED
    with app.ledger.read() as conn:
        rows = members(conn, batch_id)
    _print_batch(app, batch_id)
    return 0 if all(m["status"] == "concluded" for m in rows) else 1


def _print_batch(app: AppContext, ref: str, as_json: bool = False) -> None:
    from trackway.experiments.batch import batch_of
    from trackway.experiments.batch import table as batch_table

    with app.ledger.read() as conn:
        shown = batch_table(conn, batch_of(conn, ref))
    if as_json:
        print_json(_jsonable(shown))
        return
    from trackway.cli.render import KEY, Column, console, err_console, say, table

    spent = f"{shown['spent_gpu_hours']:.3g} GPU-h spent" + (
        f" of {shown['budget_gpu_hours']:g}" if shown["budget_gpu_hours"] is not None else "")
    say(err_console, f"batch {shown['batch_id']} {shown['status']} against {shown['baseline_run_id']}: {spent}"
        + (f"; {shown['note']}" if shown["note"] else ""))
    columns = [Column("experiment", KEY), Column("change", 50, shorten_to=12), Column("status", KEY),
               Column("verdict", KEY), Column("criteria (left vs right)", 40, shorten_to=16)]
    console.print(table(None, columns, (
        (e["experiment_id"], "; ".join(f"{c['key']}={c['after']}" for c in e["changes"]), e["status"],
         e["verdict"] or (e["stop_reason"] or ""),
         # The mark and the numbers first: on a narrow terminal the criterion's text is what gets cut.
         "; ".join(f"{ {True: '✓', False: '✗', None: '?'}[c['holds']]} {_number(c['left'])} vs {_number(c['right'])}: "
                   f"{c['criterion']}" for c in e["criteria"]))
        for e in shown["experiments"]
    )))


def _follow(app: AppContext, supervisor, experiment_id: str) -> int:
    """Tick until the experiment concludes or stops, saying each move; 0 iff it concluded."""
    from rich.text import Text

    from trackway.cli.render import duration, err_console, printable, say
    from trackway.cli.supervise_cmd import ensure_background_supervisor
    from trackway.experiments.records import ExperimentStatus, resolve_experiment
    from trackway.ledger.records import latest_attempt
    from trackway.supervisor.loop import read_log_tail

    began = time.monotonic()
    try:
        with err_console.status("", spinner="dots") as status:
            while True:
                ends = supervisor.tick()
                with app.ledger.read() as conn:
                    record = resolve_experiment(conn, experiment_id)
                    mine = {record["test_run_id"], record["full_run_id"]} - {None}
                    run_id = record["full_run_id"] or record["test_run_id"]
                    attempt = latest_attempt(conn, run_id) if run_id else None
                for end in ends:
                    if end.run_id in mine:
                        say(err_console, end_line(end.attempt_id, end.reason.value, decision_of(end), process=False))
                for who, message in supervisor.findings:
                    if who == experiment_id or who.split("/")[0] in mine:
                        say(err_console, f"{who}: {message}")
                if ExperimentStatus(record["status"]).is_final():
                    break
                line = Text(f"{experiment_id} {record['status']} {duration(time.monotonic() - began)}  ")
                if attempt is not None:
                    tail = read_log_tail(Path(attempt["log_path"]), max_bytes=4096, max_lines=1)
                    line.append(f"{attempt['attempt_id']} ", style="bold")
                    line.append(printable(tail[-1].split(" ", 2)[-1] if tail else "")[:90], style="dim")
                status.update(line)
                time.sleep(FOLLOW_INTERVAL_S)
    except KeyboardInterrupt:
        err_console.print(app.hint(f"stopped following; {experiment_id} goes on "
                                   f"(`trackway experiment show {experiment_id}`)"), highlight=False)
        ensure_background_supervisor(app)
        return INTERRUPTED
    _print_outcome(app, record)
    return 0 if record["status"] == ExperimentStatus.CONCLUDED.value else 1


def _print_outcome(app: AppContext, record) -> None:
    from trackway.cli.render import err_console, say
    from trackway.experiments.records import loads

    for check in loads(record, "test_checks", []) or []:
        mark = {True: "pass", False: "FAIL", None: "skip"}[check["passed"]]
        say(err_console, f"  {mark:4} {check['check']}: {check['detail']}")
    if record["status"] == "stopped":
        say(err_console, f"{record['experiment_id']} stopped: {record['stop_reason']}")
    else:
        detail = loads(record, "verdict_detail", {})
        say(err_console, f"{record['experiment_id']} {record['verdict']}: {detail.get('why', '')}")
        if detail.get("next_step"):
            say(err_console, f"next: {detail['next_step']}")
    err_console.print(app.hint(f"the report: `trackway experiment report {record['experiment_id']}`"), highlight=False)


@experiment_app.command("show")
def show(
    ctx: typer.Context,
    experiment: str = typer.Argument(..., help="An experiment (id or name)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show an experiment: hypothesis, changes, criteria with their numbers, test-run checks, runs and verdict."""
    from trackway.experiments.records import resolve_experiment
    from trackway.experiments.report import describe

    app = app_context(ctx)
    app.reconcile()
    with app.ledger.read() as conn:
        described = describe(conn, resolve_experiment(conn, experiment))
    if as_json:
        print_json(_jsonable(described))
        return
    _print_described(described)


def _print_described(d: dict) -> None:
    from trackway.cli.render import console, fact
    from trackway.receipts.config_diff import change_text

    console.print(f"{d['experiment_id']}  {d['title']}", style="bold", highlight=False)
    fact(console, "hypothesis", d["hypothesis"])
    fact(console, "status", d["status"] + (f" ({d['stop_reason']})" if d["stop_reason"] else ""))
    fact(console, "baseline", d["baseline_run_id"] + (f" (after {d['parent_experiment_id']})" if d["parent_experiment_id"] else ""))
    fact(console, "changes", "; ".join(change_text(c) for c in d["changes"]) or "none")
    for number, earlier in enumerate(d["earlier_test_runs"], 1):
        failed = ", ".join(c["check"] for c in earlier["checks"] if c["passed"] is False)
        fact(console, f"test run {number}", f"{earlier['run_id']} stopped: {earlier['stop_reason']}"
             + (f" (failed: {failed})" if failed else ""))
    for run_label in ("test_run", "full_run"):
        run = d[run_label]
        if run is not None:
            if run_label == "test_run" and d["earlier_test_runs"]:
                run_label = f"test run {len(d['earlier_test_runs']) + 1}"
            fact(console, run_label.replace("_", " "), f"{run['run_id']} {run['state']}"
                 + (f" ({run['termination_reason']})" if run["termination_reason"] not in (None, run["state"]) else "")
                 + f", {len(run['attempts'])} attempt(s), {run['gpu_hours']:.3g} {run['compute']}-h, ${run['cost_usd']:.2f}")
    for check in d["test_checks"] or []:
        mark = {True: "pass", False: "FAIL", None: "skip"}[check["passed"]]
        fact(console, f"check {check['check']}", f"{mark}: {check['detail']}", label_width=20)
    detail = d["verdict_detail"] or {}
    for outcome in detail.get("criteria") or []:
        holds = {True: "holds", False: "FAILS", None: "undecided"}[outcome["holds"]]
        numbers = ", ".join(f"{k} = {_number(v)}" for k, v in outcome["values"].items())
        fact(console, "expect", f"{outcome['criterion']}: {holds}" + (f" ({numbers})" if numbers else "")
             + (f"; {outcome['missing']}" if outcome["missing"] else ""))
    if not detail.get("criteria"):
        for text in d["criteria"]:
            fact(console, "expect", text)
    verdict = d["verdict"] or (f"{detail['verdict']} (provisional)" if detail.get("verdict") else
                               "none: stopped" if d["status"] == "stopped" else "not yet")
    why = detail.get("why") or (d["stop_reason"] if d["status"] == "stopped" and not d["verdict"] else None)
    fact(console, "verdict", verdict + (f": {why}" if why else ""))
    if detail.get("next_step"):
        fact(console, "next", detail["next_step"])


def _number(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


@experiment_app.command("report")
def report(
    ctx: typer.Context,
    experiment: str = typer.Argument(..., help="An experiment (id or name)."),
    output: str = typer.Option(None, "--output", "-o", help="Write the markdown to this file instead of stdout."),
) -> None:
    """Print the experiment's markdown report: hypothesis, changes, expected vs observed, checks, attempts, verdict."""
    import sys

    from trackway.experiments.records import resolve_experiment
    from trackway.experiments.report import describe, markdown

    app = app_context(ctx)
    app.reconcile()
    with app.ledger.read() as conn:
        text = markdown(describe(conn, resolve_experiment(conn, experiment)))
    if output:
        from trackway.errors import InputError

        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise InputError(f"--output {output!r}: cannot write: {exc.strerror}") from None
        return
    sys.stdout.write(text)


@experiment_app.command("stop")
def stop(
    ctx: typer.Context,
    experiment: str = typer.Argument(..., help="An experiment (id or name) not yet concluded."),
    reason: str = typer.Option(..., "--reason", help="Why it stops, recorded."),
) -> None:
    """Stop an experiment with a reason, cancelling its unfinished test or full run."""
    from trackway import validation
    from trackway.cli.render import err_console, say
    from trackway.experiments.progress import stop as stop_experiment

    validation.printable_text(reason, "--reason")
    app = app_context(ctx)
    supervisor = app.supervisor()
    record = stop_experiment(app.ledger, experiment, reason, supervisor.cancel)
    say(err_console, f"{record['experiment_id']} stopped: {reason}")


def experiments(
    ctx: typer.Context,
    chain: str = typer.Option(None, "--chain", help="The iterations leading to and following this experiment, as a table."),
    batch: str = typer.Option(None, "--batch", help="A batch (or one of its experiments): its members' verdicts with each "
                                                   "criterion's numbers, as one table."),
    project: str = typer.Option(None, "--project", help="Only experiments of this project."),
    limit: int = typer.Option(50, "--limit", help="At most this many, newest first (0: all)."),
    metric: str = typer.Option("loss", "--metric", help="The key metric shown per experiment (its full run's final value)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List experiments with their status and verdict; --chain EXP prints the iterations around EXP."""
    from trackway.experiments.chain import chain_rows, listed_row
    from trackway.experiments.records import chain_of, list_experiments
    from trackway.validation import limit as check_limit

    check_limit(limit)
    app = app_context(ctx)
    app.reconcile()
    if batch:
        _print_batch(app, batch, as_json)
        return
    with app.ledger.read() as conn:
        if chain:
            listed = chain_rows(conn, chain_of(conn, chain), metric)
        else:
            listed = [listed_row(conn, r, metric) for r in list_experiments(conn, project=project, limit=limit or 0)]
    if as_json:
        print_json(listed)
        return
    from trackway.cli.render import KEY, Column, console, table

    if chain:
        # What a person reads the chain for stays at any width: which iteration, its verdict, its number, what next.
        columns = [Column("#", KEY, right=True), Column("experiment", KEY), Column("hypothesis", 10, shorten_to=16),
                   Column("verdict", KEY), Column(f"final {metric}", 60, right=True), Column("GPU-h", 20, right=True),
                   Column("next", 50, shorten_to=8)]
        console.print(table(None, columns, (
            (e["iteration"], e["experiment_id"] or f"baseline {e['run_id']}", e["hypothesis"], e["verdict"] or e["status"],
             _number(e["key_metric"]), _number(e["gpu_hours"]), e["next"])
            for e in listed
        )))
        return
    console.print(table(None, ["experiment", "title", "status", "verdict", "baseline", "full run", "created (UTC)"], (
        (e["experiment_id"], e["title"], e["status"], e["verdict"], e["baseline_run_id"], e["full_run_id"],
         str(e["created_at"])[:16].replace("T", " "))
        for e in listed
    ), squeeze=("title",)))


def _jsonable(node):
    if isinstance(node, dict):
        return {k: _jsonable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_jsonable(v) for v in node]
    if isinstance(node, float) and node != node:
        return "nan"
    return to_jsonable(node)


def register(app: typer.Typer) -> None:
    app.add_typer(experiment_app, name="experiment")
    app.command("experiments")(experiments)
