"""Where a run's checkpoints live when they must outlive the machine: `runs.checkpoint_root`.

An fsspec URL (`s3://bucket/prefix/RUN`, `gs://...`, `file:///mnt/volume/...`) fixed at submit
from `submit --checkpoint-root` or the chosen resource's `checkpoint_root`, with the run's id
appended; every attempt uploads there and resumes from there, whichever resource it runs on.
NULL (every run recorded before, and runs without one): under trackway's home, as before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN checkpoint_root TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN checkpoint_root")
