"""A test run inside a real attempt: the SDK stops it at TRACKWAY_MAX_STEPS, completed, and reads its checkpoint back."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from trackway.ledger import open_ledger
from trackway.ledger.records import get_attempt
from trackway.ledger.schema import attempt_events
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

SCRIPT = str(Path(__file__).parent / "scripts" / "gated_loop.py")
TEST_RUN_ENV = {"TRACKWAY_MAX_STEPS": "5", "TRACKWAY_RESTORE_CHECK": "1"}


@pytest.fixture
def env(home, sqlite_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    yield settings, ledger, Supervisor(ledger, settings)
    ledger.dispose()


def _run_to_end(env, mode: str, extra: dict[str, str] | None = None) -> tuple[dict, list[dict]]:
    settings, ledger, supervisor = env
    spec = RunSpec(command=[sys.executable, SCRIPT, mode], cwd=Path.cwd(), kind="test", env={**TEST_RUN_ENV, **(extra or {})})
    run_id = submit_run(ledger, settings, spec)
    attempt_id = start_attempt(ledger, settings, run_id, supervisor.executor("local"))
    deadline = time.time() + 90
    while time.time() < deadline:
        supervisor.tick()
        with ledger.read() as conn:
            attempt = get_attempt(conn, attempt_id)
        if attempt["state"] == "ended":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"{attempt_id} did not end")
    with ledger.read() as conn:
        events = [json.loads(p) for (p,) in conn.execute(
            select(attempt_events.c.payload).where(attempt_events.c.attempt_id == attempt_id)
            .order_by(attempt_events.c.rank, attempt_events.c.seq))]
    return dict(attempt), events


def test_a_test_run_stops_at_its_max_steps_completed_with_its_checkpoint_read_back(env):
    attempt, events = _run_to_end(env, "canonical")
    assert attempt["termination_reason"] == "completed" and attempt["exit_code"] == 0
    assert (attempt["first_step"], attempt["last_step"]) == (1, 5)
    assert attempt["checkpoints_committed"] == 1
    (check,) = [e for e in events if e["kind"] == "restore_check"]
    assert check["ok"] is True and check["step"] == 5 and check["problem"] is None
    # Model (weight, bias), AdamW's step/exp_avg/exp_avg_sq per parameter and its hyperparameters, the data state.
    assert check["compared"] >= 8
    assert any(e["kind"] == "max_steps_reached" and e["max_steps"] == 5 for e in events)


def test_a_script_that_ignores_should_stop_is_ended_at_the_next_step(env):
    attempt, events = _run_to_end(env, "ignores")
    assert attempt["termination_reason"] == "completed" and attempt["exit_code"] == 0
    assert attempt["last_step"] == 5  # the step past the max is never logged
    assert not [e for e in events if e["kind"] == "restore_check"]  # nothing was saved: the gate will say so


def test_a_checkpoint_written_as_files_is_verified_byte_for_byte(env):
    attempt, events = _run_to_end(env, "writing")
    assert attempt["termination_reason"] == "completed"
    (check,) = [e for e in events if e["kind"] == "restore_check"]
    assert check["ok"] is True and check["compared"] == 1


def test_a_state_that_does_not_round_trip_is_reported(env):
    attempt, events = _run_to_end(env, "drifting")
    (check,) = [e for e in events if e["kind"] == "restore_check"]
    assert check["ok"] is False
    assert check["problem"] in ("model.weight read back differs from what was saved",
                                "model.bias read back differs from what was saved")


def test_without_the_variables_the_loop_runs_to_its_own_end(env):
    attempt, events = _run_to_end(env, "ignores", {"TRACKWAY_MAX_STEPS": "", "TRACKWAY_RESTORE_CHECK": "0"})
    assert attempt["last_step"] == 999 and attempt["termination_reason"] == "completed"
    assert not [e for e in events if e["kind"] in ("restore_check", "max_steps_reached")]
