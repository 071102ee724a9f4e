"""Classification is a pure function: each kind of evidence lands on its reason, with the lines that decided it."""

from __future__ import annotations

import signal

import pytest

from trackway.supervisor.classify import Evidence, classify
from trackway.taxonomy import TerminationReason as R

TS = "2026-11-22T04:10:00.000000Z err "


@pytest.mark.parametrize(
    ("evidence", "reason", "rule"),
    [
        (Evidence(exit_code=0), R.COMPLETED, "exit:0"),
        (Evidence(exit_code=None, signal=9, cancelled=True), R.USER_CANCELLED, "trackway:cancel"),
        (Evidence(exit_code=None, signal=9, timed_out=True), R.TIMEOUT, "trackway:time-limit"),
        (Evidence(exit_code=1, executor_state="PREEMPTED"), R.PREEMPTED, "executor:PREEMPTED"),
        (Evidence(exit_code=0, executor_state="NODE_FAIL"), R.INFRA_TRANSIENT, "executor:NODE_FAIL"),
        (Evidence(exit_code=None, signal=15), R.PREEMPTED, "signal:SIGTERM"),
        (Evidence(exit_code=127, log_tail=[TS + "trackway: cannot start command: No such file"]), R.CONFIG_ERROR, "exit:127"),
        (Evidence(exit_code=None, signal=9), R.UNKNOWN, "signal:SIGKILL"),
        (Evidence(vanished=True, executor_lines=["shim pid 1 is gone"]), R.INFRA_TRANSIENT, "executor:vanished"),
        (Evidence(exit_code=3), R.UNKNOWN, "exit:3"),
    ],
)
def test_executor_facts_decide_when_they_can(evidence, reason, rule):
    verdict = classify(evidence)
    assert (verdict.reason, verdict.rule) == (reason, rule)


def _traceback(last: str) -> list[str]:
    return [TS + "Traceback (most recent call last):", TS + '  File "train.py", line 3, in <module>', TS + last]


@pytest.mark.parametrize(
    ("last_line", "reason"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", R.OOM),
        ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error", R.INFRA_TRANSIENT),
        ("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff", R.BAD_DATA),
        ("trackway.BadData: shard 3 has no 'text' field", R.BAD_DATA),
        ("ModuleNotFoundError: No module named 'transformerz'", R.CONFIG_ERROR),
        ("FileNotFoundError: [Errno 2] No such file or directory: 'data/train.jsonl'", R.CONFIG_ERROR),
        ("ZeroDivisionError: division by zero", R.CODE_ERROR),
    ],
)
def test_the_log_tail_names_the_failure(last_line, reason):
    verdict = classify(Evidence(exit_code=1, log_tail=_traceback(last_line)))
    assert verdict.reason is reason
    assert any(last_line in line or "Traceback" in line for line in verdict.lines)


def test_import_errors_after_training_started_are_code_errors():
    tail = _traceback("ImportError: cannot import name 'x' from 'y'")
    assert classify(Evidence(exit_code=1, log_tail=tail, made_progress=False)).reason is R.CONFIG_ERROR
    assert classify(Evidence(exit_code=1, log_tail=tail, made_progress=True)).reason is R.CODE_ERROR


def test_non_finite_loss_in_the_log_is_nan_loss():
    tail = [TS + "step 11: loss is nan (non-finite loss)"]
    assert classify(Evidence(exit_code=1, log_tail=tail)).reason is R.NAN_LOSS


def test_the_sdk_note_outranks_everything_else():
    note = {"reason": "oom", "message": "CUDA out of memory at step 11"}
    verdict = classify(Evidence(exit_code=1, signal=None, log_tail=_traceback("ValueError: x"), sdk_note=note))
    assert (verdict.reason, verdict.rule, verdict.lines) == (R.OOM, "sdk:note", ("CUDA out of memory at step 11",))


