"""Notifications: each message about what needs a person, recorded once (by its key) before it is sent.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32)),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tries", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("claimed_at", TS),
        sa.Column("sent_at", TS),
    )
    op.create_index("ix_notifications_state", "notifications", ["state"])


def downgrade() -> None:
    op.drop_index("ix_notifications_state", "notifications")
    op.drop_table("notifications")
