"""A run's own acceptance criteria (`submit --expect`) and their verdict as last judged; the resource it prefers.

`expect` holds the criteria as given (a JSON list of texts), `expect_verdict` each one's state
(met, not yet, not met, not known) with its numbers; `expect_judged_at` is when they were last
judged and `expect_open` whether one of them can still change (the run, or an evaluation of it,
still going). NULL for runs recorded before: they stated no criteria.

`resource_preferred` is the API's `prefer_resource`: ranked first when it can take the run, passed
over (with its reason in the attempt's selection) when it cannot. NULL: no preference.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (not a batch copy of `runs`): the views over `runs` name their columns and keep working.
    op.add_column("runs", sa.Column("expect", sa.Text))
    op.add_column("runs", sa.Column("expect_verdict", sa.Text))
    op.add_column("runs", sa.Column("expect_judged_at", sa.DateTime(timezone=True)))
    op.add_column("runs", sa.Column("expect_open", sa.Boolean))
    op.create_index("ix_runs_expect_open", "runs", ["expect_open"])
    op.add_column("runs", sa.Column("resource_preferred", sa.String(200)))


def downgrade() -> None:
    op.drop_index("ix_runs_expect_open", "runs")
    for column in ("resource_preferred", "expect_open", "expect_judged_at", "expect_verdict", "expect"):
        op.drop_column("runs", column)
