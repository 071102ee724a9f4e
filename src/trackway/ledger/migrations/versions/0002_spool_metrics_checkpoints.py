"""What training processes said: metric series and points, attempt events, spool cursors, checkpoints mirror.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("series_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.UniqueConstraint("run_id", "key", name="uq_metric_series_run_key"),
    )
    op.create_table(
        "metric_points",
        sa.Column("series_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("value", sa.Float),
        sa.Column("attempt_number", sa.Integer, nullable=False),
        sa.Column("logged_at", sa.Float, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "attempt_events",
        sa.Column("attempt_id", sa.String(48), sa.ForeignKey("attempts.attempt_id"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_table(
        "spool_cursors",
        sa.Column("attempt_id", sa.String(48), sa.ForeignKey("attempts.attempt_id"), primary_key=True),
        sa.Column("file", sa.String(200), primary_key=True),
        sa.Column("byte_offset", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("attempt_id", sa.String(48)),
        sa.Column("parent", sa.String(64)),
        sa.Column("metrics", sa.Text),
        sa.Column("committed_at", TS),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("checkpoints", "spool_cursors", "attempt_events", "metric_points", "metric_series"):
        op.drop_table(table)
