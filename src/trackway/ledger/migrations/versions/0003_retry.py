"""Retries: a run's own policy and when it may be retried next; each attempt's memory footprint and waste split.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("retry_policy", sa.Text))
        batch.add_column(sa.Column("not_before", sa.DateTime(timezone=True)))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("memory_fingerprint", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("memory_fingerprint")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("not_before")
        batch.drop_column("retry_policy")
