"""Reading rows by id through the driver (`rows_where_in`) gives what `select(table)` gives, on both backends."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from trackway.ledger.records import IN_CHUNK, insert_attempt, insert_run, rows_where_in
from trackway.ledger.schema import attempts, runs

BASE = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=timezone.utc)
RUNS = IN_CHUNK + 7  # more than one IN list's worth


@pytest.fixture(scope="module")
def filled(module_ledger):
    with module_ledger.write() as conn:
        for i in range(RUNS):
            insert_run(conn, dict(
                run_id=f"r{i:05d}", project="p", kind="full", state="running", command="[]", workdir="/w",
                resource="local", executor="local", gpus=i % 3, created_at=BASE + timedelta(seconds=i),
                # A time on a whole second and a flag, each in some runs only.
                not_before=BASE.replace(microsecond=0) if i % 2 else None, expect_open=bool(i % 4) if i % 5 else None))
            for number in (2, 1) if i % 10 == 0 else (1,):
                insert_attempt(conn, dict(run_id=f"r{i:05d}", attempt_number=number, state="running", executor="local",
                                          state_dir="/s", log_path="/s/output.log", gpu_count=1,
                                          started_at=BASE + timedelta(minutes=number)))
    return module_ledger


def test_runs_read_through_the_driver_are_the_rows_select_reads(filled):
    wanted = [f"r{i:05d}" for i in range(RUNS)][::-1]
    with filled.read() as conn:
        fast = {row["run_id"]: row for row in rows_where_in(conn, runs, "run_id", wanted)}
        slow = {row["run_id"]: dict(row) for row in conn.execute(select(runs)).mappings()}
    assert fast == slow and len(fast) == RUNS
    some = fast["r00001"]
    assert some["created_at"] == BASE + timedelta(seconds=1) and some["created_at"].tzinfo is not None
    assert some["not_before"] == BASE.replace(microsecond=0) and some["expect_open"] is True


def test_attempts_come_in_the_order_asked_within_each_list(filled):
    with filled.read() as conn:
        rows = rows_where_in(conn, attempts, "run_id", ["r00000", "r00010", "r00003"],
                             order_by=("run_id", "attempt_number"))
    assert [(row["run_id"], row["attempt_number"]) for row in rows] == [
        ("r00000", 1), ("r00000", 2), ("r00003", 1), ("r00010", 1), ("r00010", 2)]
    assert rows[1]["started_at"] == BASE + timedelta(minutes=2)


def test_a_driver_of_another_paramstyle_reads_the_same_through_sqlalchemy(filled, monkeypatch):
    import trackway.ledger.records as records

    wanted = ["r00000", "r00010", "r00003"]
    with filled.read() as conn:
        through_driver = rows_where_in(conn, attempts, "run_id", wanted, order_by=("run_id", "attempt_number"))
        monkeypatch.setattr(records, "_POSITIONAL", {})
        assert rows_where_in(conn, attempts, "run_id", wanted, order_by=("run_id", "attempt_number")) == through_driver


def test_only_the_tables_own_column_names_reach_the_sql(filled):
    with filled.read() as conn, pytest.raises(ValueError, match="not columns of runs: run_id; DROP"):
        rows_where_in(conn, runs, "run_id; DROP", ["r00000"])


def test_nothing_asked_reads_nothing(filled):
    with filled.read() as conn:
        assert rows_where_in(conn, runs, "run_id", []) == [] == rows_where_in(conn, runs, "run_id", ["rnone"])
