"""Preemption notices are never swallowed, and every logged loss is finite-checked: fault scripts through `trackway submit`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trackway.cli.errors import run_app
from trackway.cli.main import app

FAULTS = Path(__file__).resolve().parents[2] / "examples" / "faults"


@pytest.fixture
def cli(home, capsys, sqlite_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    monkeypatch.setenv("TRACKWAY_HEARTBEAT_S", "0.5")
    # A long grace: what ends an attempt here is the SDK, never the executor's SIGKILL.
    Path("trackway.toml").write_text("[supervisor]\nstall_seconds = 30\n[resources.local]\ngrace_seconds = 60\n")

    def invoke(*args: str):
        capsys.readouterr()
        code = run_app(app, list(args))
        return code, capsys.readouterr()

    def submit(script: str):
        code, out = invoke("submit", "--name", "fault", "--", sys.executable, str(FAULTS / script))
        attempts = json.loads(invoke("attempts", "fault", "--json")[1].out)
        return code, out, attempts

    return submit


def test_a_notice_the_script_never_reads_ends_the_attempt_preempted_then_it_resumes(cli):
    code, out, attempts = cli("notice_ignored.py")
    assert code == 0, out.err
    assert [a["termination_reason"] for a in attempts] == ["preempted", "completed"]
    first = attempts[0]
    assert first["exit_code"] == 75
    assert first["termination_evidence"]["rule"] == "sdk:note"
    line = first["termination_evidence"]["lines"][0]
    assert "logged step 8 without reading run.should_stop, so trackway ended the attempt" in line
    assert "resume from step-00000005" in line
    assert json.loads(first["retry_decision"])["action"] == "resume"


def test_a_notice_after_finish_ends_nothing_and_resumes_nothing(cli):
    code, out, attempts = cli("notice_after_finish.py")
    assert code == 0, out.err
    assert [(a["termination_reason"], a["exit_code"]) for a in attempts] == [("completed", 0)]


def test_nan_under_train_slash_loss_is_nan_loss(cli):
    code, out, attempts = cli("nan_train_loss.py")
    assert code == 1
    assert [a["termination_reason"] for a in attempts] == ["nan_loss"]
    evidence = attempts[0]["termination_evidence"]
    assert evidence["rule"] == "sdk:note" and "non-finite train/loss = nan at step 6" in evidence["lines"][0]
    assert json.loads(attempts[0]["retry_decision"])["action"] == "stop"


def test_exit_0_after_a_notice_without_finish_is_preempted_even_without_a_note(cli):
    code, out, attempts = cli("notice_then_exit_0.py")
    assert code == 0, out.err
    assert [(a["termination_reason"], a["exit_code"]) for a in attempts] == [("preempted", 0), ("completed", 0)]
    assert attempts[0]["termination_evidence"]["rule"] == "sdk:notice-without-finish"
    assert json.loads(attempts[0]["retry_decision"])["action"] == "resume"
