"""`trackway submit`: record a run with its receipt, start its first attempt, and follow it to its end."""

from __future__ import annotations

import functools
import shlex
import time
from pathlib import Path

import typer
from rich.text import Text

from trackway.cli.end_line import decision_of, end_line
from trackway.cli.context import AppContext, app_context
from trackway.cli.render import console, duration, err_console, printable, say
from trackway.cli.supervise_cmd import ensure_background_supervisor
from trackway.ledger.records import get_attempt, latest_attempt, resolve_run
from trackway.taxonomy import RunState

FOLLOW_INTERVAL_S = 0.25
INTERRUPTED = 130  # follow()'s code after Ctrl-C: the run goes on without this command


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
    gpus: int = typer.Option(0, "--gpus", help="GPUs to assign (through CUDA_VISIBLE_DEVICES), in all over --nodes."),
    nodes: int = typer.Option(
        1, "--nodes",
        help="Nodes the run spans, up to its resource's (Slurm: nodes; SSH: hosts): one task per node with "
             "MASTER_ADDR, MASTER_PORT, NODE_RANK and NNODES set, for `torchrun --nnodes=$NNODES ...`.",
    ),
    time_limit: float = typer.Option(None, "--time-limit", help="Hours before the attempt is ended (SIGTERM, grace, SIGKILL)."),
    in_pieces: bool = typer.Option(
        False, "--in-pieces",
        help="--time-limit is the run's total, longer than any QoS tier or partition allows: each attempt runs on "
             "the longest tier, and one that reaches its limit is resumed from its newest checkpoint until the total "
             "is spent (each attempt's receipt says which piece it was).",
    ),
    resource: str = typer.Option(
        None, "--resource",
        help="A resource declared in trackway.toml, or auto: chosen by kind, GPUs, memory, time limit, availability "
             "and cost (the default once any resource is declared; see `trackway resources`).",
    ),
    prefer_resource: str = typer.Option(
        None, "--prefer-resource",
        help="A declared resource chosen first whenever it can take the run; when it cannot, auto chooses another "
             "and the attempt's selection says why it was passed over.",
    ),
    gpu_memory_min: float = typer.Option(None, "--gpu-memory-min", help="GB of memory each GPU must have."),
    repo: str = typer.Option(None, "--repo", help="Clone this git repository into the run's workspace and run there."),
    branch: str = typer.Option(None, "--branch", help="The branch of --repo to clone."),
    retry_policy: str = typer.Option(None, "--retry-policy", help="A TOML retry policy for this run (over trackway.toml's [retry])."),
    eval_specs: list[str] = typer.Option([], "--eval", help="An eval spec (TOML) run on committed checkpoints by its trigger (repeatable)."),
    expect: list[str] = typer.Option(
        [], "--expect",
        help="What the run sets out to show, judged as metrics and evaluations land (repeatable), in the criteria "
             "language of `trackway experiment new` over the run's own numbers: 'eval.pass@1 > 0.05' (at any "
             "evaluated checkpoint; add 'at latest' for the newest), 'final.loss < 2.0'. `show`, `explain` and "
             "`evals` give the verdict.",
    ),
    watch: list[str] = typer.Option(
        [], "--watch",
        help="This run's own watcher threshold, over trackway.toml's [watchers] (repeatable): KIND.KEY=VALUE, e.g. "
             "'loss_rising.window=200 steps', 'plateau.window=3h', 'gpu_underused.threshold=50'.",
    ),
    metric_patterns: list[str] = typer.Option(
        [], "--metric-pattern",
        help="For a script without the SDK: a regex read from its output; group (?P<step>...) is the step (without it: "
             "the last step another pattern matched), (?P<gpu>...) a device index, every other named group a metric, "
             "e.g. 'iter (?P<step>\\d+): loss (?P<loss>\\S+)' (repeatable; over [logs] metrics).",
    ),
    checkpoint_paths: list[str] = typer.Option(
        [], "--checkpoint-path",
        help="For a script without the SDK: its checkpoint file or directory (a glob relative to the working directory, "
             "e.g. out/ckpt.pt), committed by trackway once complete and restored before a retry; `{resume_from}` in "
             "COMMAND becomes the restored path (a word holding it is dropped when there is none) (repeatable).",
    ),
    checkpoint_root: str = typer.Option(
        None, "--checkpoint-root",
        help="Where checkpoints outlive the machine: an fsspec URL (s3://bucket/prefix, gs://...) or a mounted volume's "
             "path; the run's id is appended (default: the resource's checkpoint_root, else under trackway's home).",
    ),
    strict: bool = typer.Option(
        False, "--strict",
        help="Refuse the run, recording nothing, when the memory preflight (the config's [preflight]) predicts it runs "
             "out of GPU memory wherever it may go.",
    ),
    detach: bool = typer.Option(False, "--detach", help="Print the run id and return; do not follow the attempt."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Record and start nothing: check the run as a submit does, then print the resource it would go to and "
             "why, and what its executor would be sent (the sbatch script, the SSH launch, the local command line "
             "and environment names).",
    ),
) -> None:
    """Submit COMMAND as a run: capture its receipt, start an attempt and follow it (exit 0 iff it completed)."""
    # Imported on use, so that the other commands do not pay for receipts and executors at start-up.
    from trackway.supervisor.launch import command_by
    from trackway.supervisor.submit import RunSpec, submit_run

    _check_eval_files(eval_specs)
    if expect:  # refused in one line, before anything is recorded (the criteria's language loaded only then)
        from trackway.experiments.expectations import parse_all

        parse_all(expect)
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
        nodes=nodes,
        time_limit_hours=time_limit,
        resource=resource,
        prefer_resource=prefer_resource,
        gpu_memory_min_gb=gpu_memory_min,
        repo_url=repo,
        branch=branch,
        retry_policy_path=retry_policy,
        eval_spec_paths=list(eval_specs),
        metric_patterns=list(metric_patterns) or None,
        checkpoint_paths=list(checkpoint_paths) or None,
        checkpoint_root=checkpoint_root,
        preflight_strict=strict,
        expect=[text.strip() for text in expect],
        watch=list(watch),
        submitted_by=command_by("trackway submit"),
        in_pieces=in_pieces,
    )
    if dry_run:
        from trackway.supervisor.dry_run import preview_submit

        typer.echo(preview_submit(app.ledger, app.settings, spec, console=err_console).text())  # unwrapped: a script to copy
        return
    if detach:
        # Launched and left to a background supervisor: no control loop (its watchers, evaluations and
        # notifications) is loaded for a command that never ticks one.
        from trackway.executors.registry import get_executor

        supervisor = None
        executor_for = functools.cache(lambda name: get_executor(name, app.settings.home))  # as Supervisor.executor
    else:
        from trackway.supervision import supervisor_for

        supervisor = supervisor_for(app.ledger, app.settings)
        executor_for = supervisor.executor
    run_id = submit_run(app.ledger, app.settings, spec, console=err_console)
    attempt_id = _first_attempt(app, executor_for, run_id)
    _say_submitted_and_follow(app, supervisor, run_id, attempt_id, detach=detach, evaluated=bool(eval_specs))


