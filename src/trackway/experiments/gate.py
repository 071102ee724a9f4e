"""The test-run gate: the checks a short test run must pass before the expensive full run is submitted.

Each check reads the ledger only (what the test run logged, its receipts, its events), so a
reader can redo it by hand:

- ended        the test run completed (at its max steps or its own end), not failed or cancelled;
- first_step   it logged a first step;
- no_red_flag  no watcher fired on it (stall, loss rising, plateau, throughput falling, memory, GPU idle, NaN);
- loss         the loss stayed finite and fell, by the trend test of supervisor/trends.py (Sen's slope and its
               interval): falling passes, not falling fails, too short or too noisy to judge is skipped;
- throughput   at least `--min-throughput`, else half the baseline's: in steps per CPU-second where both runs have
               the shim's `node/cpu_seconds` samples, else in wall-clock steps/s (a shortfall on a busy machine,
               load above 1 per core, is not judged); start-up excluded either way; skipped if nothing says;
- gpu_use      with GPUs, no `gpu_underused` finding ([watchers.gpu_underused]); skipped without GPUs, and
               "not measured" (skipped, never passed) when no GPU utilization was read;
- checkpoint   a checkpoint was committed;
- restore      the SDK read that checkpoint back from storage and it matched what was saved.

A check is passed (True), failed (False) or skipped (None, with why); only failures stop the experiment.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from trackway.experiments.criteria import Missing, Quantity
from trackway.experiments.quantities import RunNumbers
from trackway.ledger.schema import attempt_events, attempts, checkpoints, metric_points, metric_series, runs
from trackway.supervisor.trends import direction
from trackway.supervisor.watchers import WATCHER_KINDS

RESTORE_EVENT = "restore_check"  # written by the SDK in a test run (sdk/run.py)
CPU_SERIES = "node/cpu_seconds"  # cumulative CPU seconds of the attempt's process tree, sampled by the executor shim
BUSY_LOAD_PER_CORE = 1.0  # above this, the machine ran other work too: a run's wall time says little
MIN_TIMED_S = 1.0  # a test run that logged for less cannot be timed against anything: its throughput is not judged


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "passed": self.passed, "detail": self.detail}

    @property
    def mark(self) -> str:
        return {True: "pass", False: "FAIL", None: "skip"}[self.passed]


def check_test_run(conn: Connection, run_id: str, baseline_run_id: str, plan: dict[str, Any],
                   load_per_core: float | None = None) -> list[Check]:
    """Every check of the gate on the ended test run `run_id`; `load_per_core`: the load of the machine it ran on
    (None: not known), which says whether its wall time can be compared."""
    loss_key = plan.get("loss_key") or "loss"
    run = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().one()
    tried = conn.execute(
        select(attempts).where(attempts.c.run_id == run_id).order_by(attempts.c.attempt_number)
    ).mappings().all()
    attempt_ids = [a["attempt_id"] for a in tried]
    return [
        _ended(run, tried),
        _first_step(tried),
        _no_red_flag(conn, attempt_ids),
        _loss(conn, run_id, loss_key),
        _throughput(conn, run_id, baseline_run_id, plan.get("min_throughput"), load_per_core),
        _gpu_use(conn, run, attempt_ids),
        _checkpoint(conn, run_id),
        _restore(conn, attempt_ids),
    ]


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.passed is False]


def _ended(run, tried) -> Check:
    if run["state"] == "completed":
        steps = max((a["last_step"] for a in tried if a["last_step"] is not None), default=None)
        return Check("ended", True, f"completed after {len(tried)} attempt(s), last step {steps}")
    last = tried[-1] if tried else None
    reason = run["termination_reason"] or (last["termination_reason"] if last else None) or run["state"]
    evidence = ""
    if last is not None and last["termination_evidence"]:
        lines = json.loads(last["termination_evidence"]).get("lines") or []
        evidence = f": {lines[-1][:200]}" if lines else ""
    return Check("ended", False, f"the test run {run['state']} ({reason}){evidence}")


def _first_step(tried) -> Check:
    firsts = [a["first_step"] for a in tried if a["first_step"] is not None]
    if not firsts:
        return Check("first_step", False, "no step was logged")
    return Check("first_step", True, f"first step {min(firsts)} logged")


def _no_red_flag(conn: Connection, attempt_ids: list[str]) -> Check:
    if not attempt_ids:
        return Check("no_red_flag", False, "the test run has no attempt")
    rows = conn.execute(
        select(attempt_events.c.attempt_id, attempt_events.c.kind, attempt_events.c.payload)
        .where(attempt_events.c.attempt_id.in_(attempt_ids), attempt_events.c.kind.in_(WATCHER_KINDS))
        .order_by(attempt_events.c.attempt_id, attempt_events.c.seq)
    ).all()
    if not rows:
        return Check("no_red_flag", True, "no watcher fired")
    said = "; ".join(f"{kind}: {json.loads(payload).get('message', '')}"[:160] for _, kind, payload in rows[:3])
    return Check("no_red_flag", False, said)


def _loss(conn: Connection, run_id: str, key: str) -> Check:
    values = [
        v for (v,) in conn.execute(
            select(metric_points.c.value)
            .join(metric_series, metric_points.c.series_id == metric_series.c.series_id)
            .where(metric_series.c.run_id == run_id, metric_series.c.key == key, metric_series.c.rank == 0)
            .order_by(metric_points.c.step)
        )
    ]
    name = "loss"
    if not values:
        return Check(name, False, f"{key!r} was never logged")
    bad = [v for v in values if v is None or not math.isfinite(v)]
    if bad:
        return Check(name, False, f"{key!r} was not finite at {len(bad)} of {len(values)} points")
    found = direction(values)
    passed = {"falling": True, "not_falling": False, "undecided": None}[found.verdict]
    return Check(name, passed, f"{key}: {found.detail}")


def _throughput(conn: Connection, run_id: str, baseline_run_id: str, minimum: float | None,
                load_per_core: float | None) -> Check:
    """Against `--min-throughput` as asked; else against the baseline, in CPU time per step where both runs have
    `node/cpu_seconds` (a machine busy with other work stretches wall time, not CPU time), else in wall steps/s."""
    probe = Quantity("throughput")
    numbers = RunNumbers(conn, run_id)
    try:
        value, how = numbers.throughput(probe)
        steps, seconds = numbers.step_timing(probe)
    except Missing as exc:
        return Check("throughput", None if minimum is None else False, exc.why)
    # A test run placed apart from the baseline (experiment start --test-resource/--test-gpus) ran on other
    # hardware: its speed says nothing of the full run's against the baseline's.
    placed = conn.execute(select(runs.c.run_id, runs.c.resource, runs.c.gpus)
                          .where(runs.c.run_id.in_((run_id, baseline_run_id)))).mappings().all()
    where = {row["run_id"]: (row["resource"], row["gpus"] or 0) for row in placed}
    if minimum is None and run_id in where and baseline_run_id in where and where[run_id] != where[baseline_run_id]:
        (resource, gpus), (base_resource, base_gpus) = where[run_id], where[baseline_run_id]
        return Check("throughput", None, f"{value:.4g} ({how}) on {resource} with {gpus} GPU(s) is not comparable "
                                         f"with the baseline on {base_resource} with {base_gpus}; --min-throughput "
                                         "checks it")
    if seconds < MIN_TIMED_S:
        return Check("throughput", None, f"too short to time: {steps} steps logged in {seconds:.3g} s")
    if minimum is not None:
        return _unless_busy(value >= minimum, f"{value:.4g} ({how}); minimum {minimum:g}", load_per_core)
    mine, theirs = cpu_timing(conn, run_id), cpu_timing(conn, baseline_run_id)
    if mine is not None and theirs is not None:
        rate, base = mine[0] / mine[1], theirs[0] / theirs[1]
        return Check("throughput", rate >= 0.5 * base,
                     f"{rate:.4g} steps per CPU-second ({mine[1] / mine[0]:.3g} CPU-s a step over {mine[0]} steps after "
                     f"the first logged, {CPU_SERIES}); at least half the baseline's {base:.4g} expected")
    try:
        base, base_how = RunNumbers(conn, baseline_run_id, "baseline").throughput(probe)
    except Missing:
        return Check("throughput", None, f"{value:.4g} ({how}); no minimum and no baseline figure to compare")
    if how != base_how:
        return Check("throughput", None, f"{value:.4g} ({how}) is not comparable with the baseline's {base:.4g} ({base_how})")
    lacking = "the test run" if mine is None else "the baseline"
    return _unless_busy(value >= 0.5 * base,
                        f"{value:.4g} wall-clock ({how}; {lacking} has no {CPU_SERIES}); at least half the "
                        f"baseline's {base:.4g} expected", load_per_core)


def _unless_busy(passed: bool, detail: str, load_per_core: float | None) -> Check:
    """A wall-clock rate that falls short on a machine busy with other work is not judged: the run was not slow,
    the machine was shared."""
    if passed:
        return Check("throughput", True, detail)
    if load_per_core is not None and load_per_core > BUSY_LOAD_PER_CORE:
        return Check("throughput", None, f"not judged: {detail}, but the machine was busy (load average "
                                         f"{load_per_core:.2g} per core at the gate), so wall time is not comparable")
    return Check("throughput", False, detail
                 + ("" if load_per_core is not None else "; the load of the machine it ran on is not known"))


def cpu_timing(conn: Connection, run_id: str) -> tuple[int, float] | None:
    """(steps, CPU seconds) from each attempt's first `node/cpu_seconds` sample at or after its first logged step to
    its last (rank 0): the start-up before that sample is left out. None without two such samples that moved."""
    firsts = dict(conn.execute(
        select(attempts.c.attempt_number, attempts.c.first_step).where(attempts.c.run_id == run_id)
    ).all())
    rows = conn.execute(
        select(metric_points.c.attempt_number, metric_points.c.step, metric_points.c.value)
        .join(metric_series, metric_points.c.series_id == metric_series.c.series_id)
        .where(metric_series.c.run_id == run_id, metric_series.c.key == CPU_SERIES, metric_series.c.rank == 0)
        .order_by(metric_points.c.attempt_number, metric_points.c.step)
    ).all()
    by_attempt: dict[int, list[tuple[int, float]]] = {}
    for attempt, step, value in rows:
        # A sample before the attempt's first logged step was taken during its start-up.
        if value is not None and math.isfinite(value) and step >= (firsts.get(attempt) or 0):
            by_attempt.setdefault(attempt, []).append((step, value))
    steps, seconds = 0, 0.0
    for samples in by_attempt.values():
        (first_step, first_cpu), (last_step, last_cpu) = samples[0], samples[-1]
        if last_step > first_step and last_cpu > first_cpu:
            steps += last_step - first_step
            seconds += last_cpu - first_cpu
    return (steps, seconds) if steps > 0 and seconds > 0 else None


def load_per_core() -> float | None:
    """This machine's 1-minute load average per core (None where the OS does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def _gpu_use(conn: Connection, run, attempt_ids: list[str]) -> Check:
    if not run["gpus"]:
        return Check("gpu_use", None, "no GPUs")
    found = conn.execute(
        select(attempt_events.c.payload)
        .where(attempt_events.c.attempt_id.in_(attempt_ids), attempt_events.c.kind == "gpu_underused")
    ).first()
    if found is not None:
        return Check("gpu_use", False, json.loads(found[0]).get("message", "GPU utilization low"))
    measured = conn.execute(
        select(attempt_events.c.payload)
        .where(attempt_events.c.attempt_id.in_(attempt_ids), attempt_events.c.kind == "gpu_measured")
    ).first()
    if measured is None:
        # NVML sees the supervisor's own machine only: a run elsewhere that logs no `gpu_util` was never read.
        return Check("gpu_use", None, "not measured: no GPU utilization was read for this run (NVML sees local GPUs "
                                      "only; elsewhere, log a gpu_util metric)")
    source = json.loads(measured[0]).get("message", "GPU utilization read")
    return Check("gpu_use", True, f"no GPU-underused finding ({source}; [watchers.gpu_underused] rule)")


def _checkpoint(conn: Connection, run_id: str) -> Check:
    count, newest = conn.execute(
        select(func.count(), func.max(checkpoints.c.step))
        .where(checkpoints.c.run_id == run_id, checkpoints.c.committed_at.is_not(None))
    ).one()
    if not count:
        return Check("checkpoint", False, "no checkpoint was committed")
    return Check("checkpoint", True, f"{count} committed, newest at step {newest}")


def _restore(conn: Connection, attempt_ids: list[str]) -> Check:
    rows = conn.execute(
        select(attempt_events.c.payload)
        .where(attempt_events.c.attempt_id.in_(attempt_ids), attempt_events.c.kind == RESTORE_EVENT)
        .order_by(attempt_events.c.at)
    ).all()
    if not rows:
        return Check("restore", False, "no checkpoint was read back (the script saved none through the SDK)")
    said = json.loads(rows[-1][0])
    where = f"{said.get('name')} (step {said.get('step')})"
    if said.get("ok"):
        return Check("restore", True, f"{where} read back from storage: {said.get('compared', 0)} values match")
    return Check("restore", False, f"{where}: {said.get('problem') or 'did not match what was saved'}")