def test_a_cancel_beats_the_signal_it_caused():
    assert classify(Evidence(signal=signal.SIGTERM, cancelled=True)).reason is R.USER_CANCELLED


def test_evidence_json_keeps_the_raw_facts():
    import json

    e = Evidence(exit_code=1, log_tail=_traceback("ZeroDivisionError: division by zero"), executor_lines=["exited 1"])
    stored = json.loads(classify(e).evidence_json(e))
    assert stored["rule"] == "log:traceback" and stored["exit_code"] == 1 and stored["executor"] == ["exited 1"]
    assert any("ZeroDivisionError" in line for line in stored["lines"])


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ({"cancelled": True}, R.USER_CANCELLED),
        ({"timed_out": True}, R.TIMEOUT),
        ({"stopped_by": ("stalled", "no new step")}, R.STALLED),
        ({"stopped_by": ("rank_stalled", "rank 1 stopped stepping")}, R.STALLED),
        ({"stopped_by": ("nan_in_log", "loss nan at step 9")}, R.NAN_LOSS),
        # A trend a watcher saw is not the ending it may lead to: a rising loss is not yet NaN, growing memory
        # not yet out of it.
        ({"stopped_by": ("loss_rising", "loss rising")}, R.WATCHER_STOP),
        ({"stopped_by": ("memory_growing", "RSS 40 GiB")}, R.WATCHER_STOP),
        ({"stopped_by": ("plateau", "plateau")}, R.WATCHER_STOP),
        ({"stopped_by": ("gpu_underused", "GPU 3%")}, R.WATCHER_STOP),
    ],
)
def test_a_preempted_note_caused_by_trackways_own_sigterm_is_not_a_preemption(flags, reason):
    note = {"reason": "preempted", "message": "preemption notice (SIGTERM) at step 9"}
    assert classify(Evidence(exit_code=75, sdk_note=note, **flags)).reason is reason


def test_other_notes_still_outrank_trackways_actions():
    note = {"reason": "oom", "message": "CUDA out of memory"}
    assert classify(Evidence(exit_code=1, sdk_note=note, cancelled=True)).reason is R.OOM


def test_stall_check():
    from trackway.supervisor.watchers import stall_evidence

    assert stall_evidence(None, 0, 1000, 60) is None
    assert "no heartbeat" in stall_evidence({"t": 100, "step": 5}, 0, 200, 60)
    assert "no new step" in stall_evidence({"t": 195, "step": 5, "progress_t": 100}, 0, 200, 60)
    assert stall_evidence({"t": 195, "step": 5, "progress_t": 190}, 0, 200, 60) is None
    assert "no new step" in stall_evidence({"t": 195, "step": None, "progress_t": None}, 100, 200, 60)


def _points(values, times=None):
    from trackway.supervisor.trends import Points

    steps = [10 * i for i in range(len(values))]
    return Points.of(steps, times or [float(i) for i in range(len(values))], values)


