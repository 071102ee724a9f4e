"""Retry policy as data: what to do after an attempt ends, per termination reason, and why.

`decide()` is a pure function of the policy and the run's history; the control loop only
applies what it returns. Every decision names the rule that made it, and is stored on the
attempt as `retry_decision`. The defaults are docs/taxonomy.md's table (a test holds the two equal):

    reason           action   budget  condition
    preempted        resume   10      -
    timeout          resume   5       only if the attempt committed a newer checkpoint
    infra_transient  resume   3       backoff 30 s, x2 each time; never after a full disk (stop, say
                                      where to free space: a retry into a full disk is a retry storm)
    stalled          resume   1       -
    oom              resume   3       only if batch shape / activation checkpointing / precision /
                                      placement changed since the attempt that ran out of memory
    evaluator_crash  retry    2       (evaluation runs)
    nan_loss, watcher_stop, bad_data, config_error, code_error, unknown   stop
    completed, user_cancelled                                 none

A run in pieces (`submit --time-limit 100 --in-pieces`: `in_pieces = true` in its policy) plans its
timeouts: each attempt runs at most the longest tier (resources/selection.py's piece_hours), and
its `timeout` resumes it from its newest checkpoint, outside the timeout budget, for as long as
the run's total time is not spent; the decision says which piece ended and how much is left.

Whatever a reason's budget, a failure whose signature (exception, message shape, file and line,
step: supervisor/classify.py's Signature) is the same as an earlier attempt's of the run is not
retried again: "the same failure at step S in N attempts". A run-level GPU-hour budget, when
set, stops everything once spent.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trackway.errors import InputError
from trackway.supervisor.classify import DiskFull
from trackway.taxonomy import TerminationReason as R


@dataclass(frozen=True)
class ReasonRule:
    action: str = "stop"
    budget: int = 0
    backoff_seconds: float = 0.0
    backoff_factor: float = 2.0
    backoff_max_seconds: float = 600.0
    requires: str | None = None


_STOP = ReasonRule("stop")  # a reason no rule names
DEFAULT_RULES: dict[R, ReasonRule] = {
    R.COMPLETED: ReasonRule("none"),
    R.USER_CANCELLED: ReasonRule("none"),
    R.PREEMPTED: ReasonRule("resume", budget=10),
    R.TIMEOUT: ReasonRule("resume", budget=5, requires="newer_checkpoint"),
    R.INFRA_TRANSIENT: ReasonRule("resume", budget=3, backoff_seconds=30.0),
    R.STALLED: ReasonRule("resume", budget=1),
    R.OOM: ReasonRule("resume", budget=3, requires="changed_memory_fingerprint"),
    R.EVALUATOR_CRASH: ReasonRule("resume", budget=2),
    R.NAN_LOSS: ReasonRule("stop"),
    R.WATCHER_STOP: ReasonRule("stop"),
    R.BAD_DATA: ReasonRule("stop"),
    R.CONFIG_ERROR: ReasonRule("stop"),
    R.CODE_ERROR: ReasonRule("stop"),
    R.UNKNOWN: ReasonRule("stop"),
}

# Why a stop is the right call, said to the person reading `trackway explain`.
STOP_ADVICE: dict[R, str] = {
    R.NAN_LOSS: "the loss diverged; retrying replays the same numbers: lower the learning rate or fix the data, "
    "then `trackway resume` (it starts from the last good checkpoint)",
    R.WATCHER_STOP: "a watcher listed in `[supervisor] stop_on` ended it: a person decides what its finding means "
    "before more GPU time is spent",
    R.BAD_DATA: "retrying bad data is wishful thinking with a GPU attached: fix or exclude the input",
    R.CONFIG_ERROR: "the command cannot start as configured: fix the import, path or argument",
    R.CODE_ERROR: "an uncaught exception in the training code: fix it, then `trackway resume`",
    R.UNKNOWN: "nothing explained the ending; read the evidence before spending more GPU time",
    R.OOM: "a retry would need the same memory and run out of it again: lower the batch, enable activation "
    "checkpointing, lower precision, or pick a resource with more GPU memory, then `trackway resume --set ...`",
}

# Classification rules whose failure repeats exactly on a retry: stopped at once, whatever the budget.
DETERMINISTIC_RULES: dict[str, str] = {
    "evaluator:bad-output": "the evaluator's output breaks the contract (see the evidence for the first bad line); "
    "the same evaluator on the same checkpoint writes it again: fix the evaluator or the spec's [output] mapping, "
    "then ask for the evaluation again",
}


@dataclass(frozen=True)
class RetryPolicy:
    rules: Mapping[R, ReasonRule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    gpu_hours_budget: float | None = None
    # What a retry the policy decided does when the run's data changed since the attempt before it:
    # "warn" launches it and says which files changed; "stop" launches nothing (supervisor/launch.py).
    on_data_change: str = "warn"
    # The run's time limit is its total, run in pieces (`submit --in-pieces`): see the module docstring.
    in_pieces: bool = False

    def rule(self, reason: R) -> ReasonRule:
        found = self.rules.get(reason)
        return _STOP if found is None else found  # not built per call: a burst asks once per end


@dataclass(frozen=True)
class AttemptOutcome:
    """What the policy needs to know of one ended attempt."""

    reason: R
    committed_checkpoint: bool = False
    memory_fingerprint: str | None = None
    disk_full: DiskFull | None = None  # the attempt met a full disk (from its termination evidence)
    rule: str | None = None  # the classification rule that decided its reason (`evaluator:bad-output`)
    signature: str | None = None  # its failure's signature key (supervisor/classify.py's Signature)
    failure: str | None = None  # that failure in words: `RuntimeError: ... (train.py:54 in step)`
    step: int | None = None  # the step it failed at, when known


@dataclass(frozen=True)
class Pieces:
    """Where a run in pieces stands when an attempt ended: its total time, what its attempts ran, each piece's length."""

    total_s: float
    used_s: float
    piece_s: float | None  # None: not known (the attempt's selection did not plan one)

    @property
    def count(self) -> int:
        return math.ceil(self.total_s / self.piece_s - 1e-9) if self.piece_s else 1


