"""Every fault scenario in examples/faults/ is classified to its reason and decided as docs/taxonomy.md's default policy says."""

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
    # The stall window must be well above the heartbeat interval (5 s by default); shrink both.
    monkeypatch.setenv("TRACKWAY_HEARTBEAT_S", "0.5")
    Path("trackway.toml").write_text(
        "[supervisor]\nstall_seconds = 3\n[resources.local]\ngrace_seconds = 1\n"
        "[retry.reasons.infra_transient]\nbackoff_seconds = 0.1\n"
    )

    def invoke(*args: str):
        capsys.readouterr()
        code = run_app(app, list(args))
        return code, capsys.readouterr()

    return invoke


@pytest.mark.parametrize(
    ("script", "extra", "reasons", "first_action", "outcome"),
    [
        ("preempted.py", [], ["preempted", "completed"], "resume", 0),
        ("oom.py", [], ["oom"], "stop", 1),
        ("nan_loss.py", [], ["nan_loss"], "stop", 1),
        ("bad_data.py", [], ["bad_data"], "stop", 1),
        ("config_error.py", [], ["config_error"], "stop", 1),
        ("code_error.py", [], ["code_error"], "stop", 1),
        ("stall.py", [], ["stalled", "completed"], "resume", 0),
        ("timeout.py", ["--time-limit", str(1.5 / 3600)], ["timeout"], "stop", 1),
        ("infra_transient.py", [], ["infra_transient", "completed"], "resume", 0),
        # With the SDK, the same collective error reads the same (issue 30): not a code error that stops.
        ("collective_error.py", [], ["infra_transient", "completed"], "resume", 0),
        # A NaN, then the script's own exception about it: the divergence is the ending, not the exception.
        ("nan_then_raise.py", [], ["nan_loss"], "stop", 1),
        # The same error at the same step again: stopped at the repeat, not after the whole budget.
        ("same_failure_every_attempt.py", [], ["infra_transient", "infra_transient"], "resume", 1),
    ],
)
def test_fault_scenario(cli, script, extra, reasons, first_action, outcome):
    code, out = cli("submit", "--name", "fault", *extra, "--", sys.executable, str(FAULTS / script))
    assert code == outcome, out.err
    code, out = cli("attempts", "fault", "--json")
    attempts = json.loads(out.out)
    assert [a["termination_reason"] for a in attempts] == reasons
    first = attempts[0]
    assert json.loads(first["retry_decision"])["action"] == first_action
    assert first["termination_evidence"]["rule"] and (first["termination_evidence"]["lines"] or first["termination_evidence"]["executor"])


def test_the_same_failure_at_the_same_step_is_not_retried_twice(cli):
    code, out = cli("submit", "--name", "again", "--", sys.executable, str(FAULTS / "same_failure_every_attempt.py"))
    assert code == 1, out.err
    code, out = cli("attempts", "again", "--json")
    first, second = json.loads(out.out)
    assert first["termination_evidence"]["signature"] == second["termination_evidence"]["signature"]
    assert first["termination_evidence"]["signature"]["where"].startswith("same_failure_every_attempt.py:")
    decision = json.loads(second["retry_decision"])
    assert (decision["action"], decision["rule"]) == ("stop", "infra_transient: the same failure again")
    assert decision["message"].startswith("the same failure at step 5 in 2 attempts (RuntimeError: NCCL error in: ")
    assert "it does not look transient" in decision["message"] and "`trackway resume again`" in decision["message"]
    code, out = cli("explain", "again")
    assert "the same failure at step 5 in 2 attempts" in out.out
