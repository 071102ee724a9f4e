"""`trackway submit`: record a run with its receipt, start its first attempt, and follow it to its end."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.text import Text

from trackway.cli.context import AppContext, app_context
from trackway.cli.render import console, duration, err_console
from trackway.ledger.records import get_attempt, resolve_run
from trackway.taxonomy import RunState

FOLLOW_INTERVAL_S = 0.25


def submit(
    ctx: typer.Context,
    command: list[str] = typer.Argument(None, metavar="-- COMMAND [ARGS]...", help="The command to run, after `--`."),
    name: str = typer.Option(None, "--name", help="A unique name to address the run by."),
    project: str = typer.Option("default", "--project", help="The project (namespace) the run belongs to."),
    model_family: str = typer.Option(None, "--model-family", help="The model family, e.g. reasoning."),
    kind: str = typer.Option("full", "--kind", help="test (a short gating run) or full."),
    config: str = typer.Option(None, "--config", help="Config file (TOML, YAML or JSON) snapshotted into the receipt."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config key: --set optimizer.lr=3e-4 (repeatable)."),
    data: list[str] = typer.Option([], "--data", help="A data file or directory to hash into the manifest (repeatable)."),
    gpus: int = typer.Option(0, "--gpus", help="GPUs to assign (through CUDA_VISIBLE_DEVICES)."),
    time_limit: float = typer.Option(None, "--time-limit", help="Hours before the attempt is ended (SIGTERM, grace, SIGKILL)."),
    repo: str = typer.Option(None, "--repo", help="Clone this git repository into the run's workspace and run there."),
    branch: str = typer.Option(None, "--branch", help="The branch of --repo to clone."),
    retry_policy: str = typer.Option(None, "--retry-policy", help="A TOML retry policy for this run (over trackway.toml's [retry])."),
    eval_specs: list[str] = typer.Option([], "--eval", help="An eval spec (TOML) run on committed checkpoints by its trigger (repeatable)."),
    detach: bool = typer.Option(False, "--detach", help="Print the run id and return; do not follow the attempt."),
) -> None:
    """Submit COMMAND as a run: capture its receipt, start an attempt and follow it (exit 0 iff it completed)."""
    # Imported on use, so that the other commands do not pay for receipts and executors at start-up.
    from trackway.supervisor.launch import RunSpec, start_attempt, submit_run
    from trackway.supervisor.loop import Supervisor

    app = app_context(ctx)
    spec = RunSpec(
        command=list(command or []),
        cwd=Path.cwd(),
        name=name,
        project=project,
        model_family=model_family,
        kind=kind,
        config_path=config,
        overrides=list(overrides),
        data_paths=list(data),
        gpus=gpus,
        time_limit_hours=time_limit,
        repo_url=repo,
        branch=branch,
        retry_policy_path=retry_policy,
        eval_spec_paths=list(eval_specs),
    )
    supervisor = Supervisor(app.ledger, app.settings)
    run_id = submit_run(app.ledger, app.settings, spec, console=err_console)
    with app.ledger.read() as conn:
        run = resolve_run(conn, run_id)
    attempt_id = start_attempt(app.ledger, app.settings, run_id, supervisor.executor(run["executor"]))
    console.print(run_id, highlight=False)
    if detach:
        err_console.print(
            f"attempt {attempt_id} started; follow it with `trackway logs {attempt_id} -f`; "
            "retries need a supervisor: `trackway supervise` (or any trackway command) applies the policy",
            highlight=False,
        )
        return
    raise typer.Exit(follow(app, supervisor, run_id, attempt_id))


def resume(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name that ended without completing."),
    overrides: list[str] = typer.Option([], "--set", help="Change the config from this attempt on, e.g. --set train.batch_size=16."),
    detach: bool = typer.Option(False, "--detach", help="Print the attempt id and return; do not follow it."),
) -> None:
    """Start a new attempt of RUN, from its latest committed checkpoint (exit 0 iff it completes)."""
    from trackway.errors import InputError
    from trackway.supervisor.launch import start_attempt
    from trackway.supervisor.loop import Supervisor

    app = app_context(ctx)
    supervisor = Supervisor(app.ledger, app.settings)
    supervisor.tick()
    with app.ledger.read() as conn:
        record = resolve_run(conn, run)
    if record["state"] in (RunState.RUNNING.value, RunState.QUEUED.value, RunState.COMPLETED.value):
        raise InputError(f"run {run!r}: is {record['state']}; only a run that ended without completing can be resumed")
    attempt_id = start_attempt(
        app.ledger, app.settings, record["run_id"], supervisor.executor(record["executor"]), overrides=list(overrides)
    )
    with app.ledger.read() as conn:
        resumed_from = get_attempt(conn, attempt_id)["resumed_from_checkpoint"]
    console.print(attempt_id, highlight=False)
    err_console.print(f"resuming from {resumed_from or 'the start (no committed checkpoint)'}", highlight=False)
    if not detach:
        raise typer.Exit(follow(app, supervisor, record["run_id"], attempt_id))


def follow(app: AppContext, supervisor, run_id: str, attempt_id: str) -> int:
    """Show a live status line until the run ends, across the retries the policy decides; 0 iff it completed."""
    import json

    from trackway.ledger.records import latest_attempt
    from trackway.supervisor.loop import read_log_tail

    started = time.monotonic()
    reported: set[str] = set()
    try:
        with err_console.status("", spinner="dots") as status:
            while True:
                ends = supervisor.tick()
                for watched_attempt, finding in supervisor.findings:
                    if watched_attempt.startswith(f"{run_id}/"):
                        err_console.print(f"{watched_attempt} watch: {finding}", highlight=False)
                for end in ends:
                    if end.run_id == run_id:
                        reported.add(end.attempt_id)
                        decision = end.decision
                        err_console.print(
                            f"{end.attempt_id} ended: {end.reason.value} (exit {end.exit_code}, signal {end.signal}); "
                            f"{decision.action}: {decision.message} [{decision.rule}]",
                            highlight=False,
                        )
                with app.ledger.read() as conn:
                    run = resolve_run(conn, run_id)
                    attempt = latest_attempt(conn, run_id)
                if RunState(run["state"]).is_terminal():
                    break
                if attempt is not None and attempt["attempt_id"] != attempt_id:
                    attempt_id = attempt["attempt_id"]
                    err_console.print(
                        f"{attempt_id} started, resuming from {attempt['resumed_from_checkpoint'] or 'the start'}",
                        highlight=False,
                    )
                line = Text(f"{attempt_id} {attempt['state'] if attempt else run['state']} {duration(time.monotonic() - started)}  ")
                if attempt is not None:
                    tail = read_log_tail(Path(attempt["log_path"]), max_bytes=4096, max_lines=1)
                    line.append((tail[-1].split(" ", 2)[-1] if tail else "")[:100], style="dim")
                status.update(line)
                time.sleep(FOLLOW_INTERVAL_S)
    except KeyboardInterrupt:
        err_console.print(f"stopped following; {run_id} goes on (`trackway cancel {run_id}` ends it)", highlight=False)
        return 130
    if attempt is not None and attempt["attempt_id"] not in reported:
        # Another process recorded the end: say it the same way.
        decision = json.loads(attempt["retry_decision"]) if attempt["retry_decision"] else {}
        err_console.print(
            f"{attempt['attempt_id']} ended: {attempt['termination_reason']} (exit {attempt['exit_code']}, "
            f"signal {attempt['signal']}); {decision.get('action', 'none')}: {decision.get('message', '')}",
            highlight=False,
        )
    err_console.print(f"run {run_id} {run['state']} after {duration(time.monotonic() - started)}", highlight=False)
    _say_pending_evaluations(app, run_id)
    return 0 if run["state"] == RunState.COMPLETED.value else 1


def _say_pending_evaluations(app: AppContext, run_id: str) -> None:
    """Training is done; its evaluations may not be. Say where they go on, rather than wait for them."""
    from trackway.evals.records import IN_FLIGHT, evaluations_of_run

    with app.ledger.read() as conn:
        pending = [e for e in evaluations_of_run(conn, run_id) if e["state"] == IN_FLIGHT]
    if pending:
        err_console.print(
            f"{len(pending)} evaluation(s) of {run_id} still running: `trackway supervise` finishes them, "
            f"`trackway evals {run_id}` shows them",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    app.command("resume")(resume)
