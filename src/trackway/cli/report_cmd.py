"""`trackway report waste`: GPU time that did real work and GPU time that was redone or lost, grouped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import typer
from sqlalchemy import func, select

from trackway.cli.context import app_context
from trackway.cli.render import console, print_json, table
from trackway.errors import InputError
from trackway.ledger.schema import attempts, runs

report_app = typer.Typer(help="Reports over the ledger.", no_args_is_help=True)

GROUPS = {"reason": attempts.c.termination_reason, "run": attempts.c.run_id, "resource": runs.c.resource}


@report_app.command("waste")
def waste(
    ctx: typer.Context,
    days: float = typer.Option(7, "--days", help="Attempts that started in the last DAYS days."),
    by: str = typer.Option("reason", "--by", help="Group by reason, run or resource."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which retries did real work: useful and wasted GPU-hours per termination reason, run or resource."""
    from trackway.cli.runs_cmd import reconcile

    if by not in GROUPS:
        raise InputError(f"--by {by!r}: expected one of {', '.join(GROUPS)}")
    if days <= 0:
        raise InputError(f"--days {days}: expected a positive number of days")
    app = app_context(ctx)
    reconcile(app)
    key = GROUPS[by].label(by)
    query = (
        select(
            key,
            func.count().label("attempts"),
            func.coalesce(func.sum(attempts.c.gpu_seconds), 0.0).label("gpu_seconds"),
            func.coalesce(func.sum(attempts.c.useful_gpu_seconds), 0.0).label("useful_gpu_seconds"),
            func.coalesce(func.sum(attempts.c.wasted_gpu_seconds), 0.0).label("wasted_gpu_seconds"),
        )
        .join(runs, runs.c.run_id == attempts.c.run_id)
        .where(attempts.c.started_at >= datetime.now(timezone.utc) - timedelta(days=days), attempts.c.state == "ended")
        .group_by(key)
        .order_by(func.coalesce(func.sum(attempts.c.wasted_gpu_seconds), 0.0).desc())
    )
    with app.ledger.read() as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    if as_json:
        print_json(rows)
        return
    console.print(
        table(
            f"GPU time of attempts started in the last {days:g} days, by {by}",
            [by, "attempts", "gpu-h", "useful gpu-h", "wasted gpu-h", "wasted"],
            (
                (r[by], r["attempts"], f"{r['gpu_seconds'] / 3600:.3f}", f"{r['useful_gpu_seconds'] / 3600:.3f}",
                 f"{r['wasted_gpu_seconds'] / 3600:.3f}",
                 f"{100 * r['wasted_gpu_seconds'] / r['gpu_seconds']:.0f}%" if r["gpu_seconds"] else "-")
                for r in rows
            ),
        )
    )


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")
