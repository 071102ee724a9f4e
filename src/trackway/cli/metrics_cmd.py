"""`trackway metrics`: a run's logged metrics, on its step axis, continuous across attempts."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.render import console, print_json, table
from trackway.ledger.metrics import metric_points_for_run
from trackway.ledger.records import resolve_run


def metrics(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run id or name."),
    key: str = typer.Option(None, "--key", help="Only this metric, point by point (e.g. loss)."),
    limit: int = typer.Option(0, "--limit", help="At most this many points (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print every point as JSON."),
) -> None:
    """Show a run's metrics: a summary per key, or every point of one key."""
    from trackway.cli.runs_cmd import reconcile  # ingests spools of attempts still running

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        run_id = resolve_run(conn, run)["run_id"]
        points = metric_points_for_run(conn, run_id, key=key, limit=limit or None)
    if as_json:
        print_json([dict(p) for p in points])
        return
    if key:
        console.print(table(None, ["step", key, "attempt"], ((p["step"], p["value"], p["attempt_number"]) for p in points)))
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
            ["key", "points", "steps", "last", "min", "max", "attempts"],
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