@dataclass(frozen=True)
class Decision:
    action: str  # "resume", "stop" or "none"
    rule: str
    message: str
    delay_s: float = 0.0

    def as_record(self) -> dict[str, Any]:
        return {"action": self.action, "rule": self.rule, "message": self.message, "delay_s": self.delay_s}


def decide(
    policy: RetryPolicy,
    history: Sequence[AttemptOutcome],
    *,
    next_memory_fingerprint: str | None = None,
    run_gpu_seconds: float = 0.0,
    run_ref: str = "RUN",
    pieces: Pieces | None = None,
) -> Decision:
    """What to do after the last attempt in `history` (oldest first) ended; `run_ref` names the run in advice.

    `pieces`: for a policy `in_pieces`, the run's total time and what its attempts ran (see the module docstring).
    """
    last = history[-1]
    reason = last.reason
    rule = policy.rule(reason)
    name = reason.value
    if policy.in_pieces and reason is R.TIMEOUT and pieces is not None and last.disk_full is None:
        return _next_piece(history, pieces)
    if rule.action == "none":
        return Decision("none", f"{name}: nothing to do", f"the run ended {name}")
    if last.disk_full is not None:
        # Whatever the policy allows: a retry would meet the same full disk within seconds, again and again.
        return Decision("stop", f"{name}: disk full", disk_full_advice(last.disk_full, run_ref))
    if rule.action == "stop":
        return Decision("stop", f"{name}: stop", _stop_advice(reason, history))
    if last.rule in DETERMINISTIC_RULES:
        # Whatever the budget: the same evaluator on the same checkpoint writes the same bad line again.
        return Decision("stop", f"{name}: {last.rule}", DETERMINISTIC_RULES[last.rule])
    if last.signature is not None:
        seen = sum(1 for outcome in history[:-1] if outcome.signature == last.signature)
        if seen:
            # Whatever the budget: the same exception at the same line and step again is no accident.
            return Decision("stop", f"{name}: the same failure again", _same_failure_advice(last, seen + 1, run_ref))
    used = sum(1 for outcome in history[:-1] if outcome.reason is reason)
    if used >= rule.budget:
        return Decision(
            "stop", f"{name}: budget {rule.budget} spent", f"{used + 1} attempts ended {name}; the budget allows {rule.budget} retries"
        )
    if policy.gpu_hours_budget is not None and run_gpu_seconds / 3600 >= policy.gpu_hours_budget:
        return Decision(
            "stop",
            f"gpu-hours budget {policy.gpu_hours_budget:g} spent",
            f"the run used {run_gpu_seconds / 3600:.2f} GPU-hours of its {policy.gpu_hours_budget:g}",
        )
    if rule.requires == "newer_checkpoint" and not last.committed_checkpoint:
        return Decision(
            "stop",
            f"{name}: no newer checkpoint",
            "the attempt committed no checkpoint, so another attempt would redo the same work and hit the same limit",
        )
    if rule.requires == "changed_memory_fingerprint" and next_memory_fingerprint == last.memory_fingerprint:
        return Decision("stop", f"{name}: same memory footprint", STOP_ADVICE[R.OOM])
    delay = min(rule.backoff_max_seconds, rule.backoff_seconds * (rule.backoff_factor**used)) if rule.backoff_seconds else 0.0
    return Decision(
        "resume",
        f"{name}: resume ({used + 1} of {rule.budget})",
        _resume_from(history) + (f" after {delay:.0f} s" if delay else ""),
        delay_s=delay,
    )


