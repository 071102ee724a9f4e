"""Trend tests over a logged series: is the loss rising, flat, or falling beyond what its own noise explains.

The watchers (`loss_rising`, `plateau`) and the experiment gate's loss check decide here, over a
window of the series measured in steps or in seconds (`Window`), never over a count of points: a
script that logs every 10 steps and one that logs every step are judged over the same stretch of
training. Within a window:

- the trend is Sen's slope (the median of every pairwise slope) with its confidence interval from
  the Mann-Kendall statistic's variance: rank-based, so one spike neither makes nor hides a trend,
  and a handful of points that all rise is already a trend;
- the noise is the series' own, estimated robustly on the points before the window: how much the
  same measure of a rise moved at every earlier position (the slow wander of a smoothed or
  oscillating loss included), and never less than its point-to-point noise explains;
- a rise counts only when it is significant (the interval excludes 0), large against that noise
  (`min_z` noise units) and large in the loss's own terms (`min_rise` of the level it rose from).

Pure functions of the points: the control loop (supervisor/loop.py) and the gate
(experiments/gate.py) read the points from the ledger and act on what these return.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Literal

from trackway.settings.windows import Window

MAX_POINTS = 120  # a window with more points is reduced to this many bin medians: Sen's slope is O(n²)
HISTORY_POINTS = 200  # points before a window that the white noise is estimated on
MAX_WINDOW_GROUPS = 48  # a rise is looked for over at most this many (grouped) points
MIN_CHANGES = 8
RECENT_SPANS = 4  # a rise's own noise is measured over this many of its lengths of history before it
WANDER_POINTS = 50  # ... and the newest of them, the wander: a line fits a curved descent only locally


# statistics (with the fractions it imports) is loaded on first use: every submit and command that
# imports the watchers paid 15 ms for it, and only a supervisor watching a loss curve uses it. Once:
# an import statement in `median` itself cost each call 1.2 µs, four times the median of a short list.
@functools.cache
def _statistics() -> ModuleType:
    import statistics

    return statistics


def median(values: Iterable[float]) -> float:
    return _statistics().median(values)


def _normal_quantile(p: float) -> float:
    return _statistics().NormalDist().inv_cdf(p)


@dataclass(frozen=True)
class Points:
    """A series as logged: steps, when each was logged (unix seconds), and values; in step order, finite values only."""

    steps: tuple[float, ...]
    times: tuple[float, ...]
    values: tuple[float, ...]

    @classmethod
    def of(cls, steps, times, values) -> Points:
        kept = [(float(s), float(t), float(v)) for s, t, v in zip(steps, times, values)
                if v is not None and math.isfinite(v)]
        kept.sort()
        return cls(tuple(s for s, _, _ in kept), tuple(t for _, t, _ in kept), tuple(v for _, _, v in kept))

    def __len__(self) -> int:
        return len(self.values)

    def axis(self, window: Window) -> tuple[float, ...]:
        return self.steps if window.unit == "steps" else self.times

    def split(self, window: Window) -> tuple[int, float]:
        """Index of the window's first point, and how much of the window the series covers."""
        xs = self.axis(window)
        start = xs[-1] - window.size
        first = next(i for i, x in enumerate(xs) if x >= start)
        return first, xs[-1] - xs[0]


@dataclass(frozen=True)
class Trend:
    """Sen's slope of some points with its confidence interval, per unit of the window's axis."""

    n: int
    slope: float
    low: float
    high: float
    span: float  # from the first point to the last, on the axis
    level: float  # the fitted value at the last point


def sen_trend(xs: list[float], ys: list[float], confidence: float = 0.90) -> Trend | None:
    """Sen's slope with the two-sided `confidence` interval of Mann-Kendall (Gilbert 1987); None under 3 points."""
    xs, ys = _binned(xs, ys)
    n = len(xs)
    if n < 3 or xs[-1] <= xs[0]:
        return None
    slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] > xs[i])
    count = len(slopes)
    slope = median(slopes)
    intercept = median(y - slope * x for x, y in zip(xs, ys))
    # Mann-Kendall's variance holds for independent points; a smoothed loss (an EMA) is not, and its
    # interval would be far too narrow. Widened by the residuals' lag-1 autocorrelation (n / n_eff).
    residuals = [y - intercept - slope * x for x, y in zip(xs, ys)]
    lag1 = _lag1(residuals)
    variance = n * (n - 1) * (2 * n + 5) / 18 * ((1 + lag1) / (1 - lag1) if lag1 > 0 else 1.0)
    spread = _normal_quantile(0.5 + confidence / 2) * math.sqrt(variance)
    lower = max(0, min(count - 1, math.floor((count - spread) / 2)))
    upper = max(0, min(count - 1, math.ceil((count + spread) / 2)))
    return Trend(n, slope, slopes[lower], slopes[upper], xs[-1] - xs[0], intercept + slope * xs[-1])


