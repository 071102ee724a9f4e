"""The supervisor survives itself: kill -9 and restart adopts what runs; two supervisors never launch a duplicate."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from trackway.ledger import open_ledger
from trackway.ledger.schema import attempts, runs

SCRIPT = str(Path(__file__).resolve().parents[1] / "cli" / "scripts" / "neutral.py")
RUNS = 8


def _trackway(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trackway", *args], capture_output=True, text=True, timeout=120)


def _supervisor() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trackway", "supervise", "--interval", "0.05"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _submit_preemptible_runs() -> None:
    for i in range(RUNS):
        done = _trackway("submit", "--detach", "--name", f"job{i}", "--", sys.executable, SCRIPT, "60", "--preempt-at", "20,40")
        assert done.returncode == 0, done.stderr


def _wait_all_completed(url: str, timeout: float = 180) -> None:
    ledger = open_ledger(url)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            with ledger.read() as conn:
                states = list(conn.execute(select(runs.c.state)).scalars())
            if states and all(state in ("completed", "failed", "cancelled") for state in states):
                return
            time.sleep(0.2)
        raise AssertionError(f"runs did not finish: {states}")
    finally:
        ledger.dispose()


def _assert_every_run_took_exactly_three_attempts(url: str) -> None:
    ledger = open_ledger(url)
    with ledger.read() as conn:
        per_run = dict(conn.execute(select(attempts.c.run_id, func.count()).group_by(attempts.c.run_id)).all())
        reasons = list(conn.execute(select(attempts.c.termination_reason).order_by(attempts.c.attempt_id)).scalars())
        states = set(conn.execute(select(runs.c.state)).scalars())
    ledger.dispose()
    assert states == {"completed"}
    assert sorted(per_run.values()) == [3] * RUNS, per_run  # no duplicate, no lost attempt
    assert reasons.count("preempted") == 2 * RUNS and reasons.count("completed") == RUNS


@pytest.fixture
def env(home, monkeypatch):
    def use(url: str) -> str:
        monkeypatch.setenv("TRACKWAY_DB", url)
        open_ledger(url).dispose()
        return url

    return use


def test_kill_9_the_supervisor_and_start_another(env, sqlite_url):
    url = env(sqlite_url)
    first = _supervisor()
    _submit_preemptible_runs()
    time.sleep(1.5)  # some runs are mid-retry now
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = _supervisor()
    try:
        _wait_all_completed(url)
    finally:
        second.terminate()
        second.wait(10)
    _assert_every_run_took_exactly_three_attempts(url)


def test_two_supervisors_on_postgresql(env, pg_url):
    url = env(pg_url)
    supervisors = [_supervisor(), _supervisor()]
    try:
        _submit_preemptible_runs()
        _wait_all_completed(url)
    finally:
        for s in supervisors:
            s.terminate()
            s.wait(10)
    _assert_every_run_took_exactly_three_attempts(url)


def test_a_launch_interrupted_before_the_executor_took_it_is_ended_and_retried(home, sqlite_url, monkeypatch):
    import json
    from datetime import datetime, timedelta, timezone

    from trackway.ledger.records import insert_attempt, list_attempts
    from trackway.settings import load_settings
    from trackway.supervisor.submit import RunSpec, submit_run
    from trackway.supervisor.loop import Supervisor

    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, "-c", "pass"], cwd=Path.cwd()))
    with ledger.write() as conn:  # what a launcher killed between recording and handing over leaves
        insert_attempt(conn, dict(run_id=run_id, attempt_number=1, state="starting", executor="local",
                                  state_dir=str(settings.runs_dir / run_id / "attempts" / "1"),
                                  log_path=str(settings.runs_dir / run_id / "attempts" / "1" / "output.log"),
                                  gpu_count=0, started_at=datetime.now(timezone.utc) - timedelta(minutes=10)))
    supervisor = Supervisor(ledger, settings)
    (end,) = supervisor.tick()
    assert end.reason.value == "infra_transient" and end.decision.action == "resume"
    with ledger.read() as conn:
        first = list_attempts(conn, run_id=run_id)[0]
        assert "launch was interrupted" in json.loads(first["termination_evidence"])["executor"][0]
        run = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().one()
    assert run["state"] == "queued" and end.decision.delay_s == 30.0  # retried after the transient backoff
    ledger.dispose()