# Less than this left of a run in pieces is not worth a launch (a queue, a restore): the run's time is spent.
PIECE_MIN_S = 60.0


def _next_piece(history: Sequence[AttemptOutcome], pieces: Pieces) -> Decision:
    """After a planned piece reached its time limit: the next piece from the newest checkpoint, or the end."""
    done = sum(1 for outcome in history if outcome.reason is R.TIMEOUT)
    left = pieces.total_s - pieces.used_s
    total = f"{pieces.total_s / 3600:g} h"
    said = (f"piece {done} of {pieces.count} reached its {pieces.piece_s / 3600:g} h limit as planned (--in-pieces: "
            f"{total} in all)" if pieces.piece_s else f"the attempt reached its time limit (--in-pieces: {total} in all)")
    if left < PIECE_MIN_S:
        return Decision("stop", "timeout: in pieces, total time spent",
                        f"{said}; the run's {total} are spent ({pieces.used_s / 3600:.2f} h run), so no piece follows")
    if not history[-1].committed_checkpoint:
        return Decision("stop", "timeout: in pieces, no newer checkpoint",
                        f"{said}, but it committed no checkpoint, so the next piece would redo the same work")
    return Decision("resume", f"timeout: in pieces, piece {done + 1} of {pieces.count}",
                    f"{said}; resume from the latest committed checkpoint for the next piece "
                    f"({left / 3600:.2f} h left)")


def _same_failure_advice(last: AttemptOutcome, count: int, run_ref: str) -> str:
    """`the same failure at step 54 in 3 attempts (RuntimeError: ...); it does not look transient: ...`."""
    at = f" at step {last.step}" if last.step is not None else ""
    what = f" ({last.failure})" if last.failure else ""
    if last.reason is R.EVALUATOR_CRASH:
        fix = ("a retry would crash the same way: fix the evaluator, then ask for the evaluation again "
               "(`trackway eval RUN@STEP --spec FILE`)")
    else:
        fix = f"it does not look transient, so no retry is made: fix the cause, then `trackway resume {run_ref}`"
    return f"the same failure{at} in {count} attempts{what}; {fix}"


def _resume_from(history: Sequence[AttemptOutcome]) -> str:
    """Where the next attempt starts, said truthfully: nothing committed means from the start."""
    if any(outcome.committed_checkpoint for outcome in history):
        return "resume from the latest committed checkpoint"
    return "resume from the start: no checkpoint was committed"


def _stop_advice(reason: R, history: Sequence[AttemptOutcome]) -> str:
    advice = STOP_ADVICE.get(reason, f"{reason.value} is not retried")
    if reason is R.NAN_LOSS and not any(outcome.committed_checkpoint for outcome in history):
        advice = advice.replace("(it starts from the last good checkpoint)", "(no checkpoint was committed: it starts over)")
    return advice


@dataclass(frozen=True)
class _Layer:
    """One validated policy document: rule overrides by reason, and the run-level budget if it sets one."""

    overrides: Mapping[R, Mapping[str, Any]]
    gpu_hours_budget: float | None
    sets_gpu_hours_budget: bool
    on_data_change: str | None = None
    in_pieces: bool | None = None


def _validate(doc: Any, source: str) -> _Layer:
    """Check every key and value of one policy document; refuse the first bad one in one line."""
    if not isinstance(doc, Mapping):
        raise InputError(f"{source}: expected a table of retry settings")
    if not doc:
        return _Layer({}, None, False)  # trackway.toml without [retry], as most are: no models to build
    from trackway.settings.refusal import shown
    from trackway.supervisor.policy_schema import PolicyTop, RuleOverride, checked

    top = checked(PolicyTop, doc, source, "")
    overrides: dict[R, Mapping[str, Any]] = {}
    for name, body in (top.reasons or {}).items():
        try:
            reason = R(name)
        except ValueError:
            raise InputError(f"{source}: [reasons.{name}]: expected one of {', '.join(r.value for r in R)}") from None
        if not isinstance(body, Mapping):
            raise InputError(f"{source}: [reasons.{name}]: expected a table, got {shown(body)}")
        rule = checked(RuleOverride, body, source, f"[reasons.{name}] ")
        overrides[reason] = rule.model_dump(exclude_unset=True)
    return _Layer(overrides, top.gpu_hours_budget, "gpu_hours_budget" in doc, top.on_data_change, top.in_pieces)


