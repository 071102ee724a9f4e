"""Migration 0017 on a ledger that already holds metrics: every existing series becomes rank 0's, points kept."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from trackway.ledger.migrate import alembic_config, current_revision, upgrade_to_head
from trackway.ledger.reader import Reader
from trackway.ledger.records import insert_run
from trackway.ledger.revision import HEAD_REVISION


def _at(ledger, revision: str, upgrade: bool) -> None:
    with ledger.write() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        (command.upgrade if upgrade else command.downgrade)(config, revision)


def test_existing_series_become_rank_0_and_a_rank_1_series_of_the_same_key_fits_beside_them(ledger):
    _at(ledger, "0016", upgrade=False)  # the ledger as the release before ranks left it
    with ledger.write() as conn:
        assert current_revision(conn) == "0016"
        insert_run(conn, dict(run_id="rold", project="p", kind="full", state="completed", command="[]", workdir="/w",
                              resource="local", executor="local", gpus=0, created_at=datetime.now(timezone.utc)))
        conn.execute(text("INSERT INTO metric_series (run_id, key) VALUES ('rold', 'loss'), ('rold', 'lr')"))
        loss = conn.execute(text("SELECT series_id FROM metric_series WHERE key = 'loss'")).scalar_one()
        conn.execute(text("INSERT INTO metric_points (series_id, step, value, attempt_number, logged_at) "
                          "VALUES (:s, 0, 2.5, 1, 1.0), (:s, 1, 2.0, 1, 2.0)"), {"s": loss})

    upgrade_to_head(ledger)
    with ledger.write() as conn:
        assert current_revision(conn) == HEAD_REVISION
        assert conn.execute(text("SELECT key, rank FROM metric_series ORDER BY key")).all() == [("loss", 0), ("lr", 0)]
        reader = Reader.over(conn)
        assert reader.metric_ranks("rold") == [0]
        assert [(p["step"], p["value"]) for p in reader.metric_points("rold", key="loss")] == [(0, 2.5), (1, 2.0)]
        # The same key from another rank is a series of its own; the same key from the same rank is refused.
        conn.execute(text("INSERT INTO metric_series (run_id, key, rank) VALUES ('rold', 'loss', 1)"))
        assert Reader.over(conn).metric_ranks("rold") == [0, 1]
    with pytest.raises(IntegrityError):
        with ledger.write() as conn:
            conn.execute(text("INSERT INTO metric_series (run_id, key, rank) VALUES ('rold', 'loss', 0)"))

    # And back: rank 1's series goes (the older schema has no place for it); rank 0's stays with its points.
    _at(ledger, "0016", upgrade=False)
    with ledger.read() as conn:
        assert conn.execute(text("SELECT key FROM metric_series ORDER BY key")).scalars().all() == ["loss", "lr"]
        assert conn.execute(text("SELECT count(*) FROM metric_points")).scalar_one() == 2
    upgrade_to_head(ledger)
