"""schemathesis against the API's own OpenAPI schema: generated requests never make a server error, and every
answer (errors included) matches the schema. In process (ASGI), on a ledger with one real run to read."""

from __future__ import annotations

import sys
from pathlib import Path

from waiting import wait_for

from trackway.ledger import open_ledger
from trackway.server.app import create_app
from trackway.server.reads import close_sql_workers
from trackway.server.auth import Access
from trackway.server.guard import allowed_hosts
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor


FUZZ_TOKEN = "fuzz-token-0123456789"


def _schema(home: Path, sqlite_url: str):
    # schemathesis and hypothesis are imported where they are used: every worker collects this file, and importing
    # them costs 1.4 s of CPU, which only the worker that runs the test needs to pay.
    import schemathesis

    configured = load_settings()
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, configured)
    script = "import trackway\nrun = trackway.init()\nfor s in range(50):\n    run.log({'loss': 1 / (s + 1)}, step=s)\nrun.finish()\n"
    run_id = submit_run(ledger, configured, RunSpec(command=[sys.executable, "-c", script], cwd=Path.cwd(), name="fuzzed"))
    start_attempt(ledger, configured, run_id, supervisor.executor("local"))
    # Until its end is recorded: a run to read, with points and a receipt.
    wait_for(supervisor.tick, "the run to read to end", timeout=60, interval=0.1)
    ledger.dispose()
    # With a token, as clients call it; the ASGI client's Host is `testserver`.
    app = create_app(configured, Access(FUZZ_TOKEN), Path.cwd(), hosts=allowed_hosts("127.0.0.1", ["testserver"]))
    # Generated jobs would start real processes, and the event stream never ends: both have their own tests.
    return app, (schemathesis.openapi.from_asgi("/openapi.json", app)
                 .exclude(method="POST", path="/api/jobs").exclude(path="/api/events"))


def test_no_generated_request_is_a_server_error_and_every_answer_matches_the_schema(home, sqlite_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    app, schema = _schema(home, sqlite_url)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 16  # every operation but the two excluded
    try:
        _fuzz(operations)
    finally:
        # The ASGI client runs no lifespan: the SQL workers /api/sql started end here, as at a server's shutdown.
        close_sql_workers(app)


def _fuzz(operations) -> None:
    from hypothesis import HealthCheck, given, settings
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            # Every other check runs; a schema-valid id that names nothing is rightly a 4xx, not a rejection of valid data.
            case.call_and_validate(headers={"Authorization": f"Bearer {FUZZ_TOKEN}"},
                                   excluded_checks=[positive_data_acceptance])

        check()
