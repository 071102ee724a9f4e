"""start_attempt's steps one at a time (supervisor/launch.py): plan, claim, submit, record.

Each step is driven alone against a real SQLite ledger and a real executor (local, or inline,
which refuses every launch), to show what a person reading the ledger sees at that point: a
claim that loses the race leaves no trace, a launch that fails ends its attempt with the
reason, and the executor's late answer never revives an attempt a supervisor already ended.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select, update

from trackway.errors import ExecutorError, InputError
from trackway.executors.inline import InlineExecutor
from trackway.ledger import open_ledger
from trackway.ledger.records import list_attempts, resolve_run
from trackway.ledger.schema import attempt_events, attempts
from trackway.settings import load_settings
from trackway.supervisor.launch import (
    build_request,
    claim_attempt,
    plan_attempt,
    record_started,
    submit_attempt,
)
from trackway.supervisor.loop import Supervisor
from trackway.supervisor.submit import RunSpec, submit_run


class Project:
    """A working directory with a config file, a ledger, a supervisor (ticked by the test) and one run."""

    def __init__(self, tmp_path: Path, db_url: str):
        self.work = tmp_path / "work"
        self.work.mkdir(exist_ok=True)
        (self.work / "config.json").write_text(json.dumps({"lr": 0.1}))
        self.settings = load_settings(home=tmp_path / "home", db=db_url, cwd=self.work)
        self.ledger = open_ledger(db_url)
        self.supervisor = Supervisor(self.ledger, self.settings)

    def submit(self) -> str:
        spec = RunSpec(command=[sys.executable, "-c", "pass"], cwd=self.work, config_path=str(self.work / "config.json"))
        return submit_run(self.ledger, self.settings, spec)

    def plan(self, run_id: str, **options):
        return plan_attempt(self.ledger, self.settings, run_id, self.supervisor.executor, **options)

    def attempts(self, run_id: str) -> list:
        with self.ledger.read() as conn:
            return list_attempts(conn, run_id=run_id)

    def run(self, run_id: str):
        with self.ledger.read() as conn:
            return resolve_run(conn, run_id)

    def events(self, attempt_id: str) -> list[str]:
        with self.ledger.read() as conn:
            return list(conn.execute(select(attempt_events.c.kind).where(attempt_events.c.attempt_id == attempt_id))
                        .scalars())


@pytest.fixture
def project(tmp_path, sqlite_url):
    made = Project(tmp_path, sqlite_url)
    yield made
    made.ledger.dispose()


@pytest.mark.parametrize("race", ["first", "from_queue"])
def test_a_claim_that_loses_the_race_records_nothing(project, race):
    # Two launchers planned the same attempt: a submitter and a supervisor that adopted its run
    # (`first`), or two supervisors taking the same run off the queue (`from_queue`).
    run_id = project.submit()
    winner, loser = project.plan(run_id, **{race: True}), project.plan(run_id, **{race: True})
    claimed = claim_attempt(project.ledger, project.settings, winner, **{race: True})
    assert claimed is not None and claimed.attempt_id == f"{run_id}/1"
    assert claim_attempt(project.ledger, project.settings, loser, **{race: True}) is None
    (only,) = project.attempts(run_id)
    assert (only["attempt_id"], only["state"]) == (f"{run_id}/1", "starting")
    assert project.run(run_id)["state"] == "running"
    # A retry off the queue is credited to the supervisor when no one else is named.
    assert only["started_by"] == ("supervisor" if race == "from_queue" else None)


def test_a_claim_records_the_attempt_starting_before_any_file_is_written(project):
    run_id = project.submit()
    claimed = claim_attempt(project.ledger, project.settings, project.plan(run_id, first=True), first=True)
    (attempt,) = project.attempts(run_id)
    assert attempt["state"] == "starting" and attempt["executor_job_id"] is None
    assert attempt["state_dir"] == str(claimed.state_dir)
    assert not claimed.state_dir.exists()  # the files come after the transaction: submit_attempt writes them


def test_the_request_reads_the_attempts_own_config_when_set_changed_it(project):
    run_id = project.submit()
    plan = project.plan(run_id, overrides=["lr=0.01"])
    claimed = claim_attempt(project.ledger, project.settings, plan)
    built = build_request(project.settings, plan, claimed)
    own = claimed.state_dir / "config.json"
    assert built.request.env["TRACKWAY_CONFIG"] == str(own)
    assert json.loads(own.read_text()) == {"lr": 0.01}
    assert json.loads((project.work / "config.json").read_text()) == {"lr": 0.1}  # the submitted file untouched
    assert built.request.env["TRACKWAY_ATTEMPT_ID"] == claimed.attempt_id


def test_a_launch_the_executor_refuses_ends_the_attempt_with_the_executors_words(project):
    run_id = project.submit()
    # The inline executor refuses every launch: runs a script recorded by itself cannot be started again.
    plan = replace(project.plan(run_id, first=True), executor=InlineExecutor(project.settings.home))
    claimed = claim_attempt(project.ledger, project.settings, plan, first=True)
    with pytest.raises(InputError) as refused:
        submit_attempt(project.ledger, project.settings, plan, claimed)
    (attempt,) = project.attempts(run_id)
    evidence = json.loads(attempt["termination_evidence"])
    assert attempt["state"] == "ended" and attempt["termination_reason"] == "config_error"
    assert evidence["rule"] == "executor:submit-refused" and evidence["lines"] == [str(refused.value)]
    assert "cannot be relaunched by trackway" in evidence["lines"][0]
    assert attempt["gpu_seconds"] == 0.0  # nothing ran
    assert json.loads(attempt["retry_decision"])["action"] == "stop"
    assert project.run(run_id)["state"] == "failed"


def test_a_launch_whose_files_cannot_be_written_ends_the_attempt_and_is_retried(project):
    run_id = project.submit()
    plan = project.plan(run_id, first=True)
    claimed = claim_attempt(project.ledger, project.settings, plan, first=True)
    claimed.state_dir.parent.parent.mkdir(parents=True, exist_ok=True)
    claimed.state_dir.parent.write_text("")  # `attempts` is a file: the attempt's directory cannot be made
    with pytest.raises(ExecutorError) as failed:
        submit_attempt(project.ledger, project.settings, plan, claimed)
    assert str(failed.value).startswith(f"attempt {claimed.attempt_id}: the launch failed: Not a directory: ")
    (attempt,) = project.attempts(run_id)
    evidence = json.loads(attempt["termination_evidence"])
    assert attempt["termination_reason"] == "infra_transient"
    assert evidence["lines"] == [str(failed.value)] and "disk_full" not in evidence
    decision = json.loads(attempt["retry_decision"])
    assert (decision["action"], decision["rule"]) == ("resume", "infra_transient: resume (1 of 3)")
    assert project.run(run_id)["state"] == "queued"


def test_the_executors_late_answer_leaves_an_attempt_a_supervisor_ended_ended(project):
    run_id = project.submit()
    plan = project.plan(run_id, first=True)
    claimed = claim_attempt(project.ledger, project.settings, plan, first=True)
    with project.ledger.write() as conn:  # the launcher stalled long enough for a supervisor to give up on it
        conn.execute(update(attempts).where(attempts.c.attempt_id == claimed.attempt_id)
                     .values(started_at=datetime.now(timezone.utc) - timedelta(minutes=10)))
    (end,) = project.supervisor.tick()
    assert end.attempt_id == claimed.attempt_id and end.reason.value == "infra_transient"
    launched = submit_attempt(project.ledger, project.settings, plan, claimed)  # the launcher wakes up
    record_started(project.ledger, claimed, launched)
    (attempt,) = project.attempts(run_id)
    assert attempt["state"] == "ended" and attempt["executor_job_id"] is None
    assert "launch was interrupted" in json.loads(attempt["termination_evidence"])["executor"][0]


def test_a_started_attempt_is_recorded_running_with_what_its_executor_said(project):
    run_id = project.submit()
    plan = project.plan(run_id, first=True)
    claimed = claim_attempt(project.ledger, project.settings, plan, first=True)
    launched = submit_attempt(project.ledger, project.settings, plan, claimed)
    (attempt,) = project.attempts(run_id)
    assert attempt["state"] == "starting"  # handed over, not yet recorded
    record_started(project.ledger, claimed, launched)
    (attempt,) = project.attempts(run_id)
    assert attempt["state"] == "running"
    assert attempt["executor_job_id"] == launched.submission.handle.job_id
    assert attempt["host"] == launched.submission.host
