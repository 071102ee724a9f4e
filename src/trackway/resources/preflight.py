"""The memory preflight's answer: the peak per GPU at the median, p99 and longest batch, a verdict per GPU,
and for each GPU it does not fit, the changes that make it fit, cheapest first.

The verdict is taken at the longest batch, because over a run some step meets it; the median
and p99 say what most steps cost. A fix is listed only if the estimate with it fits (≤ 0.95 of
the GPU). Their order is what they cost the user:

    fused cross-entropy          same math, same speed: a loss kernel that never materialises logits
    smaller micro-batch          same math and effective batch (more accumulation steps): a little slower
    token budget / cut length    changes the batches, or the data (offered when it cuts ≤ 10% of samples)
    activation checkpointing     ≈ +33% compute: each layer's forward runs again in backward
    a bigger GPU                 money
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from trackway.resources.gpu_catalog import Target
from trackway.resources.memory_model import FITS_BELOW, GIB, Breakdown, bytes_per_token, estimate, verdict
from trackway.resources.preflight_spec import PreflightSpec
from trackway.resources.seq_lengths import BatchShape, batch_shape

POINTS = (("median", 0.5), ("p99", 0.99), ("max", None))
MAX_CUT_SHARE = 0.10  # a shorter max_length that would cut more samples than this changes the data too much to offer


@dataclass(frozen=True)
class Correction:
    """A calibration: measured peaks are `factor` × the estimate (without the context), from `source`."""

    factor: float
    source: str


@dataclass(frozen=True)
class Fix:
    change: str
    cost: str
    peak_gib: float
    ratio: float


@dataclass
class TargetVerdict:
    target: Target
    at: dict[str, tuple[str, float]]  # point label → (verdict, ratio)
    longest_fitting: int | None = None  # the longest padded length that fits at this micro-batch
    fixes: list[Fix] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.at["max"][0]


@dataclass
class Report:
    spec: PreflightSpec
    points: dict[str, tuple[BatchShape, Breakdown]]
    targets: list[TargetVerdict]
    correction: Correction | None = None

    @property
    def peak_gib(self) -> float:
        return self.points["max"][1].total / GIB

    def for_target(self, name: str) -> TargetVerdict | None:
        return next((t for t in self.targets if t.target.name == name), None)

    def longest_share(self) -> dict[str, float] | None:
        """How often a step meets the longest batch (dynamic padding with lengths read)."""
        lengths = self.spec.lengths
        if lengths is None or self.spec.padding != "dynamic":
            return None
        share = lengths.steps_with_longest(self.spec.setup.micro_batch)
        facts = {"samples_at_longest": lengths.share_longest(), "steps_with_longest": share}
        if self.spec.steps:
            facts["expected_steps_at_longest"] = share * self.spec.steps
        return facts

    def summary(self, target: str | None = None) -> str:
        """One line for submit and explain: the peak, and the verdict on `target` (or on each)."""
        shape = self.points["max"][0]
        head = f"{self.peak_gib:.1f} GiB per GPU at the longest batch ({_shape_text(shape)})"
        chosen = [t for t in self.targets if target is None or t.target.name == target]
        verdicts = ", ".join(f"{t.target.name} {t.verdict} {t.at['max'][1]:.2f}" for t in chosen)
        return head + (f": {verdicts}" if verdicts else "") + (" (calibrated)" if self.correction else "")

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "model": {"params": spec.model.total_params, "layers": spec.model.layers, "hidden": spec.model.hidden,
                      "heads": spec.model.heads, "kv_heads": spec.model.kv_heads or spec.model.heads,
                      "ffn": spec.model.ffn_width, "vocab": spec.model.vocab, "name": spec.model_name},
            "setup": spec.describe(),
            "precision": spec.setup.precision,
            "model_family": spec.model_family,
            "lengths": None if spec.lengths is None else {
                "samples": spec.lengths.count, "longest": spec.lengths.longest, "median": spec.lengths.quantile(0.5),
                "cut_at_max_length": spec.lengths.truncated, "whitespace_proxy": spec.lengths.proxy},
            "longest_batches": self.longest_share(),
            "points": {label: {"row_length": shape.row_length, "tokens": shape.tokens,
                               "gib": {k: round(v, 4) for k, v in breakdown.gib().items()}}
                       for label, (shape, breakdown) in self.points.items()},
            "peak_gib": round(self.peak_gib, 4),
            "correction": None if self.correction is None else {"factor": self.correction.factor,
                                                                "source": self.correction.source},
            "targets": [{"name": t.target.name, "capacity_gib": t.target.capacity_gib, "source": t.target.source,
                         "resource": t.target.resource, "verdict": t.verdict,
                         "longest_fitting_length": t.longest_fitting,
                         "at": {label: {"verdict": v, "ratio": round(r, 4)} for label, (v, r) in t.at.items()},
                         "fixes": [{"change": f.change, "cost": f.cost, "peak_gib": round(f.peak_gib, 3),
                                    "ratio": round(f.ratio, 4)} for f in t.fixes]}
                        for t in self.targets],
        }


def run_preflight(spec: PreflightSpec, targets: list[Target], correction: Correction | None = None) -> Report:
    """The estimate at each point of the length distribution, and each target's verdict and fixes."""
    factor = correction.factor if correction else 1.0
    points = {}
    for label, q in POINTS:
        shape = _shape(spec, q)
        points[label] = (shape, estimate(spec.model, spec.setup, shape.row_length, shape.tokens, factor))
    report = Report(spec, points, [], correction)
    for target in targets:
        at = {label: verdict(breakdown.total, target.capacity_gib) for label, (_, breakdown) in points.items()}
        row = TargetVerdict(target, at)
        if spec.padding in ("dynamic", "fixed"):
            row.longest_fitting = _longest_fitting_length(spec, target.capacity_gib * GIB, factor)
        if row.verdict != "FITS":
            row.fixes = _fixes(spec, target, targets, factor)
        report.targets.append(row)
    return report


