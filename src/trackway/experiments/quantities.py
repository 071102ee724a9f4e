"""The numbers criteria read about a run, from the ledger: metrics, evaluations, hours, cost, throughput.

Each is computed by the database over the run's continuous step axis (every attempt's points),
so a run of millions of points costs a few aggregate queries. A number the run cannot give (a
metric never logged, a run still going) raises `Missing`, which makes its criterion inconclusive.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from trackway.experiments.criteria import Missing, Quantity
from trackway.ledger.schema import attempts, eval_metrics, evaluations, metric_points, metric_series, runs
from trackway.taxonomy import RunState

# Keys where lower is better: `best` is their minimum, `steps_to` waits for them to fall to the target.
LOWER_IS_BETTER = re.compile(r"(loss|error|err|perplexity|ppl|wer|cer|mse|mae|rmse|nll|bpb|bpc)", re.IGNORECASE)
THROUGHPUT_KEY = "throughput"
NODE_PREFIX = "node/"  # series the executor samples from the attempt's processes (node/cpu_seconds, node/rss_bytes)


def lower_is_better(metric: str) -> bool:
    return LOWER_IS_BETTER.search(metric) is not None


class RunNumbers:
    """Quantities of one run (see criteria.QUANTITIES for what each means)."""

    def __init__(self, conn: Connection, run_id: str, label: str = "run") -> None:
        self.conn = conn
        self.run_id = run_id
        self.label = label  # "run" or "baseline", for the reasons a quantity is missing

    def value(self, quantity: Quantity, value_of: Callable[[object], float]) -> float:
        kind = quantity.kind
        if kind in ("final", "best", "min", "max", "mean"):
            return self.metric(kind, quantity.metric, quantity)
        if kind == "eval":
            return self.evaluation(quantity.metric, quantity)
        if kind == "steps_to":
            return self.steps_to(quantity.metric, value_of(quantity.target), quantity)
        if kind == "wall_hours":
            return self.wall_hours(quantity)
        if kind == "gpu_hours":
            return self._attempt_sum(attempts.c.gpu_seconds, quantity) / 3600.0
        if kind == "cost_usd":
            return self._attempt_sum(attempts.c.cost_usd, quantity)
        if kind == "throughput":
            return self.throughput(quantity)[0]
        if kind == "steps":
            last = self.conn.execute(
                select(func.max(metric_points.c.step)).select_from(self._points())
                .where(metric_series.c.run_id == self.run_id, metric_series.c.rank == 0)
            ).scalar()
            if last is None:
                raise Missing(quantity, f"the {self.label} logged no metric")
            return float(last)
        raise Missing(quantity, "not a quantity")  # the parser admits nothing else

    # -- metrics ----------------------------------------------------------------------------------

    @staticmethod
    def _points():
        return metric_points.join(metric_series, metric_points.c.series_id == metric_series.c.series_id)

    def _where(self, metric: str):
        return (metric_series.c.run_id == self.run_id, metric_series.c.key == metric, metric_series.c.rank == 0)

    def metric(self, kind: str, metric: str, quantity: Quantity) -> float:
        points = self._points()
        where = self._where(metric)
        if kind == "best":
            kind = "min" if lower_is_better(metric) else "max"
        if kind == "final":
            row = self.conn.execute(
                select(metric_points.c.value).select_from(points).where(*where)
                .order_by(metric_points.c.step.desc()).limit(1)
            ).first()
            value = None if row is None else row[0]
            if row is None:
                raise Missing(quantity, f"the {self.label} never logged {metric!r}")
            if value is None:
                raise Missing(quantity, f"the {self.label}'s last {metric!r} point has no value")
            return float(value)
        aggregate = {"min": func.min, "max": func.max, "mean": func.avg}[kind]
        value = self.conn.execute(select(aggregate(metric_points.c.value)).select_from(points).where(*where)).scalar()
        if value is None:
            raise Missing(quantity, f"the {self.label} never logged {metric!r}")
        return float(value)

    def steps_to(self, metric: str, target: float, quantity: Quantity) -> float:
        reached = metric_points.c.value <= target if lower_is_better(metric) else metric_points.c.value >= target
        step = self.conn.execute(
            select(func.min(metric_points.c.step)).select_from(self._points()).where(*self._where(metric), reached)
        ).scalar()
        if step is None:
            logged = self.conn.execute(
                select(func.count()).select_from(self._points()).where(*self._where(metric))
            ).scalar()
            why = f"never logged {metric!r}" if not logged else f"never reached {metric} {target:.6g}"
            raise Missing(quantity, f"the {self.label} {why}")
        return float(step)

    # -- evaluations ------------------------------------------------------------------------------

    def evaluation(self, metric: str, quantity: Quantity) -> float:
        """The metric's mean over seeds at the run's best evaluated checkpoint (by the spec's primary metric)."""
        rows = self.conn.execute(
            select(evaluations.c.eval_id, evaluations.c.primary_metric, evaluations.c.checkpoint_step,
                   eval_metrics.c.metric, eval_metrics.c.mean)
            .join(eval_metrics, eval_metrics.c.eval_id == evaluations.c.eval_id)
            .where(evaluations.c.run_id == self.run_id, evaluations.c.state == "completed")
        ).mappings().all()
        by_eval: dict[str, dict[str, float]] = {}
        primary: dict[str, str] = {}
        for row in rows:
            by_eval.setdefault(row["eval_id"], {})[row["metric"]] = row["mean"]
            primary[row["eval_id"]] = row["primary_metric"]
        having = [e for e, metrics in by_eval.items() if metric in metrics]
        if not having:
            raise Missing(quantity, f"the {self.label} has no completed evaluation with {metric!r}")

        def rank(eval_id: str) -> float:
            ranked_by = primary[eval_id] if primary[eval_id] in by_eval[eval_id] else metric
            value = by_eval[eval_id][ranked_by]
            return -value if lower_is_better(ranked_by) else value

        return float(by_eval[max(having, key=rank)][metric])

    # -- time and money ---------------------------------------------------------------------------

    def wall_hours(self, quantity: Quantity) -> float:
        state = self.conn.execute(select(runs.c.state).where(runs.c.run_id == self.run_id)).scalar()
        if state is None or not RunState(state).is_terminal():
            raise Missing(quantity, f"the {self.label} has not ended")
        first, last = self.conn.execute(
            select(func.min(attempts.c.started_at), func.max(attempts.c.ended_at)).where(attempts.c.run_id == self.run_id)
        ).one()
        if first is None or last is None:
            raise Missing(quantity, f"the {self.label} never started an attempt")
        return max(0.0, (last - first).total_seconds() / 3600.0)

    def _attempt_sum(self, column, quantity: Quantity) -> float:
        total, count = self.conn.execute(
            select(func.sum(column), func.count(column)).where(attempts.c.run_id == self.run_id)
        ).one()
        if not count:
            raise Missing(quantity, f"the {self.label}'s attempts recorded no {column.name}")
        return float(total or 0.0)

    def throughput(self, quantity: Quantity) -> tuple[float, str]:
        """The mean of the logged `throughput` metric, else steps per second of the attempts; and which it was."""
        mean = self.conn.execute(
            select(func.avg(metric_points.c.value)).select_from(self._points()).where(*self._where(THROUGHPUT_KEY))
        ).scalar()
        if mean is not None:
            return float(mean), f"mean of the logged {THROUGHPUT_KEY!r}"
        return self.step_rate(quantity), "steps per second of logged points"

    def step_rate(self, quantity: Quantity) -> float:
        """Steps per second while attempts were logging: per attempt, its points of the most logged key over their span."""
        steps, seconds = self.step_timing(quantity)
        return steps / seconds

    def step_timing(self, quantity: Quantity) -> tuple[int, float]:
        """(steps, seconds) that `step_rate` divides: intervals between logged points, and the time they spanned."""
        # The executor's `node/...` samples are taken by the clock, from before the first step: not the script's steps.
        key = self.conn.execute(
            select(metric_series.c.key, func.count().label("n")).select_from(self._points())
            .where(metric_series.c.run_id == self.run_id, metric_series.c.rank == 0,
                   metric_series.c.key.not_like(NODE_PREFIX + "%"))
            .group_by(metric_series.c.key)
            .order_by(func.count().desc(), metric_series.c.key).limit(1)
        ).first()
        if key is None:
            raise Missing(quantity, f"the {self.label} logged no metric")
        spans = self.conn.execute(
            select(func.count(), func.min(metric_points.c.logged_at), func.max(metric_points.c.logged_at))
            .select_from(self._points()).where(*self._where(key[0])).group_by(metric_points.c.attempt_number)
        ).all()
        steps = sum(n - 1 for n, _, _ in spans if n > 1)
        seconds = sum(last - first for n, first, last in spans if n > 1)
        if steps <= 0 or seconds <= 0:
            raise Missing(quantity, f"the {self.label} logged too few steps to time")
        return steps, seconds


class Comparison:
    """Looks quantities up on the run or, with `baseline.`, on the baseline run (criteria.Lookup)."""

    def __init__(self, conn: Connection, run_id: str | None, baseline_run_id: str) -> None:
        self.run = RunNumbers(conn, run_id, "run") if run_id else None
        self.baseline = RunNumbers(conn, baseline_run_id, "baseline")

    def __call__(self, quantity: Quantity, value_of: Callable[[object], float]) -> float:
        numbers = self.baseline if quantity.baseline else self.run
        if numbers is None:
            raise Missing(quantity, "the experiment has no full run yet")
        return numbers.value(quantity, value_of)
