"""`trackway runs`, `show`, `attempts` and `cancel`: reading runs and their attempt receipts, and ending runs."""

from __future__ import annotations

import json
import signal

import typer

from trackway.cli.context import AppContext, app_context
from trackway.cli.jsonout import print_json, rows_to_dicts
from trackway.redaction import redact_argv, redact_structure
from trackway.validation import attempt_ref, limit as check_limit

# Human output (rich) is imported where it is printed: `--json` and the first line of output do not wait for it.

RUN_COLUMNS = [
    "run_id", "name", "project", "model_family", "kind", "state", "termination_reason", "attempt_count",
    "created_at", "ended_at", "command", "workdir", "resource", "resource_request", "gpu_memory_min_gb", "executor",
    "gpus", "nodes", "time_limit_s",
    "config_sha256", "data_manifest_sha256", "code_repo", "code_branch", "code_commit", "code_dirty_sha256",
    "checkpoint_root", "submitted_by", "approval", "approval_note", "approval_at",
]
ATTEMPT_COLUMNS = [
    "attempt_id", "run_id", "run_name", "attempt_number", "state", "executor", "executor_job_id", "host",
    "gpu_ids", "gpu_model", "gpu_count", "started_at", "ended_at", "last_heartbeat_at", "gpu_seconds", "cost_usd",
    "exit_code", "signal", "termination_reason", "termination_evidence", "config_sha256", "data_manifest_sha256",
    "environment_sha256", "code_commit", "code_dirty_sha256", "resumed_from_checkpoint", "first_step", "last_step",
    "checkpoints_committed", "useful_gpu_seconds", "wasted_gpu_seconds", "retry_decision", "log_path", "environ_sha256", "started_by",
    "resource", "qos", "selection", "workdir", "code_branch", "code_capture",
]


def reconcile(app: AppContext) -> None:
    """Record the ends of attempts that finished while nobody was following them (see `AppContext.reconcile`)."""
    app.reconcile()


def _run_json(row) -> dict:
    out = rows_to_dicts([row], [c for c in RUN_COLUMNS if c in row])[0]
    out["command"] = shown_command(row)
    return out


def shown_command(run) -> list[str]:
    """The run's command, redacted again: a run recorded before commands were redacted holds it as typed."""
    return redact_argv(json.loads(run["command"]))


def _attempt_json(row) -> dict:
    out = rows_to_dicts([row], [c for c in ATTEMPT_COLUMNS if c in row])[0]
    if row["termination_evidence"]:
        out["termination_evidence"] = json.loads(row["termination_evidence"])
    if out.get("code_capture"):
        out["code_capture"] = json.loads(out["code_capture"])
    return out