def _check_eval_files(paths: list[str]) -> None:
    """Each `--eval` names a file: refused before anything else is read or written."""
    from trackway.validation import existing_file

    for path in paths:
        existing_file(path, "--eval", "an eval spec file (TOML)")


def _first_attempt(app: AppContext, executor_for, run_id: str) -> str:
    """Start the submitted run's attempt 1; the one a supervisor started instead, when it took the launch over."""
    from trackway.supervisor.launch import command_by

    attempt_id = _start(
        app, run_id, executor_for, first=True, started_by=command_by("trackway submit"),
    )
    if attempt_id is None:
        # A supervisor took over a launch it judged abandoned (this process was stopped that long).
        with app.ledger.read() as conn:
            attempt_id = latest_attempt(conn, run_id)["attempt_id"]
    return attempt_id


def _say_submitted_and_follow(app: AppContext, supervisor, run_id: str, attempt_id: str, *, detach: bool,
                              evaluated: bool) -> None:
    """Print the run id and where its attempt went; with `detach` return, else follow it and exit with its code."""
    console.print(run_id, highlight=False)
    if app.settings.resources:
        _say_placement(app, attempt_id)
    _say_declared_paths(app, attempt_id)
    if detach:
        err_console.print(app.hint(f"attempt {attempt_id} started; follow it with `trackway logs {attempt_id} -f`"),
                          highlight=False)
        ensure_background_supervisor(app)
        return
    code = follow(app, supervisor, run_id, attempt_id)
    if evaluated or code == INTERRUPTED or _pending_evaluations(app, run_id):
        # Evaluations (and, after Ctrl-C, the run itself) go on after this command returns.
        ensure_background_supervisor(app)
    raise typer.Exit(code)