def test_trend_watchers():
    from trackway.supervisor.watchers import gpu_underused, loss_trends, memory_growing

    falling = [1.0 / (i + 1) for i in range(200)]
    assert loss_trends(_points(falling)) == []
    flat = [1.0 + 0.01 * (i % 3) for i in range(60)]
    (kind, said), = [f for f in loss_trends(_points(flat + [1.5, 2.2, 3.0, 3.9])) if f[0] == "loss_rising"]
    assert "window 500 steps" in said and "rule: at least +10% and 8× the noise" in said
    long_flat = [0.5 + 0.01 * (i % 3) for i in range(400)]
    assert [k for k, _ in loss_trends(_points(long_flat))] == ["plateau"]
    # one point a second, then one every 3 s: a third of the pace over the last 500 steps
    times = [float(i) for i in range(101)] + [100 + 3.0 * i for i in range(1, 51)]
    slow = loss_trends(_points([1.0 / (i + 1) for i in range(151)], times))
    assert [k for k, _ in slow] == ["throughput_falling"] and "rule: below 0.5" in slow[0][1]
    tighter = loss_trends(_points(flat + [1.05, 1.1, 1.12, 1.15]), {"loss_rising": {"min_rise": 0.05}})
    assert [k for k, _ in tighter] == ["loss_rising"]
    assert loss_trends(_points(flat + [1.05, 1.1, 1.12, 1.15])) == []  # +10% by default
    assert memory_growing(1 << 30, 3 << 30) is not None and memory_growing(1 << 30, 1 << 30) is None
    assert gpu_underused([5, 10]) is not None and gpu_underused([5, 90]) is None and gpu_underused([]) is None
    # below 70 % for 10 minutes by default: five minutes low is not yet underused
    assert gpu_underused([40, 50], 70, "NVML", low_for=300, duration=600) is None
    said = gpu_underused([40, 50], 70, "NVML", low_for=660, duration=600)
    assert "low for 11 min: 40%, 50%" in said and "rule: below 70% for 10 min" in said, said


@pytest.mark.parametrize(
    ("evidence", "reason", "rule"),
    [
        (Evidence(exit_code=1, log_tail=[TS + "Traceback (most recent call last):", TS + "RuntimeError: gather"]),
         R.EVALUATOR_CRASH, "evaluator:log:traceback"),
        (Evidence(exit_code=1, log_tail=[TS + "torch.OutOfMemoryError: CUDA out of memory"]), R.EVALUATOR_CRASH, "evaluator:log:cuda-oom"),
        (Evidence(exit_code=None, signal=9), R.EVALUATOR_CRASH, "evaluator:signal:SIGKILL"),
        (Evidence(exit_code=0, output_problem="output line 3: missing 'correct'"), R.EVALUATOR_CRASH, "evaluator:bad-output"),
        (Evidence(exit_code=0), R.COMPLETED, "exit:0"),
        (Evidence(exit_code=None, signal=15), R.PREEMPTED, "signal:SIGTERM"),
        (Evidence(exit_code=None, signal=9, timed_out=True), R.TIMEOUT, "trackway:time-limit"),
        (Evidence(exit_code=None, signal=15, cancelled=True), R.USER_CANCELLED, "trackway:cancel"),
        (Evidence(exit_code=127), R.CONFIG_ERROR, "exit:127"),
    ],
)
def test_an_evaluation_attempt_that_fails_on_its_own_is_an_evaluator_crash(evidence, reason, rule):
    from dataclasses import replace

    verdict = classify(replace(evidence, evaluation=True))
    assert (verdict.reason, verdict.rule) == (reason, rule)


JUDGE_DOWN = [TS + "Traceback (most recent call last):",
              TS + "__main__.JudgeUnreachable: judge at http://judge.internal:8000 did not answer"]


@pytest.mark.parametrize(
    ("phase", "evidence", "reason", "rule"),
    [
        # Only the scoring phase asks a judge: there, one that does not answer is the surroundings' fault.
        ("scoring", Evidence(exit_code=1, log_tail=JUDGE_DOWN), R.INFRA_TRANSIENT, "scoring:judge-unreachable"),
        ("scoring", Evidence(exit_code=1, sdk_note={"reason": "code_error", "message": "judge unreachable: timed out"}),
         R.INFRA_TRANSIENT, "scoring:judge-unreachable"),
        # The same words from the inference phase (or an evaluation in one command) are the evaluator's crash.
        ("inference", Evidence(exit_code=1, log_tail=JUDGE_DOWN), R.EVALUATOR_CRASH, "evaluator:log:traceback"),
        (None, Evidence(exit_code=1, log_tail=JUDGE_DOWN), R.EVALUATOR_CRASH, "evaluator:log:traceback"),
        # A scorer that crashed on its own, or was preempted, keeps what it is.
        ("scoring", Evidence(exit_code=1, log_tail=[TS + "Traceback (most recent call last):", TS + "KeyError: 'x'"]),
         R.EVALUATOR_CRASH, "evaluator:log:traceback"),
        ("scoring", Evidence(exit_code=None, signal=15), R.PREEMPTED, "signal:SIGTERM"),
        ("inference", Evidence(exit_code=0, output_problem="the inference phase wrote nothing"), R.EVALUATOR_CRASH,
         "inference:no-outputs"),
    ],
)
def test_a_judge_that_cannot_be_reached_is_infra_transient_only_in_the_scoring_phase(phase, evidence, reason, rule):
    from dataclasses import replace

    verdict = classify(replace(evidence, evaluation=True, phase=phase))
    assert (verdict.reason, verdict.rule) == (reason, rule)


