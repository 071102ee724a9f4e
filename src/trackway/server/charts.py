"""A run's metric curves for a chart: every point when few, else min and max per step bucket; and its attempts' bounds.

Downsampling keeps what a person must see on a loss curve: a spike or a NaN-free dip survives,
because each bucket of steps contributes its lowest and highest value (drawn at the bucket's
first and last logged step). The database does the bucketing, so the points never travel.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from trackway.errors import NotFound
from trackway.ledger.schema import attempts, metric_points, metric_series

DEFAULT_POINTS = 2000
MAX_POINTS = 100_000


def series_chart(conn: Connection, series_id: int, max_points: int) -> dict[str, Any]:
    """{steps, values, points, downsampled} for one series."""
    where = metric_points.c.series_id == series_id
    lo, hi = conn.execute(select(func.min(metric_points.c.step), func.max(metric_points.c.step)).where(where)).one()
    if lo is None:
        return {"steps": [], "values": [], "points": 0, "downsampled": False}
    if hi - lo + 1 <= max_points:
        rows = conn.execute(
            select(metric_points.c.step, metric_points.c.value).where(where).order_by(metric_points.c.step)
        ).all()
        return {"steps": [r[0] for r in rows], "values": [_plain(r[1]) for r in rows], "points": len(rows),
                "downsampled": False}
    buckets = max(1, max_points // 2)
    width = math.ceil((hi - lo + 1) / buckets)
    bucket = ((metric_points.c.step - lo) // width).label("bucket")  # SQLAlchemy 2: `//` is integer division
    rows = conn.execute(
        select(bucket, func.min(metric_points.c.step), func.max(metric_points.c.step), func.min(metric_points.c.value),
               func.max(metric_points.c.value), func.count())
        .where(where).group_by(bucket).order_by(bucket)
    ).all()
    steps: list[int] = []
    values: list[float | None] = []
    total = 0
    for _, first, last, low, high, count in rows:
        total += count
        steps.append(first)
        values.append(_plain(low))
        if last != first:
            steps.append(last)
            values.append(_plain(high))
    return {"steps": steps, "values": values, "points": total, "downsampled": True}


def run_chart(conn: Connection, run_id: str, keys: list[str] | None, max_points: int) -> dict[str, Any]:
    """Every asked key's curve (all keys when none asked) and the attempts that drew them."""
    found = dict(conn.execute(
        select(metric_series.c.key, metric_series.c.series_id).where(metric_series.c.run_id == run_id)
    ).all())
    wanted = keys or sorted(found)
    missing = [k for k in wanted if k not in found]
    if missing:
        raise NotFound(f"keys: run {run_id} never logged {', '.join(repr(k) for k in missing)} "
                       f"(it logged {', '.join(sorted(found)) or 'nothing'})")
    return {
        "run_id": run_id,
        "max_points": max_points,
        "series": {key: series_chart(conn, found[key], max_points) for key in wanted},
        "attempts": attempt_bounds(conn, run_id),
    }


def attempt_bounds(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """Each attempt's steps and times, with why the one before it ended: what a restart marker says."""
    rows = conn.execute(
        select(attempts.c.attempt_id, attempts.c.attempt_number, attempts.c.first_step, attempts.c.last_step,
               attempts.c.started_at, attempts.c.ended_at, attempts.c.termination_reason,
               attempts.c.resumed_from_checkpoint)
        .where(attempts.c.run_id == run_id).order_by(attempts.c.attempt_number)
    ).mappings().all()
    bounds = []
    previous = None
    for row in rows:
        bounds.append({
            "attempt_id": row["attempt_id"], "number": row["attempt_number"], "first_step": row["first_step"],
            "last_step": row["last_step"], "started_at": row["started_at"], "ended_at": row["ended_at"],
            "termination_reason": row["termination_reason"], "resumed_from": row["resumed_from_checkpoint"],
            "after": previous["termination_reason"] if previous is not None else None,
        })
        previous = row
    return bounds


def _plain(value: float | None) -> float | None:
    """JSON has no NaN: a non-finite value is None (the chart leaves a gap)."""
    return value if value is None or math.isfinite(value) else None