def _start(app: AppContext, run_id: str, executor, **options) -> str | None:
    """`start_attempt`, where a launch the executor refused is an attempt like any other, not an error.

    The refusal is recorded on the attempt with the policy's decision (supervisor/launch.py); it is
    said here, and the command goes on following the run: its retry, if the policy makes one, is
    what the person waits for.
    """
    from trackway.errors import ExecutorError
    from trackway.supervisor.launch import start_attempt

    with app.ledger.read() as conn:
        before = latest_attempt(conn, run_id)
    try:
        return start_attempt(app.ledger, app.settings, run_id, executor, **options)
    except ExecutorError:
        with app.ledger.read() as conn:
            refused = latest_attempt(conn, run_id)
        if refused is None or (before is not None and refused["attempt_id"] == before["attempt_id"]):
            raise  # refused before any attempt was recorded: nothing to follow
    _say_end(refused)
    return refused["attempt_id"]


def _say_end(attempt) -> None:
    """`RUN/N ended: REASON (exit code 1); ACTION: MESSAGE [RULE]`, as the live status says an end."""
    import json

    decision = json.loads(attempt["retry_decision"]) if attempt["retry_decision"] else {}
    say(err_console, end_line(attempt["attempt_id"], attempt["termination_reason"], decision,
                              exit_code=attempt["exit_code"], signal=attempt["signal"]))


def _say_placement(app: AppContext, attempt_id: str) -> None:
    """Where the first attempt went and why, in one line on stderr."""
    from trackway.resources.selection_record import Selection

    with app.ledger.read() as conn:
        placement = Selection.from_json(get_attempt(conn, attempt_id)["selection"])
    if placement is not None:
        err_console.print(Text(f"trackway: {printable(placement.text())}", style="dim"))


def resume(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name that ended without completing."),
    overrides: list[str] = typer.Option([], "--set", help="Change the config from this attempt on, e.g. --set train.batch_size=16."),
    same_code: bool = typer.Option(
        False, "--same-code",
        help="Run the code the run was submitted with (its recorded commit and diff, rebuilt in the attempt's own "
             "workspace) instead of the work tree as it is now.",
    ),
    detach: bool = typer.Option(False, "--detach", help="Print the attempt id and return; do not follow it."),
) -> None:
    """Start a new attempt of RUN, from its latest committed checkpoint (exit 0 iff it completes).

    The attempt runs the work tree as it is now, with a new code receipt; --same-code keeps the submitted code.
    """
    from trackway.errors import InputError
    from trackway.redaction import redact
    from trackway.supervisor.launch import command_by
    from trackway.supervision import supervisor_for

    app = app_context(ctx)
    supervisor = supervisor_for(app.ledger, app.settings)
    supervisor.tick()
    with app.ledger.read() as conn:
        record = resolve_run(conn, run)
    record = _after_cancel(app, supervisor, run, record)
    if record["state"] in (RunState.RUNNING.value, RunState.QUEUED.value, RunState.COMPLETED.value):
        raise InputError(f"run {run!r}: is {record['state']}; only a run that ended without completing can be resumed")
    if same_code and not record["code_commit"]:
        raise InputError(f"--same-code: run {run!r} has no code receipt to rebuild (it was not submitted from a git "
                         "work tree with a commit); resume without --same-code to run the work tree as it is")
    # Recorded as who started the attempt: `--set api_key=...` is said as `--set api_key=***`.
    shown = [redact(o) for o in overrides]
    words = ["trackway", "resume", *(a for o in shown for a in ("--set", o)), *(["--same-code"] if same_code else [])]
    attempt_id = _start(
        app, record["run_id"], supervisor.executor, overrides=list(overrides),
        started_by=command_by(shlex.join(words)), code_from="receipt" if same_code else "work_tree",
    )
    with app.ledger.read() as conn:
        resumed_from = get_attempt(conn, attempt_id)["resumed_from_checkpoint"]
    console.print(attempt_id, highlight=False)
    say(err_console, f"resuming from {resumed_from or 'the start (no committed checkpoint)'}")
    _say_declared_paths(app, attempt_id)
    if detach:
        ensure_background_supervisor(app)
        return
    code = follow(app, supervisor, record["run_id"], attempt_id)
    if code == INTERRUPTED or _pending_evaluations(app, record["run_id"]):
        ensure_background_supervisor(app)
    raise typer.Exit(code)


