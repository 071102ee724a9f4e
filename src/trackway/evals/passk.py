"""pass@k with the unbiased estimator, and the aggregation of one metric across seeds.

For a task with n samples of which c are correct, the chance that at least one of k samples
drawn without replacement is correct is

    pass@k = 1 - C(n - c, k) / C(n, k)

(Chen et al., 2021). It is computed as a running product so that large n cannot overflow,
and it is exactly 1 when fewer than k samples are wrong. A task set's pass@k is the mean over
its tasks; k may not exceed the fewest samples any task has.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

METRIC_PATTERN = re.compile(r"^pass@([1-9][0-9]*)$")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k for one task with `n` samples, `c` of them correct."""
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass@k needs 0 ≤ c ≤ n and n ≥ 1, got n={n} c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 ≤ k ≤ n (n={n} samples)")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    ratio = 1.0
    for i in range(n - c + 1, n + 1):
        ratio *= 1.0 - k / i
    return 1.0 - ratio


def metric_k(metric: str) -> int:
    """The k of a metric named `pass@k`; ValueError for any other name."""
    match = METRIC_PATTERN.match(metric)
    if match is None:
        raise ValueError(f"{metric!r}: expected pass@K with K a whole number ≥ 1")
    return int(match.group(1))


def task_set_pass_at_k(counts: Sequence[tuple[int, int]], max_k: int | None = None) -> dict[str, float]:
    """pass@k for every k from 1 to the fewest samples of any task (capped at `max_k`), from (n, c) per task."""
    if not counts:
        return {}
    fewest = min(n for n, _ in counts)
    top = fewest if max_k is None else min(fewest, max_k)
    return {f"pass@{k}": math.fsum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in range(1, top + 1)}


@dataclass(frozen=True)
class SeedSummary:
    """One metric across seeds: mean, sample standard deviation (0 for one seed), min, max, how many."""

    mean: float
    std: float
    min: float
    max: float
    seeds: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "std": self.std, "min": self.min, "max": self.max, "seeds": self.seeds}


def summarize(values: Iterable[float]) -> SeedSummary:
    values = list(values)
    if not values:
        raise ValueError("nothing to summarize: no seed has a value")
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return SeedSummary(mean=mean, std=std, min=min(values), max=max(values), seeds=len(values))
