"""`trackway runs`, `show`, `attempts` and `cancel`: reading runs and their attempt receipts, and ending runs."""

from __future__ import annotations

import json

import typer
from rich.console import Group
from rich.panel import Panel

from trackway.cli.context import AppContext, app_context
from trackway.cli.render import console, duration, print_json, rows_to_dicts, short_sha, short_time, table
from trackway.ledger.blobs import get_blob
from trackway.ledger.records import list_attempts, list_runs, resolve_attempt, resolve_run

RUN_COLUMNS = [
    "run_id", "name", "project", "model_family", "kind", "state", "termination_reason", "attempt_count",
    "created_at", "ended_at", "command", "workdir", "resource", "executor", "gpus", "time_limit_s",
    "config_sha256", "data_manifest_sha256", "code_repo", "code_branch", "code_commit", "code_dirty_sha256",
]
ATTEMPT_COLUMNS = [
    "attempt_id", "run_id", "run_name", "attempt_number", "state", "executor", "executor_job_id", "host",
    "gpu_ids", "gpu_model", "gpu_count", "started_at", "ended_at", "last_heartbeat_at", "gpu_seconds", "cost_usd",
    "exit_code", "signal", "termination_reason", "termination_evidence", "config_sha256", "data_manifest_sha256",
    "environment_sha256", "code_commit", "code_dirty_sha256", "resumed_from_checkpoint", "first_step", "last_step",
    "checkpoints_committed", "useful_gpu_seconds", "wasted_gpu_seconds", "retry_decision", "log_path",
]


def reconcile(app: AppContext):
    """Record the ends of attempts that finished while nobody was following them."""
    from trackway.supervisor.loop import Supervisor  # on use: `trackway sql` starts faster without it

    supervisor = Supervisor(app.ledger, app.settings)
    supervisor.tick()
    return supervisor


def _run_json(row) -> dict:
    out = rows_to_dicts([row], [c for c in RUN_COLUMNS if c in row])[0]
    out["command"] = json.loads(row["command"])
    return out


def _attempt_json(row) -> dict:
    out = rows_to_dicts([row], [c for c in ATTEMPT_COLUMNS if c in row])[0]
    if row["termination_evidence"]:
        out["termination_evidence"] = json.loads(row["termination_evidence"])
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
    kinds = None if kind == "all" else [kind] if kind else [RunKind.TEST.value, RunKind.FULL.value]
    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        rows = list_runs(conn, limit=limit or None, project=project, kinds=kinds)
    if as_json:
        print_json([_run_json(r) for r in rows])
        return
    console.print(
        table(
            None,
            ["run", "name", "project", "kind", "state", "reason", "attempts", "created (UTC)", "command"],
            (
                (r["run_id"], r["name"], r["project"], r["kind"], r["state"], r["termination_reason"],
                 r["attempt_count"], short_time(r["created_at"]), " ".join(json.loads(r["command"]))[:60])
                for r in rows
            ),
            squeeze=("name", "command"),
        )
    )