# Past the grace period, how long a cancel may take to be recorded (the SIGKILL, the executor's own report).
CANCEL_SETTLE_S = 15.0


def _after_cancel(app: AppContext, supervisor, run: str, record):
    """The run once a cancel still finishing has ended it: `resume` right after `cancel` waits for it (at most
    the grace period and CANCEL_SETTLE_S), with a live status line; past that, it says how long to wait."""
    import time

    from trackway.errors import TrackwayError
    from trackway.ledger.records import active_attempts
    from trackway.supervisor.loop import handle_of

    if record["state"] not in (RunState.RUNNING.value, RunState.QUEUED.value):
        return record
    with app.ledger.read() as conn:
        live = [a for a in active_attempts(conn) if a["run_id"] == record["run_id"]]
    cancelling = [a for a in live if a["executor_job_id"]
                  and supervisor.executor(a["executor"]).poll(handle_of(a)).cancelled]
    if not live or len(cancelling) < len(live):
        return record  # it runs: not ours to wait for
    grace = max(app.settings.resource(a["resource"] or record["resource"]).grace_seconds for a in cancelling)
    bound = grace + CANCEL_SETTLE_S
    ids = ", ".join(a["attempt_id"] for a in cancelling)
    deadline = time.monotonic() + bound
    with err_console.status(f"{ids} is being cancelled: waiting for it to end (at most {bound:.0f} s: the "
                            f"{grace:g} s grace period, then SIGKILL)"):
        while time.monotonic() < deadline:
            supervisor.tick()
            with app.ledger.read() as conn:
                record = resolve_run(conn, run)
            if record["state"] not in (RunState.RUNNING.value, RunState.QUEUED.value):
                say(err_console, f"{ids} ended (cancelled); resuming")
                return record
            time.sleep(0.5)
    raise TrackwayError(f"run {run!r}: the cancel of {ids} has not finished after {bound:.0f} s; `trackway show {run}` "
                        "says when it has, then resume it")