def noise(values: list[float]) -> float:
    """A robust estimate of the per-point noise of `values`: white (successive differences) or wander
    (scatter about their own Sen line), whichever is larger; 0 under 4 values."""
    if len(values) < 4:
        return 0.0
    diffs = [b - a for a, b in zip(values, values[1:])]
    center = median(diffs)
    white = 1.4826 * median(abs(d - center) for d in diffs) / math.sqrt(2)
    local = values[-WANDER_POINTS:]
    xs = list(range(len(local)))
    fit = sen_trend([float(x) for x in xs], local)
    if fit is None:
        return white
    residuals = [v - (fit.level - fit.slope * (xs[-1] - x)) for x, v in zip(xs, local)]
    middle = median(residuals)
    wander = 1.4826 * median(abs(r - middle) for r in residuals)
    return max(white, wander)


@dataclass(frozen=True)
class Rise:
    """What `rising` found: the level the series rose from and to, over how much of the window, against its noise."""

    start: float
    end: float
    points: int
    span: float
    window: Window
    z: float
    relative: float

    def __str__(self) -> str:
        unit = "steps" if self.window.unit == "steps" else "s"
        return (f"loss rising: {self.start:.4g} → {self.end:.4g} (+{100 * self.relative:.0f}%) over the last "
                f"{self.span:g} {unit} ({self.points} points), {self.z:.1f}× its noise; "
                f"window {self.window}")


def rising(points: Points, window: Window, min_rise: float = 0.10, min_z: float = 8.0,
           min_points: int = 4) -> Rise | None:
    """A significant, large rise at the end of the series, within `window`; None when there is none.

    Looked for over the last `min_points` points, then twice as many, and so on up to the window, so
    that a fast divergence is caught at its first points and a slow one over the whole window. Each
    stretch is compared with the points just before it, and its rise with the rises of the same
    length at every earlier position: the series must have shown a level and its own noise first
    (2 × the stretch + 7 points before it).
    """
    if len(points) < 2 * min_points:
        return None
    first, _ = points.split(window)
    xs, ys = points.axis(window), points.values
    in_window = len(ys) - first
    # A window of many points is judged on the medians of groups of them, so that a rise over the whole
    # window is measured against history as long as the rise (the noise check needs twice its length).
    group = max(1, math.ceil(in_window / MAX_WINDOW_GROUPS))
    if group > 1:
        xs, ys = _grouped(xs, group), _grouped(ys, group)
        in_window = math.ceil(in_window / group)
    size = min_points
    while size <= in_window:
        found = _rise_over(xs, ys, size, window, min_rise, min_z, min_points)
        if found is not None:
            return found if group == 1 else replace(found, points=found.points * group)
        if size == in_window:
            break
        size = min(2 * size, in_window)
    return None


def _rise_over(xs, ys, size, window, min_rise, min_z, min_points) -> Rise | None:
    start = len(ys) - size
    before = list(ys[max(0, start - HISTORY_POINTS):start])
    if len(before) < 2 * size + MIN_CHANGES - 1:  # the series must have shown its own noise first
        return None
    trend = sen_trend(list(xs[start:]), list(ys[start:]))
    if trend is None or trend.low <= 0:
        return None
    rise, base, end = _level_change(list(ys[start - size:]), size)
    if rise <= 0 or base == 0:
        return None
    relative = rise / abs(base)
    if relative < min_rise:
        return None
    sigma = _change_noise(before, size)
    z = rise / sigma if sigma > 0 else math.inf
    if z < min_z:
        return None
    return Rise(base, end, size, xs[-1] - xs[start], window, z, relative)


def _level_change(values: list[float], size: int) -> tuple[float, float, float]:
    """(change, from, to): the median of the newest half of the last `size` values against the median of the
    `size` values before them."""
    base = median(values[-2 * size:-size])
    end = median(values[-max(1, math.ceil(size / 2)):])
    return end - base, base, end


def _change_noise(history: list[float], size: int) -> float:
    """How much `_level_change` over `size` points moves in this series when nothing is wrong: its robust
    spread at every earlier position of `history` (the series' own wander, spikes and autocorrelation
    included), and never less than white noise of the series' point-to-point noise would give it."""
    point = noise(history)
    white = point * math.sqrt(1 / size + 1 / max(1, math.ceil(size / 2)))
    # The newest stretch of history only: a loss descends fast early on, and that descent's changes would
    # hide a rise from the level the run has reached since.
    recent = history[-(RECENT_SPANS * size + 2 * size + MIN_CHANGES):]
    changes = [_level_change(recent[:end], size)[0] for end in range(2 * size, len(recent) + 1)]
    # A descent that slows (a loss's usual curve) makes the changes drift: their spread is taken about
    # their own trend, not about one middle value.
    fit = sen_trend([float(i) for i in range(len(changes))], changes)
    if fit is not None:
        changes = [c - (fit.level - fit.slope * (len(changes) - 1 - i)) for i, c in enumerate(changes)]
    middle = median(changes)
    return max(white, 1.4826 * median(abs(c - middle) for c in changes))


