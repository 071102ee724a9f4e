"""Reading metric points back: one run's series on the run's continuous step axis."""

from __future__ import annotations

from sqlalchemy import Connection, RowMapping, select

from trackway.ledger.schema import metric_points, metric_series


def metric_keys(conn: Connection, run_id: str) -> list[str]:
    query = select(metric_series.c.key).where(metric_series.c.run_id == run_id).order_by(metric_series.c.key)
    return list(conn.execute(query).scalars())


def metric_points_for_run(
    conn: Connection, run_id: str, key: str | None = None, limit: int | None = None, first: bool = False
) -> list[RowMapping]:
    """(key, step, value, attempt_number, logged_at) rows ordered by key, then step.

    With `limit`, the latest `limit` points by step (what a person watching a run wants), or the
    earliest with `first`.
    """
    query = (
        select(
            metric_series.c.key,
            metric_points.c.step,
            metric_points.c.value,
            metric_points.c.attempt_number,
            metric_points.c.logged_at,
        )
        .join(metric_points, metric_points.c.series_id == metric_series.c.series_id)
        .where(metric_series.c.run_id == run_id)
    )
    if key is not None:
        query = query.where(metric_series.c.key == key)
    if not limit:
        return list(conn.execute(query.order_by(metric_series.c.key, metric_points.c.step)).mappings())
    step = metric_points.c.step if first else metric_points.c.step.desc()
    rows = list(conn.execute(query.order_by(step, metric_series.c.key).limit(limit)).mappings())
    return sorted(rows, key=lambda row: (row["key"], row["step"]))


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