def runs(
    ctx: typer.Context,
    project: str = typer.Option(None, "--project", help="Only runs of this project."),
    kind: str = typer.Option(None, "--kind", help="Only runs of this kind: test, full, eval or all (default: test and full)."),
    limit: int = typer.Option(50, "--limit", help="At most this many runs, newest first (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List runs, newest first (evaluation seeds, kind eval, only with --kind eval or all)."""
    from trackway.errors import InputError
    from trackway.taxonomy import RunKind

    if kind not in (None, "all", *(k.value for k in RunKind)):
        raise InputError(f"--kind {kind!r}: expected test, full, eval or all")
    check_limit(limit)
    kinds = None if kind == "all" else [kind] if kind else [RunKind.TEST.value, RunKind.FULL.value]
    app = app_context(ctx)
    reconcile(app)
    with app.reader() as reader:
        rows = reader.runs(limit=limit or None, project=project, kinds=kinds)
    if as_json:
        print_json([_run_json(r) for r in rows])
        return
    from trackway.cli.render import console, table

    console.print(table(None, runs_listing(), (
        (r["run_id"], r["name"], r["project"], r["kind"], _state(r), r["termination_reason"], r["attempt_count"],
         _minute(r["created_at"]), " ".join(shown_command(r)))
        for r in rows
    )))


def _state(run) -> str:
    """The run's state, and a person's approval it waits for (an agent's run: `trackway approve`)."""
    return f"{run['state']} (awaiting approval)" if run.get("approval") == "awaiting" else run["state"]


def runs_listing() -> list:
    """The runs listing's columns. Narrow terminals drop the lowest `keep` first: what tells runs apart and
    says how they ended stays."""
    from trackway.cli.render import KEY, Column

    return [
        Column("run", KEY), Column("name", 60, shorten_to=16, middle=True), Column("project", 20, shorten_to=8),
        Column("kind", 30),
        Column("state", KEY), Column("reason", KEY), Column("attempts", 50, right=True), Column("created (UTC)", 40),
        Column("command", 10, shorten_to=12),
    ]


def _minute(value) -> str:
    """A listing's time: to the minute (the full time is in `show` and --json)."""
    from trackway.cli.render import short_time

    return short_time(value)[:16]


def attempts(
    ctx: typer.Context,
    run: str = typer.Argument(None, help="A run id or name; all runs when left out."),
    limit: int = typer.Option(100, "--limit", help="At most this many attempts (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List attempts (the receipts), of one run or of all runs."""
    check_limit(limit)
    app = app_context(ctx)
    reconcile(app)
    with app.reader() as reader:
        run_id = reader.run(run)["run_id"] if run else None
        rows = reader.attempts(run_id=run_id, limit=limit or None)
    if as_json:
        print_json([_attempt_json(r) for r in rows])
        return
    from trackway.cli.render import console

    console.print(attempts_listing(rows, with_run_name=run is None))


def attempts_listing(rows, with_run_name: bool = False):
    """Attempts one per row; how each ended (exit, signal, reason) outlasts where and when on a narrow terminal."""
    from trackway.cli.render import KEY, Column, duration, short_time, table
    from trackway.display import compute_unit_of

    rows = list(rows)
    columns = [Column("attempt", KEY)]
    columns += [Column("name", 35, shorten_to=12, middle=True)] if with_run_name else []
    columns += [
        Column("state", KEY), Column("host", 50, shorten_to=10), Column("gpus", 25, right=True),
        # GPU-hours only where GPUs were used: the header says what the listed attempts' hours are.
        Column("started (UTC)", 40), Column("wall", 45, right=True),
        Column(f"{compute_unit_of(a['gpu_count'] for a in rows).lower()}-h", 30, right=True),
        Column("exit", 70, right=True), Column("signal", 70), Column("reason", KEY),
    ]
    return table(None, columns, (
        (a["attempt_id"], *([a["run_name"]] if with_run_name else []), a["state"], a["host"], a["gpu_count"],
         short_time(a["started_at"]), duration(_wall(a)), f"{(a['gpu_seconds'] or 0) / 3600:.3f}", a["exit_code"],
         signal_name(a["signal"]), a["termination_reason"])
        for a in rows
    ))


def signal_name(number: int | None) -> str | None:
    """`SIGTERM` for 15: the name people search logs for."""
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _placement_line(a) -> str:
    """Where the attempt went and why, as the selection recorded it."""
    from trackway.resources.selection_record import Selection

    chosen = Selection.from_json(a["selection"])
    if chosen is None:
        return f"{a['resource'] or 'the run’s'} (chosen before trackway recorded its reasons)"
    return chosen.text()


def _wall(a) -> float | None:
    if a["started_at"] and a["ended_at"]:
        return (a["ended_at"] - a["started_at"]).total_seconds()
    return None


def resolve_ref(reader, ref: str):
    """(run, attempt or None) for `RUN` or `RUN/N`; an evaluation seed's name (`RUN@STEP/SPEC/seed-N`) is a RUN."""
    named = reader.run_named(ref)
    if named is not None:
        return named, None
    if "/" in ref:
        attempt = reader.attempt(ref)
        return reader.run(attempt["run_id"]), attempt
    return reader.run(ref), None


def show(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="RUN|RUN/N", help="A run (id or name), or one attempt as RUN/N."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a run with its receipt and attempts, or one attempt's full receipt."""
    from trackway.experiments.expectation_verdicts import verdict_of

    attempt_ref(ref)
    app = app_context(ctx)
    reconcile(app)
    with app.reader() as reader:
        run, asked = resolve_ref(reader, ref)
        rows = [asked] if asked is not None else reader.attempts(run_id=run["run_id"], limit=None)
        # The config and data the attempt shown last ran with: `resume --set` gives an attempt its own.
        shown = rows[-1] if rows else None
        config_sha = (shown and shown["config_sha256"]) or run["config_sha256"]
        data_sha = (shown and shown["data_manifest_sha256"]) or run["data_manifest_sha256"]
        # Masked as `explain` masks it (by key name and shape): a config may hold a pasted API key.
        config = redact_structure(json.loads(reader.blob(config_sha))) if config_sha else None
        manifest = json.loads(reader.blob(data_sha)) if data_sha else None
    if as_json:
        payload = _run_json(run)
        payload["config"] = config
        payload["config_of"] = shown["attempt_id"] if shown is not None else None
        payload["data_manifest"] = manifest
        payload["preflight"] = json.loads(run["preflight"]) if run.get("preflight") else None
        payload["expectations"] = verdict_of(run)
        payload["attempts"] = [_attempt_json(a) for a in rows]
        print_json(payload)
        return
    from trackway.cli.render import console, plain, say

    _print_run(app, run, config_sha, config, data_sha, manifest, shown)
    if asked is None and len(rows) > 1:
        say(console, plain("attempts", style="bold"))
        console.print(attempts_listing(rows))
    if shown is not None:
        _print_attempt(shown)
        if asked is None and len(rows) > 1:
            say(console, app.hint(f"(another attempt's receipt: `trackway show {run['name'] or run['run_id']}/N`)"))


# Config values shown before `--json` is needed for the rest.
CONFIG_SHOWN = 20
LABEL = 14


def _fact(label: str, value: str) -> None:
    from trackway.cli.render import console, fact

    fact(console, label, value, LABEL)


def _print_run(app: AppContext, run, config_sha, config, data_sha, manifest, shown) -> None:
    from trackway.cli.render import console, plain, say, short_sha, short_time
    from trackway.experiments.expectation_verdicts import lines as expectation_lines

    say(console, plain(f"run {run['run_id']}", style="bold") + plain(f"  {run['name']}" if run["name"] else ""))
    files = manifest["files"] if manifest else []
    reason = f" ({run['termination_reason']})" if run["termination_reason"] not in (None, run["state"]) else ""
    limit = f"{run['time_limit_s'] / 3600:g} h" if run["time_limit_s"] else "none"
    code = f"{run['code_repo'] or 'not a git repository'}"
    if run["code_repo"]:
        code += f" @ {run['code_branch'] or 'detached'} {short_sha(run['code_commit'])}"
        code += f" + uncommitted diff {short_sha(run['code_dirty_sha256'])}" if run["code_dirty_sha256"] else ""
    for label, value in (
        ("state", f"{_state(run)}{reason}"),
        *((("submitted by", run["submitted_by"]),) if run.get("submitted_by") else ()),
        *((("approval", run["approval_note"]),) if run.get("approval") else ()),
        ("project", f"{run['project']}   model family {run['model_family'] or 'not set'}   kind {run['kind']}"),
        ("command", " ".join(shown_command(run))),
        ("workdir", run["workdir"]),
        ("created", f"{short_time(run['created_at'])} UTC"
         + (f", ended {short_time(run['ended_at'])} UTC" if run["ended_at"] else "")),
        ("resource", ("auto, first chosen: " if run["resource_request"] == "auto" else "")
         + f"{run['resource']} ({run['executor']}), gpus {run['gpus']}"
         + (f" over {run['nodes']} nodes" if (run.get("nodes") or 1) > 1 else "")
         + (f" of ≥ {run['gpu_memory_min_gb']:g} GB" if run["gpu_memory_min_gb"] else "") + f", time limit {limit}"),
        ("data", f"{short_sha(data_sha)}  {len(files)} file(s), {sum(f['size'] for f in files):,} bytes"
         if manifest else "no data declared"),
        ("code", code),
        ("checkpoints", run["checkpoint_root"] or "under trackway's home"),
        ("memory", _preflight_line(run)),
        *(("expect" if i == 0 else "", line) for i, line in enumerate(expectation_lines(run))),
    ):
        _fact(label, value)
    _print_config(app, run, config_sha, config, shown)


def _preflight_line(run) -> str:
    from trackway.resources.run_preflight import summary_of

    return summary_of(run.get("preflight")) or "no memory preflight (the config declares no [preflight])"


def _print_config(app: AppContext, run, config_sha, config, shown) -> None:
    """Every config value as stored (0.05 stays 0.05), the first CONFIG_SHOWN of them; the attempt it is from."""
    from trackway.cli.render import console, fact, say, short_sha

    if config is None:
        _fact("config", "no config declared")
        return
    of = f" (attempt {shown['attempt_number']} ran with it)" if shown is not None else ""
    _fact("config", f"{short_sha(config_sha)}{of}")
    values = flat_config(config)
    for key, value in values[:CONFIG_SHOWN]:
        fact(console, "", f"{key} = {value}", 0, indent=4)
    if len(values) > CONFIG_SHOWN:
        ref = run["name"] or run["run_id"]
        say(console, app.hint(f"    … {len(values) - CONFIG_SHOWN} more (`trackway show {ref} --json`)"))


def flat_config(config, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value as JSON text) for each leaf: the value exactly as stored, never rounded for display."""
    if isinstance(config, dict) and config:
        out: list[tuple[str, str]] = []
        for key in sorted(config):
            out += flat_config(config[key], f"{prefix}{key}.")
        return out
    return [(prefix[:-1] or "(value)", json.dumps(config, ensure_ascii=False))]


def _print_attempt(a) -> None:
    from trackway.cli.render import console, duration, fact, plain, say, short_sha, short_time

    evidence = json.loads(a["termination_evidence"]) if a["termination_evidence"] else {}
    ending = a["state"]
    if a["termination_reason"]:
        ending += f": {a['termination_reason']} (rule {evidence.get('rule') or 'not recorded'})"
    gpus = f"{a['gpu_count']} {a['gpu_model'] or ''}".strip() + (f", ids {a['gpu_ids']}" if a["gpu_ids"] else "")
    # With no GPU the ledger counts the attempt's wall seconds on one CPU: said as such, not as GPU time.
    compute = "gpu-seconds" if a["gpu_count"] else "cpu-seconds"
    say(console, plain(f"attempt {a['attempt_id']}", style="bold"))
    for label, value in (
        ("state", ending),
        ("started by", a["started_by"] or "not recorded"),
        ("resource", _placement_line(a)),
        ("executor", f"{a['executor']} job {a['executor_job_id'] or 'not started'} on {a['host'] or 'no host yet'}"),
        ("gpus", gpus if a["gpu_count"] else "none"),
        ("time", f"{short_time(a['started_at'])} → {short_time(a['ended_at'])} UTC ({duration(_wall(a))})"
         if a["ended_at"] else f"{short_time(a['started_at'])} UTC, not ended"),
        (compute, f"{_number(a['gpu_seconds'])}   cost ${a['cost_usd'] or 0:.2f}"),
        ("exit", f"{'no exit code' if a['exit_code'] is None else 'code ' + str(a['exit_code'])}, "
                 f"{signal_name(a['signal']) or 'no signal'}"),
        ("steps", "none logged" if a["first_step"] is None else f"{a['first_step']}..{a['last_step']}"),
        ("resumed from", a["resumed_from_checkpoint"] or "the start (no checkpoint)"),
        ("code", _attempt_code_line(a)),
        ("environment", f"{short_sha(a['environment_sha256'])}   config {short_sha(a['config_sha256'])}"
                        f"   data {short_sha(a['data_manifest_sha256'])}"),
        ("log", a["log_path"]),
    ):
        _fact(label, value)
    # Evidence is what the script printed: `[rank0]: ...` must reach the screen as it was written.
    if evidence.get("lines"):
        say(console, "  evidence:")
        for line in evidence["lines"]:
            fact(console, "", line, 0, indent=4)


def _attempt_code_line(a) -> str:
    """`1a2b3c... + uncommitted diff 9f8e...; the run's recorded commit and diff, rebuilt into ...`."""
    from trackway.cli.render import short_sha

    if not a.get("code_capture"):
        return "as its run's receipt (taken at submit)"
    capture = json.loads(a["code_capture"])
    commit = f"{short_sha(a['code_commit'])}" if a["code_commit"] else "no commit"
    diff = f" + uncommitted diff {short_sha(a['code_dirty_sha256'])}" if a["code_dirty_sha256"] else ""
    return f"{commit}{diff}; {capture['said']}"


def cancel(ctx: typer.Context, run: str = typer.Argument(..., help="A run id or name.")) -> None:
    """End a run: SIGTERM to its attempts' process groups, SIGKILL after the grace period."""
    from trackway.cli.render import console, say

    app = app_context(ctx)
    reconcile(app)
    cancelled = app.supervisor().cancel(run)
    if cancelled:
        say(console, f"cancel requested for {', '.join(cancelled)}; the end is recorded as user_cancelled")
    else:
        say(console, f"run {run} had no running attempt; marked cancelled")


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("attempts")(attempts)
    app.command("show")(show)
    app.command("cancel")(cancel)
