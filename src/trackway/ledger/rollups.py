"""Each series' lowest and highest value per block of steps, so a chart of millions of points reads thousands of rows.

Two block sizes (LEVELS). A block's row is computed from its points the first time a chart
needs it, then kept. Writing points into a series drops the rows of every block from the lowest
step written on, in the same transaction (ledger/ingest.py): a kept row always equals its points,
whatever a resumed attempt overwrote. On PostgreSQL both sides take the series' advisory lock
first, so a block computed from points a concurrent ingest is replacing cannot be kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlalchemy import delete, func, select, text
from sqlalchemy.engine import Connection

from trackway.ledger.schema import metric_rollups

LEVELS = (256, 16384)  # steps per block
LOCK_SPACE = 0x7477  # the advisory lock's first key: "tw"

_FILL = (
    "INSERT INTO metric_rollups (series_id, width, bucket, first_step, last_step, first_value, last_value, "
    "min_value, max_value, points) "
    "SELECT g.series_id, :width, g.bucket, g.first_step, g.last_step, "
    "(SELECT p.value FROM metric_points p WHERE p.series_id = g.series_id AND p.step = g.first_step), "
    "(SELECT p.value FROM metric_points p WHERE p.series_id = g.series_id AND p.step = g.last_step), "
    "g.low, g.high, g.n FROM ("
    "SELECT series_id, step / :width AS bucket, min(step) AS first_step, max(step) AS last_step, "
    "min(value) AS low, max(value) AS high, count(*) AS n FROM metric_points "
    "WHERE series_id = :series AND step BETWEEN :low AND :high GROUP BY series_id, step / :width) AS g "
    "WHERE true ON CONFLICT (series_id, width, bucket) DO NOTHING"
)


def level_for(chart_width: int) -> int | None:
    """The coarsest block size that fits in one chart bucket, or None when the buckets are finer than any."""
    fitting = [width for width in LEVELS if width <= chart_width]
    return fitting[-1] if fitting else None


def lock(conn: Connection, series_ids: Iterable[int]) -> None:
    """Serialize writers of these series' points and rollups (PostgreSQL; SQLite has one writer anyway)."""
    if conn.dialect.name != "postgresql":
        return
    for series_id in sorted(set(series_ids)):
        conn.execute(text("SELECT pg_advisory_xact_lock(:space, :series)"), {"space": LOCK_SPACE, "series": series_id})


def invalidate(conn: Connection, lowest_step: Mapping[int, int]) -> None:
    """Drop the kept blocks of each series from the block holding its lowest newly written step on."""
    for series_id, step in lowest_step.items():
        for width in LEVELS:
            conn.execute(delete(metric_rollups).where(
                metric_rollups.c.series_id == series_id, metric_rollups.c.width == width,
                metric_rollups.c.bucket >= step // width,
            ))


def complete(conn: Connection, series_id: int, width: int, low: int, high: int) -> bool:
    """Whether every block of steps `low`..`high` is kept (the usual case once a chart has been drawn): a read."""
    first, last = low // width, high // width
    return conn.execute(select(func.count()).where(
        metric_rollups.c.series_id == series_id, metric_rollups.c.width == width,
        metric_rollups.c.bucket.between(first, last),
    )).scalar() == last - first + 1


def ensure(conn: Connection, series_id: int, width: int, low: int, high: int) -> None:
    """Compute and keep the blocks of steps `low`..`high` that are not kept yet (call inside a write transaction)."""
    lock(conn, [series_id])
    if complete(conn, series_id, width, low, high):
        return  # kept meanwhile by another request
    first, last = low // width, high // width
    have = set(conn.execute(
        select(metric_rollups.c.bucket).where(
            metric_rollups.c.series_id == series_id, metric_rollups.c.width == width,
            metric_rollups.c.bucket.between(first, last),
        )
    ).scalars())
    gaps = _gaps(first, last, have)
    if not gaps:
        return
    # One pass over the span from the first missing block to the last (usually the tail, or all of it the first
    # time), then a row with no points for each block there that has none, so a sparse series is not scanned again.
    start, end = gaps[0][0], gaps[-1][1]
    conn.execute(text(_FILL), {"series": series_id, "width": width, "low": start * width, "high": (end + 1) * width - 1})
    filled = set(conn.execute(
        select(metric_rollups.c.bucket).where(
            metric_rollups.c.series_id == series_id, metric_rollups.c.width == width,
            metric_rollups.c.bucket.between(start, end),
        )
    ).scalars())
    empty = [{"series_id": series_id, "width": width, "bucket": b, "points": 0}
             for b in range(start, end + 1) if b not in filled]
    if empty:
        conn.execute(metric_rollups.insert(), empty)


def read(conn: Connection, series_id: int, width: int, low: int, high: int) -> list[tuple]:
    """The kept blocks of steps `low`..`high` with points, in step order:
    (first step, last step, first value, last value, min, max, points)."""
    rows = conn.execute(
        select(metric_rollups.c.first_step, metric_rollups.c.last_step, metric_rollups.c.first_value,
               metric_rollups.c.last_value, metric_rollups.c.min_value, metric_rollups.c.max_value,
               metric_rollups.c.points)
        .where(metric_rollups.c.series_id == series_id, metric_rollups.c.width == width,
               metric_rollups.c.bucket.between(low // width, high // width), metric_rollups.c.points > 0)
        .order_by(metric_rollups.c.bucket)
    )
    return [tuple(row) for row in rows]


def _gaps(first: int, last: int, have: set[int]) -> list[tuple[int, int]]:
    """The runs of block numbers in first..last that are not in `have`."""
    gaps: list[tuple[int, int]] = []
    start = None
    for bucket in range(first, last + 1):
        if bucket in have:
            if start is not None:
                gaps.append((start, bucket - 1))
                start = None
        elif start is None:
            start = bucket
    if start is not None:
        gaps.append((start, last))
    return gaps
