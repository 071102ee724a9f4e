"""`trackway checkpoints` and `trackway gc`: what storage holds for a run, and retention applied to it."""

from __future__ import annotations

import json

import typer

from trackway.cli.context import AppContext, app_context
from trackway.cli.render import console, print_json, say, short_time, table
from trackway.display import size_text
from trackway.errors import InputError
from trackway.ledger.records import active_attempts, list_runs, resolve_run


def _store(app: AppContext, run):
    """Where the run's checkpoints are: its object store (checkpoint_root), else under trackway's home."""
    if run["checkpoint_root"]:
        from trackway.checkpoints.object_store import RemoteCheckpointStore

        return RemoteCheckpointStore(run["checkpoint_root"])
    from trackway.ledger.checkpoint_mirror import checkpoint_root
    from trackway.checkpoints.store import CheckpointStore

    return CheckpointStore(checkpoint_root(app.settings.runs_dir, run["run_id"]))


def _reconcile(app: AppContext, run_id: str, store) -> list:
    """Mirror storage into the ledger for one run; what storage holds, by step."""
    from trackway.ledger.checkpoint_mirror import reconcile_remote_checkpoints, reconcile_run_checkpoints
    from trackway.checkpoints.store import CheckpointStore

    if isinstance(store, CheckpointStore):
        return reconcile_run_checkpoints(app.ledger, run_id, store)
    return reconcile_remote_checkpoints(app.ledger, run_id, store)


def _host_held(app: AppContext, run) -> tuple[list[tuple[object, str]], list[str]] | None:
    """For a run whose attempts ran over SSH with no object store: what its hosts (and this machine) hold, each with
    where it is, and the hosts that could not be read; None for any other run.

    Only what a store was seen not to hold is marked deleted, and nothing at all while a host is unread:
    a checkpoint trackway cannot see is not known, never gone.
    """
    from pathlib import Path

    from trackway.ledger.checkpoint_mirror import checkpoint_root, reconcile_listed_checkpoints
    from trackway.ledger.records import list_attempts

    if run["checkpoint_root"]:
        return None
    with app.ledger.read() as conn:
        dirs = [Path(a["state_dir"]) for a in list_attempts(conn, run["run_id"], limit=None) if a["executor"] == "ssh"]
    if not dirs:
        return None
    from trackway.checkpoints.store import CheckpointStore
    from trackway.executors.ssh_checkpoints import host_stores

    local = CheckpointStore(checkpoint_root(app.settings.runs_dir, run["run_id"]))
    listed = [(info, str(info.path)) for info in (local.list() + local.set_aside_list() if local.root.is_dir() else [])]
    stores = host_stores(dirs, run["run_id"], app.settings.home)
    for store in stores:
        listed += [(info, store.where(info)) for info in (*store.held, *store.set_aside)]
    unread = [f"host {store.host}: {store.error}" for store in stores if store.error is not None]
    seen = () if unread else (str(local.root), *(store.root for store in stores))
    held = [info for info, _ in listed if info.state.value != "set_aside"]
    aside = [info for info, _ in listed if info.state.value == "set_aside"]
    reconcile_listed_checkpoints(app.ledger, run["run_id"], held, aside, gone_under=seen)
    return sorted(listed, key=lambda pair: (pair[0].step, pair[0].name)), unread


