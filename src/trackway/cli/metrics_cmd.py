"""`trackway metrics`: a run's logged metrics, on its step axis, continuous across attempts."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.render import KEY, Column, console, print_json, table
from trackway.errors import InputError, NotFound
from trackway.ledger.metrics import metric_keys, metric_points_for_run
from trackway.ledger.records import resolve_run
from trackway.validation import limit as check_limit


def metrics(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name."),
    key: str = typer.Option(None, "--key", help="Only this metric, point by point (e.g. loss)."),
    limit: int = typer.Option(0, "--limit", help="Only the latest N points by step (0: all)."),
    first: bool = typer.Option(False, "--first", help="With --limit: the earliest N points instead of the latest."),
    as_json: bool = typer.Option(False, "--json", help="Print every point as JSON."),
) -> None:
    """Show a run's metrics: a summary per key, or every point of one key."""
    from trackway.cli.runs_cmd import reconcile  # ingests spools of attempts still running

    check_limit(limit)
    if first and not limit:
        raise InputError("--first: expected together with --limit N (the earliest N points)")
    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        run_id = resolve_run(conn, run)["run_id"]
        if key is not None:
            # An empty table for a typo reads as "nothing logged": say which keys there are instead.
            keys = metric_keys(conn, run_id)
            if key not in keys:
                has = f"it has {', '.join(keys)}" if keys else "it has logged no metrics yet"
                raise NotFound(f"--key {key}: no such metric for run {run}; {has}")
        points = metric_points_for_run(conn, run_id, key=key, limit=limit or None, first=first)
    if as_json:
        print_json([dict(p) for p in points])
        return
    if key:
        console.print(table(
            None, [Column("step", KEY, right=True), Column(key, KEY, right=True), Column("attempt", 10, right=True)],
            ((p["step"], p["value"], p["attempt_number"]) for p in points),
        ))
        return
    summary: dict[str, dict] = {}
    for p in points:
        s = summary.setdefault(p["key"], {"n": 0, "first": p["step"], "min": p["value"], "max": p["value"], "attempts": set()})
        s["n"] += 1
        s["last"], s["last_value"] = p["step"], p["value"]
        if p["value"] is not None:
            s["min"] = p["value"] if s["min"] is None else min(s["min"], p["value"])
            s["max"] = p["value"] if s["max"] is None else max(s["max"], p["value"])
        s["attempts"].add(p["attempt_number"])
    console.print(
        table(
            None,
            [Column("key", KEY, shorten_to=16), Column("points", 20, right=True), Column("steps", 40, right=True),
             Column("last", 90, right=True), Column("min", 50, right=True), Column("max", 50, right=True),
             Column("attempts", 10)],
            (
                (k, s["n"], f"{s['first']}..{s['last']}", _g(s["last_value"]), _g(s["min"]), _g(s["max"]),
                 ",".join(str(a) for a in sorted(s["attempts"])))
                for k, s in summary.items()
            ),
        )
    )


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics)
