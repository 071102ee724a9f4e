"""Who submitted a run, and a person's approval where an agent's settings ask for one before it starts.

`submitted_by` is the submitter as `started_by` says it (`agent NAME via mcp (user@host)`,
`trackway submit (user@host)`): an agent's runs are the ones it submitted, whoever started their
attempts. NULL for runs recorded before: their first attempt's `started_by` says it.

`approval` is NULL for a run that needs none, else `awaiting` (recorded, no attempt started, the
supervisor passes it over), `approved` or `refused`; `approval_note` says who decided, when and why
(and, while awaiting, what asked for it); `approval_at` when it was decided.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (not a batch copy of `runs`): the views over `runs` name their columns and keep working.
    op.add_column("runs", sa.Column("submitted_by", sa.Text))
    op.add_column("runs", sa.Column("approval", sa.String(16)))
    op.create_index("ix_runs_approval", "runs", ["approval"])
    op.add_column("runs", sa.Column("approval_note", sa.Text))
    op.add_column("runs", sa.Column("approval_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_index("ix_runs_approval", "runs")
    for column in ("approval_at", "approval_note", "approval", "submitted_by"):
        op.drop_column("runs", column)
