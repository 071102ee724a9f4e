"""A burst of ends recorded by two processes (supervisor/burst_split.py): every receipt once, whatever the child does.

A real fork and a real ledger, SQLite and PostgreSQL; the burst is made small by lowering
SPLIT_MIN_ENDS, and the batches small so that a child can be stopped between two of its commits.
The check that this process runs no other thread is taken as met, except where it is what is tested:
a test runner may keep a thread of its own.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from given_ends import Given

from trackway.errors import LedgerError
from trackway.executors.base import JobPhase, JobStatus
from trackway.ledger import open_ledger
from trackway.ledger.records import list_attempts
from trackway.settings import load_settings
from trackway.supervisor import burst_split, loop
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.loop import Supervisor
from trackway.supervisor.submit import RunSpec, submit_run

ATTEMPTS = 8


@pytest.fixture
def split(monkeypatch):
    """Bursts of 4 ends or more split; the helpers forked, as they were made."""
    monkeypatch.setattr(burst_split, "SPLIT_MIN_ENDS", 4)
    monkeypatch.setattr(burst_split, "_only_thread", lambda: True)
    monkeypatch.setattr(burst_split, "usable_cores", lambda: 2)
    helpers: list[burst_split.Helper] = []

    class Seen(burst_split.Helper):
        def __init__(self, work, ledger):
            super().__init__(work, ledger)
            helpers.append(self)

    monkeypatch.setattr(burst_split, "Helper", Seen)
    return helpers


def _burst(tmp_path: Path, url: str, code: int = 1):
    executor = Given()
    settings = load_settings(home=tmp_path / "home", db=url, cwd=tmp_path)
    ledger = open_ledger(url)
    supervisor = Supervisor(ledger, settings, executor_for=lambda name: executor)
    attempts = [start_attempt(ledger, settings, submit_run(ledger, settings, RunSpec(
        command=[sys.executable, "train.py"], cwd=tmp_path)), executor) for _ in range(ATTEMPTS)]
    for attempt_id in attempts:
        executor.ended[attempt_id] = code
    return ledger, supervisor, attempts


def _rows(ledger) -> dict[str, dict]:
    with ledger.read() as conn:
        return {row["attempt_id"]: dict(row) for row in list_attempts(conn, limit=None)}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_burst_split_in_two_records_every_end_once_with_its_whole_receipt(backend, split, tmp_path, request):
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    ledger, supervisor, attempts = _burst(tmp_path, url)
    ends = supervisor.tick()
    [helper] = split
    assert helper.pid != os.getpid() and helper.ended_how == "exit status 0"
    # Every end answered for once, the child's half included, each with its receipt and its decision.
    assert sorted(end.attempt_id for end in ends) == sorted(attempts)
    rows = _rows(ledger)
    for attempt_id in attempts:
        row = rows[attempt_id]
        assert row["state"] == "ended" and row["termination_reason"] == "code_error"
        assert json.loads(row["retry_decision"])["action"] and row["gpu_seconds"] is not None
        assert "ValueError: bad batch" in row["termination_evidence"]
    # This process's connections still answer: the child took its own and closed none of those it was copied
    # (on PostgreSQL, closing a copy would have ended this process's session).
    assert len(_rows(ledger)) == ATTEMPTS
    assert supervisor.tick() == []


def test_the_runs_of_a_burst_are_split_whole_and_in_order():
    ended = JobStatus(phase=JobPhase.ENDED, exit_code=1)
    burst = [({"run_id": run, "attempt_id": f"{run}/{n}"}, ended)
             for run, n in (("ra", 1), ("rb", 1), ("ra", 2), ("rc", 1), ("rd", 1), ("rc", 2), ("re", 1))]
    mine, theirs = burst_split.by_run(burst)
    assert [a["attempt_id"] for a, _ in mine] == ["ra/1", "ra/2", "rc/1", "rc/2", "re/1"]
    assert [a["attempt_id"] for a, _ in theirs] == ["rb/1", "rd/1"]


def test_a_burst_is_not_split_where_forking_is_not_safe_or_not_worth_it(sqlite_url, monkeypatch):
    monkeypatch.setattr(burst_split, "usable_cores", lambda: 2)
    ledger = open_ledger(sqlite_url)
    many = burst_split.SPLIT_MIN_ENDS
    monkeypatch.setattr(burst_split, "_only_thread", lambda: True)
    assert burst_split.worth_splitting(many, ledger)
    assert not burst_split.worth_splitting(many - 1, ledger)  # a small burst: one process
    with ledger.read():
        assert not burst_split.worth_splitting(many, ledger)  # a connection in use would be copied mid-transaction
    monkeypatch.setattr(burst_split, "usable_cores", lambda: 1)
    assert not burst_split.worth_splitting(many, ledger)  # one core: the two would take turns
    monkeypatch.undo()
    monkeypatch.setattr(burst_split, "usable_cores", lambda: 2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not burst_split.worth_splitting(many, ledger)  # another thread could hold a lock the child copies
    finally:
        stop.set()
        other.join()


def test_a_child_killed_between_its_commits_loses_no_receipt(split, tmp_path, sqlite_url, monkeypatch):
    # Batches of two: the child commits its first, then is killed (SIGKILL) before its second.
    monkeypatch.setattr(loop, "FIRST_END_BATCH", 2)
    monkeypatch.setattr(loop, "END_BATCH", 2)
    ledger, supervisor, attempts = _burst(tmp_path, sqlite_url)
    parent, killed = os.getpid(), tmp_path / "killed"
    recorded = loop.record_ends

    def record_then_die(*args):
        ends = recorded(*args)
        if os.getpid() != parent and not killed.exists():
            killed.touch()  # once: the child of the next tick is left alone
            os.kill(os.getpid(), signal.SIGKILL)
        return ends

    monkeypatch.setattr(loop, "record_ends", record_then_die)
    ends = supervisor.tick()
    assert split[0].ended_how == f"killed by signal {int(signal.SIGKILL)}"
    assert len(ends) == ATTEMPTS // 2  # this process's half, answered for
    [said] = [message for _, message in supervisor.findings if "ended without an answer" in message]
    assert "the next tick records the rest" in said
    ended = {a for a, row in _rows(ledger).items() if row["state"] == "ended"}
    assert len(ended) == ATTEMPTS // 2 + 2  # the child's first batch was committed before it was killed
    later = supervisor.tick()
    assert sorted(end.attempt_id for end in later) == sorted(set(attempts) - ended)
    rows = _rows(ledger)
    assert all(rows[a]["state"] == "ended" and rows[a]["retry_decision"] for a in attempts)


def test_an_error_in_the_child_is_raised_after_every_other_end_is_recorded(split, tmp_path, sqlite_url, monkeypatch):
    ledger, supervisor, attempts = _burst(tmp_path, sqlite_url)
    parent, prepare = os.getpid(), loop.prepare_end
    failed: list[str] = []

    def fails_in_the_child(ledger, settings, attempt, *args):
        if os.getpid() != parent and not failed:
            failed.append(attempt["attempt_id"])
            Path(tmp_path / "failed").write_text(attempt["attempt_id"])
            raise ValueError("its files could not be read")
        return prepare(ledger, settings, attempt, *args)

    monkeypatch.setattr(loop, "prepare_end", fails_in_the_child)
    with pytest.raises(ValueError, match="its files could not be read") as raised:
        supervisor.tick()
    assert any("in the child recording part of a burst of ends" in note for note in raised.value.__notes__)
    broken = (tmp_path / "failed").read_text()
    rows = _rows(ledger)
    assert [a for a in attempts if rows[a]["state"] != "ended"] == [broken]  # not lost: the next tick tries it
    monkeypatch.setattr(loop, "prepare_end", prepare)
    assert [end.attempt_id for end in supervisor.tick()] == [broken]


def test_an_error_that_does_not_unpickle_comes_back_as_its_name_and_text():
    import pickle

    class Odd(LedgerError):
        def __init__(self, url, why):
            super().__init__(f"{url}: {why}")

    answer = burst_split.Answer([], Odd("sqlite:///l.db", "disk full"))
    back = pickle.loads(burst_split._pickled(answer)).failure
    assert isinstance(back, LedgerError)  # still the ledger's failure: a supervisor waits and tries again
    assert str(back) == "Odd: sqlite:///l.db: disk full"
    assert "in the child recording part of a burst of ends" in back.__notes__[0]
    plain = pickle.loads(burst_split._pickled(burst_split.Answer([], KeyError("attempt_id")))).failure
    assert isinstance(plain, KeyError)  # one that unpickles comes back as it was
