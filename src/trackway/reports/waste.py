"""GPU time that did real work and GPU time that was redone or lost, per reason, run, resource or phase (`report waste`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import case, func, select

from trackway.errors import InputError
from trackway.ledger.schema import attempts, runs
from trackway.taxonomy import RunKind
from trackway.validation import finite

# A century: anything longer reaches before any ledger existed, and `timedelta` overflows soon after.
MAX_DAYS = 36500.0


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


def check(by: str, days: float, kind: str | None) -> None:
    """The report's options, refused in one line each (the CLI's flags)."""
    if by not in GROUPS:
        raise InputError(f"--by {by!r}: expected one of {', '.join(GROUPS)}")
    if kind not in (None, *KINDS):
        raise InputError(f"--kind {kind!r}: expected test, full, eval or all")
    finite(days, "--days", 0, MAX_DAYS, "days", low_open=True, note=" (100 years)")


def kinds_for(by: str, kind: str | None) -> list[str] | None:
    """The run kinds counted: per run, evaluation seeds (one run per seed) would bury the training runs."""
    if kind is None:
        return TRAINING if by == "run" else None
    return None if kind == "all" else [kind]


def waste_rows(conn, by: str, days: float, kinds: list[str] | None) -> list[dict[str, Any]]:
    """Ended attempts started in the last `days` days, summed per group, most waste first."""
    return [dict(r) for r in conn.execute(_query(by, days, kinds)).mappings()]


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