def follow(app: AppContext, supervisor, run_id: str, attempt_id: str) -> int:
    """Show a live status line until the run ends, across the retries the policy decides; 0 iff it completed."""

    from trackway.supervisor.loop import read_log_tail

    started = time.monotonic()
    reported: set[str] = set()
    with app.ledger.read() as conn:
        first = get_attempt(conn, attempt_id)
        if first["state"] == "ended":
            reported.add(attempt_id)  # a launch refused: its end was said already
    # What each attempt was given to resume from: the script's own restore may fall back to an older one.
    offered = {attempt_id: first["resumed_from_checkpoint"]}
    try:
        with err_console.status("", spinner="dots") as status:
            while True:
                ends = supervisor.tick()
                for watched_attempt, finding in supervisor.findings:
                    if watched_attempt.startswith(f"{run_id}/"):
                        say(err_console, f"{watched_attempt} watch: {finding}")
                for end in ends:
                    if end.run_id == run_id:
                        reported.add(end.attempt_id)
                        say(err_console, end_line(end.attempt_id, end.reason.value, decision_of(end),
                                                  exit_code=end.exit_code, signal=end.signal))
                with app.ledger.read() as conn:
                    run = resolve_run(conn, run_id)
                    attempt = latest_attempt(conn, run_id)
                if RunState(run["state"]).is_terminal():
                    break
                if attempt is not None and attempt["attempt_id"] != attempt_id:
                    attempt_id = attempt["attempt_id"]
                    offered[attempt_id] = attempt["resumed_from_checkpoint"]
                    resumed_from = attempt["resumed_from_checkpoint"] or "the start"
                    say(err_console, f"{attempt_id} started, resuming from {resumed_from}")
                    _say_declared_paths(app, attempt_id)
                if attempt is not None and offered.get(attempt["attempt_id"], attempt["resumed_from_checkpoint"]) \
                        != attempt["resumed_from_checkpoint"]:
                    # The script's restore set the offered checkpoint aside (it did not verify) and took an older one.
                    said = attempt["resumed_from_checkpoint"] or "nothing (it started from the start)"
                    say(err_console, f"{attempt['attempt_id']} restored {said}, not {offered[attempt['attempt_id']]}: "
                                     f"see `trackway explain {attempt['attempt_id']}`")
                    offered[attempt["attempt_id"]] = attempt["resumed_from_checkpoint"]
                line = Text(f"{attempt_id} {attempt['state'] if attempt else run['state']} {duration(time.monotonic() - started)}  ")
                if attempt is not None:
                    tail = read_log_tail(Path(attempt["log_path"]), max_bytes=4096, max_lines=1)
                    line.append(printable(tail[-1].split(" ", 2)[-1] if tail else "")[:100], style="dim")
                status.update(line)
                time.sleep(FOLLOW_INTERVAL_S)
    except KeyboardInterrupt:
        err_console.print(
            app.hint(f"stopped following; {run_id} goes on (`trackway cancel {run_id}` ends it)"), highlight=False
        )
        ensure_background_supervisor(app)  # this process was driving its retries
        return INTERRUPTED
    if attempt is not None and attempt["attempt_id"] not in reported:
        _say_end(attempt)  # another process recorded the end: said the same way
    err_console.print(f"run {run_id} {run['state']} after {duration(time.monotonic() - started)}", highlight=False)
    _say_pending_evaluations(app, run_id)
    return 0 if run["state"] == RunState.COMPLETED.value else 1


def _say_declared_paths(app: AppContext, attempt_id: str) -> None:
    """What the launch did to a `--checkpoint-path`: restored a committed checkpoint, or moved a left-over aside."""
    import json

    from sqlalchemy import select

    from trackway.ledger.schema import attempt_events

    with app.ledger.read() as conn:
        payload = conn.execute(
            select(attempt_events.c.payload).where(
                attempt_events.c.attempt_id == attempt_id, attempt_events.c.kind == "checkpoint_path_restored"
            )
        ).scalar()
    if payload is None:
        return
    done = json.loads(payload)
    if done.get("restored"):
        say(err_console, f"restored {done.get('checkpoint')} to {', '.join(done['restored'])}")
    if done.get("moved_aside"):
        say(err_console, "nothing committed yet, so this attempt starts from the start; moved aside: "
            + ", ".join(done["moved_aside"]))


def _pending_evaluations(app: AppContext, run_id: str) -> int:
    """How many evaluations of `run_id` are still in flight."""
    from trackway.evals.records import IN_FLIGHT, evaluations_of_run

    with app.ledger.read() as conn:
        return sum(1 for e in evaluations_of_run(conn, run_id) if e["state"] == IN_FLIGHT)


def _say_pending_evaluations(app: AppContext, run_id: str) -> None:
    """Training is done; its evaluations may not be. Say where they go on, rather than wait for them."""
    pending = _pending_evaluations(app, run_id)
    if pending:
        err_console.print(
            app.hint(f"{pending} evaluation(s) of {run_id} still running; `trackway evals {run_id}` shows them"),
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    app.command("resume")(resume)
