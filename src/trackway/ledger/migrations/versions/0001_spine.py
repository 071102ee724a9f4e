"""The spine: blobs, runs, attempts and the training_attempts view.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

TRAINING_ATTEMPTS = """
CREATE VIEW training_attempts AS
SELECT
    a.attempt_id, a.run_id, r.name AS run_name, r.project, r.model_family, r.kind AS run_kind,
    a.attempt_number, a.executor, a.executor_job_id, a.host, a.gpu_model, a.gpu_count,
    a.started_at, a.ended_at, a.gpu_seconds, a.cost_usd, a.exit_code, a.signal,
    a.termination_reason, a.termination_evidence, a.config_sha256, a.data_manifest_sha256,
    a.environment_sha256, a.code_commit, a.code_dirty_sha256, a.resumed_from_checkpoint,
    a.first_step, a.last_step, a.checkpoints_committed, a.useful_gpu_seconds,
    a.wasted_gpu_seconds, a.retry_decision
FROM attempts a
JOIN runs r ON r.run_id = a.run_id
WHERE r.kind <> 'eval'
"""


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("compression", sa.String(16), nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), unique=True),
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("model_family", sa.String(200)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("workdir", sa.Text, nullable=False),
        sa.Column("resource", sa.String(200), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("time_limit_s", sa.Float),
        sa.Column("config_sha256", sa.String(64), sa.ForeignKey("blobs.sha256")),
        sa.Column("data_manifest_sha256", sa.String(64), sa.ForeignKey("blobs.sha256")),
        sa.Column("data_paths", sa.Text),
        sa.Column("code_repo", sa.Text),
        sa.Column("code_branch", sa.String(400)),
        sa.Column("code_commit", sa.String(64)),
        sa.Column("code_dirty_sha256", sa.String(64), sa.ForeignKey("blobs.sha256")),
        sa.Column("termination_reason", sa.String(32)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("ended_at", TS),
    )
    op.create_table(
        "attempts",
        sa.Column("attempt_id", sa.String(48), primary_key=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("attempt_number", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("executor_job_id", sa.String(200)),
        sa.Column("state_dir", sa.Text, nullable=False),
        sa.Column("log_path", sa.Text, nullable=False),
        sa.Column("host", sa.String(255)),
        sa.Column("gpu_ids", sa.String(200)),
        sa.Column("gpu_model", sa.String(200)),
        sa.Column("gpu_count", sa.Integer, nullable=False),
        sa.Column("config_sha256", sa.String(64)),
        sa.Column("data_manifest_sha256", sa.String(64)),
        sa.Column("environment_sha256", sa.String(64), sa.ForeignKey("blobs.sha256")),
        sa.Column("code_commit", sa.String(64)),
        sa.Column("code_dirty_sha256", sa.String(64)),
        sa.Column("resumed_from_checkpoint", sa.Text),
        sa.Column("first_step", sa.Integer),
        sa.Column("last_step", sa.Integer),
        sa.Column("checkpoints_committed", sa.Integer),
        sa.Column("started_at", TS),
        sa.Column("ended_at", TS),
        sa.Column("last_heartbeat_at", TS),
        sa.Column("gpu_seconds", sa.Float),
        sa.Column("useful_gpu_seconds", sa.Float),
        sa.Column("wasted_gpu_seconds", sa.Float),
        sa.Column("cost_usd", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("signal", sa.Integer),
        sa.Column("termination_reason", sa.String(32)),
        sa.Column("termination_evidence", sa.Text),
        sa.Column("retry_decision", sa.Text),
        sa.UniqueConstraint("run_id", "attempt_number", name="uq_attempts_run_number"),
    )
    op.create_index("ix_runs_created_at", "runs", ["created_at"])
    op.create_index("ix_attempts_run_id", "attempts", ["run_id"])
    op.create_index("ix_attempts_state", "attempts", ["state"])
    op.create_index("ix_attempts_started_at", "attempts", ["started_at"])
    op.create_index("ix_attempts_termination_reason", "attempts", ["termination_reason"])
    op.execute(TRAINING_ATTEMPTS)


def downgrade() -> None:
    op.execute("DROP VIEW training_attempts")
    op.drop_table("attempts")
    op.drop_table("runs")
    op.drop_table("blobs")
