"""Ends recorded together (supervisor/endings.py): every receipt whole, and one attempt's failure loses no other's.

The attempts run on an executor that reports the ends a test gives it (tests/given_ends.py), as the local
executor reports an `exit.json`: what is exercised is the supervisor's recording, on a real ledger.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import select

from given_ends import Given

from trackway.executors.base import JobPhase, JobStatus
from trackway.ledger import open_ledger
from trackway.ledger.records import list_attempts, resolve_run
from trackway.ledger.schema import attempt_events
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.loop import Supervisor
from trackway.supervisor.submit import RunSpec, submit_run


@pytest.fixture
def project(tmp_path, sqlite_url):
    executor = Given()
    settings = load_settings(home=tmp_path / "home", db=sqlite_url, cwd=tmp_path)
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings, executor_for=lambda name: executor)
    attempts = []
    for _ in range(5):
        run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, "train.py"], cwd=tmp_path))
        attempts.append(start_attempt(ledger, settings, run_id, executor))
    return executor, ledger, supervisor, attempts


def test_ends_of_one_tick_each_get_their_whole_receipt(project):
    executor, ledger, supervisor, attempts = project
    for number, attempt_id in enumerate(attempts):
        executor.ended[attempt_id] = 0 if number % 2 else 1
    ends = supervisor.tick()
    assert sorted(end.attempt_id for end in ends) == sorted(attempts)
    with ledger.read() as conn:
        rows = {row["attempt_id"]: row for row in list_attempts(conn, limit=None)}
        runs = {attempt_id: resolve_run(conn, attempt_id.split("/")[0]) for attempt_id in attempts}
    for number, attempt_id in enumerate(attempts):
        row = rows[attempt_id]
        assert row["state"] == "ended" and row["ended_at"] is not None
        assert row["termination_reason"] == ("completed" if number % 2 else "code_error")
        assert json.loads(row["retry_decision"])["action"]
        evidence = json.loads(row["termination_evidence"])
        assert evidence["exit_code"] == (0 if number % 2 else 1)
        if not number % 2:
            assert any("ValueError: bad batch" in line for line in evidence["lines"])
        assert runs[attempt_id]["state"] == ("completed" if number % 2 else "failed")
    assert supervisor.tick() == []  # recorded once


def test_an_end_that_cannot_be_read_leaves_every_other_receipt_recorded(project):
    executor, ledger, supervisor, attempts = project
    broken = attempts[2]
    with ledger.read() as conn:
        log = Path(next(row for row in list_attempts(conn, limit=None) if row["attempt_id"] == broken)["log_path"])
    log.unlink()
    log.mkdir()  # its log cannot be read as a file
    for attempt_id in attempts:
        executor.ended[attempt_id] = 0
    with pytest.raises(IsADirectoryError):
        supervisor.tick()
    with ledger.read() as conn:
        states = {row["attempt_id"]: row["state"] for row in list_attempts(conn, limit=None)}
    assert [states[a] for a in attempts if a != broken] == ["ended"] * 4
    assert states[broken] != "ended"  # not lost: the next tick tries it again
    log.rmdir()
    assert [end.attempt_id for end in supervisor.tick()] == [broken]


def test_runs_read_together_mask_each_runs_own_secrets(tmp_path, sqlite_url):
    """A supervisor meeting many running attempts at once reads their runs' secrets together: each run's
    events and receipt still have that run's own values masked, whatever the other runs hold."""
    executor = Given()
    settings = load_settings(home=tmp_path / "home", db=sqlite_url, cwd=tmp_path)
    ledger = open_ledger(sqlite_url)
    values = {}
    for number in range(4):
        value = f"kb-{number}-Vq3xTr8pLw"
        run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, "train.py"], cwd=tmp_path,
                                                       environ={"KB_PASSWORD": value}))
        values[start_attempt(ledger, settings, run_id, executor)] = value
    with ledger.read() as conn:
        rows = {row["attempt_id"]: row for row in list_attempts(conn, limit=None)}
    for attempt_id, value in values.items():
        spool = Path(rows[attempt_id]["state_dir"]) / "spool"
        spool.mkdir(parents=True, exist_ok=True)
        (spool / "events.jsonl").write_text(json.dumps(
            {"seq": 1, "kind": "said", "t": datetime.now(timezone.utc).timestamp(), "message": f"logged in as {value}"}
        ) + "\n")
        with Path(rows[attempt_id]["log_path"]).open("a") as log:
            log.write(f"ValueError: could not log in as {value}\n")

    supervisor = Supervisor(ledger, settings, executor_for=lambda name: executor)
    assert supervisor.tick() == []  # all running: their spools ingested
    for attempt_id in values:
        executor.ended[attempt_id] = 1
    assert len(supervisor.tick()) == len(values)

    with ledger.read() as conn:
        said = {attempt_id: payload for attempt_id, payload in conn.execute(
            select(attempt_events.c.attempt_id, attempt_events.c.payload).where(attempt_events.c.kind == "said"))}
        evidence = {row["attempt_id"]: row["termination_evidence"] for row in list_attempts(conn, limit=None)}
    assert said.keys() == values.keys()
    for attempt_id, value in values.items():
        assert value not in said[attempt_id] and "logged in as ***" in json.loads(said[attempt_id])["message"]
        assert value not in evidence[attempt_id] and "could not log in as ***" in evidence[attempt_id]


