"""Scripts without the SDK: the log patterns and checkpoint paths a run was submitted with.

`runs.log_patterns` is a JSON list of regular expressions (`submit --metric-pattern`, or
`[logs] metrics` in trackway.toml) whose named groups are read from each attempt's output.log
as metrics (`step` is the step). `runs.checkpoint_paths` is a JSON list of globs relative to the
run's working directory (`submit --checkpoint-path`, or `[checkpoints] path`) whose files the
supervisor commits as checkpoints and restores before a retry. NULL: none.

How far each attempt's output.log was read is kept in `spool_cursors` (file `output.log`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The view training_attempts reads `runs` but none of these columns; plain ADD COLUMN keeps it.
    op.execute("ALTER TABLE runs ADD COLUMN log_patterns TEXT")
    op.execute("ALTER TABLE runs ADD COLUMN checkpoint_paths TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN checkpoint_paths")
    op.execute("ALTER TABLE runs DROP COLUMN log_patterns")
