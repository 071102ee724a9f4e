"""Kept min/max blocks make long curves cheap to chart and always equal their points, across overwrites (both backends)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from trackway.ledger.ingest import _ingest_metric_lines
from trackway.ledger.records import get_attempt, insert_attempt, insert_run
from trackway.ledger.schema import metric_points, metric_rollups, metric_series
from trackway.server.charts import series_chart

STEPS = 100_000


def _value(step: int) -> float:
    if step == 54_321:
        return 1e3  # a spike a chart must not lose
    return math.sin(step / 997) + step * 1e-5


def _write(ledger, run_id: str, number: int, key: str, steps: list[int], value) -> None:
    """Points written as the ingester writes a spool's lines: in batches, through the same function."""
    with ledger.write() as conn:
        attempt = get_attempt(conn, f"{run_id}/{number}")
        for start in range(0, len(steps), 10_000):
            chunk = steps[start:start + 10_000]
            _ingest_metric_lines(conn, attempt, [([key], chunk, [0.0] * len(chunk), [[value(s) for s in chunk]])])


@pytest.fixture
def run(ledger):
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rroll", name="roll", project="p", kind="full", state="running", command="[]",
                              workdir="/w", resource="local", executor="local", gpus=0, created_at=now))
        for number in (1, 2):
            insert_attempt(conn, dict(run_id="rroll", attempt_number=number, state="ended", executor="local",
                                      state_dir="/s", log_path="/s/log", gpu_count=0, started_at=now))
    _write(ledger, "rroll", 1, "loss", list(range(STEPS)), _value)
    with ledger.read() as conn:
        series = conn.execute(select(metric_series.c.series_id).where(metric_series.c.key == "loss")).scalar()
    return series


def _faithful(ledger, series_id: int, chart: dict, width: int) -> None:
    """Each bucket as drawn starts and ends on its real first and last points, and reaches its real min and max."""
    with ledger.read() as conn:
        points = conn.execute(select(metric_points.c.step, metric_points.c.value)
                              .where(metric_points.c.series_id == series_id).order_by(metric_points.c.step)).all()
    truth: dict[int, list[tuple[int, float]]] = {}
    for step, value in points:
        truth.setdefault(step // width, []).append((step, value))
    drawn: dict[int, list[tuple[int, float]]] = {}
    for step, value in zip(chart["steps"], chart["values"]):
        drawn.setdefault(step // width, []).append((step, value))
    assert chart["steps"] == sorted(chart["steps"]) and sorted(drawn) == sorted(truth)
    for bucket, real in truth.items():
        shown = drawn[bucket]
        assert shown[0] == pytest.approx(real[0]) and shown[-1] == pytest.approx(real[-1]), bucket
        assert min(v for _, v in shown) == pytest.approx(min(v for _, v in real)), bucket
        assert max(v for _, v in shown) == pytest.approx(max(v for _, v in real)), bucket


def test_a_long_curve_is_charted_from_kept_blocks_equal_to_its_points(ledger, run):
    chart = series_chart(ledger, run, max_points=200)  # 50 buckets of 2,048 steps: eight 256-step blocks each
    assert chart["downsampled"] and chart["points"] == STEPS and len(chart["steps"]) <= 200
    _faithful(ledger, run, chart, 2048)
    assert max(chart["values"]) == 1e3
    with ledger.read() as conn:
        kept = conn.execute(select(func.count()).select_from(metric_rollups).where(metric_rollups.c.series_id == run)).scalar()
    assert kept == math.ceil(STEPS / 256)
    assert series_chart(ledger, run, max_points=200) == chart  # the second time from the kept blocks alone


def test_a_resumed_attempt_that_rewrites_steps_is_charted_with_its_values(ledger, run):
    series_chart(ledger, run, max_points=200)
    # Attempt 2 redoes steps 60,000..70,000 (after the last checkpoint) with other values, one a new spike.
    _write(ledger, "rroll", 2, "loss", list(range(60_000, 70_001)),
           lambda step: 5e3 if step == 65_000 else -2.0 + step * 1e-6)
    chart = series_chart(ledger, run, max_points=200)
    _faithful(ledger, run, chart, 2048)
    assert max(chart["values"]) == 5e3 and 1e3 in chart["values"]  # the new spike, and the old one before it


def test_a_sparse_series_keeps_its_empty_blocks_too(ledger, run):
    # Ten points 100,000 steps apart: most 16,384-step blocks hold none, and are kept as empty, not scanned again.
    _write(ledger, "rroll", 1, "eval_loss", list(range(0, 1_000_000, 100_000)), lambda step: 1.0 / (step + 1))
    with ledger.read() as conn:
        sparse = conn.execute(select(metric_series.c.series_id).where(metric_series.c.key == "eval_loss")).scalar()
    chart = series_chart(ledger, sparse, max_points=100)  # 25 buckets wanted: 49,152 steps (three blocks) each
    assert chart["downsampled"] and chart["points"] == 10
    assert chart["steps"] == list(range(0, 1_000_000, 100_000)) and chart["values"][0] == 1.0
    _faithful(ledger, sparse, chart, 49_152)

    def kept() -> tuple[int, int]:
        with ledger.read() as conn:
            return tuple(conn.execute(select(func.count(), func.sum(metric_rollups.c.points))
                                      .where(metric_rollups.c.series_id == sparse)).one())

    assert kept() == (900_000 // 16_384 + 1, 10)  # 55 blocks, 45 of them empty
    assert series_chart(ledger, sparse, max_points=100) == chart and kept() == (55, 10)
