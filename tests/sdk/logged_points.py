"""How many metric points a script logged, counted in the ledger without the shim's own node samples."""

from sqlalchemy import func, select

from trackway.ledger.schema import metric_points, metric_series


def logged_points(conn) -> int:
    """The points of every series but node/... (the shim samples its attempt every 10 s: a script slowed past 10 s
    on a busy machine has some, which no test's count of what the script logged should include)."""
    joined = metric_points.join(metric_series, metric_points.c.series_id == metric_series.c.series_id)
    return conn.execute(
        select(func.count()).select_from(joined).where(~metric_series.c.key.startswith("node/"))
    ).scalar_one()
