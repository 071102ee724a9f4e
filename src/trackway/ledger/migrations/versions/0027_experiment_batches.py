"""Experiment batches: several hypotheses against one baseline, a shared GPU-hour budget, a few running at once.

`experiment_batches` holds the batch (its baseline, budget, how many of its experiments run at
once, the test plan each is started with, and whether it is still starting them); each member
experiment names its batch in `experiments.batch_id` (NULL: an experiment of its own).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op


revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "experiment_batches",
        sa.Column("batch_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), unique=True),
        sa.Column("baseline_run_id", sa.String(32), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("budget_gpu_hours", sa.Float),
        sa.Column("max_running", sa.Integer, nullable=False),
        sa.Column("plan", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("note", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("concluded_at", sa.DateTime(timezone=True)),
    )
    # Plain ADD COLUMN (not a batch copy of `experiments`): nothing else changes in it.
    op.add_column("experiments", sa.Column("batch_id", sa.String(32)))
    op.create_index("ix_experiments_batch_id", "experiments", ["batch_id"])


def downgrade() -> None:
    op.drop_index("ix_experiments_batch_id", "experiments")
    op.drop_column("experiments", "batch_id")
    op.drop_table("experiment_batches")
