"""`memory_growing`'s starting value: the first RSS a heartbeat said, kept in the ledger across supervisors."""

from datetime import datetime, timezone

import pytest

from trackway.ledger.open import open_ledger
from trackway.ledger.records import insert_attempt, insert_run
from trackway.settings import load_settings
from trackway.supervisor.loop import Supervisor
from trackway.supervisor.watchers import memory_growing

GIB = 1 << 30


@pytest.fixture
def attempt(sqlite_url, home):
    ledger = open_ledger(sqlite_url)
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="r1", name="r1", project="p", kind="full", state="running", command='["python"]',
                              workdir="/w", resource="local", executor="local", gpus=0, created_at=now))
        insert_attempt(conn, dict(run_id="r1", attempt_number=1, state="running", executor="local", state_dir="/s",
                                  log_path="/s/log", gpu_count=0, started_at=now))
    yield ledger, {"attempt_id": "r1/1"}
    ledger.dispose()


def test_a_look_before_the_first_heartbeat_does_not_lose_the_starting_value(attempt):
    ledger, row = attempt
    settings = load_settings()
    first = Supervisor(ledger, settings)
    assert first._rss_baseline(row, None) is None  # no heartbeat yet: nothing is set
    assert first._rss_baseline(row, GIB // 2) == GIB // 2
    assert memory_growing(first._rss_baseline(row, 3 * GIB), 3 * GIB) is not None
    # A supervisor started later (a restart) judges from the same start, not from what it reads first.
    again = Supervisor(ledger, settings)
    said = memory_growing(again._rss_baseline(row, 3 * GIB), 3 * GIB)
    assert said is not None and "was 0.50 GiB" in said and "rule: ×2 and +1 GiB" in said
