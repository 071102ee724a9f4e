"""Checkpoint retention: which committed checkpoints to keep, which to supersede, which to delete, and why.

`plan_retention` is a pure function of what storage holds, the policy and what is protected, so
`trackway gc --dry-run` prints exactly what `apply_retention` would do. A checkpoint leaves in two
passes, never straight from committed to gone:

    committed ──(not kept: plan.supersede)──► superseded ──(still not kept, a later pass: plan.delete)──► deleted

Kept, whatever the policy says: the newest committed checkpoint, the last `keep_last` (at least 2,
so a corrupt newest one still leaves one to resume from) and everything in `protected` (the one an
attempt resumes from, ones evaluations or promotions reference). Only committed and superseded
checkpoints are candidates; writing, corrupt and half-deleted ones are never touched here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from trackway.checkpoints.layout import CheckpointError, CheckpointInfo, CheckpointState
from trackway.checkpoints.store import CheckpointStore

if TYPE_CHECKING:
    from trackway.checkpoints.object_store import RemoteCheckpoint, RemoteCheckpointStore


class RetentionPolicyError(CheckpointError, ValueError):
    """A retention policy that cannot be applied; the message names the field."""

    exit_code = 2
    http_status = 400


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep the last N, every K-th step, and the best N by a metric recorded in the manifest."""

    keep_last: int = 2
    keep_every: int | None = None
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: str = "min"

    def __post_init__(self) -> None:
        if not _count(self.keep_last) or self.keep_last < 2:
            raise RetentionPolicyError(
                f"keep_last must be an integer ≥ 2 (the newest checkpoint may turn out corrupt), got {self.keep_last!r}"
            )
        if self.keep_every is not None and (not _count(self.keep_every) or self.keep_every < 1):
            raise RetentionPolicyError(f"keep_every must be a positive integer or unset, got {self.keep_every!r}")
        if not _count(self.keep_best):
            raise RetentionPolicyError(f"keep_best must be an integer ≥ 0, got {self.keep_best!r}")
        if self.keep_best and not self.best_metric:
            raise RetentionPolicyError("keep_best needs best_metric: the metric (recorded at save time) to rank by")
        if self.best_mode not in ("min", "max"):
            raise RetentionPolicyError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")


@dataclass(frozen=True)
class RetentionPlan:
    """What one retention pass keeps (step → reasons), supersedes and deletes; steps in ascending order."""

    keep: dict[int, list[str]]
    supersede: list[int] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The plan as a person reads it, one line per checkpoint."""
        rows = [(step, f"keep       step {step}: {', '.join(reasons)}") for step, reasons in self.keep.items()]
        rows += [(step, f"supersede  step {step}") for step in self.supersede]
        rows += [(step, f"delete     step {step}") for step in self.delete]
        return [text for _, text in sorted(rows)]


def plan_retention(
    checkpoints: list[CheckpointInfo] | list[RemoteCheckpoint],
    policy: RetentionPolicy,
    protected: Mapping[int, str] = MappingProxyType({}),
) -> RetentionPlan:
    """Decide, without touching storage, what to keep, supersede and delete among `checkpoints`.

    Not kept and committed → supersede; not kept and already superseded → delete. A superseded
    checkpoint that is kept again (say, an evaluation now references it) stays superseded.
    """
    candidates = sorted((c for c in checkpoints if c.state.readable), key=lambda c: c.step)
    steps = sorted({c.step for c in candidates})
    keep: dict[int, list[str]] = {}

    def hold(step: int, reason: str) -> None:
        keep.setdefault(step, []).append(reason)

    if steps:
        hold(steps[-1], "newest")
    for step in steps[-policy.keep_last :]:
        hold(step, f"last {policy.keep_last}")
    if policy.keep_every:
        for step in steps:
            if step % policy.keep_every == 0:
                hold(step, f"every {policy.keep_every}")
    if policy.keep_best and policy.best_metric:
        for step in _best(candidates, policy):
            hold(step, f"best {policy.best_metric}")
    for step, reason in protected.items():
        if step in steps:
            hold(step, reason)
    supersede = [c.step for c in candidates if c.step not in keep and c.state is CheckpointState.COMMITTED]
    delete = [c.step for c in candidates if c.step not in keep and c.state is CheckpointState.SUPERSEDED]
    return RetentionPlan(keep={s: keep[s] for s in sorted(keep)}, supersede=supersede, delete=delete)


def apply_retention(store: CheckpointStore | RemoteCheckpointStore, plan: RetentionPlan) -> None:
    """Carry out a plan: supersede first, then delete (COMMITTED marker first, see `CheckpointStore.delete`).

    `store` is a local root or a remote one (object_store.py): both list, get, supersede and delete alike.

    Storage is read again before each step, so a plan made from an older listing cannot delete
    something that has changed since: only what is still superseded is deleted, and never the
    newest committed checkpoint storage holds now.
    """
    if overlap := sorted(set(plan.keep) & set(plan.delete + plan.supersede)):
        raise CheckpointError(f"retention plan both keeps and removes step(s) {overlap}; refusing to apply it")
    newest = max((c.step for c in store.list() if c.state.readable), default=None)
    for step in plan.supersede:
        info = store.get(step)
        if info is not None and info.state is CheckpointState.COMMITTED and step != newest:
            store.supersede(info)
    for step in plan.delete:
        info = store.get(step)
        if info is not None and info.state is CheckpointState.SUPERSEDED and step != newest:
            store.delete(info)


def _best(candidates: list[CheckpointInfo], policy: RetentionPolicy) -> list[int]:
    scored = []
    for info in candidates:
        value = ((info.manifest or {}).get("metrics") or {}).get(policy.best_metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            scored.append((value if policy.best_mode == "min" else -value, -info.step, info.step))
    return [step for *_, step in sorted(scored)[: policy.keep_best]]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
