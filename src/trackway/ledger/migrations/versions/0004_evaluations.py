"""Evaluations: specs attached to runs, evaluations pinned to checkpoints, their seeds, per-task results, metrics.

Also `runs.env` (extra environment for a run's attempts) and the view `checkpoint_evals`.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

# One row per (evaluation, metric): "best checkpoint by pass@1 for this run" is one query.
CHECKPOINT_EVALS = """
CREATE VIEW checkpoint_evals AS
SELECT
    e.run_id, r.name AS run_name, r.project, r.model_family,
    e.checkpoint_name AS checkpoint, e.checkpoint_step AS step, e.eval_id, e.spec_name,
    e.evaluator_version, e.task_set_sha256, e.decoding, e.primary_metric, e.state,
    m.metric, m.mean, m.std, m.min, m.max, m.seeds,
    e.created_at, e.ended_at
FROM evaluations e
JOIN runs r ON r.run_id = e.run_id
JOIN eval_metrics m ON m.eval_id = e.eval_id
"""


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("env", sa.Text))
    op.create_table(
        "run_eval_specs",
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.run_id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("spec_sha256", sa.String(64), sa.ForeignKey("blobs.sha256"), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("considered_step", sa.BigInteger),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "evaluations",
        sa.Column("eval_id", sa.String(32), primary_key=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("checkpoint_step", sa.BigInteger, nullable=False),
        sa.Column("checkpoint_name", sa.String(64), nullable=False),
        sa.Column("checkpoint_path", sa.Text, nullable=False),
        sa.Column("checkpoint_manifest_sha256", sa.String(64), nullable=False),
        sa.Column("spec_name", sa.String(64), nullable=False),
        sa.Column("spec_sha256", sa.String(64), sa.ForeignKey("blobs.sha256"), nullable=False),
        sa.Column("evaluator_version", sa.String(200), nullable=False),
        sa.Column("task_set_sha256", sa.String(80), nullable=False),
        sa.Column("decoding", sa.Text, nullable=False),
        sa.Column("primary_metric", sa.String(32), nullable=False),
        sa.Column("eval_key", sa.String(64), nullable=False, unique=True),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("escalation", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("ended_at", TS),
    )
    op.create_index("ix_evaluations_run_id", "evaluations", ["run_id"])
    op.create_index("ix_evaluations_state", "evaluations", ["state"])
    op.create_table(
        "evaluation_seeds",
        sa.Column("eval_id", sa.String(32), sa.ForeignKey("evaluations.eval_id"), primary_key=True),
        sa.Column("seed", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("eval_run_id", sa.String(32), sa.ForeignKey("runs.run_id"), nullable=False, unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("samples", sa.Integer),
        sa.Column("tasks", sa.Integer),
        sa.Column("outputs_sha256", sa.String(64), sa.ForeignKey("blobs.sha256")),
        sa.Column("failures", sa.Text),
        sa.Column("termination_reason", sa.String(32)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("ended_at", TS),
    )
    op.create_table(
        "eval_task_results",
        sa.Column("eval_id", sa.String(32), sa.ForeignKey("evaluations.eval_id"), primary_key=True),
        sa.Column("seed", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("task_id", sa.String(200), primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("correct", sa.Integer, nullable=False),
    )
    op.create_table(
        "eval_seed_metrics",
        sa.Column("eval_id", sa.String(32), sa.ForeignKey("evaluations.eval_id"), primary_key=True),
        sa.Column("seed", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("metric", sa.String(32), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
    )
    op.create_table(
        "eval_metrics",
        sa.Column("eval_id", sa.String(32), sa.ForeignKey("evaluations.eval_id"), primary_key=True),
        sa.Column("metric", sa.String(32), primary_key=True),
        sa.Column("mean", sa.Float, nullable=False),
        sa.Column("std", sa.Float, nullable=False),
        sa.Column("min", sa.Float, nullable=False),
        sa.Column("max", sa.Float, nullable=False),
        sa.Column("seeds", sa.Integer, nullable=False),
    )
    op.execute(CHECKPOINT_EVALS)


def downgrade() -> None:
    op.execute("DROP VIEW checkpoint_evals")
    for table in ("eval_metrics", "eval_seed_metrics", "eval_task_results", "evaluation_seeds", "evaluations",
                  "run_eval_specs"):
        op.drop_table(table)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("env")
