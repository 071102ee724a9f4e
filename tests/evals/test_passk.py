"""pass@k against a reference computed with exact binomials, including the n = k and c = 0 edges."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from trackway.evals.passk import metric_k, pass_at_k, summarize, task_set_pass_at_k


def reference(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


@pytest.mark.parametrize(
    "n,c,k",
    [(1, 0, 1), (1, 1, 1), (4, 0, 1), (4, 0, 4), (4, 1, 1), (4, 1, 2), (4, 2, 2), (4, 3, 2), (4, 4, 4),
     (5, 5, 1), (10, 3, 5), (10, 1, 10), (20, 7, 3), (200, 13, 100), (200, 0, 200)],
)
def test_matches_the_exact_binomial_reference(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(reference(n, c, k), abs=1e-12)


def test_hand_computed_cases():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # one of four samples right
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(3, 0, 3) == 0.0  # n = k, nothing right
    assert pass_at_k(3, 1, 3) == 1.0  # n = k: the one right sample is always drawn
    assert pass_at_k(5, 3, 3) == 1.0  # fewer wrong samples than k: exactly 1


def test_large_n_does_not_overflow():
    assert pass_at_k(10_000, 1, 5_000) == pytest.approx(0.5)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_impossible_inputs_are_refused(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_a_task_set_averages_tasks_and_stops_at_the_fewest_samples():
    counts = [(4, 0), (4, 1), (4, 4), (2, 1)]
    values = task_set_pass_at_k(counts)
    assert set(values) == {"pass@1", "pass@2"}  # one task has only 2 samples
    assert values["pass@1"] == pytest.approx((0 + 0.25 + 1 + 0.5) / 4)
    assert values["pass@2"] == pytest.approx((0 + 0.5 + 1 + 1) / 4)


def test_seed_summary():
    s = summarize([0.1, 0.2, 0.3])
    assert (s.mean, s.min, s.max, s.seeds) == (pytest.approx(0.2), 0.1, 0.3, 3)
    assert s.std == pytest.approx(0.1)  # sample standard deviation
    assert summarize([0.4]).std == 0.0


def test_metric_names():
    assert metric_k("pass@8") == 8
    for bad in ("pass@0", "pass@", "acc", "pass@1.5"):
        with pytest.raises(ValueError):
            metric_k(bad)