# torchrun 2.13's summary when rank 1 of two was SIGKILLed (captured from examples/faults/torchrun_rank_killed.py).
TORCHRUN_KILLED = [
    TS + "W1125 03:08:51.011000 23934 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
    "23938 closing signal SIGTERM",
    TS + "E1125 03:08:51.044000 23934 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: -9) local_rank: 1 (pid: 23939) of binary: /usr/bin/python",
    TS + "Traceback (most recent call last):",
    TS + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    TS + "Failures:",
    TS + "[1]:",
    TS + "  rank      : 0 (local_rank: 0)",
    TS + "  exitcode  : -15 (pid: 23938)  (SIGTERM)",
    TS + "  traceback : Signal 15 (SIGTERM) received by PID 23938",
    TS + "Root Cause (first observed failure):",
    TS + "[0]:",
    TS + "  time      : 2026-11-25_03:08:51",
    TS + "  host      : localhost",
    TS + "  rank      : 1 (local_rank: 1)",
    TS + "  exitcode  : -9 (pid: 23939)  (SIGKILL)",
    TS + "  error_file: <N/A>",
    TS + "  traceback : Signal 9 (SIGKILL) received by PID 23939",
    TS + "=======================================================",
]
GLOO = TS + "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"


def _with_root_cause(exitcode: str, signal_name: str) -> list[str]:
    return [line.replace("-9 (pid: 23939)  (SIGKILL)", f"{exitcode} (pid: 23939)  ({signal_name})") for line in TORCHRUN_KILLED]


@pytest.mark.parametrize(
    ("tail", "note", "reason", "rule"),
    [
        # The survivor's gloo error and its SDK note (code_error) came after the kill: the kill decides.
        ([GLOO, *TORCHRUN_KILLED], None, R.INFRA_TRANSIENT, "torchrun:rank-SIGKILL"),
        ([GLOO, *TORCHRUN_KILLED], {"reason": "code_error", "message": "RuntimeError: Connection closed by peer"},
         R.INFRA_TRANSIENT, "torchrun:rank-SIGKILL"),
        # The agent's SIGTERM to the survivor wrote a preempted note; the first failure was still a SIGKILL.
        (TORCHRUN_KILLED, {"reason": "preempted", "message": "preemption notice (SIGTERM)"},
         R.INFRA_TRANSIENT, "torchrun:rank-SIGKILL"),
        # The kernel's OOM killer said so in the log: an OOM, not the infrastructure.
        ([TS + "Out of memory: Killed process 23939 (python)", *TORCHRUN_KILLED], None, R.OOM,
         "torchrun:rank-killed:host-oom"),
        # A SIGTERM first (a reclaimed machine tells every rank): a preemption, as for a single process.
        (_with_root_cause("-15", "SIGTERM"), {"reason": "preempted", "message": "preemption notice (SIGTERM)"},
         R.PREEMPTED, "sdk:note"),
        (_with_root_cause("-15", "SIGTERM"), None, R.PREEMPTED, "torchrun:rank-SIGTERM"),
        # A rank that failed by its own exception: its traceback decides, not the survivors' lost connections.
        ([*_traceback("ZeroDivisionError: division by zero"), GLOO, *_with_root_cause("1", "N/A")], None,
         R.CODE_ERROR, "log:traceback"),
        # A specific note (a rank ran out of memory itself) is not overruled.
        (TORCHRUN_KILLED, {"reason": "oom", "message": "CUDA out of memory"}, R.OOM, "sdk:note"),
    ],
)
def test_torchruns_first_failure_outranks_what_the_surviving_ranks_said(tail, note, reason, rule):
    verdict = classify(Evidence(exit_code=1, log_tail=tail, made_progress=True, sdk_note=note))
    assert (verdict.reason, verdict.rule) == (reason, rule)
    if rule.startswith("torchrun:"):
        assert any("received by PID 23939" in line for line in verdict.lines)


