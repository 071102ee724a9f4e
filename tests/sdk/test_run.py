"""The SDK inside real attempts: logging lands in the ledger, and every way a script ends is told apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from trackway.ledger import open_ledger
from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.reader import Reader
from trackway.ledger.records import get_attempt, latest_attempt, resolve_run
from trackway.ledger.schema import attempt_events
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

from logged_points import logged_points  # noqa: E402  (tests/sdk is on sys.path under importlib mode via conftest)

SCRIPT = str(Path(__file__).parent / "scripts" / "sdk_script.py")


@pytest.fixture
def env(home, ledger_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", ledger_url)
    settings = load_settings()
    ledger = open_ledger(ledger_url)
    supervisor = Supervisor(ledger, settings)
    yield settings, ledger, supervisor
    ledger.dispose()


def _launch(env, *args: str) -> tuple[str, str]:
    settings, ledger, supervisor = env
    run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, SCRIPT, *args], cwd=Path.cwd()))
    return run_id, start_attempt(ledger, settings, run_id, supervisor.executor("local"))


def _wait_end(env, attempt_id: str, timeout: float = 60):
    _, ledger, supervisor = env
    deadline = time.time() + timeout
    while time.time() < deadline:
        supervisor.tick()
        with ledger.read() as conn:
            attempt = get_attempt(conn, attempt_id)
        if attempt["state"] == "ended":
            return attempt
        time.sleep(0.1)
    raise AssertionError(f"{attempt_id} did not end")


def test_logged_metrics_land_in_the_ledger_once(env):
    run_id, attempt_id = _launch(env, "ok", "200")
    attempt = _wait_end(env, attempt_id)
    assert attempt["termination_reason"] == "completed"
    assert (attempt["first_step"], attempt["last_step"]) == (0, 199)
    assert attempt["last_heartbeat_at"] is not None
    _, ledger, _ = env
    with ledger.read() as conn:
        losses = Reader.over(conn).metric_points(run_id, key="loss")
        total = logged_points(conn)
    assert [p["step"] for p in losses] == list(range(200))
    assert losses[3]["value"] == pytest.approx(0.25) and losses[3]["attempt_number"] == 1
    assert total == 200 * 5
    ingest_attempt(ledger, attempt)  # again: nothing new, nothing doubled
    with ledger.read() as conn:
        assert logged_points(conn) == 200 * 5


def test_preemption_notice_ends_the_attempt_as_preempted(env, tmp_path, monkeypatch):
    ready = tmp_path / "ready"
    monkeypatch.setenv("SDK_READY_FILE", str(ready))
    run_id, attempt_id = _launch(env, "preempt", "1000")
    deadline = time.time() + 60
    while not ready.exists():
        assert time.time() < deadline, "script never reached step 5"
        time.sleep(0.05)
    _, ledger, _ = env
    with ledger.read() as conn:
        attempt = get_attempt(conn, attempt_id)
    job = Path(attempt["state_dir"]) / "job.json"
    child = json.loads(job.read_text())["child_pid"]
    os.kill(child, signal.SIGTERM)
    attempt = _wait_end(env, attempt_id)
    assert attempt["termination_reason"] == "preempted" and attempt["exit_code"] == 75
    evidence = json.loads(attempt["termination_evidence"])
    assert evidence["rule"] == "sdk:note" and "SIGTERM" in evidence["lines"][0]
    with ledger.read() as conn:
        kinds = set(conn.execute(select(attempt_events.c.kind).where(attempt_events.c.attempt_id == attempt_id)).scalars())
    assert {"started", "preemption_notice", "termination_note"} <= kinds
    decision = json.loads(attempt["retry_decision"])
    assert decision["action"] == "resume" and decision["rule"] == "preempted: resume (1 of 10)"
    _, _, supervisor = env
    with ledger.read() as conn:
        assert latest_attempt(conn, run_id)["attempt_number"] == 2  # the supervisor relaunched it
    supervisor.cancel(run_id)
    _wait_end(env, f"{run_id}/2")


@pytest.mark.parametrize(
    ("mode", "reason", "fragment"),
    [
        ("bad_data", "bad_data", "shard 3"),
        ("oom", "oom", "CUDA out of memory"),
        ("nan", "nan_loss", "at step 7"),
        ("nan_tensor", "nan_loss", "at step 7"),
        ("code_error", "code_error", "KeyError"),
    ],
)
def test_the_scripts_own_note_names_the_reason(env, mode, reason, fragment):
    _, attempt_id = _launch(env, mode, "20")
    attempt = _wait_end(env, attempt_id)
    assert attempt["termination_reason"] == reason
    evidence = json.loads(attempt["termination_evidence"])
    assert evidence["rule"] == "sdk:note" and fragment in evidence["lines"][0]
    assert json.loads(attempt["retry_decision"])["action"] == "stop"


def test_a_script_run_alone_records_its_own_run(home, ledger_url):
    env = {**os.environ, "TRACKWAY_DB": ledger_url, "SDK_RUN_NAME": "alone"}
    done = subprocess.run([sys.executable, SCRIPT, "ok", "30"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ledger = open_ledger(ledger_url)
    with ledger.read() as conn:
        run = resolve_run(conn, "alone")
        attempt = latest_attempt(conn, run["run_id"])
        points = Reader.over(conn).metric_points(run["run_id"], key="lr")
    ledger.dispose()
    assert run["state"] == "completed" and run["executor"] == "inline" and run["config_sha256"]
    assert attempt["termination_reason"] == "completed" and attempt["environment_sha256"]
    assert len(points) == 30


def test_a_config_refused_before_the_first_step_is_a_config_error_after_it_a_code_error():
    from trackway.sdk.hooks import reason_for_exception
    from trackway.taxonomy import TerminationReason

    refused = ValueError("Unknown config key: lrr")
    assert reason_for_exception(refused, made_progress=False) is TerminationReason.CONFIG_ERROR
    assert reason_for_exception(refused, made_progress=True) is TerminationReason.CODE_ERROR
    assert reason_for_exception(ValueError("shapes (3,) and (4,) differ"), made_progress=False) is TerminationReason.CODE_ERROR


def test_a_checkpoint_store_that_does_not_answer_is_infra_transient_not_the_codes_fault():
    from trackway.checkpoints.object_store import RemoteStoreError
    from trackway.sdk.hooks import reason_for_exception
    from trackway.taxonomy import TerminationReason

    down = RemoteStoreError("list s3://bucket/ckpts/r1 failed: EndpointConnectionError: Could not connect")
    assert reason_for_exception(down, made_progress=False) is TerminationReason.INFRA_TRANSIENT
    assert reason_for_exception(down, made_progress=True) is TerminationReason.INFRA_TRANSIENT
