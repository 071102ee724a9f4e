"""Every attempt runs with the environment its run was submitted with, whoever launches it.

Regression for issue 9.1: a retry launched by `trackway supervise` saw the supervisor's
environment (`FOO=None`), trained 60 steps instead of 100 and was recorded `completed`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from sqlalchemy import select
from waiting import wait_for

from trackway.ledger import open_ledger
from trackway.ledger.schema import attempts, blobs, runs
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "env_echo.py")
TOKEN = "hf_" + "Zq8vN3kLm2Xp7rT5wY1bC4dF6gH9jK0aSe"


def _rows(url: str, table, *where):
    ledger = open_ledger(url)
    try:
        with ledger.read() as conn:
            return [dict(r) for r in conn.execute(select(table).where(*where)).mappings()]
    finally:
        ledger.dispose()


def _supervise(url: str, home: Path, env_changes: dict[str, str | None]) -> subprocess.Popen:
    """A supervisor started from a shell that has a different environment from the submitter's."""
    env = dict(os.environ, TRACKWAY_DB=url, TRACKWAY_HOME=str(home))
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.Popen(
        [sys.executable, "-m", "trackway", "supervise", "--interval", "0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def test_a_retry_launched_by_the_supervisor_runs_with_the_submitters_environment(cli, home, ledger_url, monkeypatch):
    monkeypatch.setenv("KB_FOO", "bar")
    monkeypatch.setenv("KB_STEPS", "30")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("KB_LAUNCHER_ONLY", raising=False)
    submitted = cli("submit", "--detach", "--name", "envrun", "--", sys.executable, SCRIPT)
    assert submitted.code == 0, submitted.err
    run_id = submitted.out.strip()
    # Attempt 1 preempts itself; the retry is launched by a supervisor whose shell differs.
    supervisor = _supervise(ledger_url, home, {"KB_FOO": "launcher", "KB_STEPS": "3", "HF_TOKEN": None,
                                               "KB_LAUNCHER_ONLY": "leaked"})
    try:
        wait_for(lambda: _rows(ledger_url, runs, runs.c.run_id == run_id)[0]["state"] == "completed",
                 "the run to complete through its retry", timeout=90, interval=0.1)
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=30)

    tries = sorted(_rows(ledger_url, attempts, attempts.c.run_id == run_id), key=lambda a: a["attempt_number"])
    assert [a["termination_reason"] for a in tries] == ["preempted", "completed"]
    for attempt in tries:
        seen = json.loads((Path(attempt["state_dir"]) / "seen-env.json").read_text())
        assert seen == {"KB_FOO": "bar", "KB_STEPS": "30", "HF_TOKEN": TOKEN, "KB_LAUNCHER_ONLY": None}
    assert tries[-1]["last_step"] == 29  # the submitted 30 steps, not the launcher's 3
    assert tries[0]["started_by"].startswith("trackway submit (")
    assert tries[1]["started_by"].startswith("supervisor: preempted")  # the rule that queued the retry

    # The receipt: every attempt got the run's environment, and the ledger never saw the token.
    run = _rows(ledger_url, runs, runs.c.run_id == run_id)[0]
    assert {a["environ_sha256"] for a in tries} == {run["environ_sha256"]}
    ledger = open_ledger(ledger_url)
    with ledger.read() as conn:
        stored = {row.sha256: zlib.decompress(bytes(row.content))
                  for row in conn.execute(select(blobs.c.sha256, blobs.c.content))}
    contents = list(stored.values())
    description = json.loads(stored[run["environ_sha256"]])
    ledger.dispose()
    assert not any(TOKEN.encode() in c for c in contents)
    assert description["variables"]["KB_FOO"] == "bar"
    assert "HF_TOKEN" in description["secrets"] and "HF_TOKEN" not in description["variables"]
    assert not any(name.startswith("TRACKWAY_") for name in description["variables"])

    # Secret values and the launch file (which holds them and the ledger URL) are the owner's only.
    secret_file = home / "runs" / run_id / "secret-env.json"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert json.loads(secret_file.read_text())["HF_TOKEN"] == TOKEN
    for attempt in tries:
        for name in ("launch.json", "output.log", "shim.err"):  # the log can hold what the script printed
            assert stat.S_IMODE((Path(attempt["state_dir"]) / name).stat().st_mode) == 0o600, name

    explained = cli("explain", run_id, "--markdown")
    assert explained.code == 0, explained.err
    assert "- environment variables: none" in explained.out  # no change between the attempts
    assert "secret, kept outside the ledger: HF_TOKEN" in explained.out
    assert TOKEN not in explained.out


def test_explain_names_the_variables_that_changed_between_attempts(cli, home, ledger_url, monkeypatch):
    """A run recorded before environments were stored inherits its launcher's: explain must say what changed."""
    monkeypatch.setenv("KB_STEPS", "30")
    monkeypatch.setenv("KB_FOO", "first")
    submitted = cli("submit", "--detach", "--", sys.executable, SCRIPT)
    run_id = submitted.out.strip()
    ledger = open_ledger(ledger_url)
    with ledger.write() as conn:  # what a ledger migrated from 0004 holds for an older run
        conn.execute(runs.update().where(runs.c.run_id == run_id).values(environ_sha256=None))
    ledger.dispose()
    supervisor = _supervise(ledger_url, home, {"KB_FOO": "second"})
    try:
        wait_for(lambda: _rows(ledger_url, runs, runs.c.run_id == run_id)[0]["state"] == "completed", "completion",
                 timeout=90, interval=0.1)
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=30)
    explained = cli("explain", run_id, "--markdown")
    assert "KB_FOO: 'first' → 'second'" in explained.out