@pytest.mark.parametrize(
    ("tail", "progress", "reason", "rule"),
    [
        ([TS + "usage: train.py [-h] [--lr LR]", TS + "train.py: error: unrecognized arguments: --lrr 0.1"], False,
         R.CONFIG_ERROR, "log:start-up-error"),
        ([TS + "train.py: error: argument --lr: invalid float value: 'fast'"], False, R.CONFIG_ERROR, "log:start-up-error"),
        (_traceback("ValueError: Unknown config key: lrr"), False, R.CONFIG_ERROR, "log:config-refused"),
        (_traceback("KeyError: 'missing required config key: model.dim'"), False, R.CONFIG_ERROR, "log:config-refused"),
        # After the first step the same words are the code's business; and a plain ValueError is no config error.
        (_traceback("ValueError: Unknown config key: lrr"), True, R.CODE_ERROR, "log:traceback"),
        (_traceback("ValueError: math domain error"), False, R.CODE_ERROR, "log:traceback"),
    ],
)
def test_a_command_refused_before_its_first_step_is_a_config_error(tail, progress, reason, rule):
    verdict = classify(Evidence(exit_code=1, log_tail=tail, made_progress=progress))
    assert (verdict.reason, verdict.rule) == (reason, rule)


def test_a_non_finite_loss_read_from_the_log_is_nan_loss():
    verdict = classify(Evidence(exit_code=0, stopped_by=("nan_in_log", "loss is nan at step 30")))
    assert (verdict.reason, verdict.rule) == (R.NAN_LOSS, "watcher:nan_in_log")


def test_exit_0_after_an_unfinished_notice_is_preempted():
    verdict = classify(Evidence(exit_code=0, unfinished_notice=True))
    assert (verdict.reason, verdict.rule) == (R.PREEMPTED, "sdk:notice-without-finish")
    assert classify(Evidence(exit_code=0)).reason is R.COMPLETED


@pytest.mark.parametrize(("state", "executor_reason"), [
    ("NODE_FAIL", "infra_transient"), ("CANCELLED", "user_cancelled"), ("PREEMPTED", "preempted"),
])
def test_the_schedulers_final_state_outranks_the_note_its_sigterm_caused(state, executor_reason):
    # Slurm SIGTERMs the step of a job whose node failed or that an operator cancelled; the SDK
    # writes its "preempted" note on that SIGTERM. The scheduler knows why; the note does not.
    note = {"reason": "preempted", "message": "preemption notice (SIGTERM) at step 54"}
    line = f"slurm job 36: {state}, exit code 75:0, partition test, nodes vm [squeue]"
    verdict = classify(Evidence(exit_code=75, sdk_note=note, executor_reason=executor_reason, executor_lines=[line]))
    assert (verdict.reason, verdict.rule) == (R(executor_reason), f"executor:{executor_reason}")
    assert verdict.lines[0] == line
    if executor_reason != "preempted":
        assert "the SDK's note said preempted" in verdict.lines[-1]


