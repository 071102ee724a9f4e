"""`trackway report waste`: GPU time that did real work and GPU time that was redone or lost, grouped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import typer
from sqlalchemy import case, func, select

from trackway.cli.context import app_context
from trackway.cli.render import KEY, Column, console, print_json, table
from trackway.display import compute_unit_of
from trackway.errors import InputError
from trackway.ledger.schema import attempts, runs
from trackway.taxonomy import RunKind
from trackway.validation import finite

# A century: anything longer reaches before any ledger existed, and `timedelta` overflows soon after.
MAX_DAYS = 36500.0

report_app = typer.Typer(help="Reports over the ledger.", no_args_is_help=True)

def _phase():
    """What an attempt's run did: training, an evaluation's inference or scoring phase, or an evaluation in one command."""
    from trackway.ledger.schema import evaluation_seeds as seeds

    inference = select(seeds.c.seed).where(seeds.c.inference_run_id == runs.c.run_id).exists()
    scoring = select(seeds.c.seed).where(seeds.c.eval_run_id == runs.c.run_id, seeds.c.inference_run_id.is_not(None),
                                         seeds.c.inference_run_id != runs.c.run_id).exists()
    return case((runs.c.kind != RunKind.EVAL.value, "training"), (inference, "inference"), (scoring, "scoring"),
                else_="evaluation")


GROUPS = {"reason": attempts.c.termination_reason, "run": attempts.c.run_id, "resource": runs.c.resource,
          "phase": _phase()}
KINDS = ("all", *(k.value for k in RunKind))
TRAINING = [RunKind.TEST.value, RunKind.FULL.value]


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

    if by not in GROUPS:
        raise InputError(f"--by {by!r}: expected one of {', '.join(GROUPS)}")
    if kind not in (None, *KINDS):
        raise InputError(f"--kind {kind!r}: expected test, full, eval or all")
    finite(days, "--days", 0, MAX_DAYS, "days", low_open=True, note=" (100 years)")
    app = app_context(ctx)
    reconcile(app)
    # Per run, evaluation seeds (one run per seed) would bury the training runs: they are asked for.
    kinds = (TRAINING if by == "run" else None) if kind is None else None if kind == "all" else [kind]
    with app.ledger.read() as conn:
        rows = [dict(r) for r in conn.execute(_query(by, days, kinds)).mappings()]
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


def _query(by: str, days: float, kinds: list[str] | None):
    """Ended attempts started in the last `days` days, summed per group, most waste first."""
    key = GROUPS[by].label(by)
    # A run is shown by its name where it has one (evaluation seeds: `RUN@STEP/SPEC/seed-N`).
    keys = [key, runs.c.name.label("name")] if by == "run" else [key]
    wasted = func.coalesce(func.sum(attempts.c.wasted_gpu_seconds), 0.0)
    query = (
        select(
            *keys,
            func.count().label("attempts"),
            func.coalesce(func.sum(case((attempts.c.gpu_count > 0, 1), else_=0)), 0).label("gpu_attempts"),
            func.coalesce(func.sum(attempts.c.gpu_seconds), 0.0).label("gpu_seconds"),
            func.coalesce(func.sum(attempts.c.useful_gpu_seconds), 0.0).label("useful_gpu_seconds"),
            wasted.label("wasted_gpu_seconds"),
        )
        .join(runs, runs.c.run_id == attempts.c.run_id)
        .where(attempts.c.started_at >= datetime.now(timezone.utc) - timedelta(days=days), attempts.c.state == "ended")
        .group_by(*keys)
        .order_by(wasted.desc())
    )
    return query.where(runs.c.kind.in_(kinds)) if kinds else query


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")