def _shape(spec: PreflightSpec, q: float | None) -> BatchShape:
    return batch_shape(spec.lengths, q, spec.setup.micro_batch, spec.padding, spec.max_length, spec.group_by_length)


def _fixes(spec: PreflightSpec, target: Target, targets: list[Target], factor: float) -> list[Fix]:
    """The changes that make the longest batch fit on `target`, cheapest first (see the module docstring)."""
    capacity = target.capacity_gib * GIB
    longest = _shape(spec, None)
    setup = spec.setup
    fixes: list[Fix] = []

    def fits(candidate: PreflightSpec, change: str, cost: str) -> bool:
        shape = _shape(candidate, None)
        total = estimate(candidate.model, candidate.setup, shape.row_length, shape.tokens, factor).total
        if total <= FITS_BELOW * capacity:
            fixes.append(Fix(change, cost, total / GIB, total / capacity))
            return True
        return False

    if not setup.fused_cross_entropy:
        fits(replace(spec, setup=replace(setup, fused_cross_entropy=True)),
             "a fused cross-entropy (Liger's fused linear cross-entropy, cut-cross-entropy): the logits are never "
             "materialised", "same math and speed; one dependency")
    effective = setup.micro_batch * spec.grad_accum
    for smaller in range(setup.micro_batch - 1, 0, -1):
        if effective % smaller:
            continue
        if fits(replace(spec, setup=replace(setup, micro_batch=smaller), grad_accum=effective // smaller),
                f"micro-batch {smaller} with {effective // smaller} gradient accumulation steps (the same effective "
                f"batch of {effective} per GPU)", "same math; smaller kernels run somewhat slower"):
            break
    fixed = estimate(spec.model, setup, longest.row_length, 0.0, factor).total
    per_token = bytes_per_token(spec.model, setup, longest.row_length)
    budget = math.floor((FITS_BELOW * capacity - fixed) / per_token) if per_token > 0 else 0
    if spec.padding != "packed" and longest.row_length <= budget < longest.tokens:
        fixes.append(Fix(f"a token budget of {budget:,} tokens per micro-batch (max_tokens): long samples travel in "
                         "smaller batches", "the number of samples per step varies",
                         (fixed + budget * per_token) / GIB, (fixed + budget * per_token) / capacity))
    cut = _longest_fitting_length(spec, capacity, factor, int(longest.row_length))
    share = 1.0 - spec.lengths.share_at_most(cut) if spec.lengths is not None else 1.0
    if spec.padding in ("dynamic", "fixed") and 0 < cut < longest.row_length and share <= MAX_CUT_SHARE:
        shape = BatchShape(cut, setup.micro_batch * cut)
        total = estimate(spec.model, setup, shape.row_length, shape.tokens, factor).total
        fixes.append(Fix(f"max_length {cut:,} (the longest that fits at micro-batch {setup.micro_batch})",
                         f"cuts {share:.1%} of samples", total / GIB, total / capacity))
    if not setup.activation_checkpointing:
        fits(replace(spec, setup=replace(setup, activation_checkpointing=True)),
             "activation checkpointing", "≈ +33% compute per step: each layer's forward runs again in backward")
    bigger = [t for t in targets if t.capacity_gib > target.capacity_gib]
    total = estimate(spec.model, setup, longest.row_length, longest.tokens, factor).total
    for other in sorted(bigger, key=lambda t: (t.cost_per_gpu_hour, t.capacity_gib)):
        if total <= FITS_BELOW * other.capacity_gib * GIB:
            price = f"${other.cost_per_gpu_hour:.2f}/GPU-h" if other.cost_per_gpu_hour else "a bigger GPU"
            fixes.append(Fix(f"{other.name} ({other.capacity_gib:g} GiB)", price, total / GIB,
                             total / (other.capacity_gib * GIB)))
            break
    if not fixes and not setup.activation_checkpointing:
        fits(replace(spec, setup=replace(setup, activation_checkpointing=True, fused_cross_entropy=True)),
             "activation checkpointing and a fused cross-entropy", "≈ +33% compute per step")
        for smaller in range(setup.micro_batch - 1, 0, -1):
            if effective % smaller == 0 and fits(
                replace(spec, setup=replace(setup, micro_batch=smaller, activation_checkpointing=True)),
                f"activation checkpointing and micro-batch {smaller} with {effective // smaller} accumulation steps",
                "≈ +33% compute per step, and smaller kernels",
            ):
                break
    return fixes


def _longest_fitting_length(spec: PreflightSpec, capacity: float, factor: float, upper: int = 1 << 22) -> int:
    """The longest padded length (up to `upper`) whose batch fits (≤ 0.95) at this micro-batch; 0 when none does."""
    low, high = 0, upper
    while low < high:
        middle = (low + high + 1) // 2
        total = estimate(spec.model, spec.setup, middle, spec.setup.micro_batch * middle, factor).total
        if total <= FITS_BELOW * capacity:
            low = middle
        else:
            high = middle - 1
    return low


def _shape_text(shape: BatchShape) -> str:
    if shape.tokens == shape.row_length or shape.tokens % shape.row_length:
        return f"{shape.tokens:,.0f} tokens"
    return f"{shape.tokens / shape.row_length:.0f} × {shape.row_length:,.0f} tokens"
