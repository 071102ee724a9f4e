"""Who started each attempt: the submitter, the supervisor by which rule, or a person's `resume`.

`attempts.started_by` is one line of text (e.g. `trackway resume --set batch_size=32 (ana@gpu3)`,
`supervisor: preempted: resume (1 of 10)`); NULL for attempts recorded before it was kept.
The view `training_attempts` gains it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COLUMNS = """
    a.attempt_id, a.run_id, r.name AS run_name, r.project, r.model_family, r.kind AS run_kind,
    a.attempt_number, a.executor, a.executor_job_id, a.host, a.gpu_model, a.gpu_count,
    a.started_at, a.ended_at, a.gpu_seconds, a.cost_usd, a.exit_code, a.signal,
    a.termination_reason, a.termination_evidence, a.config_sha256, a.data_manifest_sha256,
    a.environment_sha256, a.code_commit, a.code_dirty_sha256, a.resumed_from_checkpoint,
    a.first_step, a.last_step, a.checkpoints_committed, a.useful_gpu_seconds,
    a.wasted_gpu_seconds, a.retry_decision, a.environ_sha256"""

_VIEW = """
CREATE VIEW training_attempts AS
SELECT{columns}
FROM attempts a
JOIN runs r ON r.run_id = a.run_id
WHERE r.kind <> 'eval'
"""


def upgrade() -> None:
    op.execute("DROP VIEW training_attempts")  # it reads `attempts`
    op.execute("ALTER TABLE attempts ADD COLUMN started_by TEXT")
    op.execute(_VIEW.format(columns=_COLUMNS + ",\n    a.started_by"))


def downgrade() -> None:
    op.execute("DROP VIEW training_attempts")
    op.execute("ALTER TABLE attempts DROP COLUMN started_by")
    op.execute(_VIEW.format(columns=_COLUMNS))