def _exists(store) -> bool:
    from trackway.checkpoints.store import CheckpointStore

    return store.root.is_dir() if isinstance(store, CheckpointStore) else True


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def checkpoints(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List a run's checkpoints as storage holds them: state, step, size and lineage; set-aside ones with why."""
    from trackway.cli.runs_cmd import reconcile

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        found = resolve_run(conn, run)
    on_hosts = _host_held(app, found)
    if on_hosts is None:
        held, unread = [(c, str(c.url if hasattr(c, "url") else c.path)) for c in
                        _reconcile(app, found["run_id"], _store(app, found))], []
    else:
        held, unread = on_hosts
    rows = [
        {
            "name": c.name,
            "step": c.step,
            "state": c.state.value,
            "size_bytes": c.size_bytes,
            "committed_at": c.committed_at,
            "attempt_id": (c.manifest or {}).get("attempt_id"),
            "parent": (c.manifest or {}).get("parent"),
            "metrics": (c.manifest or {}).get("metrics"),
            "path": where,
            "problems": list(c.problems),
        }
        for c, where in held
    ]
    if as_json:
        print_json(rows)
        _say_unread(unread)
        return
    console.print(
        table(
            None,
            ["checkpoint", "state", "size", "committed (UTC)", "attempt", "parent", "metrics"],
            (
                (r["name"], r["state"].replace("_", " "), _size(r["size_bytes"]), short_time(r["committed_at"]),
                 r["attempt_id"], r["parent"], json.dumps(r["metrics"]) if r["metrics"] else None)
                for r in rows
            ),
            squeeze=("metrics",),
        )
    )
    # The why is prose, too long for a column that a narrow terminal would cut or drop: one line each.
    for r in rows:
        if r["problems"]:
            verb = "set aside" if r["state"] == "set_aside" else r["state"]
            say(console, f"{r['name']} {verb}: {'; '.join(r['problems'])}")
    _say_unread(unread)


def _say_unread(unread: list[str]) -> None:
    """Hosts whose copy could not be read: their checkpoints are not known (exit 1), and the ledger keeps its rows."""
    from trackway.errors import TrackwayError

    if unread:
        raise TrackwayError("the run's checkpoints on these hosts are not known (the ledger's rows are kept as they "
                            "were): " + "; ".join(unread))


def gc(
    ctx: typer.Context,
    run: str = typer.Argument(None, help="A run id or name; every run when left out."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be superseded and deleted; change nothing."),
    keep_last: int = typer.Option(None, "--keep-last", help="Keep the last N committed checkpoints (≥ 2)."),
    keep_every: int = typer.Option(None, "--keep-every", help="Also keep every checkpoint whose step is a multiple of K."),
    keep_best: int = typer.Option(None, "--keep-best", help="Also keep the best N by --metric."),
    metric: str = typer.Option(None, "--metric", help="The metric --keep-best ranks by (recorded at save time)."),
    mode: str = typer.Option(None, "--mode", help="min or max: which end of --metric is best."),
) -> None:
    """Apply checkpoint retention in one pass: what is not kept is superseded, then deleted (marker first)."""
    from trackway.checkpoints.retention import RetentionPlan, RetentionPolicy, apply_retention, plan_retention
    from trackway.cli.runs_cmd import reconcile

    app = app_context(ctx)
    reconcile(app)
    settings = {**app.settings.retention}  # checked when trackway.toml was read (settings/model.py)
    keep_evaluated = settings.pop("keep_evaluated", "best")
    for key, value in (("keep_last", keep_last), ("keep_every", keep_every), ("keep_best", keep_best),
                       ("best_metric", metric), ("best_mode", mode)):
        if value is not None:
            settings[key] = value
    try:
        policy = RetentionPolicy(**settings)
    except ValueError as exc:
        raise InputError(f"retention: {exc}") from None
    with app.ledger.read() as conn:
        chosen = [resolve_run(conn, run)] if run else list_runs(conn, limit=None)
    protected_by_run = _protected(app, keep_all_evaluated=keep_evaluated == "all")
    freed_total = 0
    for found in chosen:
        run_id = found["run_id"]
        store = _store(app, found)
        if not _exists(store):
            continue
        plan = plan_retention(store.list(), policy, protected_by_run.get(run_id, {}))
        leaving = {info.step: info.size_bytes for info in store.list() if info.step in plan.supersede + plan.delete}
        if leaving:
            verb = "would delete" if dry_run else "deleting"
            console.print(f"{run_id}: {verb} {_steps(sorted(leaving))} ({size_text(sum(leaving.values()))})",
                          highlight=False)
        for step, reasons in sorted(plan.keep.items()):
            console.print(f"  keep step {step}: {', '.join(reasons)}", highlight=False)
        if dry_run or not leaving:
            continue
        # Two steps in one command: supersede, then read the pins again and delete only what is
        # still unpinned, so an evaluation requested meanwhile keeps the checkpoint it reads.
        apply_retention(store, RetentionPlan(keep=plan.keep, supersede=plan.supersede))
        again = plan_retention(store.list(), policy, _protected(app, keep_evaluated == "all").get(run_id, {}))
        gone = {info.step: info.size_bytes for info in store.list() if info.step in again.delete}
        apply_retention(store, RetentionPlan(keep=again.keep, delete=again.delete))
        store.clean_debris()
        _reconcile(app, run_id, store)
        freed = sum(size for step, size in gone.items() if store.get(step) is None)
        freed_total += freed
        console.print(f"{run_id}: deleted {_steps(sorted(gone))}, freed {size_text(freed)}", highlight=False)
    if not dry_run and len(chosen) > 1:
        console.print(f"freed {size_text(freed_total)} in all", highlight=False)


def _protected(app, keep_all_evaluated: bool) -> dict[str, dict[int, str]]:
    """Per run, the steps retention must keep whatever the policy says, and why (resumed from, evaluated)."""
    from trackway.evals.records import pinned_checkpoints

    protected_by_run: dict[str, dict[int, str]] = {}
    with app.ledger.read() as conn:
        for attempt in active_attempts(conn):
            name = attempt["resumed_from_checkpoint"]
            if name and name.startswith("step-"):
                protected_by_run.setdefault(attempt["run_id"], {})[int(name[5:])] = f"resumed from by {attempt['attempt_id']}"
        for run_id, pins in pinned_checkpoints(conn, keep_all_evaluated=keep_all_evaluated).items():
            for step, why in pins.items():
                protected_by_run.setdefault(run_id, {}).setdefault(step, why)
    return protected_by_run


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps) or "nothing"


def register(app: typer.Typer) -> None:
    app.command("checkpoints")(checkpoints)
    app.command("gc")(gc)
