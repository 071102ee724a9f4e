"""The notifications outbox: who holds a message being sent (host, pid, start time) until when, and each
destination's delivery (state, tries, last error, sent at) under its hash, never its URL.

A claim by a process that died on the claimant's own host is taken over at once, another host's
when its lease runs out; a retry goes only to the destinations that did not take the message.

Revision ID: 0020
Revises: 0018
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0018"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Plain ADD COLUMN: the rows already recorded keep their state; a row left `sending` with no
    # claimant is taken over once its claim is a lease old.
    op.execute("ALTER TABLE notifications ADD COLUMN claimed_by VARCHAR(200)")
    op.add_column("notifications", sa.Column("lease_until", TS))
    op.create_table(
        "notification_deliveries",
        sa.Column("key", sa.String(200), sa.ForeignKey("notifications.key"), primary_key=True),
        sa.Column("destination", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tries", sa.Integer, nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("tried_at", TS),
        sa.Column("sent_at", TS),
    )


def downgrade() -> None:
    op.drop_table("notification_deliveries")
    op.drop_column("notifications", "lease_until")
    op.drop_column("notifications", "claimed_by")
