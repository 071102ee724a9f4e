"""The newest metric points one attempt logged, for the supervisor's watchers (Reader reads a run's whole series)."""

from __future__ import annotations

from sqlalchemy import Connection, RowMapping, select

from trackway.ledger.schema import metric_points, metric_series


def recent_points(conn: Connection, run_id: str, key: str, attempt_number: int, limit: int,
                  rank: int = 0) -> list[RowMapping]:
    """The newest `limit` points of one key that one attempt's `rank` logged, oldest first (for the watchers)."""
    query = (
        select(metric_points.c.step, metric_points.c.value, metric_points.c.logged_at)
        .join(metric_series, metric_points.c.series_id == metric_series.c.series_id)
        .where(metric_series.c.run_id == run_id, metric_series.c.key == key, metric_series.c.rank == rank,
               metric_points.c.attempt_number == attempt_number)
        .order_by(metric_points.c.step.desc())
        .limit(limit)
    )
    return list(reversed(list(conn.execute(query).mappings())))
