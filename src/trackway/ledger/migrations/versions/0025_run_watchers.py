"""A run's own watcher thresholds (`submit --watch KIND.KEY=VALUE`), over trackway.toml's [watchers].

`watchers` holds only what the run set, as a JSON table {kind: {key: value}}, checked at submit by
the same models as trackway.toml (settings/run_watchers.py). NULL: the run follows the file.

Revision ID: 0025
Revises: 0021
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (not a batch copy of `runs`): the views over `runs` name their columns and keep working.
    op.add_column("runs", sa.Column("watchers", sa.Text))


def downgrade() -> None:
    op.drop_column("runs", "watchers")
