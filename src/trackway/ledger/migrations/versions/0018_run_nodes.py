"""Runs over several nodes: the nodes a run spans (`submit --nodes`, the API's `nodes`), kept with the run.

Every attempt of the run, retries included, spans the same nodes. NULL for runs recorded before:
they ran on one node.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("nodes", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("nodes")
