"""Where each attempt ran and why: the resource, the QoS tier and the selection's reasons.

`runs.resource_request` is what the submitter asked for: a resource's name, or `auto` (choose by
trackway.toml's resources and [selection]); NULL for runs recorded before, which ran on
`runs.resource`. `runs.gpu_memory_min_gb` is `submit --gpu-memory-min` (NULL: none asked).
`attempts.resource` and `attempts.qos` are where the attempt was sent (NULL for attempts
recorded before: `runs.resource`, no QoS); `attempts.selection` is a JSON object holding the
choice and every candidate passed over, each with its reason (resources/selection.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN: the views over `runs` and `attempts` name their columns and keep working.
    op.execute("ALTER TABLE runs ADD COLUMN resource_request VARCHAR(200)")
    op.execute("ALTER TABLE runs ADD COLUMN gpu_memory_min_gb FLOAT")
    op.execute("ALTER TABLE attempts ADD COLUMN resource VARCHAR(200)")
    op.execute("ALTER TABLE attempts ADD COLUMN qos VARCHAR(200)")
    op.execute("ALTER TABLE attempts ADD COLUMN selection TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE attempts DROP COLUMN selection")
    op.execute("ALTER TABLE attempts DROP COLUMN qos")
    op.execute("ALTER TABLE attempts DROP COLUMN resource")
    op.execute("ALTER TABLE runs DROP COLUMN gpu_memory_min_gb")
    op.execute("ALTER TABLE runs DROP COLUMN resource_request")
