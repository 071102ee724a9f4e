"""The shim's node samples become the run's node/* series at the step the attempt reached, and cost no write
while there is no step to attach them to."""

from __future__ import annotations

import json

from spool_attempt import attempt_with_spool
from sqlalchemy import select, update

from trackway.executors.node_sampler import SAMPLES_FILE
from trackway.ledger.reader import Reader
from trackway.ledger.schema import attempts, spool_cursors
from trackway.supervisor.node_samples import ingest_node_samples


def _sample(path, t: float, rss: int) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"t": t, "rss_bytes": rss, "cpu_seconds": t / 10}) + "\n")


def test_samples_wait_for_a_step_without_a_write_then_land_on_it_newest_first(ledger, tmp_path):
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rnode")
    samples = tmp_path / "attempt" / "spool" / SAMPLES_FILE
    _sample(samples, 10.0, 100)
    _sample(samples, 20.0, 200)
    known: dict = {}

    # No step yet: nothing stored, and no cursor written (no write transaction at all).
    assert ingest_node_samples(ledger, attempt, known) == 0
    with ledger.read() as conn:
        cursors = conn.execute(select(spool_cursors).where(spool_cursors.c.attempt_id == attempt["attempt_id"]))
        assert cursors.all() == []
        assert Reader.over(conn).metric_points("rnode", key="node/rss_bytes") == []
    assert ingest_node_samples(ledger, attempt, known) == 0  # the same file again: not even read

    # The script reaches step 7 and the shim samples again: every sample read lands on step 7, the newest kept.
    with ledger.write() as conn:
        conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"]).values(last_step=7))
    _sample(samples, 30.0, 300)
    assert ingest_node_samples(ledger, attempt, known) == 3
    assert ingest_node_samples(ledger, attempt, known) == 0
    with ledger.read() as conn:
        points = Reader.over(conn).metric_points("rnode", key="node/rss_bytes")
    assert [(p["step"], p["value"]) for p in points] == [(7, 300.0)]

    # A later sample at a later step is a point of its own; what was stored stays.
    with ledger.write() as conn:
        conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"]).values(last_step=9))
    _sample(samples, 40.0, 400)
    assert ingest_node_samples(ledger, attempt, known) == 1
    with ledger.read() as conn:
        points = Reader.over(conn).metric_points("rnode", key="node/rss_bytes")
    assert [(p["step"], p["value"]) for p in points] == [(7, 300.0), (9, 400.0)]