def test_a_run_whose_submitter_died_before_its_first_attempt_is_launched_by_the_supervisor(home, sqlite_url, monkeypatch):
    """Regression for issue 9.2: a submit killed between recording the run and its attempt left it queued forever."""
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(settings.db_url)
    # What a submit killed right after recording the run leaves behind: a queued run, no attempt.
    run_id = submit_run(ledger, settings, RunSpec(
        command=[sys.executable, SCRIPT], cwd=Path.cwd(),
        environ={**os.environ, "KB_FOO": "orphan", "KB_STEPS": "8"},
    ))
    supervisor = Supervisor(ledger, settings)
    supervisor.tick()
    assert _rows(sqlite_url, attempts, attempts.c.run_id == run_id) == []  # too fresh: its submitter may be alive
    supervisor.orphaned_run_s = 0
    deadline = time.time() + 90
    while _rows(sqlite_url, runs, runs.c.run_id == run_id)[0]["state"] not in ("completed", "failed"):
        assert time.time() < deadline, "the orphaned run never finished"
        supervisor.tick()
        time.sleep(0.1)
    tries = sorted(_rows(sqlite_url, attempts, attempts.c.run_id == run_id), key=lambda a: a["attempt_number"])
    assert [a["termination_reason"] for a in tries] == ["preempted", "completed"]
    seen = json.loads((Path(tries[0]["state_dir"]) / "seen-env.json").read_text())
    assert seen["KB_FOO"] == "orphan"
    assert tries[0]["started_by"] == "supervisor: its submitter died before launching attempt 1"
    # The submitter, had it only been slow, now finds attempt 1 taken and does not start another.
    assert start_attempt(ledger, settings, run_id, supervisor.executor("local"), first=True) is None
    assert len(_rows(sqlite_url, attempts, attempts.c.run_id == run_id)) == 2
    ledger.dispose()


def test_a_retry_whose_secrets_are_gone_is_not_started_with_another_environment(cli, home, ledger_url, monkeypatch):
    monkeypatch.setenv("KB_STEPS", "30")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    run_id = cli("submit", "--detach", "--", sys.executable, SCRIPT).out.strip()
    (home / "runs" / run_id / "secret-env.json").unlink()
    supervisor = _supervise(ledger_url, home, {})
    try:
        wait_for(lambda: len([a for a in _rows(ledger_url, attempts, attempts.c.run_id == run_id)
                              if a["state"] == "ended"]) == 2, "the retry to be refused", timeout=90, interval=0.1)
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=30)
    tries = sorted(_rows(ledger_url, attempts, attempts.c.run_id == run_id), key=lambda a: a["attempt_number"])
    assert [a["termination_reason"] for a in tries] == ["preempted", "config_error"]
    evidence = json.loads(tries[1]["termination_evidence"])
    assert "HF_TOKEN" in " ".join(evidence["lines"]) and "secret-env.json" in " ".join(evidence["lines"])
    assert not (Path(tries[1]["state_dir"]) / "seen-env.json").exists()  # the command never ran
    assert _rows(ledger_url, runs, runs.c.run_id == run_id)[0]["state"] == "failed"


@pytest.mark.parametrize("name", ["HF_TOKEN", "DATABASE_URL"])
def test_secret_looking_variables_are_split_out(name):
    from trackway.receipts.submitted_env import capture

    value = TOKEN if name == "HF_TOKEN" else "postgresql://bob:hunter2@db.example/x"
    captured = capture({name: value, "LR": "3e-4", "TRACKWAY_DB": "sqlite:///x", "PATH": "/usr/bin"})
    assert captured.secret == {name: value}
    assert captured.plain == {"LR": "3e-4", "PATH": "/usr/bin"}
    assert value not in json.dumps(captured.description("r1"))