def test_trackways_own_cancel_still_outranks_what_the_executor_reports():
    verdict = classify(Evidence(exit_code=75, cancelled=True, executor_reason="preempted"))
    assert verdict.reason is R.USER_CANCELLED


def test_a_collective_error_reads_the_same_with_and_without_the_sdk():
    message = ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, "
               "NCCL version 2.19.3: Connection reset by peer")
    plain = classify(Evidence(exit_code=1, log_tail=_traceback(message), made_progress=True))
    noted = classify(Evidence(exit_code=1, log_tail=_traceback(message), made_progress=True,
                              sdk_note={"reason": "code_error", "message": message}))
    assert plain.reason is noted.reason is R.INFRA_TRANSIENT
    assert noted.rule == "sdk:note:network-or-io" and noted.lines == (message,)
    # An exception of the code's own stays a code error.
    other = classify(Evidence(exit_code=1, sdk_note={"reason": "code_error", "message": "KeyError: 'lr'"}))
    assert other.reason is R.CODE_ERROR


def _failed_at(line_no: int, message: str, step: int | None = 54) -> Evidence:
    tail = [TS + "Traceback (most recent call last):", TS + f'  File "/work/a/train.py", line {line_no}, in step',
            TS + "    y = model(x)", TS + message]
    return Evidence(exit_code=1, log_tail=tail, made_progress=True, last_step=step)


def test_a_failure_signature_ignores_numbers_and_paths_but_not_the_line_or_the_step():
    first = classify(_failed_at(54, "RuntimeError: size mismatch: 128 vs 0x7f3a in 'layer3'")).signature
    again = classify(_failed_at(54, "RuntimeError: size mismatch: 256 vs 0x7f00 in 'layer4'")).signature
    assert first.key == again.key and first.where == "train.py:54 in step" and first.step == 54
    assert first.shape == "size mismatch: <n> vs <hex> in <str>" and first.message.startswith("size mismatch: 128")
    assert classify(_failed_at(55, "RuntimeError: size mismatch: 128 vs 1")).signature.key != first.key
    assert classify(_failed_at(54, "RuntimeError: size mismatch: 128 vs 1", step=60)).signature.key != first.key
    assert classify(_failed_at(54, "ValueError: size mismatch: 128 vs 1")).signature.key != first.key


def test_the_sdks_note_and_a_plain_log_give_the_same_signature():
    plain = _failed_at(54, "KeyError: 'lr'")
    noted = Evidence(**{**plain.__dict__, "sdk_note": {"reason": "code_error", "message": "KeyError: 'lr'",
                                                       "exception": "KeyError", "step": 54}})
    assert classify(plain).signature == classify(noted).signature


def test_endings_from_outside_the_attempt_have_no_signature():
    assert classify(Evidence(exit_code=0)).signature is None
    assert classify(Evidence(signal=signal.SIGTERM, log_tail=[TS + "step 9"])).signature is None
    assert classify(Evidence(exit_code=1, executor_reason="preempted")).signature is None


# What torch printed here when torchrun's rendezvous met a port another process listened on.
_PORT_TAKEN = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
               "address. port: 29555, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")


def test_a_rendezvous_port_already_taken_is_transient_with_or_without_the_sdk():
    plain = classify(Evidence(exit_code=1, log_tail=_traceback(_PORT_TAKEN)))
    assert (plain.reason, plain.rule) == (R.INFRA_TRANSIENT, "log:port-in-use")
    assert TS + _PORT_TAKEN in plain.lines
    noted = classify(Evidence(exit_code=1, log_tail=_traceback(_PORT_TAKEN),
                              sdk_note={"reason": "code_error", "message": _PORT_TAKEN}))
    assert (noted.reason, noted.rule) == (R.INFRA_TRANSIENT, "sdk:note:port-in-use")
    python = classify(Evidence(exit_code=1, log_tail=_traceback("OSError: [Errno 98] Address already in use")))
    assert python.reason is R.INFRA_TRANSIENT
