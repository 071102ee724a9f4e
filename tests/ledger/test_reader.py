"""The plain DB-API reader gives what SQLAlchemy's types give, and the listings read through it on both backends."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from trackway.evals.records import IN_FLIGHT
from trackway.ledger import open_ledger
from trackway.ledger.reader import EVALUATION_IN_FLIGHT, TIMESTAMP_COLUMNS, Reader, open_reader, sqlite_file
from trackway.ledger.records import insert_attempt, insert_run
from trackway.ledger.schema import UTCDateTime, attempts, metadata, runs

PY = sys.executable


def _fill(ledger) -> None:
    created = datetime(2026, 11, 1, 12, 30, 15, 123456, tzinfo=timezone.utc)
    with ledger.write() as conn:
        for i in range(3):
            insert_run(conn, dict(run_id=f"r{i}", name=f"run-{i}", project="p", kind="full", state="completed",
                                  command='["python", "train.py"]', workdir="/w", resource="local", executor="local",
                                  gpus=0, created_at=created.replace(minute=i)))
            insert_attempt(conn, dict(run_id=f"r{i}", attempt_number=1, state="ended", executor="local",
                                      state_dir="/s", log_path="/s/output.log", gpu_count=0,
                                      started_at=created.replace(minute=i), ended_at=created.replace(minute=i + 1)))


def test_the_schema_timestamps_are_the_ones_the_reader_converts():
    stamps = {c.name for table in metadata.tables.values() for c in table.columns if isinstance(c.type, UTCDateTime)}
    assert stamps == TIMESTAMP_COLUMNS
    assert EVALUATION_IN_FLIGHT == IN_FLIGHT


def test_rows_read_without_sqlalchemy_equal_what_sqlalchemy_reads(ledger_url):
    ledger = open_ledger(ledger_url)
    try:
        _fill(ledger)
        with ledger.read() as conn:
            core_runs = [dict(r) for r in conn.execute(select(runs).order_by(runs.c.created_at.desc())).mappings()]
            core_attempt = dict(conn.execute(select(attempts).where(attempts.c.run_id == "r1")).mappings().one())
        with open_reader(ledger_url) as reader:
            listed = reader.runs(limit=None)
            attempt = reader.attempt("run-1/1")
            assert reader.run("r2")["name"] == "run-2" and reader.latest_attempt("r0")["attempt_id"] == "r0/1"
    finally:
        ledger.dispose()
    assert [{k: v for k, v in r.items() if k != "attempt_count"} for r in listed] == core_runs
    assert [r["attempt_count"] for r in listed] == [1, 1, 1]
    assert attempt == core_attempt
    assert attempt["started_at"].tzinfo is not None and attempt["started_at"].microsecond == 123456


def test_a_sqlite_file_is_read_without_importing_sqlalchemy(tmp_path):
    import subprocess

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    _fill(ledger)
    ledger.dispose()
    probe = (
        "import sys; from trackway.ledger.reader import open_reader\n"
        f"with open_reader({url!r}) as r: names = [x['name'] for x in r.runs()]\n"
        "print(names, 'sqlalchemy' in sys.modules)"
    )
    out = subprocess.run([PY, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['run-2', 'run-1', 'run-0'] False"


def test_a_ledger_file_not_yet_created_or_migrated_is_migrated_first(tmp_path):
    url = f"sqlite:///{tmp_path / 'new' / 'ledger.db'}"
    with open_reader(url) as reader:
        assert reader.runs() == [] and reader.in_flight() == {}
    assert sqlite_file(url) == tmp_path / "new" / "ledger.db"
    assert sqlite_file("sqlite://") is None and sqlite_file("postgresql+psycopg://h/db") is None


def test_a_reader_never_writes(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url).dispose()
    import sqlite3

    with open_reader(url) as reader, pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.dicts("DELETE FROM runs")


def test_over_a_sqlalchemy_connection_the_same_queries_run(ledger):
    _fill(ledger)
    with ledger.read() as conn:
        reader = Reader.over(conn)
        assert [r["run_id"] for r in reader.runs(kinds=["full"], limit=2)] == ["r2", "r1"]
        assert reader.attempts(run_id="r0")[0]["run_name"] == "run-0"
