"""`trackway report waste`: GPU time that did real work and GPU time that was redone or lost, grouped."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.render import KEY, Column, console, print_json, table
from trackway.display import compute_unit_of

report_app = typer.Typer(help="Reports over the ledger.", no_args_is_help=True)


@report_app.command("waste")
def waste(
    ctx: typer.Context,
    days: float = typer.Option(7, "--days", help="Attempts that started in the last DAYS days."),
    by: str = typer.Option("reason", "--by", help="Group by reason, run, resource or phase (training; an evaluation's "
                                                  "inference or scoring; evaluation: one command)."),
    kind: str = typer.Option(
        None, "--kind",
        help="Only runs of this kind: test, full, eval or all (default: all; with --by run, test and full).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which retries did real work: useful and wasted GPU-hours per termination reason, run, resource or phase."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.reports.waste import check, kinds_for, waste_rows

    check(by, days, kind)
    app = app_context(ctx)
    reconcile(app)
    kinds = kinds_for(by, kind)
    with app.ledger.read() as conn:
        rows = waste_rows(conn, by, days, kinds)
    if as_json:
        print_json(rows)
        return
    what = "" if kinds is None else f" ({' and '.join(kinds)} runs)"
    # GPU-hours only where GPUs were used: a CPU attempt's hours are wall time on its CPUs.
    unit = compute_unit_of([1] * sum(r["gpu_attempts"] for r in rows)
                           + [0] * sum(r["attempts"] - r["gpu_attempts"] for r in rows))
    said = {"GPU": "GPU time", "CPU": "CPU time (no attempt had a GPU)",
            "compute": "Compute time (GPU-hours where GPUs were used, CPU-hours where none were)"}[unit]
    h = {"GPU": "gpu-h", "CPU": "cpu-h", "compute": "compute-h"}[unit]
    console.print(
        table(
            f"{said} of attempts started in the last {days:g} days{what}, by {by}",
            [Column(by, KEY, shorten_to=16, middle=True), Column("attempts", 40, right=True), Column(h, 50, right=True),
             Column(f"useful {h}", 60, right=True), Column(f"wasted {h}", 70, right=True),
             Column("wasted", 80, right=True)],
            (
                (r.get("name") or r[by], r["attempts"], f"{r['gpu_seconds'] / 3600:.3f}",
                 f"{r['useful_gpu_seconds'] / 3600:.3f}", f"{r['wasted_gpu_seconds'] / 3600:.3f}",
                 f"{100 * r['wasted_gpu_seconds'] / r['gpu_seconds']:.0f}%" if r["gpu_seconds"] else "-")
                for r in rows
            ),
        )
    )


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")
