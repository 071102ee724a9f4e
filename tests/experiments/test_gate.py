"""The gate's loss and throughput checks on a hand-built SQLite ledger, and the test run's default length.

Throughput: the executor shim's `node/cpu_seconds` (cumulative CPU seconds of the attempt's processes, at the step
reached) is inserted as the shim records it; a machine busy with other work stretches the wall time between logged
steps, not the CPU time each step takes.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from trackway.experiments.gate import check_test_run
from trackway.experiments.launch import default_test_steps
from trackway.ledger.open import open_ledger
from trackway.ledger.records import insert_attempt, insert_run
from trackway.ledger.schema import metric_points, metric_series

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)
STARTUP_S = 30.0  # before the first logged step: imports, data; never part of a rate


@pytest.fixture
def ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    yield led
    led.dispose()


def _run(conn, run_id: str, losses: list[float], seconds_per_step: float,
         cpu_per_step: float | None = None) -> None:
    """A completed run logging `losses` at steps 1.., one step every `seconds_per_step` s of wall time after a
    STARTUP_S start-up; with `cpu_per_step`, the shim's CPU samples at each step (start-up CPU included)."""
    insert_run(conn, dict(run_id=run_id, name=run_id, project="p", kind="test", state="completed",
                          command='["python"]', workdir="/w", resource="local", executor="local", gpus=0,
                          created_at=T0, termination_reason="completed"))
    insert_attempt(conn, dict(run_id=run_id, attempt_number=1, state="ended", executor="local", state_dir="/s",
                              log_path="/s/log", gpu_count=0, started_at=T0, first_step=1, last_step=len(losses),
                              ended_at=T0 + timedelta(seconds=STARTUP_S + seconds_per_step * len(losses)),
                              termination_reason="completed"))
    series = {"loss": losses}
    if cpu_per_step is not None:
        series["node/cpu_seconds"] = [12.0 + cpu_per_step * step for step in range(1, len(losses) + 1)]
    for key, values in series.items():
        series_id = conn.execute(metric_series.insert().values(run_id=run_id, key=key)).inserted_primary_key[0]
        conn.execute(metric_points.insert(), [
            dict(series_id=series_id, step=i + 1, value=v, attempt_number=1,
                 logged_at=1_000.0 + STARTUP_S + i * seconds_per_step)
            for i, v in enumerate(values)
        ])


def _check(ledger, name: str, run_id: str = "test", baseline: str = "base", load: float | None = None,
           plan: dict | None = None):
    with ledger.read() as conn:
        return next(c for c in check_test_run(conn, run_id, baseline, plan or {}, load) if c.name == name)


FALLING = [2.0 * math.exp(-0.2 * step) + 0.1 for step in range(1, 13)]


def test_a_busy_machine_slows_the_wall_clock_but_not_the_cpu_time_a_step_takes(ledger):
    with ledger.write() as conn:
        _run(conn, "base", FALLING, seconds_per_step=0.1, cpu_per_step=0.09)  # 10 steps/s
        _run(conn, "test", FALLING, seconds_per_step=0.3, cpu_per_step=0.09)  # 3.3 steps/s: the machine was shared
    check = _check(ledger, "throughput", load=3.0)
    assert check.passed is True
    # 11 steps after the first logged, 0.99 CPU-s: 11.1 steps per CPU-second on both runs.
    assert check.detail.startswith("11.11 steps per CPU-second (0.09 CPU-s a step over 11 steps")
    assert "node/cpu_seconds" in check.detail and "baseline's 11.11" in check.detail


def test_a_run_that_needs_more_cpu_per_step_fails_however_idle_the_machine(ledger):
    with ledger.write() as conn:
        _run(conn, "base", FALLING, seconds_per_step=0.1, cpu_per_step=0.09)
        _run(conn, "test", FALLING, seconds_per_step=0.3, cpu_per_step=0.27)  # three times the work a step
    check = _check(ledger, "throughput", load=0.1)
    assert check.passed is False and "steps per CPU-second" in check.detail


