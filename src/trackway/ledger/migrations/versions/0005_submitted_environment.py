"""The submitter's environment: stored with the run, and the digest of what each attempt was given.

`runs.environ_sha256` and `attempts.environ_sha256` point at `environ` blobs (plain variables
with their values, secret ones as names and salted digests; see receipts/submitted_env.py).
The view `training_attempts` gains `environ_sha256`; `runs.state` gets an index.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMNS = """
    a.attempt_id, a.run_id, r.name AS run_name, r.project, r.model_family, r.kind AS run_kind,
    a.attempt_number, a.executor, a.executor_job_id, a.host, a.gpu_model, a.gpu_count,
    a.started_at, a.ended_at, a.gpu_seconds, a.cost_usd, a.exit_code, a.signal,
    a.termination_reason, a.termination_evidence, a.config_sha256, a.data_manifest_sha256,
    a.environment_sha256, a.code_commit, a.code_dirty_sha256, a.resumed_from_checkpoint,
    a.first_step, a.last_step, a.checkpoints_committed, a.useful_gpu_seconds,
    a.wasted_gpu_seconds, a.retry_decision"""

_VIEW = """
CREATE VIEW training_attempts AS
SELECT{columns}
FROM attempts a
JOIN runs r ON r.run_id = a.run_id
WHERE r.kind <> 'eval'
"""


def upgrade() -> None:
    # The view reads `attempts`: drop it while the table changes. Plain ADD COLUMN (no batch):
    # SQLite takes a nullable REFERENCES column in place, and a batch rebuild of `runs` would trip
    # over the other views that read it.
    op.execute("DROP VIEW training_attempts")
    for table in ("runs", "attempts"):
        op.execute(f"ALTER TABLE {table} ADD COLUMN environ_sha256 VARCHAR(64) REFERENCES blobs (sha256)")
    op.execute(_VIEW.format(columns=_COLUMNS + ",\n    a.environ_sha256"))
    # Every tick looks for queued runs (retries due, runs orphaned by a dead submitter).
    op.create_index("ix_runs_state", "runs", ["state"])


def downgrade() -> None:
    op.drop_index("ix_runs_state", "runs")
    op.execute("DROP VIEW training_attempts")
    for table in ("attempts", "runs"):
        op.execute(f"ALTER TABLE {table} DROP COLUMN environ_sha256")
    op.execute(_VIEW.format(columns=_COLUMNS))
