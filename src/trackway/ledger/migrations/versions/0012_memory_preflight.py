"""Memory preflight: a run's preflight verdict in its receipt, and the corrections learnt from measured peaks.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("preflight", sa.Text))
    op.create_table(
        "memory_calibrations",
        sa.Column("calibration_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model_family", sa.String(200), nullable=False),
        sa.Column("precision", sa.String(32), nullable=False),
        sa.Column("factor", sa.Float, nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("estimated_bytes", sa.Float, nullable=False),
        sa.Column("measured_allocated_bytes", sa.BigInteger),
        sa.Column("measured_reserved_bytes", sa.BigInteger, nullable=False),
        sa.Column("row_length", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_memory_calibrations_family", "memory_calibrations", ["model_family", "precision"])


def downgrade() -> None:
    op.drop_index("ix_memory_calibrations_family", "memory_calibrations")
    op.drop_table("memory_calibrations")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("preflight")