@pytest.mark.parametrize(("load", "passed", "said"), [
    (3.0, None, "not judged: "),  # busy: a wall-clock shortfall says nothing about the run
    (0.2, False, "at least half the baseline's 10 expected"),  # idle: it was slow
    (None, False, "the load of the machine it ran on is not known"),  # ran elsewhere
])
def test_without_cpu_samples_the_wall_clock_rate_is_judged_only_on_an_idle_machine(ledger, load, passed, said):
    with ledger.write() as conn:
        _run(conn, "base", FALLING, seconds_per_step=0.1, cpu_per_step=0.09)
        _run(conn, "test", FALLING, seconds_per_step=0.3)  # no shim samples: wall clock only
    check = _check(ledger, "throughput", load=load)
    assert check.passed is passed and said in check.detail
    assert "3.333 wall-clock (steps per second of logged points; the test run has no node/cpu_seconds)" in check.detail


def test_the_loss_check_is_the_trend_test(ledger):
    with ledger.write() as conn:
        _run(conn, "base", FALLING, seconds_per_step=0.1)
        _run(conn, "test", FALLING, seconds_per_step=0.1)
        _run(conn, "short", FALLING[:3], seconds_per_step=0.1)
        _run(conn, "rising", list(reversed(FALLING)), seconds_per_step=0.1)
        _run(conn, "noisy", [1.0, 1.3, 0.8, 1.25, 0.85, 1.2, 0.9, 1.15, 0.95, 1.1, 1.0, 1.05], seconds_per_step=0.1)
    falling = _check(ledger, "loss")
    assert falling.passed is True and falling.detail.startswith("loss: falling: Sen's slope")
    short = _check(ledger, "loss", run_id="short")
    assert short.passed is None and "too short to judge: 3 points" in short.detail  # skipped, not failed
    rising = _check(ledger, "loss", run_id="rising")
    assert rising.passed is False and "not falling" in rising.detail
    noisy = _check(ledger, "loss", run_id="noisy")
    assert noisy.passed is None and "too noisy to judge" in noisy.detail


@pytest.mark.parametrize(("planned", "log_every", "steps"), [
    (60, 1, 12),  # a tenth (6) is too few points for a trend: 12 loss points
    (60, None, 50),  # interval not known: at least 50
    (30, None, 30),  # ... never past the planned steps
    (1000, 10, 120),  # 12 points at every 10 steps beats a tenth (100)
    (100_000, 1, 200),  # a tenth, at most 200
    (100_000, 100, 1200),  # ... unless 12 points need more
    (None, None, 100),  # no step count in the config
])
def test_the_default_test_run_is_long_enough_for_the_trend_test(planned, log_every, steps):
    found, rule = default_test_steps(planned, log_every)
    assert found == steps
    assert ("12 loss points" in rule) == (log_every is not None)


def test_gpu_use_read_nowhere_is_not_measured_never_passed(ledger):
    from trackway.ledger.schema import runs
    from trackway.ledger.supervisor_events import add_supervisor_event

    with ledger.write() as conn:
        _run(conn, "test", [2.0 - 0.05 * i for i in range(20)], 0.1)
        conn.execute(runs.update().where(runs.c.run_id == "test").values(gpus=1))
    unread = _check(ledger, "gpu_use")
    assert unread.passed is None and unread.detail.startswith("not measured")
    with ledger.write() as conn:
        add_supervisor_event(conn, "test/1", "gpu_measured", {"message": "GPU utilization read from NVML"})
    read = _check(ledger, "gpu_use")
    assert read.passed is True and "NVML" in read.detail
    with ledger.write() as conn:
        add_supervisor_event(conn, "test/1", "gpu_underused", {"message": "GPU utilization low for 12 min: 5%"})
    assert _check(ledger, "gpu_use").passed is False
