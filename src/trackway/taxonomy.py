"""The words for states and endings: run states, attempt states and the termination taxonomy.

    run:      queued ──► running ──► completed
                            │   └──► failed      (the last attempt ended for any other reason)
                            └──────► cancelled   (trackway cancel)

    attempt:  starting ──► running ──► ended     (termination_reason says why)

An attempt that ended always carries exactly one `TerminationReason`; "failed" is never a reason.
"""

from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


class Approval(str, Enum):
    """A person's approval of a run an agent's settings hold back (`runs.approval`; NULL: none needed)."""

    AWAITING = "awaiting"  # recorded whole, nothing started: `trackway approve RUN` starts it
    APPROVED = "approved"
    REFUSED = "refused"  # ended cancelled before anything ran


class AttemptState(str, Enum):
    STARTING = "starting"
    # Submitted, held by the executor's queue (Slurm PENDING): not started, no compute spent yet.
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"

    def is_terminal(self) -> bool:
        return self is AttemptState.ENDED


class TerminationReason(str, Enum):
    """Why an attempt ended: the closed taxonomy of docs/taxonomy.md."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    INFRA_TRANSIENT = "infra_transient"
    STALLED = "stalled"
    # A watcher listed in `[supervisor] stop_on` ended it (loss rising, a plateau, throughput falling, host
    # memory growing, GPUs underused): none of the other reasons is true of such an ending.
    WATCHER_STOP = "watcher_stop"
    OOM = "oom"
    NAN_LOSS = "nan_loss"
    BAD_DATA = "bad_data"
    CONFIG_ERROR = "config_error"
    CODE_ERROR = "code_error"
    EVALUATOR_CRASH = "evaluator_crash"
    USER_CANCELLED = "user_cancelled"
    UNKNOWN = "unknown"


# An exception message that says the command's configuration is wrong, not the code: raised before
# the first step (nanoGPT's configurator: `ValueError: Unknown config key: lrr`), it is config_error.
# Read by the SDK (the exception itself) and by classification (the log line, for scripts without it).
CONFIG_MESSAGE_PATTERN = (
    r"\b(unknown|unrecognized|unrecognised|invalid|unexpected|missing|required|bad|unsupported)\b"
    r".{0,40}\b(config(uration)?|argument|option|flag|setting|parameter|hyperparameter|key)s?\b"
    r"|\b(config(uration)?|argument|option|flag|setting|parameter)s?\b.{0,40}"
    r"\b(unknown|unrecognized|unrecognised|invalid|not (allowed|supported|recognized|recognised|found)|missing|required)\b"
)
CONFIG_EXCEPTIONS = ("ValueError", "KeyError", "TypeError", "AssertionError", "TOMLDecodeError", "ArgumentError")


class RunKind(str, Enum):
    TEST = "test"
    FULL = "full"
    EVAL = "eval"