def attempts(
    ctx: typer.Context,
    run: str = typer.Argument(None, help="A run id or name; all runs when left out."),
    limit: int = typer.Option(100, "--limit", help="At most this many attempts (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List attempts (the receipts), of one run or of all runs."""
    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        run_id = resolve_run(conn, run)["run_id"] if run else None
        rows = list_attempts(conn, run_id=run_id, limit=limit or None)
    if as_json:
        print_json([_attempt_json(r) for r in rows])
        return
    console.print(
        table(
            None,
            ["attempt", "state", "host", "gpus", "started (UTC)", "wall", "gpu-h", "exit", "signal", "reason"],
            (
                (a["attempt_id"], a["state"], a["host"], a["gpu_count"], short_time(a["started_at"]),
                 duration(_wall(a)), f"{(a['gpu_seconds'] or 0) / 3600:.3f}", a["exit_code"], a["signal"],
                 a["termination_reason"])
                for a in rows
            ),
        )
    )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _wall(a) -> float | None:
    if a["started_at"] and a["ended_at"]:
        return (a["ended_at"] - a["started_at"]).total_seconds()
    return None


def show(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="RUN|RUN/N", help="A run (id or name), or one attempt as RUN/N."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a run with its receipt and attempts, or one attempt's full receipt."""
    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        if "/" in ref:
            attempt = resolve_attempt(conn, ref)
            run = resolve_run(conn, attempt["run_id"])
            rows = [attempt]
        else:
            run = resolve_run(conn, ref)
            rows = list_attempts(conn, run_id=run["run_id"], limit=None)
        config = json.loads(get_blob(conn, run["config_sha256"])) if run["config_sha256"] else None
        manifest = json.loads(get_blob(conn, run["data_manifest_sha256"])) if run["data_manifest_sha256"] else None
    if as_json:
        payload = _run_json(run)
        payload["config"] = config
        payload["data_manifest"] = manifest
        payload["attempts"] = [_attempt_json(a) for a in rows]
        print_json(payload)
        return
    console.print(_run_panel(run, config, manifest))
    for attempt in rows:
        console.print(_attempt_panel(attempt))


def _run_panel(run, config, manifest) -> Panel:
    files = manifest["files"] if manifest else []
    lines = [
        f"name          {run['name'] or '-'}   project {run['project']}   model family {run['model_family'] or '-'}   kind {run['kind']}",
        f"state         {run['state']}"
        + (f" ({run['termination_reason']})" if run["termination_reason"] not in (None, run["state"]) else ""),
        f"command       {' '.join(json.loads(run['command']))}",
        f"workdir       {run['workdir']}",
        f"created       {short_time(run['created_at'])} UTC   ended {short_time(run['ended_at'])}",
        f"resource      {run['resource']} ({run['executor']}), gpus {run['gpus']}, time limit "
        + (f"{run['time_limit_s'] / 3600:g} h" if run["time_limit_s"] else "none"),
        f"config        {short_sha(run['config_sha256'])}  {json.dumps(config, sort_keys=True)[:200] if config else ''}",
        f"data          {short_sha(run['data_manifest_sha256'])}  {len(files)} file(s), "
        f"{sum(f['size'] for f in files):,} bytes",
        f"code          {run['code_repo'] or '-'} @ {run['code_branch'] or '-'} {short_sha(run['code_commit'])}"
        + (f" + dirty diff {short_sha(run['code_dirty_sha256'])}" if run["code_dirty_sha256"] else ""),
    ]
    return Panel("\n".join(lines), title=f"run {run['run_id']}", title_align="left", expand=False)


def _attempt_panel(a) -> Panel:
    evidence = json.loads(a["termination_evidence"]) if a["termination_evidence"] else {}
    lines = [
        f"state         {a['state']}" + (f": {a['termination_reason']} (rule {evidence.get('rule')})" if a["termination_reason"] else ""),
        f"executor      {a['executor']} job {a['executor_job_id'] or '-'} on {a['host'] or '-'}",
        f"gpus          {a['gpu_count']} {a['gpu_model'] or ''} {('ids ' + a['gpu_ids']) if a['gpu_ids'] else ''}",
        f"time          {short_time(a['started_at'])} → {short_time(a['ended_at'])} UTC ({duration(_wall(a))})",
        f"gpu-seconds   {_number(a['gpu_seconds'])}   cost ${a['cost_usd'] or 0:.2f}",
        f"exit          code {a['exit_code'] if a['exit_code'] is not None else '-'}, signal {a['signal'] or '-'}",
        f"environment   {short_sha(a['environment_sha256'])}   config {short_sha(a['config_sha256'])}"
        f"   data {short_sha(a['data_manifest_sha256'])}",
        f"log           {a['log_path']}",
    ]
    body: list = ["\n".join(lines)]
    if evidence.get("lines"):
        body.append("evidence:\n" + "\n".join(f"  {line}" for line in evidence["lines"]))
    return Panel(Group(*body), title=f"attempt {a['attempt_id']}", title_align="left", expand=False)


def cancel(ctx: typer.Context, run: str = typer.Argument(..., help="A run id or name.")) -> None:
    """End a run: SIGTERM to its attempts' process groups, SIGKILL after the grace period."""
    app = app_context(ctx)
    supervisor = reconcile(app)
    cancelled = supervisor.cancel(run)
    if cancelled:
        console.print(f"cancel requested for {', '.join(cancelled)}; the end is recorded as user_cancelled", highlight=False)
    else:
        console.print(f"run {run} had no running attempt; marked cancelled", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("attempts")(attempts)
    app.command("show")(show)
    app.command("cancel")(cancel)
