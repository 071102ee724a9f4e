"""The loss watchers: false alarms on healthy runs, and how soon a divergence is seen.

Targets (issue 34, item 1), with the defaults of `[watchers]` (supervisor/watchers.py TREND_DEFAULTS):
- 0 `loss_rising` alarms over ≥ 50 healthy, converging runs: noise of 1 % to 15 % of the loss,
  heavy-tailed spikes, losses printed raw or smoothed (an EMA, as many scripts print), logged every
  step, every 10 or every 100 steps; each fed point by point as the supervisor sees it, judged
  after every new point (every 5th for the longer series);
- 0 `plateau` alarms on those runs while they are still improving;
- every divergence (a jump, a linear climb, an exponential blow-up, a slow creep) seen within the
  window (500 steps), each detection delay printed in steps;
- four log points rising far above the noise at 10-step intervals after a converged stretch: seen
  at the fourth point;
- a time window ("10m" at one point every 30 s) behaves as the step one.

The series are synthetic and seeded (no model trains here): the watchers are pure functions of the
points, so what is measured is the decision rule itself.

    python bench/bench_watchers.py
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure  # noqa: E402

from trackway.supervisor.trends import Points  # noqa: E402
from trackway.supervisor.watchers import TREND_DEFAULTS, loss_trends  # noqa: E402

WINDOW_STEPS = 500


def healthy(seed: int, points: int, every: int, noise: float, ema: float, spikes: float) -> list[float]:
    """A converging loss (a power law towards 0.3) with relative noise, rare 4x spikes, optionally smoothed."""
    r = random.Random(seed)
    values, shown = [], None
    for i in range(points):
        step = i * every
        level = 2.0 * (1 + step / 500) ** -0.5 + 0.3
        value = level * (1 + r.gauss(0, noise) * (4 if r.random() < spikes else 1))
        shown = value if shown is None or not ema else ema * shown + (1 - ema) * value
        values.append(shown)
    return values


def series(values: list[float], every: int, seconds_per_step: float = 0.05) -> Points:
    steps = [i * every for i in range(len(values))]
    return Points.of(steps, [s * seconds_per_step for s in steps], values)


def first_alarm(values: list[float], every: int, kind: str, start: int = 8, stride: int = 1,
                settings: dict | None = None) -> int | None:
    """The number of points seen when `kind` first fired, judging as the supervisor does after new points."""
    whole = series(values, every)
    for end in range(start, len(values) + 1, stride):
        seen = Points(whole.steps[:end], whole.times[:end], whole.values[:end])
        if any(k == kind for k, _ in loss_trends(seen, settings)):
            return end
    return None


def main() -> int:
    ok = True
    started = time.perf_counter()
    runs = rising_alarms = flat_alarms = 0
    for every, points, stride in ((1, 1500, 5), (10, 400, 1), (100, 150, 1)):
        for noise in (0.01, 0.05, 0.15):
            for ema in (0.0, 0.9):
                for seed in range(3):
                    values = healthy(seed * 31 + every, points, every, noise, ema, spikes=0.02)
                    runs += 1
                    fired = first_alarm(values, every, "loss_rising", stride=stride)
                    if fired is not None:
                        rising_alarms += 1
                        print(f"  false loss_rising: every {every}, noise {noise}, ema {ema}, seed {seed}, at point {fired}")
                    # Still improving: a plateau over 2000 steps would need the power law to stop.
                    flat = first_alarm(values, every, "plateau", stride=max(stride, 5))
                    if flat is not None:
                        flat_alarms += 1
                        print(f"  plateau on an improving run: every {every}, noise {noise}, ema {ema}, at point {flat}")
    ok &= figure("healthy runs judged (after every new point)", runs, unit="runs", target=50, higher_is_better=True)
    ok &= figure("loss_rising alarms on healthy runs", rising_alarms, unit="alarms", target=0)
    ok &= figure("plateau alarms on runs still improving", flat_alarms, unit="alarms", target=0)

    shapes = {
        "jump x1.5": lambda d, v: v * 1.5,
        "linear climb": lambda d, v: v + 0.004 * d,
        "exponential blow-up": lambda d, v: v * math.exp(0.01 * d),
        "slow creep (+40% over 500 steps)": lambda d, v: v * (1 + 0.4 * d / 500),
    }
    for name, shape in shapes.items():
        for every in (1, 10):
            for noise in (0.01, 0.05):
                base = healthy(7, 3000 // every, every, noise, 0.0, spikes=0.0)
                onset = len(base) * 2 // 3
                values = base[:onset] + [shape(i * every, v) for i, v in enumerate(base[onset:], start=1)]
                fired = first_alarm(values, every, "loss_rising", start=onset, stride=1)
                delay = None if fired is None else (fired - onset) * every
                ok &= figure(f"{name}, every {every}, noise {noise}: seen after", delay if delay is not None else math.inf,
                             unit="steps", target=WINDOW_STEPS)

    flat = [0.55 + 0.01 * ((i * 7) % 5 - 2) for i in range(40)]
    four = flat + [0.85, 1.56, 2.30, 2.9]
    fired = first_alarm(four, 10, "loss_rising", start=41)
    ok &= figure("four rising log points at 10-step intervals: seen at point", (fired or math.inf) - 40,
                 unit="points", target=4)

    timed = {"loss_rising": {**TREND_DEFAULTS["loss_rising"], "window": "10m"}}
    base = healthy(3, 200, 10, 0.05, 0.0, spikes=0.0)
    whole = Points.of([i * 10 for i in range(200)], [30.0 * i for i in range(200)],
                      base[:150] + [v * math.exp(0.05 * i) for i, v in enumerate(base[150:], start=1)])
    seen = next((end for end in range(151, 201)
                 if any(k == "loss_rising" for k, _ in loss_trends(
                     Points(whole.steps[:end], whole.times[:end], whole.values[:end]), timed))), None)
    ok &= figure('time window "10m", a point every 30 s: blow-up seen after', (seen - 150) * 30.0 if seen else math.inf,
                 unit="s", target=600)
    quiet = healthy(4, 200, 10, 0.05, 0.9, spikes=0.02)
    false_timed = first_alarm(quiet, 10, "loss_rising", settings=timed)
    ok &= figure('time window "10m": alarms on a healthy run', 0 if false_timed is None else 1, unit="alarms", target=0)

    probe = series(healthy(1, 400, 10, 0.05, 0.0, 0.02), 10)
    took = min(_timed(lambda: loss_trends(probe)) for _ in range(5))
    figure("one judgement of a 400-point series (all three watchers)", took)
    print(f"bench_watchers: {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


if __name__ == "__main__":
    raise SystemExit(main())
