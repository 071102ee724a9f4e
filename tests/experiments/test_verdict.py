"""Quantities and verdicts on a hand-built ledger (both backends): every number is one a reader can redo by hand."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from trackway.experiments.criteria import Missing, Quantity, parse
from trackway.experiments.quantities import RunNumbers
from trackway.experiments.records import Verdict
from trackway.experiments.verdict import judge
from trackway.ledger.records import insert_attempt, insert_run, resolve_run
from trackway.ledger.schema import eval_metrics, evaluations, metric_points, metric_series

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)


def _run(conn, run_id: str, *, state: str = "completed", hours: list[float], losses: list[float],
         extra: dict[str, list[float]] | None = None, cost: float = 2.0, reason: str | None = None) -> None:
    """A run whose attempt k ran `hours[k]` hours on 2 GPUs; `losses` logged at steps 1.., split over the attempts."""
    insert_run(conn, dict(run_id=run_id, name=run_id, project="p", kind="full", state=state, command='["python"]',
                          workdir="/w", resource="local", executor="local", gpus=2, created_at=T0,
                          termination_reason=reason or state))
    start = T0
    for number, span in enumerate(hours, 1):
        insert_attempt(conn, dict(run_id=run_id, attempt_number=number, state="ended", executor="local",
                                  state_dir="/s", log_path="/s/log", gpu_count=2, started_at=start,
                                  ended_at=start + timedelta(hours=span), gpu_seconds=2 * span * 3600,
                                  cost_usd=cost * 2 * span, termination_reason="completed"))
        start += timedelta(hours=span + 0.5)  # half an hour queued between attempts
    series = {"loss": losses, **(extra or {})}
    per_attempt = math.ceil(len(losses) / len(hours))
    for key, values in series.items():
        series_id = conn.execute(metric_series.insert().values(run_id=run_id, key=key)).inserted_primary_key[0]
        conn.execute(metric_points.insert(), [
            dict(series_id=series_id, step=i + 1, value=v, attempt_number=i // per_attempt + 1,
                 logged_at=1_000.0 + i * 0.5 + (i // per_attempt) * 100)
            for i, v in enumerate(values)
        ])


def _evaluation(conn, run_id: str, eval_id: str, step: int, means: dict[str, float]) -> None:
    conn.execute(evaluations.insert().values(
        eval_id=eval_id, run_id=run_id, checkpoint_step=step, checkpoint_name=f"step-{step:08d}", checkpoint_path="/c",
        checkpoint_manifest_sha256="0" * 64, spec_name="arith", spec_sha256=_spec(conn), evaluator_version="v",
        task_set_sha256="t", decoding="{}", primary_metric="pass@1", eval_key=eval_id, trigger="every", state="completed",
        created_at=T0,
    ))
    for metric, mean in means.items():
        conn.execute(eval_metrics.insert().values(eval_id=eval_id, metric=metric, mean=mean, std=0.01, min=mean,
                                                  max=mean, seeds=3))


def _spec(conn) -> str:
    from trackway.ledger.blobs import put_blob

    return put_blob(conn, b"spec", "eval_spec")


@pytest.fixture
def filled(ledger):
    with ledger.write() as conn:
        # The baseline: 8 steps in one 4 h attempt; loss falls to 1.0.
        _run(conn, "base", hours=[4.0], losses=[3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0])
        # The change: preempted once (1 h + 1 h, half an hour between), reaches 1.0 at step 4, ends at 0.9.
        _run(conn, "fast", hours=[1.0, 1.0], losses=[2.0, 1.5, 1.2, 1.0, 0.95, 0.9],
             extra={"throughput": [100.0, 110.0, 120.0, 130.0, 140.0, 150.0]})
        _evaluation(conn, "fast", "ev1", 3, {"pass@1": 0.04, "pass@2": 0.07})
        _evaluation(conn, "fast", "ev2", 6, {"pass@1": 0.09, "pass@2": 0.12})
        _run(conn, "died", state="failed", reason="oom", hours=[0.5], losses=[2.0, 1.9])
    return ledger


def _value(conn, run_id: str, text: str) -> float:
    criterion = parse(f"{text} > 0")
    numbers = RunNumbers(conn, run_id)
    return numbers.value(criterion.left, lambda node: node.value)


def test_quantities_are_read_from_every_attempt_on_the_run_step_axis(filled):
    with filled.read() as conn:
        assert _value(conn, "fast", "final.loss") == 0.9
        assert _value(conn, "fast", "min.loss") == 0.9 and _value(conn, "fast", "max.loss") == 2.0
        assert _value(conn, "fast", "best.loss") == 0.9  # lower is better for a loss
        assert _value(conn, "fast", "best.throughput") == 150.0  # higher otherwise
        assert _value(conn, "fast", "mean.loss") == pytest.approx(sum([2.0, 1.5, 1.2, 1.0, 0.95, 0.9]) / 6)
        assert _value(conn, "fast", "steps") == 6
        assert _value(conn, "fast", "steps_to(loss, 1.0)") == 4
        # 1 h + 0.5 h queued + 1 h: wall time counts the wait; GPU-hours and cost count what ran.
        assert _value(conn, "fast", "wall_hours") == pytest.approx(2.5)
        assert _value(conn, "fast", "gpu_hours") == pytest.approx(4.0)
        assert _value(conn, "fast", "cost_usd") == pytest.approx(8.0)
        assert _value(conn, "fast", "throughput") == pytest.approx(125.0)  # the logged metric's mean
        assert _value(conn, "base", "throughput") == pytest.approx(2.0)  # derived: 7 steps in 3.5 s
        # The best evaluated checkpoint by pass@1 (step 6), read for any of its metrics.
        assert _value(conn, "fast", "eval.pass@1") == 0.09 and _value(conn, "fast", "eval.pass@2") == 0.12


def test_a_quantity_the_run_cannot_give_is_missing_with_why(filled):
    with filled.read() as conn:
        for text, why in (("final.accuracy", "never logged 'accuracy'"), ("eval.pass@1", "no completed evaluation"),
                          ("steps_to(loss, 0.1)", "never reached loss 0.1")):
            with pytest.raises(Missing, match=why):
                _value(conn, "base", text)


def test_all_criteria_holding_is_supported_with_the_numbers(filled):
    with filled.read() as conn:
        judged = judge(conn, [
            "final.loss <= baseline.final.loss * 1.05",
            "steps_to(loss, baseline.final.loss) <= 0.5 * baseline.steps",
            "eval.pass@1 > 0.05",
        ], resolve_run(conn, "fast"), "base", "x1")
    assert judged.verdict is Verdict.SUPPORTED
    steps = judged.outcomes[1]
    assert (steps.left, steps.right) == (4.0, 4.0)
    assert steps.values == {"steps_to(loss, baseline.final.loss)": 4.0, "baseline.final.loss": 1.0, "baseline.steps": 8.0}
    assert "push further" in judged.next_step


def test_one_failing_criterion_rejects_and_suggests_reverting(filled):
    with filled.read() as conn:
        judged = judge(conn, ["final.loss <= baseline.final.loss", "wall_hours <= 0.5 * baseline.wall_hours"],
                       resolve_run(conn, "fast"), "base", "x1")
    assert judged.verdict is Verdict.REJECTED
    assert "wall_hours <= 0.5 * baseline.wall_hours (2.5 vs 2)" in judged.why
    assert judged.next_step.startswith("revert")


def test_a_missing_quantity_is_inconclusive_not_rejected(filled):
    with filled.read() as conn:
        judged = judge(conn, ["final.loss <= baseline.final.loss", "final.accuracy > 0.5"],
                       resolve_run(conn, "fast"), "base", "x1")
    assert judged.verdict is Verdict.INCONCLUSIVE
    assert "final.accuracy" in judged.why and "never logged" in judged.why


def test_a_full_run_that_did_not_complete_is_inconclusive_whatever_its_numbers(filled):
    with filled.read() as conn:
        judged = judge(conn, ["final.loss >= 0"], resolve_run(conn, "died"), "base", "x1")
    assert judged.verdict is Verdict.INCONCLUSIVE
    assert "the full run failed (oom)" in judged.why
    assert "explain died" in judged.next_step


def test_no_criteria_is_inconclusive(filled):
    with filled.read() as conn:
        judged = judge(conn, [], resolve_run(conn, "fast"), "base", "x1")
    assert judged.verdict is Verdict.INCONCLUSIVE and "no criteria" in judged.why


def test_quantity_text_round_trips():
    assert Quantity("final", "loss", baseline=True).text() == "baseline.final.loss"
