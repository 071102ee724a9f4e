"""The retry policy as a pure function: docs/taxonomy.md's defaults, budgets, conditions, backoff, and policy files."""

from __future__ import annotations

import pytest

from trackway.errors import InputError
from trackway.supervisor.policy import AttemptOutcome, RetryPolicy, decide, load_policy, memory_fingerprint
from trackway.taxonomy import TerminationReason as R

DEFAULT = RetryPolicy()


def outcome(reason: R, committed: bool = False, fingerprint: str | None = "fp") -> AttemptOutcome:
    return AttemptOutcome(reason, committed_checkpoint=committed, memory_fingerprint=fingerprint)


@pytest.mark.parametrize(
    ("reason", "action"),
    [
        (R.COMPLETED, "none"), (R.USER_CANCELLED, "none"), (R.PREEMPTED, "resume"), (R.INFRA_TRANSIENT, "resume"),
        (R.STALLED, "resume"), (R.NAN_LOSS, "stop"), (R.BAD_DATA, "stop"), (R.CONFIG_ERROR, "stop"),
        (R.CODE_ERROR, "stop"), (R.UNKNOWN, "stop"), (R.EVALUATOR_CRASH, "resume"),
    ],
)
def test_default_actions_follow_design(reason, action):
    assert decide(DEFAULT, [outcome(reason)]).action == action


def test_preemption_budget_is_ten():
    history = [outcome(R.PREEMPTED)] * 10
    assert decide(DEFAULT, history).action == "resume"
    spent = decide(DEFAULT, history + [outcome(R.PREEMPTED)])
    assert (spent.action, spent.rule) == ("stop", "preempted: budget 10 spent")


def test_budgets_count_per_reason():
    history = [outcome(R.INFRA_TRANSIENT)] * 3 + [outcome(R.PREEMPTED)]
    assert decide(DEFAULT, history).action == "resume"


def test_timeout_resumes_only_after_a_newer_checkpoint():
    assert decide(DEFAULT, [outcome(R.TIMEOUT, committed=True)]).action == "resume"
    stuck = decide(DEFAULT, [outcome(R.TIMEOUT, committed=False)])
    assert (stuck.action, stuck.rule) == ("stop", "timeout: no newer checkpoint")


def test_oom_retries_only_when_the_memory_footprint_changed():
    same = decide(DEFAULT, [outcome(R.OOM, fingerprint="a")], next_memory_fingerprint="a")
    assert same.action == "stop" and "batch" in same.message
    changed = decide(DEFAULT, [outcome(R.OOM, fingerprint="a")], next_memory_fingerprint="b")
    assert changed.action == "resume"


def test_the_resume_message_says_where_the_next_attempt_starts():
    assert decide(DEFAULT, [outcome(R.PREEMPTED, committed=True)]).message == "resume from the latest committed checkpoint"
    # An unchanged script saving nothing trackway can see restarts from scratch: say so, never "latest committed".
    fresh = decide(DEFAULT, [outcome(R.PREEMPTED, committed=False)])
    assert fresh.message == "resume from the start: no checkpoint was committed"
    earlier = [outcome(R.PREEMPTED, committed=True), outcome(R.PREEMPTED, committed=False)]
    assert decide(DEFAULT, earlier).message == "resume from the latest committed checkpoint"


def test_nan_advice_points_at_a_checkpoint_only_when_one_exists():
    assert "last good checkpoint" in decide(DEFAULT, [outcome(R.NAN_LOSS, committed=True)]).message
    none = decide(DEFAULT, [outcome(R.NAN_LOSS, committed=False)]).message
    assert "last good checkpoint" not in none and "no checkpoint was committed" in none


def test_a_broken_evaluator_output_is_not_retried_whatever_the_budget():
    broken = AttemptOutcome(R.EVALUATOR_CRASH, rule="evaluator:bad-output")
    decision = decide(DEFAULT, [broken])
    assert (decision.action, decision.rule) == ("stop", "evaluator_crash: evaluator:bad-output")
    assert "[output] mapping" in decision.message
    crashed = AttemptOutcome(R.EVALUATOR_CRASH, rule="evaluator:log:traceback")
    assert decide(DEFAULT, [crashed]).action == "resume"


def test_transient_failures_back_off_exponentially():
    delays = [decide(DEFAULT, [outcome(R.INFRA_TRANSIENT)] * n).delay_s for n in (1, 2, 3)]
    assert delays == [30.0, 60.0, 120.0]


def test_gpu_hour_budget_stops_everything():
    policy = RetryPolicy(gpu_hours_budget=2.0)
    assert decide(policy, [outcome(R.PREEMPTED)], run_gpu_seconds=3600).action == "resume"
    spent = decide(policy, [outcome(R.PREEMPTED)], run_gpu_seconds=2 * 3600)
    assert spent.action == "stop" and spent.rule.startswith("gpu-hours budget")


