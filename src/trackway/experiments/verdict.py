"""The verdict: every criterion judged on the full run against the baseline, and what to try next.

    supported     every criterion holds
    rejected      at least one criterion fails (decided by numbers both runs have)
    inconclusive  no criterion fails but one cannot be decided (a quantity is missing), or the
                  full run did not complete, so its numbers do not describe the change
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from trackway.experiments import criteria as language
from trackway.experiments.quantities import Comparison
from trackway.experiments.records import Verdict


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    outcomes: list[language.Outcome]
    why: str  # one line: what decided it
    next_step: str  # push further, revert, or fix the bottleneck

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "why": self.why, "next_step": self.next_step,
                "criteria": [o.to_json() for o in self.outcomes]}


def judge(conn: Connection, criteria: list[str], full_run: dict | None, baseline_run_id: str,
          experiment_id: str, test_failed: list[str] | None = None) -> Judgement:
    """Judge `criteria` (texts) on `full_run` (its row, or None) against the baseline."""
    lookup = Comparison(conn, full_run["run_id"] if full_run else None, baseline_run_id)
    outcomes = [language.evaluate(language.parse(text), lookup) for text in criteria]
    failing = [o for o in outcomes if o.holds is False]
    undecided = [o for o in outcomes if o.holds is None]
    completed = full_run is not None and full_run["state"] == "completed"
    if failing and completed:
        verdict = Verdict.REJECTED
        why = f"{len(failing)} of {len(outcomes)} criteria fail: " + "; ".join(_shown(o) for o in failing)
    elif not completed:
        verdict = Verdict.INCONCLUSIVE
        if full_run is None:
            why = "no full run: " + ("the test run failed " + ", ".join(test_failed) if test_failed else "never started")
        else:
            why = (f"the full run {full_run['state']} ({full_run['termination_reason'] or 'no reason recorded'}), "
                   "so its numbers do not describe the change")
    elif undecided:
        verdict = Verdict.INCONCLUSIVE
        why = "cannot decide: " + "; ".join(f"{o.criterion}: {o.missing}" for o in undecided)
    elif not outcomes:
        verdict = Verdict.INCONCLUSIVE
        why = "the experiment states no criteria (--expect)"
    else:
        verdict = Verdict.SUPPORTED
        why = f"all {len(outcomes)} criteria hold: " + "; ".join(_shown(o) for o in outcomes)
    return Judgement(verdict, outcomes, why, _next_step(verdict, full_run, experiment_id, test_failed))


def _shown(outcome: language.Outcome) -> str:
    return f"{outcome.criterion} ({_number(outcome.left)} vs {_number(outcome.right)})"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _next_step(verdict: Verdict, full_run: dict | None, experiment_id: str, test_failed: list[str] | None) -> str:
    if verdict is Verdict.SUPPORTED:
        return (f"push further: build on this run (`trackway experiment new --from {experiment_id}` takes its full "
                "run as the baseline) and test the next change, one at a time")
    if verdict is Verdict.REJECTED:
        return (f"revert: the change did not do what was expected; `trackway experiment new --from {experiment_id}` "
                "keeps the old baseline for the next hypothesis")
    if test_failed:
        return f"fix the bottleneck: the test run failed {', '.join(test_failed)}; fix it and start again"
    if full_run is not None and full_run["state"] != "completed":
        return (f"fix the bottleneck: the full run ended {full_run['termination_reason'] or full_run['state']}; "
                f"`trackway explain {full_run['run_id']}` says why")
    return "measure what is missing (log the metric the criterion reads, or let the evaluations finish), then judge again"
