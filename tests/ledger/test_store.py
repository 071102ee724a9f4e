"""The ledger opens, migrates once, and keeps what is written: on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import make_url

from trackway.errors import InputError, LedgerUnavailable
from trackway.ledger import open_ledger
from trackway.ledger.blobs import get_blob, put_blob
from trackway.ledger.migrate import current_revision, head_revision
from trackway.ledger.schema import blobs, runs
from trackway.ledger.store import WAL_SIZE_LIMIT_BYTES


def _run(**overrides):
    values = dict(
        project="arcagi", model_family="reasoning", kind="test", state="queued", command='["true"]',
        workdir="/tmp", resource="local", executor="local", gpus=0, created_at=datetime.now(timezone.utc),
    )
    values.update(overrides)
    return values


def test_fresh_ledger_is_migrated_to_head_with_the_view(ledger):
    with ledger.read() as conn:
        assert current_revision(conn) == head_revision()
        names = set(inspect(conn).get_table_names())
        assert {"blobs", "runs", "attempts"} <= names
        assert "training_attempts" in inspect(conn).get_view_names()


def test_reopening_does_not_migrate_again(ledger_url):
    open_ledger(ledger_url).dispose()
    again = open_ledger(ledger_url)
    with again.read() as conn:
        assert current_revision(conn) == head_revision()
    again.dispose()


def test_same_blob_is_stored_once(ledger):
    with ledger.write() as conn:
        first = put_blob(conn, b'{"lr": 0.001}', "config")
        second = put_blob(conn, b'{"lr": 0.001}', "config")
        third = put_blob(conn, b'{"lr": 0.002}', "config")
    assert first == second != third
    with ledger.read() as conn:
        assert conn.execute(select(func.count()).select_from(blobs).where(blobs.c.kind == "config")).scalar_one() == 2
        assert get_blob(conn, first) == b'{"lr": 0.001}'


def test_failed_write_leaves_nothing_behind(ledger):
    with pytest.raises(RuntimeError):
        with ledger.write() as conn:
            conn.execute(runs.insert().values(run_id="r1", **_run()))
            raise RuntimeError("boom")
    with ledger.read() as conn:
        assert conn.execute(select(runs)).first() is None


def test_timestamps_come_back_in_utc(ledger):
    moment = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2)))
    with ledger.write() as conn:
        conn.execute(runs.insert().values(run_id="r1", **_run(created_at=moment)))
    with ledger.read() as conn:
        stored = conn.execute(select(runs.c.created_at)).scalar_one()
    assert stored == moment and stored.tzinfo is not None and stored.utcoffset() == timedelta(0)


def test_concurrent_writers_all_land(ledger):
    errors = []

    def write(i):
        try:
            with ledger.write() as conn:
                conn.execute(runs.insert().values(run_id=f"r{i}", **_run()))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with ledger.read() as conn:
        assert conn.execute(text("select count(*) from runs")).scalar_one() == 20


def test_sqlite_ledger_uses_wal(sqlite_url):
    led = open_ledger(sqlite_url)
    with led.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
    led.dispose()


def _write_blobs(ledger, megabytes: int) -> None:
    with ledger.write() as conn:
        for _ in range(megabytes):
            put_blob(conn, os.urandom(1 << 20), "test")  # random: stored at its size
        put_blob(conn, os.urandom(64), "test")


def test_writes_inside_checkpoints_after_leave_the_copy_back_to_its_end(sqlite_url):
    database = Path(make_url(sqlite_url).database)
    wal = Path(f"{database}-wal")
    led = open_ledger(sqlite_url)
    _write_blobs(led, 0)
    before = database.stat().st_size
    with led.checkpoints_after():
        for _ in range(5):
            _write_blobs(led, 4)  # each commit finds more than SQLite's 1,000 pages in the log
        # Every commit went on without copying the log back: the database file has not grown.
        assert database.stat().st_size == before and wal.stat().st_size > 20 << 20
    assert database.stat().st_size > before + (20 << 20)  # copied back at its end
    _write_blobs(led, 0)
    assert wal.stat().st_size <= WAL_SIZE_LIMIT_BYTES  # and the log is not kept at its largest on disk
    led.dispose()


def test_without_checkpoints_after_a_commit_past_the_bound_copies_the_log_back(sqlite_url):
    database = Path(make_url(sqlite_url).database)
    led = open_ledger(sqlite_url)
    _write_blobs(led, 0)
    before = database.stat().st_size
    _write_blobs(led, 5)
    assert database.stat().st_size > before + (5 << 20)
    led.dispose()


def test_bad_url_is_one_line_input_error():
    with pytest.raises(InputError, match="expected a sqlite:// or postgresql"):
        open_ledger("mysql://nobody@nowhere/x")


def test_unreachable_postgres_is_ledger_unavailable():
    with pytest.raises(LedgerUnavailable, match="cannot open the ledger"):
        open_ledger("postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2")


def _write_runs(url: str, prefix: str, count: int) -> None:
    led = open_ledger(url)
    for i in range(count):
        with led.write() as conn:
            conn.execute(runs.insert().values(run_id=f"{prefix}{i}", **_run()))
    led.dispose()


def test_writer_processes_queue_instead_of_failing(sqlite_url):
    """Several processes writing one SQLite ledger at once: every write lands, none sees 'database is locked'."""
    import multiprocessing

    open_ledger(sqlite_url).dispose()
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_write_runs, args=(sqlite_url, f"p{n}-", 40)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    led = open_ledger(sqlite_url)
    with led.read() as conn:
        assert conn.execute(text("select count(*) from runs")).scalar_one() == 160
    led.dispose()


def test_a_postgresql_connection_cut_while_pooled_is_replaced_and_busy_ones_are_not_pinged(pg_url, monkeypatch):
    """A server restart (or a proxy's idle timeout) between two ticks must not fail the second; a tick's dozen
    checkouts in a row must not each cost a round trip to check the connection first."""
    import trackway.ledger.store as store

    ledger = open_ledger(pg_url)
    pings = []
    ping = ledger.engine.dialect.do_ping
    monkeypatch.setattr(ledger.engine.dialect, "do_ping", lambda conn: pings.append(1) or ping(conn))
    try:
        with ledger.read() as conn:
            pid = conn.execute(text("select pg_backend_pid()")).scalar_one()
        for _ in range(10):
            with ledger.read() as conn:
                assert conn.execute(text("select pg_backend_pid()")).scalar_one() == pid  # the pooled one, unchecked
        assert pings == []

        admin = open_ledger(pg_url)
        with admin.read() as conn:
            assert conn.execute(text("select pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        admin.dispose()
        monkeypatch.setattr(store, "PING_AFTER_IDLE_S", 0.05)
        time.sleep(0.1)

        with ledger.read() as conn:  # found cut by its check, and replaced before use
            assert conn.execute(text("select pg_backend_pid()")).scalar_one() != pid
        assert len(pings) == 1
    finally:
        ledger.dispose()
