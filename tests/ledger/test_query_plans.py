"""Every query a supervisor tick and a listing run reads `attempts` and `runs` through an index, never whole.

A ledger keeps every attempt forever; a tick that scans the history costs more each week. SQLite's
`EXPLAIN QUERY PLAN` says `SCAN attempts` (or `SCAN runs`) for a full scan and `SEARCH ...` when an
index narrows the rows; without `ANALYZE` statistics the plan does not depend on how many rows there
are, so a small ledger tells what a million attempts would get.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sqlalchemy import event

from trackway.ledger import open_ledger
from trackway.ledger.reader import open_reader
from trackway.settings import load_settings
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

HISTORY = ("attempts", "runs")


def _full_scans(conn, statement: str, parameters) -> list[str]:
    plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
    return [row[-1] for row in plan if any(row[-1].startswith(f"SCAN {table}") for table in HISTORY)]


def _captured_reads(ledger, action) -> list[tuple[str, object]]:
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - the event's signature
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and not executemany:
            seen.append((statement, parameters))

    event.listen(ledger.engine, "before_cursor_execute", capture)
    try:
        action()
    finally:
        event.remove(ledger.engine, "before_cursor_execute", capture)
    return seen


def _queued_evaluations(ledger) -> None:
    from trackway.evals.records import queued_eval_runs, running_eval_attempts

    with ledger.read() as conn:
        queued_eval_runs(conn, 4)
        running_eval_attempts(conn)


def test_a_supervisor_tick_reads_the_history_through_indexes(home, sqlite_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    try:
        # One run finished, one still running: the tick has ends to look for and history to leave alone.
        done = submit_run(ledger, settings, RunSpec(command=[sys.executable, "-c", "pass"], cwd=Path.cwd()))
        supervisor = Supervisor(ledger, settings)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and supervisor.tick() == []:
            time.sleep(0.1)
        live = None
        live = submit_run(ledger, settings, RunSpec(command=[sys.executable, "-c", "import time; time.sleep(30)"],
                                                    cwd=Path.cwd()))
        reads = _captured_reads(ledger, supervisor.tick)
        reads += _captured_reads(ledger, lambda: _queued_evaluations(ledger))
        assert reads, "the tick ran no query"
        with ledger.engine.connect() as conn:
            offenders = {statement: scans for statement, params in reads if (scans := _full_scans(conn, statement, params))}
        assert offenders == {}, f"these tick queries scan the whole history: {offenders}"
        assert done != live
    finally:
        from trackway.cli.errors import run_app
        from trackway.cli.main import app

        if live:
            run_app(app, ["cancel", live])
        ledger.dispose()


def test_what_in_flight_and_the_listings_ask_uses_indexes(sqlite_url):
    ledger = open_ledger(sqlite_url)
    ledger.dispose()
    import sqlite3

    from trackway.ledger import reader as reader_module

    statements: list[tuple[str, dict]] = []
    original = reader_module._SqliteReader._execute

    def recording(self, sql, params):
        statements.append((sql, dict(params)))
        return original(self, sql, params)

    reader_module._SqliteReader._execute = recording
    try:
        with open_reader(sqlite_url) as reader:
            reader.in_flight()
            reader.runs(limit=50, kinds=["test", "full"])
            reader.attempts(limit=100)
    finally:
        reader_module._SqliteReader._execute = original
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        offenders = {}
        for sql, params in statements:
            plan = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            scans = [step for step in plan if step.startswith(tuple(f"SCAN {t}" for t in HISTORY))]
            # A listing newest-first may walk an index in order, stopping at its LIMIT: that is not a scan.
            scans = [step for step in scans if "USING INDEX ix_" not in step or "in_flight" in sql]
            if scans:
                offenders[sql] = scans
    finally:
        conn.close()
    assert offenders == {}, f"these queries scan the whole history: {offenders}"


def test_the_seed_query_starts_from_the_model_familys_runs_not_every_attempt(sqlite_url):
    import sqlite3

    open_ledger(sqlite_url).dispose()
    seed_query = (
        "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
        "from training_attempts where model_family = 'reasoning' and started_at >= datetime('now', '-7 days') "
        "group by termination_reason order by gpu_hours desc"
    )
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        plan = [row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {seed_query}")]
    finally:
        conn.close()
    # The view joins attempts `a` to runs `r`: a scan of `a` reads every attempt ever recorded.
    assert any(step.startswith("SEARCH r USING INDEX ix_runs_model_family") for step in plan), plan
    assert not [step for step in plan if step.startswith(("SCAN a", "SCAN attempts"))], plan
