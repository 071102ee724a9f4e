"""Migration 0028 on a ledger that already holds evaluations: every seed and evaluation kept, the phases' columns empty."""

from __future__ import annotations

from datetime import datetime, timezone

from alembic import command
from sqlalchemy import text

from trackway.ledger.migrate import alembic_config, current_revision, upgrade_to_head
from trackway.ledger.records import insert_run
from trackway.ledger.revision import HEAD_REVISION


def _at(ledger, revision: str, upgrade: bool) -> None:
    with ledger.write() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        (command.upgrade if upgrade else command.downgrade)(config, revision)


def test_evaluations_recorded_before_phases_keep_their_seeds_and_read_as_one_command(ledger):
    _at(ledger, "0027", upgrade=False)
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        assert current_revision(conn) == "0027"
        for run_id, kind in (("rtrain", "full"), ("rseed", "eval")):
            insert_run(conn, dict(run_id=run_id, project="p", kind=kind, state="completed", command="[]", workdir="/w",
                                  resource="local", executor="local", gpus=0, created_at=now))
        conn.execute(text("INSERT INTO blobs (sha256, kind, size, compression, content, created_at) "
                          "VALUES (:s, 'eval_spec', 2, 'none', :d, :t)"), {"s": "a" * 64, "d": b"{}", "t": now})
        conn.execute(text(
            "INSERT INTO evaluations (eval_id, run_id, checkpoint_step, checkpoint_name, checkpoint_path, "
            "checkpoint_manifest_sha256, spec_name, spec_sha256, evaluator_version, task_set_sha256, decoding, "
            "primary_metric, eval_key, trigger, state, created_at) VALUES ('evold', 'rtrain', 10, 'step-00000010', "
            "'/c', :m, 'arith', :s, 'sha256:e', 'sha256:t', '{}', 'pass@1', :k, 'on_demand', 'completed', :t)"),
            {"m": "b" * 64, "s": "a" * 64, "k": "c" * 64, "t": now})
        conn.execute(text("INSERT INTO evaluation_seeds (eval_id, seed, eval_run_id, state, samples, created_at) "
                          "VALUES ('evold', 0, 'rseed', 'completed', 40, :t)"), {"t": now})

    upgrade_to_head(ledger)
    with ledger.read() as conn:
        assert current_revision(conn) == HEAD_REVISION
        seed = conn.execute(text("SELECT eval_run_id, samples, inference_run_id, inference_outputs, "
                                 "judge_answers_sha256 FROM evaluation_seeds")).one()
        assert tuple(seed) == ("rseed", 40, None, None, None)
        assert tuple(conn.execute(text("SELECT inference_key, judge FROM evaluations")).one()) == (None, None)

    _at(ledger, "0027", upgrade=False)  # and back, the seed still there
    with ledger.read() as conn:
        assert conn.execute(text("SELECT eval_run_id FROM evaluation_seeds")).scalar_one() == "rseed"
    upgrade_to_head(ledger)
