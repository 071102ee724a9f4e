"""Endings read from all the evidence: a torchrun rank killed, a bad flag, a refused config key, through `trackway submit`."""

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
    Path("trackway.toml").write_text(
        "[supervisor]\nstall_seconds = 60\n[resources.local]\ngrace_seconds = 5\n"
        "[retry.reasons.infra_transient]\nbackoff_seconds = 0.1\n"
    )

    def submit(script: str, *args: str):
        capsys.readouterr()
        code = run_app(app, ["submit", "--name", "fault", "--", sys.executable, str(FAULTS / script), *args])
        out = capsys.readouterr()
        assert run_app(app, ["attempts", "fault", "--json"]) == 0
        return code, out, json.loads(capsys.readouterr().out)

    return submit


def test_a_torchrun_rank_killed_by_sigkill_is_infra_transient_and_resumed(cli):
    code, out, attempts = cli("torchrun_rank_killed.py")
    assert code == 0, out.err
    assert [a["termination_reason"] for a in attempts] == ["infra_transient", "completed"]
    evidence = attempts[0]["termination_evidence"]
    # torchrun's own summary decided, not the surviving rank's error or the SIGTERM the agent sent it.
    assert evidence["rule"] == "torchrun:rank-SIGKILL"
    assert any("Signal 9 (SIGKILL)" in line for line in evidence["lines"])
    assert any("rank      : 1" in line for line in evidence["lines"])
    assert json.loads(attempts[0]["retry_decision"])["action"] == "resume"


@pytest.mark.parametrize(
    ("script", "rule", "line"),
    [
        ("bad_flag.py", "log:start-up-error", "error: unrecognized arguments: --lrr 0.1"),
        ("bad_config_value.py", "log:config-refused", "ValueError: Unknown config key: lrr"),
    ],
)
def test_a_command_refused_before_its_first_step_is_a_config_error(cli, script, rule, line):
    code, out, attempts = cli(script)
    assert code == 1
    (attempt,) = attempts
    assert attempt["termination_reason"] == "config_error"
    assert attempt["termination_evidence"]["rule"] == rule
    assert any(line in shown for shown in attempt["termination_evidence"]["lines"])
    assert json.loads(attempt["retry_decision"])["action"] == "stop"
