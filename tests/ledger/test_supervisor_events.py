"""What the supervisor notes about an attempt stays whole when two processes note it at once (PostgreSQL)."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import select

from trackway.ledger import open_ledger
from trackway.ledger.schema import attempt_events
from trackway.ledger.supervisor_events import SUPERVISOR_RANK, add_supervisor_event

from spool_attempt import attempt_with_spool


def test_two_writers_noting_one_attempt_at_once_each_get_their_own_event(pg_url, tmp_path: Path):
    first_ledger, second_ledger = open_ledger(pg_url), open_ledger(pg_url)
    try:
        attempt = attempt_with_spool(first_ledger, tmp_path / "attempt")
        attempt_id = attempt["attempt_id"]
        outcome: dict[str, object] = {}
        second_started = threading.Event()

        def second_writer() -> None:
            second_started.set()
            try:
                with second_ledger.write() as conn:
                    outcome["second"] = add_supervisor_event(conn, attempt_id, "host_answered_again", {"message": "b"})
            except Exception as exc:  # noqa: BLE001 - what the test reports
                outcome["second"] = exc

        # The first writer's transaction is open, its event written but not committed, when the second starts.
        with first_ledger.write() as conn:
            assert add_supervisor_event(conn, attempt_id, "host_unreachable", {"message": "a"})
            thread = threading.Thread(target=second_writer)
            thread.start()
            second_started.wait(10)
            thread.join(1.0)  # the second waits on the first (it would find the same next number otherwise)
        thread.join(30)

        assert outcome.get("second") is True, outcome
        with first_ledger.read() as conn:
            rows = conn.execute(select(attempt_events.c.seq, attempt_events.c.kind).where(
                attempt_events.c.attempt_id == attempt_id, attempt_events.c.rank == SUPERVISOR_RANK)
                .order_by(attempt_events.c.seq)).all()
        assert [(row.seq, row.kind) for row in rows] == [(0, "host_unreachable"), (1, "host_answered_again")]
    finally:
        first_ledger.dispose()
        second_ledger.dispose()
