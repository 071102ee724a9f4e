"""Evaluations end to end: triggered on commits, run as their own runs, retried on evaluator crashes, never touching training."""

from __future__ import annotations

import sys
import time
from pathlib import Path

PY = sys.executable
NEUTRAL = str(Path(__file__).parent.parent / "cli" / "scripts" / "neutral.py")


def settle(cli, run: str, timeout: float = 90) -> list[dict]:
    """Tick the supervisor until every evaluation of `run` has ended; return `evals RUN --json` rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert cli("supervise", "--once").code == 0
        rows = cli("evals", run, "--json").json()["evaluations"]
        if rows and all(r["state"] != "running" for r in rows):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"evaluations of {run} still running after {timeout} s: {rows}")


def test_every_commit_is_evaluated_and_a_crashed_evaluator_is_retried_without_touching_training(cli, write_spec):
    spec = write_spec("toy", ["--crash-attempts", "1"])
    result = cli("submit", "--name", "train", "--eval", str(spec), "--", PY, NEUTRAL, "40")
    assert result.code == 0, result.err
    rows = settle(cli, "train")
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert all(r["state"] == "completed" for r in rows)
    # Each seed's first attempt crashed and its retry succeeded: evaluator_crash, then completed.
    detail = cli("eval", "show", rows[0]["eval_id"], "--json").json()
    for seed in detail["seeds"]:
        assert [a["termination_reason"] for a in seed["attempts"]] == ["evaluator_crash", "completed"]
        assert seed["attempts"][0]["retry_decision"]["rule"] == "evaluator_crash: resume (1 of 2)"
        assert seed["attempts"][0]["rule"] == "evaluator:log:traceback"
    # The training run had one attempt, completed; evaluations never added to it.
    (attempt,) = cli("attempts", "train", "--json").json()
    assert attempt["termination_reason"] == "completed"
    # pass@1 and pass@2 per seed and aggregated; the stand-in's skill grows with the step.
    means = [r["metrics"]["pass@1"]["mean"] for r in rows]
    assert means[0] < means[1] < means[2]
    assert all(r["metrics"]["pass@2"]["mean"] >= r["metrics"]["pass@1"]["mean"] for r in rows)
    assert set(rows[0]["per_seed"]) == {"0", "1"} and rows[0]["metrics"]["pass@1"]["seeds"] == 2
    assert rows[0]["progress"] == 0.25 or rows[0]["progress"] is None


def test_an_evaluator_that_always_crashes_the_same_way_stops_at_the_repeat_while_training_completes(cli, write_spec):
    spec = write_spec("doomed", ["--crash-attempts", "99"], body='seeds = [0]\n[decoding]\nsamples = 2\n')
    assert cli("submit", "--name", "train2", "--eval", str(spec), "--", PY, NEUTRAL, "20").code == 0
    rows = settle(cli, "train2")
    assert [r["state"] for r in rows] == ["failed"]
    detail = cli("eval", "show", rows[0]["eval_id"], "--json").json()
    (seed,) = detail["seeds"]
    # The same traceback twice is no accident: the budget of 2 retries is not spent on a third (issue 30).
    assert [a["termination_reason"] for a in seed["attempts"]] == ["evaluator_crash"] * 2
    decision = seed["attempts"][-1]["retry_decision"]
    assert decision["rule"] == "evaluator_crash: the same failure again"
    assert decision["message"].startswith("the same failure in 2 attempts (RuntimeError: NCCL all_gather failed in the "
                                          "evaluator (simulated) (evaluator.py:")
    assert "fix the evaluator" in decision["message"]
    assert seed["state"] == "failed" and seed["termination_reason"] == "evaluator_crash"
    assert [a["termination_reason"] for a in cli("attempts", "train2", "--json").json()] == ["completed"]
    assert cli("runs", "--json").json()[0]["state"] == "completed"


def test_every_n_commits_evaluates_only_those(cli, write_spec):
    spec = write_spec("sparse", body='seeds = [0]\nevery_n_commits = 2\n[decoding]\nsamples = 2\n')
    assert cli("submit", "--name", "train3", "--eval", str(spec), "--", PY, NEUTRAL, "50").code == 0
    rows = settle(cli, "train3")
    assert [r["step"] for r in rows] == [20, 40]  # commits 10, 20, 30, 40: the 2nd and the 4th
