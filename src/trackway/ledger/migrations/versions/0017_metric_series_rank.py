"""A rank on each metric series: every rank's logged values kept as its own series, unique on (run, key, rank).

Before, only rank 0 logged (or every rank's points went into one series per key, where they
overwrote each other step by step). Every existing series is rank 0's: that is what it held.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_series") as batch:
        batch.add_column(sa.Column("rank", sa.Integer, nullable=False, server_default="0"))
        batch.drop_constraint("uq_metric_series_run_key", type_="unique")
        batch.create_unique_constraint("uq_metric_series_run_key_rank", ["run_id", "key", "rank"])


def downgrade() -> None:
    # Ranks above 0 have no place in the older schema: their series and points go.
    op.execute("DELETE FROM metric_rollups WHERE series_id IN (SELECT series_id FROM metric_series WHERE rank > 0)")
    op.execute("DELETE FROM metric_points WHERE series_id IN (SELECT series_id FROM metric_series WHERE rank > 0)")
    op.execute("DELETE FROM metric_series WHERE rank > 0")
    with op.batch_alter_table("metric_series") as batch:
        batch.drop_constraint("uq_metric_series_run_key_rank", type_="unique")
        batch.create_unique_constraint("uq_metric_series_run_key", ["run_id", "key"])
        batch.drop_column("rank")
