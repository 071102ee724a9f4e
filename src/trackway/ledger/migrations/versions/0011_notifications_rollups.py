"""Notifications (each message about what needs a person, recorded once by its key before it is sent) and
metric rollups (each series' min and max per block of steps, kept for charts; ledger/rollups.py).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32)),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tries", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("claimed_at", TS),
        sa.Column("sent_at", TS),
    )
    op.create_index("ix_notifications_state", "notifications", ["state"])
    op.create_table(
        "metric_rollups",
        sa.Column("series_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("first_step", sa.BigInteger),
        sa.Column("last_step", sa.BigInteger),
        sa.Column("first_value", sa.Float),
        sa.Column("last_value", sa.Float),
        sa.Column("min_value", sa.Float),
        sa.Column("max_value", sa.Float),
        sa.Column("points", sa.Integer, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("metric_rollups")
    op.drop_index("ix_notifications_state", "notifications")
    op.drop_table("notifications")
