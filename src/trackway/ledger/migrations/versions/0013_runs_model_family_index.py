"""An index on runs.model_family: "GPU-hours by reason for one model family" starts from that family's runs.

Without it SQLite (which trackway leaves without planner statistics) answered the seed query at
1M attempts by walking every attempt in termination-reason order, 0.9-1.2 s; with it, it searches
the family's runs and their attempts by run_id, 0.3 s.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_model_family", "runs", ["model_family"])


def downgrade() -> None:
    op.drop_index("ix_runs_model_family", "runs")
