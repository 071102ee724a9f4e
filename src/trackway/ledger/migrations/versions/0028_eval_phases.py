"""Evaluations in two phases (inference, then scoring) and pinned judges.

`evaluations.inference_key` is the identity of the generation alone (checkpoint, inference
version and command, server, task set, decoding): a rescore reuses the outputs of an evaluation
with the same key. `evaluations.judge` is the judge's identity as read when it was requested
(JSON: model and version, or command and code hash; the rubric's hash; decoding). NULL for
evaluations in one command and those without a judge.

`evaluation_seeds.inference_run_id` is the seed's inference run (its `eval_run_id` is the run
that scores it once inference committed its outputs), `inference_outputs` where the outputs were
committed (a checkpoint directory with its manifest), `inference_manifest_sha256` that manifest's
hash, and `judge_answers_sha256` the blob of every judge answer the scorer kept.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("evaluations", sa.Column("inference_key", sa.String(64)))
    op.add_column("evaluations", sa.Column("judge", sa.Text))
    op.create_index("ix_evaluations_inference_key", "evaluations", ["inference_key"])
    with op.batch_alter_table("evaluation_seeds") as batch:
        batch.add_column(sa.Column("inference_run_id", sa.String(32)))
        batch.add_column(sa.Column("inference_outputs", sa.Text))
        batch.add_column(sa.Column("inference_manifest_sha256", sa.String(64)))
        batch.add_column(sa.Column("judge_answers_sha256", sa.String(64)))
        batch.create_foreign_key("fk_evaluation_seeds_inference_run_id_runs", "runs", ["inference_run_id"], ["run_id"])
        batch.create_foreign_key("fk_evaluation_seeds_judge_answers_sha256_blobs", "blobs",
                                 ["judge_answers_sha256"], ["sha256"])
        batch.create_index("ix_evaluation_seeds_inference_run_id", ["inference_run_id"])


def downgrade() -> None:
    with op.batch_alter_table("evaluation_seeds") as batch:
        batch.drop_index("ix_evaluation_seeds_inference_run_id")
        batch.drop_constraint("fk_evaluation_seeds_judge_answers_sha256_blobs", type_="foreignkey")
        batch.drop_constraint("fk_evaluation_seeds_inference_run_id_runs", type_="foreignkey")
        for column in ("judge_answers_sha256", "inference_manifest_sha256", "inference_outputs", "inference_run_id"):
            batch.drop_column(column)
    op.drop_index("ix_evaluations_inference_key", "evaluations")
    op.drop_column("evaluations", "judge")
    op.drop_column("evaluations", "inference_key")
