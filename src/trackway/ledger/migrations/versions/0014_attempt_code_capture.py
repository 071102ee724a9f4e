"""Per-attempt code capture: where each attempt ran, on which branch, and how its code was taken.

Before, an attempt's code columns were copied from its run at submit, whatever the attempt ran;
now each attempt records the code it was given when it launched (supervisor/workspace.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("workdir", sa.Text))
        batch.add_column(sa.Column("code_branch", sa.String(400)))
        batch.add_column(sa.Column("code_capture", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("code_capture")
        batch.drop_column("code_branch")
        batch.drop_column("workdir")