def disk_full_advice(full: DiskFull, run_ref: str) -> str:
    """What to do about an attempt that met a full disk: free space where it was met, then resume."""
    free = f" ({full.free_bytes} bytes were free)" if full.free_bytes is not None else ""
    where = (
        f"the file system holding {full.path}"
        if full.path
        else "the disk the attempt writes to (checkpoints, spool, outputs; the evidence did not name the path)"
    )
    return (
        f"the disk is full{free}; a retry would fail the same way at once, so none is made: "
        f"free space on {where}, then `trackway resume {run_ref}`"
    )


def policy_from_layers(layers: Sequence[tuple[Mapping[str, Any], str]]) -> RetryPolicy:
    """The defaults, then each (document, source) in turn: later tables override fields of earlier ones."""
    rules = dict(DEFAULT_RULES)
    gpu_hours_budget: float | None = None
    on_data_change = "warn"
    in_pieces = False
    for doc, source in layers:
        layer = _validate(doc, source)
        for reason, fields in layer.overrides.items():
            rules[reason] = replace(rules[reason], **fields)
        if layer.sets_gpu_hours_budget:
            gpu_hours_budget = layer.gpu_hours_budget
        on_data_change = layer.on_data_change or on_data_change
        in_pieces = layer.in_pieces if layer.in_pieces is not None else in_pieces
    return RetryPolicy(rules=rules, gpu_hours_budget=gpu_hours_budget, on_data_change=on_data_change,
                       in_pieces=in_pieces)


def policy_from_mapping(doc: Mapping[str, Any], source: str) -> RetryPolicy:
    """A policy from one parsed TOML table: `gpu_hours_budget` and `[reasons.NAME]` tables over the defaults."""
    return policy_from_layers([(doc, source)])


PROJECT_SOURCE = "trackway.toml [retry]"


def load_policy(path: str | Path | None, project_doc: Mapping[str, Any] | None = None) -> RetryPolicy:
    """The defaults, then `[retry]` from trackway.toml, then a `--retry-policy FILE`."""
    layers: list[tuple[Mapping[str, Any], str]] = [(project_doc or {}, PROJECT_SOURCE)]
    if path:
        layers.append((parse_policy_text(read_policy_text(path), path), f"--retry-policy {path}"))
    return policy_from_layers(layers)


def read_policy_text(path: str | Path) -> str:
    """The text of a --retry-policy file; a missing, unreadable or non-file path is refused in one line."""
    where = f"--retry-policy {path}"
    file = Path(path).expanduser()
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{where}: expected a TOML file, found a directory") from None
    except PermissionError:
        raise InputError(f"{where}: expected a readable TOML file, permission denied") from None
    except UnicodeDecodeError:
        raise InputError(f"{where}: expected a UTF-8 TOML file, found undecodable bytes") from None
    except OSError as exc:
        if file.is_dir():
            raise InputError(f"{where}: expected a TOML file, found a directory") from None
        raise InputError(f"{where}: expected a readable TOML file: {exc.strerror or exc}") from None


def parse_policy_text(text: str, path: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--retry-policy {path}: not valid TOML: {exc}") from None


# Config keys (matched by their last dotted segment) that change how much memory a step needs.
MEMORY_KEYS = frozenset(
    {
        "batch_size", "micro_batch_size", "per_device_train_batch_size", "train_micro_batch_size_per_gpu",
        "global_batch_size", "gradient_accumulation_steps", "seq_len", "max_seq_len", "max_length",
        "sequence_length", "block_size", "context_length", "gradient_checkpointing", "activation_checkpointing",
        "precision", "dtype", "mixed_precision", "bf16", "fp16", "tf32",
    }
)


def memory_fingerprint(config: Mapping[str, Any] | None, resource: str, gpus: int) -> str:
    """A digest of what decides an attempt's memory: batch shape, checkpointing, precision and placement."""
    import hashlib
    import json

    found: dict[str, Any] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif path.rsplit(".", 1)[-1] in MEMORY_KEYS:
            found[path] = node

    walk(config or {}, "")
    payload = json.dumps({"config": found, "resource": resource, "gpus": gpus}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