def test_a_runs_second_end_in_one_tick_waits_for_the_next_batch_and_the_order_holds():
    from trackway.supervisor.loop import end_batches

    ended = JobStatus(phase=JobPhase.ENDED, exit_code=1)
    ends = [({"run_id": run, "attempt_id": f"{run}/{n}"}, ended)
            for run, n in (("ra", 1), ("ra", 2), ("rb", 1), ("rc", 1), ("rd", 1))]
    batches = [[attempt["attempt_id"] for attempt, _ in batch] for batch in end_batches(ends, 3)]
    # ra's second end is decided after its first is recorded; nothing is dropped or repeated.
    assert batches == [["ra/1", "rb/1", "rc/1"], ["ra/2", "rd/1"]]
    assert [len(batch) for batch in end_batches(ends[2:], 2)] == [2, 1]
    # A smaller first batch: the oldest ends are written before the rest are even read.
    assert [len(batch) for batch in end_batches(ends[2:], 2, first=1)] == [1, 2]


def test_each_end_of_a_batch_is_decided_from_its_runs_attempts_as_they_are_with_it(tmp_path, sqlite_url):
    from trackway.supervisor.retry import attempts_of_runs, decide_ends

    # One retry of a code error: each run's first failure resumes it; its second, the same failure, stops it.
    (tmp_path / "trackway.toml").write_text('[retry.reasons.code_error]\naction = "resume"\nbudget = 1\n'
                                            'backoff_seconds = 0\n')
    executor = Given()
    settings = load_settings(home=tmp_path / "home", db=sqlite_url, cwd=tmp_path)
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings, executor_for=lambda name: executor)
    # A tick launches due retries until its time budget is spent, then leaves the rest to the next; on a machine
    # slowed enough, that was after the first of these four. What is tested here is the decisions, not the budget.
    supervisor.tick_budget_s = 60.0
    run_ids = [submit_run(ledger, settings, RunSpec(command=[sys.executable, "train.py"], cwd=tmp_path))
               for _ in range(4)]
    for run_id in run_ids:
        executor.ended[start_attempt(ledger, settings, run_id, executor)] = 1
    assert len(supervisor.tick()) == 4  # which also launched the retries, due at once
    with ledger.read() as conn:
        assert {row["attempt_id"] for row in list_attempts(conn, limit=None)} == {
            f"{run_id}/{number}" for run_id in run_ids for number in (1, 2)}
    for run_id in run_ids:
        executor.ended[f"{run_id}/2"] = 1
    ends = supervisor.tick()
    assert sorted(end.attempt_id for end in ends) == sorted(f"{run_id}/2" for run_id in run_ids)
    with ledger.read() as conn:
        rows = {row["attempt_id"]: row for row in list_attempts(conn, limit=None)}
        runs = {run_id: resolve_run(conn, run_id) for run_id in run_ids}
        # What the batch wrote is what deciding again from the ledger as it now is gives.
        again = decide_ends(settings, [(runs[run_id], f"{run_id}/2", None) for run_id in run_ids],
                            attempts_of_runs(conn, run_ids))
    for run_id in run_ids:
        first, second = (json.loads(rows[f"{run_id}/{number}"]["retry_decision"]) for number in (1, 2))
        assert (first["action"], first["rule"]) == ("resume", "code_error: resume (1 of 1)")
        assert (second["action"], second["rule"]) == ("stop", "code_error: the same failure again")  # read off both
        assert second == again.decisions[f"{run_id}/2"].as_record()
        assert runs[run_id]["state"] == "failed" and runs[run_id]["termination_reason"] == "code_error"
        assert rows[f"{run_id}/2"]["termination_reason"] == "code_error" and rows[f"{run_id}/2"]["gpu_seconds"] >= 0


def test_the_cycle_collector_is_paused_for_a_burst_and_left_as_it_was_found():
    import gc

    from trackway.supervisor.loop import collector_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a batch that failed")
    assert gc.isenabled()  # on again, whatever ended the burst
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a process that had it off keeps it off
    finally:
        gc.enable()


def test_a_tick_runs_with_the_cycle_collector_paused_and_leaves_it_on(project):
    """What a tick reads of thousands of attempts is not counted over and over by the collector while it runs."""
    import gc

    executor, ledger, supervisor, attempts = project
    seen = []

    class Looks:
        def tick(self, supervisor):
            seen.append(gc.isenabled())
            return []

        def settle(self, timeout):
            pass

    supervisor.duties = (Looks(),)
    executor.ended[attempts[0]] = 1
    assert [end.attempt_id for end in supervisor.tick()] == [attempts[0]]
    assert seen == [False] and gc.isenabled()

    def broken(handles):
        raise RuntimeError("an executor's bug")

    executor.poll_many = broken
    with pytest.raises(RuntimeError):
        supervisor.tick()
    assert gc.isenabled()  # on again after a tick that failed


def test_an_end_is_decided_by_its_own_projects_retry_policy_not_the_supervisors(tmp_path, sqlite_url):
    # A supervisor started in another project (a background one, say) decides each run's retry by the
    # [retry] of the project the run was submitted from, as it prices and places it.
    supervising, project = tmp_path / "elsewhere", tmp_path / "project"
    supervising.mkdir()
    project.mkdir()
    (project / "trackway.toml").write_text('[retry.reasons.code_error]\naction = "resume"\nbudget = 1\n'
                                           'backoff_seconds = 600\n')
    executor = Given()
    ledger = open_ledger(sqlite_url)
    own = load_settings(home=tmp_path / "home", db=sqlite_url, cwd=project)
    run_id = submit_run(ledger, own, RunSpec(command=[sys.executable, "train.py"], cwd=project))
    executor.ended[start_attempt(ledger, own, run_id, executor)] = 1
    supervisor = Supervisor(ledger, load_settings(home=tmp_path / "home", db=sqlite_url, cwd=supervising),
                            executor_for=lambda name: executor)
    [end] = supervisor.tick()
    assert (end.decision.action, end.decision.rule) == ("resume", "code_error: resume (1 of 1)")
    with ledger.read() as conn:
        assert resolve_run(conn, run_id)["state"] == "queued"  # held back by its project's backoff