@dataclass(frozen=True)
class Flat:
    """What `plateau` found: at best this much improvement over the whole window."""

    level: float
    best_case: float  # the most the series could have improved over the window, relative to its level
    points: int
    window: Window
    min_improvement: float

    def __str__(self) -> str:
        return (f"plateau: loss {self.level:.4g}, improved at most {100 * max(0.0, self.best_case):.2g}% over the last "
                f"{self.window} ({self.points} points); rule: less than {100 * self.min_improvement:g}%")


def plateau(points: Points, window: Window, min_improvement: float = 0.01, min_points: int = 8) -> Flat | None:
    """The series, over a whole `window`, improved (fell) by less than `min_improvement` of its level, even at
    the optimistic end of its trend's confidence interval; None while the window is not yet covered or the
    noise leaves room for a real improvement."""
    if len(points) < min_points:
        return None
    first, covered = points.split(window)
    if covered < window.size:
        return None
    xs, ys = points.axis(window), points.values
    if len(ys) - first < min_points:
        return None
    trend = sen_trend(list(xs[first:]), list(ys[first:]))
    if trend is None or trend.level == 0:
        return None
    best_case = -trend.low * trend.span / abs(trend.level)
    if best_case >= min_improvement:
        return None
    return Flat(trend.level, best_case, len(ys) - first, window, min_improvement)


@dataclass(frozen=True)
class Direction:
    """The gate's reading of a short run's loss: `falling`, `not_falling` or `undecided` (too few or too noisy)."""

    verdict: Literal["falling", "not_falling", "undecided"]
    detail: str


def direction(values: list[float], min_points: int = 6) -> Direction:
    """Did the loss fall over these points (in step order)? Decided only when the trend's interval says so."""
    n = len(values)
    if n < min_points:
        return Direction("undecided", f"too short to judge: {n} points, at least {min_points} needed to tell a "
                                      "fall from noise")
    trend = sen_trend([float(i) for i in range(n)], [float(v) for v in values])
    assert trend is not None  # n ≥ 3 distinct positions
    first, last = values[0], trend.level
    said = f"Sen's slope {trend.slope:+.3g} per point (90% interval {trend.low:+.3g}..{trend.high:+.3g}) over {n} points"
    if trend.high < 0:
        return Direction("falling", f"falling: {said}")
    if trend.low >= 0:
        return Direction("not_falling", f"not falling: {said}; from {first:.4g} to {last:.4g}")
    return Direction("undecided", f"too noisy to judge: {said}")


def _lag1(values: list[float]) -> float:
    """Lag-1 autocorrelation of `values`, capped below 1 (0 when it cannot be told)."""
    mean = sum(values) / len(values)
    centred = [v - mean for v in values]
    total = sum(c * c for c in centred)
    if total == 0 or len(values) < 4:
        return 0.0
    return min(0.95, sum(a * b for a, b in zip(centred, centred[1:])) / total)


def _grouped(values, group: int) -> tuple[float, ...]:
    """Medians of consecutive groups of `group` values, aligned so the newest group ends at the newest value."""
    end = len(values)
    start = end % group
    return tuple(median(values[i:i + group]) for i in range(start, end, group))


@dataclass(frozen=True)
class Slowdown:
    """What `slower` found: steps per second over the last window against the window before."""

    before: float
    after: float
    window: Window
    ratio: float

    def __str__(self) -> str:
        return (f"throughput falling: {self.after:.3g} steps/s over the last {self.window} vs {self.before:.3g} "
                f"over the {self.window} before; rule: below {self.ratio:g} of it")


def slower(points: Points, window: Window, ratio: float = 0.5, min_points: int = 4) -> Slowdown | None:
    """Steps per second over the last `window` below `ratio` of the rate over the window before it."""
    if len(points) < 2 * min_points:
        return None
    xs = points.axis(window)
    end = xs[-1]
    recent = [i for i, x in enumerate(xs) if x >= end - window.size]
    earlier = [i for i, x in enumerate(xs) if end - 2 * window.size <= x < end - window.size]
    if len(recent) < min_points or len(earlier) < min_points or xs[0] > end - 2 * window.size:
        return None
    rates = []
    for stretch in (earlier, [earlier[-1], *recent]):
        steps = points.steps[stretch[-1]] - points.steps[stretch[0]]
        seconds = points.times[stretch[-1]] - points.times[stretch[0]]
        if steps <= 0 or seconds <= 0:
            return None
        rates.append(steps / seconds)
    before, after = rates
    return Slowdown(before, after, window, ratio) if after < ratio * before else None


def _binned(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS points: consecutive points grouped, each group by its medians."""
    n = len(xs)
    if n <= MAX_POINTS:
        return list(xs), list(ys)
    edges = [round(i * n / MAX_POINTS) for i in range(MAX_POINTS + 1)]
    return ([median(xs[a:b]) for a, b in zip(edges, edges[1:])],
            [median(ys[a:b]) for a, b in zip(edges, edges[1:])])
