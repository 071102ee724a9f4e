"""Retries by policy, end to end: real preemption notices, real failures, decisions written down."""

from __future__ import annotations

import sys
from pathlib import Path

PY = sys.executable
SCRIPT = str(Path(__file__).parent / "scripts" / "neutral.py")


def test_a_run_preempted_three_times_completes_with_four_attempts(cli):
    result = cli("submit", "--name", "spot", "--", PY, SCRIPT, "40", "--preempt-at", "12,25,33")
    assert result.code == 0, result.err
    attempts = cli("attempts", "spot", "--json").json()
    assert [a["termination_reason"] for a in attempts] == ["preempted", "preempted", "preempted", "completed"]
    assert [a["retry_decision"] and __import__("json").loads(a["retry_decision"])["rule"] for a in attempts] == [
        "preempted: resume (1 of 10)", "preempted: resume (2 of 10)", "preempted: resume (3 of 10)", "completed: nothing to do",
    ]
    # The notice let each attempt save at the step it stopped: the next one resumes right after it.
    assert [a["resumed_from_checkpoint"] for a in attempts] == [None, "step-00000012", "step-00000025", "step-00000033"]
    assert [a["first_step"] for a in attempts] == [0, 13, 26, 34]
    points = cli("metrics", "spot", "--key", "loss", "--json").json()
    assert [p["step"] for p in points] == list(range(40))


def test_a_policy_file_sets_the_budget(cli, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[reasons.preempted]\nbudget = 1\n")
    result = cli("submit", "--name", "tight", "--retry-policy", str(policy), "--", PY, SCRIPT, "40", "--preempt-at", "12,25,33")
    assert result.code == 1
    attempts = cli("attempts", "tight", "--json").json()
    assert [a["termination_reason"] for a in attempts] == ["preempted", "preempted"]
    last = __import__("json").loads(attempts[-1]["retry_decision"])
    assert last["action"] == "stop" and last["rule"] == "preempted: budget 1 spent"


def test_a_bad_policy_file_is_refused_before_anything_is_recorded(cli, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[reasons.preempted]\naction = 'pray'\n")
    result = cli("submit", "--retry-policy", str(policy), "--", PY, "-c", "pass")
    assert result.code == 2 and "action 'pray'" in result.err and len(result.err.strip().splitlines()) == 1
    assert cli("runs", "--json").json() == []


def test_code_errors_are_not_retried(cli):
    result = cli("submit", "--name", "bug", "--", PY, SCRIPT, "40", "--fail-at", "15")
    assert result.code == 1
    (attempt,) = cli("attempts", "bug", "--json").json()
    assert attempt["termination_reason"] == "code_error"
    assert "stop" in attempt["retry_decision"]
