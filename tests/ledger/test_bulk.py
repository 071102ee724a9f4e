"""Rows read by id and rows updated through the driver (`ledger.bulk`) are what `select` reads and `update` stores,
on both backends."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from trackway.ledger.bulk import IN_CHUNK, rows_where_in, update_many
from trackway.ledger.records import insert_attempt, insert_run
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
    import trackway.ledger.bulk as records

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


def _end_values(i: int) -> dict:
    # A time given in another zone, stored in UTC as select/update store it; a value unset; a float.
    return dict(state="ended", ended_at=datetime(2026, 11, 29, 14, 0, i, 250000, tzinfo=timezone(timedelta(hours=2))),
                gpu_seconds=3600.5 + i, signal=None, exit_code=3, termination_reason="code_error",
                termination_evidence='{"rule": "log:traceback"}')


def _stored(conn, attempt_ids):
    """Each attempt's row as select reads it, and its time as the database holds it."""
    rows = {row["attempt_id"]: dict(row) for row in conn.execute(
        select(attempts).where(attempts.c.attempt_id.in_(attempt_ids))).mappings()}
    held = dict(conn.execute(select(attempts.c.attempt_id, attempts.c.ended_at.cast(attempts.c.log_path.type))
                             .where(attempts.c.attempt_id.in_(attempt_ids))).all())
    return rows, held


def test_rows_updated_through_the_driver_hold_what_an_update_statement_stores(filled, monkeypatch):
    import trackway.ledger.bulk as bulk

    with filled.write() as conn:
        update_many(conn, attempts, "attempt_id", [{"attempt_id": f"r{i:05d}/1", **_end_values(i)} for i in (21, 22)])
        for i in (23, 24):
            conn.execute(update(attempts).where(attempts.c.attempt_id == f"r{i:05d}/1").values(**_end_values(i - 2)))
        monkeypatch.setattr(bulk, "_POSITIONAL", {})  # a driver of another style: through SQLAlchemy
        update_many(conn, attempts, "attempt_id", [{"attempt_id": "r00025/1", **_end_values(21)}])
        rows, held = _stored(conn, [f"r{i:05d}/1" for i in range(21, 26)])

    def ended(row):
        return {key: row[key] for key in _end_values(0)}

    assert ended(rows["r00021/1"]) == ended(rows["r00023/1"]) == ended(rows["r00025/1"]) != ended(rows["r00022/1"])
    assert ended(rows["r00022/1"]) == ended(rows["r00024/1"])
    assert rows["r00021/1"]["ended_at"] == datetime(2026, 11, 29, 12, 0, 21, 250000, tzinfo=timezone.utc)
    assert held["r00021/1"] == held["r00023/1"] == held["r00025/1"]  # the same text on SQLite, not just the same time
    assert rows["r00021/1"]["state_dir"] == "/s" and rows["r00021/1"]["gpu_count"] == 1  # the rest as it was


@pytest.mark.parametrize("when", [
    datetime(2026, 11, 29, 15, 0, 0, tzinfo=timezone.utc),  # on a whole second: its microseconds are written too
    datetime(2026, 11, 29, 15, 0, 1, 7),  # naive: taken for UTC
    datetime(2026, 11, 30, 1, 0, 2, 999999, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),  # the next day in UTC
], ids=["whole-second", "naive", "other-zone"])
def test_a_time_is_held_as_the_text_an_update_statement_stores(filled, when):
    with filled.write() as conn:
        update_many(conn, attempts, "attempt_id", [{"attempt_id": "r00031/1", "ended_at": when}])
        conn.execute(update(attempts).where(attempts.c.attempt_id == "r00032/1").values(ended_at=when))
        rows, held = _stored(conn, ["r00031/1", "r00032/1"])
    assert held["r00031/1"] == held["r00032/1"]
    assert rows["r00031/1"]["ended_at"] == rows["r00032/1"]["ended_at"] == when.replace(tzinfo=when.tzinfo or timezone.utc)


def test_a_row_holding_the_unless_value_is_left_as_it_is(filled):
    with filled.write() as conn:
        conn.execute(update(attempts).where(attempts.c.attempt_id == "r00031/1").values(state="ended", exit_code=0))
        update_many(conn, attempts, "attempt_id",
                    [{"attempt_id": f"r{i:05d}/1", "state": "ended", "exit_code": 9} for i in (31, 32)],
                    unless=("state", "ended"))
        codes = dict(conn.execute(select(attempts.c.attempt_id, attempts.c.exit_code)
                                  .where(attempts.c.attempt_id.in_(["r00031/1", "r00032/1"]))).all())
    assert codes == {"r00031/1": 0, "r00032/1": 9}


def test_an_update_names_only_the_tables_own_columns(filled):
    with filled.write() as conn, pytest.raises(ValueError, match="not columns of attempts: exit_code = 0 --"):
        update_many(conn, attempts, "attempt_id", [{"attempt_id": "r00033/1", "exit_code = 0 --": 1}])


def test_a_few_columns_are_read_as_select_reads_them(filled, monkeypatch):
    import trackway.ledger.bulk as bulk

    wanted = ["r00000", "r00001"]
    with filled.read() as conn:
        few = rows_where_in(conn, attempts, "run_id", wanted, order_by=("run_id", "attempt_number"),
                            columns=("attempt_id", "started_at"))
        monkeypatch.setattr(bulk, "_POSITIONAL", {})
        assert rows_where_in(conn, attempts, "run_id", wanted, order_by=("run_id", "attempt_number"),
                             columns=("attempt_id", "started_at")) == few
        with pytest.raises(ValueError, match="not columns of attempts: started_at, 1"):
            rows_where_in(conn, attempts, "run_id", wanted, columns=("started_at, 1",))
    assert few == [{"attempt_id": "r00000/1", "started_at": BASE + timedelta(minutes=1)},
                   {"attempt_id": "r00000/2", "started_at": BASE + timedelta(minutes=2)},
                   {"attempt_id": "r00001/1", "started_at": BASE + timedelta(minutes=1)}]


def test_rows_read_for_update_stay_locked_until_their_transaction_ends(filled):
    from sqlalchemy.exc import DBAPIError

    if filled.dialect != "postgresql":
        pytest.skip("a SQLite writer holds the whole database (BEGIN IMMEDIATE): there are no rows to lock")
    ask = "SELECT attempt_id FROM attempts WHERE run_id = %s FOR UPDATE NOWAIT"
    with filled.write() as conn:
        assert len(rows_where_in(conn, attempts, "run_id", ["r00040"], for_update=True)) == 2
        with filled.engine.connect() as other:
            with pytest.raises(DBAPIError, match="lock"):
                other.exec_driver_sql(ask, ("r00040",))
            other.rollback()
            assert other.exec_driver_sql(ask, ("r00041",)).all() == [("r00041/1",)]  # the others are free
            other.rollback()
    with filled.engine.connect() as other:
        assert len(other.exec_driver_sql(ask, ("r00040",)).all()) == 2  # free once it ended
        other.rollback()