def test_policy_files_override_defaults(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("gpu_hours_budget = 5\n[reasons.code_error]\naction = 'resume'\nbudget = 1\n")
    policy = load_policy(path, {"reasons": {"preempted": {"budget": 2}}})
    assert policy.gpu_hours_budget == 5.0
    assert decide(policy, [outcome(R.CODE_ERROR)]).action == "resume"
    assert decide(policy, [outcome(R.PREEMPTED)] * 3).action == "stop"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[reasons.flaky]\nbudget = 1\n", "reasons.flaky"),
        ("[reasons.oom]\nrequires = 'luck'\n", "requires 'luck'"),
        ("[reasons.oom]\nbudget = -1\n", "budget"),
        ("[reasons.oom]\nbudgie = 1\n", "budgie"),
        ("gpu_hours_budget = 0\n", "gpu_hours_budget"),
        ("[reasons\n", "not valid TOML"),
    ],
)
def test_bad_policies_are_one_line_input_errors(tmp_path, text, fragment):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=fragment.replace("(", r"\(")):
        load_policy(path)


def test_memory_fingerprint_sees_batch_precision_and_placement():
    base = {"train": {"batch_size": 32, "lr": 1e-3}, "model": {"precision": "bf16"}}
    fp = memory_fingerprint(base, "local", 1)
    assert fp == memory_fingerprint({**base, "train": {"batch_size": 32, "lr": 3e-4}}, "local", 1)
    assert fp != memory_fingerprint({**base, "train": {"batch_size": 16, "lr": 1e-3}}, "local", 1)
    assert fp != memory_fingerprint({**base, "model": {"precision": "fp32"}}, "local", 1)
    assert fp != memory_fingerprint(base, "h100-80gb", 1)


def test_the_same_failure_again_is_not_retried_whatever_the_budget():
    from trackway.supervisor.policy import AttemptOutcome, decide, load_policy
    from trackway.taxonomy import TerminationReason as R

    policy = load_policy(None)
    nccl = dict(failure="RuntimeError: NCCL error: Connection reset by peer (train.py:54 in step)", step=5)
    first = AttemptOutcome(R.INFRA_TRANSIENT, signature="a" * 16, **nccl)
    assert decide(policy, [first]).action == "resume"
    repeat = decide(policy, [first, first], run_ref="big")
    assert (repeat.action, repeat.rule) == ("stop", "infra_transient: the same failure again")
    assert repeat.message == ("the same failure at step 5 in 2 attempts (RuntimeError: NCCL error: Connection reset by "
                              "peer (train.py:54 in step)); it does not look transient, so no retry is made: fix the "
                              "cause, then `trackway resume big`")
    # A preemption between the two does not make the failure any less the same.
    preempted = AttemptOutcome(R.PREEMPTED)
    assert decide(policy, [first, preempted, first]).action == "stop"
    # Another failure (another line, step or message) is retried by the budget as before.
    other = AttemptOutcome(R.INFRA_TRANSIENT, signature="b" * 16, **nccl)
    assert decide(policy, [first, other]).action == "resume"
    crash = AttemptOutcome(R.EVALUATOR_CRASH, signature="c" * 16, failure="RuntimeError: boom (eval.py:9)")
    stopped = decide(policy, [crash, crash])
    assert stopped.action == "stop" and "fix the evaluator" in stopped.message


def test_a_run_in_pieces_resumes_each_planned_timeout_until_its_time_is_spent():
    from trackway.supervisor.policy import Pieces

    policy = RetryPolicy(in_pieces=True)
    hours = 3600.0
    # 100 h in pieces of 24 h: five pieces, more than the timeout budget (5 retries) would allow as failures.
    history = [outcome(R.TIMEOUT, committed=True)] * 4
    going = decide(policy, history, pieces=Pieces(total_s=100 * hours, used_s=96 * hours, piece_s=24 * hours))
    assert (going.action, going.rule) == ("resume", "timeout: in pieces, piece 5 of 5")
    assert going.message == ("piece 4 of 5 reached its 24 h limit as planned (--in-pieces: 100 h in all); resume from "
                             "the latest committed checkpoint for the next piece (4.00 h left)")
    six = [outcome(R.TIMEOUT, committed=True)] * 6
    assert decide(policy, six, pieces=Pieces(100 * hours, 90 * hours, 15 * hours)).action == "resume"  # no budget
    spent = decide(policy, history + [outcome(R.TIMEOUT, committed=True)],
                   pieces=Pieces(total_s=100 * hours, used_s=100 * hours, piece_s=24 * hours))
    assert (spent.action, spent.rule) == ("stop", "timeout: in pieces, total time spent")
    stuck = decide(policy, [outcome(R.TIMEOUT, committed=False)], pieces=Pieces(100 * hours, 24 * hours, 24 * hours))
    assert (stuck.action, stuck.rule) == ("stop", "timeout: in pieces, no newer checkpoint")
    # Any other ending follows the policy as ever: a preemption in the middle is a preemption.
    assert decide(policy, [outcome(R.PREEMPTED)], pieces=Pieces(100 * hours, 3 * hours, 24 * hours)).rule == \
        "preempted: resume (1 of 10)"


def test_in_pieces_is_a_policy_key_and_a_bad_value_is_one_line(tmp_path):
    policy_file = tmp_path / "p.toml"
    policy_file.write_text("in_pieces = true\n[reasons.timeout]\nbudget = 2\n")
    assert load_policy(policy_file).in_pieces is True
    policy_file.write_text('in_pieces = "yes"\n')
    with pytest.raises(InputError) as refused:
        load_policy(policy_file)
    assert str(refused.value) == (f"--retry-policy {policy_file}: in_pieces 'yes': expected true or false: the run's "
                                  "time limit is its total, run in pieces of the longest QoS tier")
