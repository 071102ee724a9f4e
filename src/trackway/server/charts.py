"""A run's metric curves for a chart: every point when few, else min and max per step bucket; and its attempts' bounds.

Downsampling keeps what a person must see on a loss curve: each bucket of steps is drawn as its
first and last point, with its lowest and highest value between them when they lie beyond both,
so a spike or a dip survives and a falling curve still falls. Long series are grouped from kept per-block summaries (ledger/rollups.py), so
a chart of 10M points reads tens of thousands of rows, not the points.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from trackway.errors import NotFound
from trackway.ledger import Ledger, rollups
from trackway.ledger.records import resolve_run
from trackway.ledger.reader import Reader
from trackway.ledger.schema import attempts, metric_points, metric_series

DEFAULT_POINTS = 2000
MAX_POINTS = 100_000


def series_chart(ledger: Ledger, series_id: int, max_points: int) -> dict[str, Any]:
    """{steps, values, points, downsampled} for one series."""
    where = metric_points.c.series_id == series_id
    with ledger.read() as conn:
        # Two queries: each is one index probe, where min() and max() together would scan every point.
        lo = conn.execute(select(func.min(metric_points.c.step)).where(where)).scalar()
        hi = conn.execute(select(func.max(metric_points.c.step)).where(where)).scalar()
        if lo is None:
            return {"steps": [], "values": [], "points": 0, "downsampled": False}
        if hi - lo + 1 <= max_points:
            rows = conn.execute(
                select(metric_points.c.step, metric_points.c.value).where(where).order_by(metric_points.c.step)
            ).all()
            return {"steps": [r[0] for r in rows], "values": [_plain(r[1]) for r in rows], "points": len(rows),
                    "downsampled": False}
    # Up to four points a bucket: its first and last, and its lowest and highest where they are not those.
    width = math.ceil((hi - lo + 1) / max(1, max_points // 4))
    level = rollups.level_for(width)
    if level is None:
        # Fewer steps a bucket than the finest kept block: the points are few enough to read (each its own block).
        with ledger.read() as conn:
            blocks = [(step, step, value, value, value, value, 1) for step, value in conn.execute(
                select(metric_points.c.step, metric_points.c.value).where(where).order_by(metric_points.c.step))]
    else:
        width = math.ceil(width / level) * level  # whole blocks per bucket
        with ledger.read() as conn:
            kept = rollups.complete(conn, series_id, level, lo, hi)
        if not kept:  # the write lock only when blocks must be computed: charts never queue behind ingest otherwise
            with ledger.write() as conn:
                rollups.ensure(conn, series_id, level, lo, hi)
        with ledger.read() as conn:
            blocks = rollups.read(conn, series_id, level, lo, hi)
    steps, values = [], []
    origin = lo - lo % (level or 1)
    total = 0
    for _, group in groupby(blocks, key=lambda block: (block[0] - origin) // width):
        group = list(group)
        total += sum(block[6] for block in group)
        for step, value in _bucket_points(group):
            steps.append(step)
            values.append(_plain(value))
    return {"steps": steps, "values": values, "points": total, "downsampled": True}


def _bucket_points(blocks: list[tuple]) -> list[tuple[int, float | None]]:
    """A bucket drawn as its first and last point, with its lowest and highest value between them (placed at the
    middle of the block holding each) where they lie beyond both ends: the spikes and dips a chart must show."""
    first = (blocks[0][0], blocks[0][2])
    last = (blocks[-1][1], blocks[-1][3])
    ends = [v for v in (first[1], last[1]) if v is not None]
    extremes = []
    with_values = [b for b in blocks if b[4] is not None]
    if with_values and ends:
        low = min(with_values, key=lambda b: b[4])
        high = max(with_values, key=lambda b: b[5])
        if low[4] < min(ends):
            extremes.append((_inside(low, first[0], last[0]), low[4]))
        if high[5] > max(ends):
            extremes.append((_inside(high, first[0], last[0]), high[5]))
    points = [first, *sorted(extremes)]
    if last[0] != first[0]:
        points.append(last)
    return points


def _inside(block: tuple, first: int, last: int) -> int:
    """The middle of `block`, kept strictly between the bucket's first and last steps when there is room."""
    middle = (block[0] + block[1]) // 2
    if last - first >= 2:
        middle = min(max(middle, first + 1), last - 1)
    return middle


def run_chart(ledger: Ledger, run_id: str, keys: list[str] | None, max_points: int, rank: int = 0) -> dict[str, Any]:
    """Every asked key's curve as `rank` logged it (all keys when none asked), the attempts that drew them,
    and the ranks that logged metrics."""
    with ledger.read() as conn:
        run_id = resolve_run(conn, run_id)["run_id"]
        ranks = Reader.over(conn).metric_ranks(run_id)
        if rank and rank not in ranks:
            has = f"it has rank(s) {', '.join(map(str, ranks))}" if ranks else "it has logged no metrics yet"
            raise NotFound(f"rank {rank}: run {run_id} has no metrics from that rank; {has}")
        found = dict(conn.execute(
            select(metric_series.c.key, metric_series.c.series_id)
            .where(metric_series.c.run_id == run_id, metric_series.c.rank == rank)
        ).all())
        bounds = attempt_bounds(conn, run_id)
    wanted = keys or sorted(found)
    missing = [k for k in wanted if k not in found]
    if missing:
        whose = f"'s rank {rank}" if rank else ""
        raise NotFound(f"keys: run {run_id}{whose} never logged {', '.join(repr(k) for k in missing)} "
                       f"(it logged {', '.join(sorted(found)) or 'nothing'})")
    return {
        "run_id": run_id,
        "rank": rank,
        "ranks": ranks or [0],
        "max_points": max_points,
        "series": {key: series_chart(ledger, found[key], max_points) for key in wanted},
        "attempts": bounds,
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
