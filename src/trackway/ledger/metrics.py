"""Reading metric points back: one run's series on the run's continuous step axis."""

from __future__ import annotations

from sqlalchemy import Connection, RowMapping, select

from trackway.ledger.reader import Reader
from trackway.ledger.schema import metric_points, metric_series


def metric_keys(conn: Connection, run_id: str) -> list[str]:
    return Reader.over(conn).metric_keys(run_id)


def metric_points_for_run(
    conn: Connection, run_id: str, key: str | None = None, limit: int | None = None, first: bool = False
) -> list[dict]:
    """(key, step, value, attempt_number, logged_at) rows ordered by key, then step (see `Reader.metric_points`)."""
    return Reader.over(conn).metric_points(run_id, key=key, limit=limit, first=first)


def recent_points(conn: Connection, run_id: str, key: str, attempt_number: int, limit: int) -> list[RowMapping]:
    """The newest `limit` points of one key that one attempt logged, oldest first (for the watchers)."""
    query = (
        select(metric_points.c.step, metric_points.c.value, metric_points.c.logged_at)
        .join(metric_series, metric_points.c.series_id == metric_series.c.series_id)
        .where(metric_series.c.run_id == run_id, metric_series.c.key == key, metric_points.c.attempt_number == attempt_number)
        .order_by(metric_points.c.step.desc())
        .limit(limit)
    )
    return list(reversed(list(conn.execute(query).mappings())))
