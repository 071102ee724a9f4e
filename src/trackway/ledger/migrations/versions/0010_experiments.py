"""Experiments: a hypothesis against a baseline run, its criteria, test-run checks, runs and verdict.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("experiment_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), unique=True),
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("hypothesis", sa.Text, nullable=False),
        sa.Column("baseline_run_id", sa.String(32), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("parent_experiment_id", sa.String(32)),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("workdir", sa.Text, nullable=False),
        sa.Column("config_sha256", sa.String(64), sa.ForeignKey("blobs.sha256")),
        sa.Column("overrides", sa.Text, nullable=False),
        sa.Column("changes", sa.Text, nullable=False),
        sa.Column("allow_multiple_changes", sa.Boolean, nullable=False),
        sa.Column("criteria", sa.Text, nullable=False),
        sa.Column("eval_specs", sa.Text),
        sa.Column("data_paths", sa.Text),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("time_limit_s", sa.Float),
        sa.Column("resource_request", sa.String(200)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stop_reason", sa.Text),
        sa.Column("skip_test", sa.Boolean),
        sa.Column("test_plan", sa.Text),
        sa.Column("test_run_id", sa.String(32), sa.ForeignKey("runs.run_id")),
        sa.Column("full_run_id", sa.String(32), sa.ForeignKey("runs.run_id")),
        sa.Column("test_checks", sa.Text),
        sa.Column("estimate", sa.Text),
        sa.Column("verdict", sa.String(16)),
        sa.Column("verdict_detail", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS),
        sa.Column("concluded_at", TS),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_experiments_status", "experiments", ["status"])


def downgrade() -> None:
    op.drop_index("ix_experiments_status", "experiments")
    op.drop_table("experiments")
