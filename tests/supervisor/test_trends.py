"""The trend tests behind `loss_rising`, `plateau` and the gate's loss check: noise-aware, windows in steps or time."""

import math
import random

import pytest

from trackway.supervisor.trends import Points, Window, direction, plateau, rising, sen_trend


def _series(values, every=10, seconds_per_step=0.1):
    steps = [i * every for i in range(len(values))]
    return Points.of(steps, [s * seconds_per_step for s in steps], values)


def _converging(seed, n=400, noise=0.05):
    r = random.Random(seed)
    return [(2.0 * (1 + 10 * i / 500) ** -0.5 + 0.3) * (1 + r.gauss(0, noise)) for i in range(n)]


@pytest.mark.parametrize(("text", "size", "unit"), [
    ("500 steps", 500, "steps"), ("3h", 10800, "seconds"), ("90 s", 90, "seconds"), ("10m", 600, "seconds"),
    ("1.5 hours", 5400, "seconds"), (200, 200, "steps"),
])
def test_a_window_is_steps_or_a_duration(text, size, unit):
    window = Window.parse(text)
    assert (window.size, window.unit) == (size, unit)


@pytest.mark.parametrize("text", ["3 parsecs", "-5 steps", "0 steps", "steps", "", True, "5e3 steps"])
def test_a_window_that_is_neither_is_refused_saying_what_was_expected(text):
    with pytest.raises(ValueError, match="expected"):
        Window.parse(text)


def test_four_log_points_rising_far_above_the_noise_are_enough():
    flat = [0.55 + 0.01 * ((i * 7) % 5 - 2) for i in range(30)]
    found = rising(_series(flat + [0.85, 1.56, 2.30, 2.9]), Window.parse("500 steps"))
    assert found is not None and found.points == 4
    assert "40 steps" not in str(found) and "4 points" in str(found) and "window 500 steps" in str(found)


def test_healthy_noisy_runs_never_look_rising_at_any_point_of_their_life():
    window = Window.parse("500 steps")
    for seed in range(6):
        values = _converging(seed, noise=0.15)
        for end in range(8, len(values), 7):
            assert rising(_series(values[:end]), window) is None, (seed, end)


def test_a_slow_divergence_is_seen_within_the_window_and_a_rise_as_small_as_the_noise_is_not():
    values = _converging(3, n=300, noise=0.02)
    diverging = values[:200] + [v * math.exp(0.03 * i) for i, v in enumerate(values[200:])]
    seen = next(end for end in range(201, 300) if rising(_series(diverging[:end]), Window.parse("500 steps")))
    assert seen - 200 <= 50  # 50 points = the 500-step window at 10 steps a point
    wobble = values[:200] + [v * 1.03 for v in values[200:]]
    assert all(rising(_series(wobble[:end]), Window.parse("500 steps")) is None for end in range(201, 300, 5))


def test_a_window_in_time_counts_seconds_not_points():
    # one point a minute; a rise over the last 5 minutes is inside "10m" and outside "2m"... of history
    values = [1.0 + 0.01 * ((i * 3) % 4) for i in range(60)] + [1.4, 1.9, 2.6, 3.4, 4.0]
    points = Points.of(range(65), [60.0 * i for i in range(65)], values)
    assert rising(points, Window.parse("10m")) is not None
    assert rising(points, Window.parse("2m")) is None  # 3 points fit in 2 minutes: fewer than a trend needs


def test_plateau_needs_the_whole_window_and_no_room_for_an_improvement():
    r = random.Random(1)
    flat = [1.0 + r.gauss(0, 0.02) for _ in range(300)]
    assert plateau(_series(flat), Window.parse("2000 steps")) is not None
    assert plateau(_series(flat[:100]), Window.parse("2000 steps")) is None  # covers 990 steps only
    improving = [2.0 * (1 + i / 50) ** -0.5 + r.gauss(0, 0.02) for i in range(300)]
    assert plateau(_series(improving), Window.parse("2000 steps")) is None
    found = plateau(_series(flat), Window.parse("2000 steps"), min_improvement=0.01)
    assert "rule: less than 1%" in str(found)


def test_a_test_run_too_short_or_too_noisy_is_undecided_not_failed():
    assert direction([2.0, 1.9, 1.8]).verdict == "undecided"
    assert "too short to judge" in direction([2.0, 1.9, 1.8]).detail
    assert direction([2.3, 2.2, 2.25, 2.1, 2.0, 1.95, 1.9]).verdict == "falling"
    assert direction([1.0, 1.2, 1.3, 1.5, 1.6, 1.8]).verdict == "not_falling"
    assert direction([1.0, 1.02, 0.98, 1.01, 0.99, 1.0]).verdict == "undecided"


def test_sen_slope_ignores_one_spike():
    values = [10 - 0.1 * i for i in range(20)]
    values[10] = 100.0
    trend = sen_trend([float(i) for i in range(20)], values)
    assert trend.slope == pytest.approx(-0.1) and trend.high < 0
