"""Runs over several nodes: the nodes a run spans (`submit --nodes`, the API's `nodes`), kept with the run.

Every attempt of the run, retries included, spans the same nodes. NULL for runs recorded before:
they ran on one node.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (not a batch copy of `runs`): the views over `runs` name their columns and keep working.
    op.execute("ALTER TABLE runs ADD COLUMN nodes INTEGER")


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN nodes")
