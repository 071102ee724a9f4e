"""Retry policy as data: what to do after an attempt ends, per termination reason, and why.

`decide()` is a pure function of the policy and the run's history; the control loop only
applies what it returns. Every decision names the rule that made it, and is stored on the
attempt as `retry_decision`. The defaults are DESIGN.md's table:

    reason           action   budget  condition
    preempted        resume   10      -
    timeout          resume   5       only if the attempt committed a newer checkpoint
    infra_transient  resume   3       backoff 30 s, x2 each time
    stalled          resume   1       -
    oom              resume   3       only if batch shape / activation checkpointing / precision /
                                      placement changed since the attempt that ran out of memory
    evaluator_crash  retry    2       (evaluation runs)
    nan_loss, bad_data, config_error, code_error, unknown   stop
    completed, user_cancelled                                 none

A run-level GPU-hour budget, when set, stops everything once spent.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trackway.errors import InputError
from trackway.taxonomy import TerminationReason as R

ACTIONS = ("resume", "stop", "none")
CONDITIONS = ("newer_checkpoint", "changed_memory_fingerprint")


@dataclass(frozen=True)
class ReasonRule:
    action: str = "stop"
    budget: int = 0
    backoff_seconds: float = 0.0
    backoff_factor: float = 2.0
    backoff_max_seconds: float = 600.0
    requires: str | None = None


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
    R.BAD_DATA: ReasonRule("stop"),
    R.CONFIG_ERROR: ReasonRule("stop"),
    R.CODE_ERROR: ReasonRule("stop"),
    R.UNKNOWN: ReasonRule("stop"),
}

# Why a stop is the right call, said to the person reading `trackway explain`.
STOP_ADVICE: dict[R, str] = {
    R.NAN_LOSS: "the loss diverged; retrying replays the same numbers: lower the learning rate or fix the data, "
    "then resume from the last good checkpoint",
    R.BAD_DATA: "retrying bad data is wishful thinking with a GPU attached: fix or exclude the input",
    R.CONFIG_ERROR: "the command cannot start as configured: fix the import, path or argument",
    R.CODE_ERROR: "an uncaught exception in the training code: fix it, then `trackway resume`",
    R.UNKNOWN: "nothing explained the ending; read the evidence before spending more GPU time",
    R.OOM: "a retry would need the same memory and run out of it again: lower the batch, enable activation "
    "checkpointing, lower precision, or pick a resource with more GPU memory, then `trackway resume --set ...`",
}


@dataclass(frozen=True)
class RetryPolicy:
    rules: Mapping[R, ReasonRule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    gpu_hours_budget: float | None = None

    def rule(self, reason: R) -> ReasonRule:
        return self.rules.get(reason, ReasonRule("stop"))


@dataclass(frozen=True)
class AttemptOutcome:
    """What the policy needs to know of one ended attempt."""

    reason: R
    committed_checkpoint: bool = False
    memory_fingerprint: str | None = None


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
) -> Decision:
    """What to do after the last attempt in `history` (oldest first) ended."""
    last = history[-1]
    reason = last.reason
    rule = policy.rule(reason)
    name = reason.value
    if rule.action == "none":
        return Decision("none", f"{name}: nothing to do", f"the run ended {name}")
    if rule.action == "stop":
        return Decision("stop", f"{name}: stop", STOP_ADVICE.get(reason, f"{name} is not retried"))
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
        "resume from the latest committed checkpoint" + (f" after {delay:.0f} s" if delay else ""),
        delay_s=delay,
    )


def policy_from_mapping(doc: Mapping[str, Any], source: str) -> RetryPolicy:
    """A policy from a parsed TOML table: `gpu_hours_budget` and `[reasons.NAME]` tables over the defaults."""
    rules = dict(DEFAULT_RULES)
    for name, body in (doc.get("reasons") or {}).items():
        try:
            reason = R(name)
        except ValueError:
            raise InputError(f"{source}: [reasons.{name}]: expected one of {', '.join(r.value for r in R)}") from None
        if not isinstance(body, Mapping):
            raise InputError(f"{source}: [reasons.{name}] must be a table")
        unknown = set(body) - set(ReasonRule.__dataclass_fields__)
        if unknown:
            raise InputError(f"{source}: [reasons.{name}] {sorted(unknown)[0]}: expected one of {', '.join(ReasonRule.__dataclass_fields__)}")
        rule = replace(rules[reason], **body)
        if rule.action not in ACTIONS:
            raise InputError(f"{source}: [reasons.{name}] action {rule.action!r}: expected one of {', '.join(ACTIONS)}")
        if rule.requires is not None and rule.requires not in CONDITIONS:
            raise InputError(f"{source}: [reasons.{name}] requires {rule.requires!r}: expected one of {', '.join(CONDITIONS)}")
        if not isinstance(rule.budget, int) or rule.budget < 0:
            raise InputError(f"{source}: [reasons.{name}] budget: expected a whole number ≥ 0")
        rules[reason] = rule
    budget = doc.get("gpu_hours_budget")
    if budget is not None and not (isinstance(budget, int | float) and budget > 0):
        raise InputError(f"{source}: gpu_hours_budget: expected a positive number of GPU-hours")
    return RetryPolicy(rules=rules, gpu_hours_budget=float(budget) if budget is not None else None)


def load_policy(path: str | Path | None, project_doc: Mapping[str, Any] | None = None) -> RetryPolicy:
    """The defaults, then `[retry]` from trackway.toml, then a `--retry-policy FILE`."""
    merged: dict[str, Any] = {"reasons": {}}
    for doc in (project_doc or {}, _read(path) if path else {}):
        for name, body in (doc.get("reasons") or {}).items():
            merged["reasons"].setdefault(name, {}).update(body)
        if "gpu_hours_budget" in doc:
            merged["gpu_hours_budget"] = doc["gpu_hours_budget"]
    return policy_from_mapping(merged, str(path or "trackway.toml [retry]"))


def _read(path: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"--retry-policy {path}: no such file") from None
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
