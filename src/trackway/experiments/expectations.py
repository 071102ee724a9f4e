"""A run's own acceptance criteria (`submit --expect`): parsed at submit, judged as metrics and evaluations land.

A run states what it set out to show in the criteria language of experiments (criteria.py), over
its own numbers only (no `baseline.`):

    eval.pass@1 > 0.05                 at any evaluated checkpoint (the default)
    eval.quality.pass@1 > 0.05 at latest   at the newest evaluated checkpoint (`quality`: the spec)
    final.loss < 2.0                   on the run's metrics

Each criterion is in one of four states:

    met        it holds (an `eval.` criterion at any checkpoint: once one checkpoint meets it)
    not yet    it does not hold now, and the run or an evaluation of it is still going
    not met    it cannot be met any more: the run ended and every evaluation asked for finished
    not known  the run ended, but a number it needs was never logged or evaluated

Only `met`, `not met` and `not known` are settled: those are what a notification tells. A later
`trackway eval` of the run's checkpoints judges them again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, and_, exists, func, or_, select, update

from trackway.errors import InputError
from trackway.evals.records import IN_FLIGHT
from trackway.experiments import criteria as language
from trackway.experiments.criteria import Missing, Quantity
from trackway.experiments.quantities import RunNumbers
from trackway.ledger.schema import checkpoints, eval_metrics, evaluations, run_eval_specs, runs
from trackway.experiments.expectation_verdicts import MET, NOT_KNOWN, NOT_MET, NOT_YET, SETTLED, verdict_of
from trackway.taxonomy import RunState

ANY, LATEST = "any", "latest"
MAX_CRITERIA = 20
_AT = re.compile(r"\s+at\s+(?:the\s+)?(any|latest)(?:\s+checkpoint)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Expectation:
    """One criterion of a run: its text as given, the parsed comparison, and which checkpoints `eval.` reads."""

    text: str
    criterion: language.Criterion
    at: str = ANY

    @property
    def reads_evaluations(self) -> bool:
        return any(q.kind == "eval" for q in self.criterion.quantities())


def parse(text: str) -> Expectation:
    """One `--expect` criterion, or InputError naming the flag and what was expected."""
    raw = str(text).strip()
    at = ANY
    if match := _AT.search(raw):
        at, raw = match[1].lower(), raw[:match.start()].rstrip()
    try:
        criterion = language.parse(raw)
    except InputError as exc:
        raise InputError(f"--expect: {exc}") from None
    baseline = [q.text() for q in criterion.quantities() if q.baseline]
    if baseline:
        raise InputError(f"--expect {text!r}: a run's own criterion reads the run alone, not {baseline[0]}; "
                         "to compare with a baseline run, use `trackway experiment new`")
    expectation = Expectation(str(text).strip(), criterion, at)
    if at == LATEST and not expectation.reads_evaluations:
        raise InputError(f"--expect {text!r}: `at latest` picks an evaluated checkpoint; the criterion reads no "
                         "`eval.` metric")
    return expectation


def parse_all(texts: list[str] | tuple[str, ...] | None) -> list[Expectation]:
    """Every `--expect` of a submit (at most MAX_CRITERIA, no repeats)."""
    found = [parse(text) for text in texts or ()]
    if len(found) > MAX_CRITERIA:
        raise InputError(f"--expect: at most {MAX_CRITERIA} criteria, got {len(found)}")
    if len({e.text for e in found}) != len(found):
        raise InputError("--expect: the same criterion was given twice")
    return found


def stored(expectations: list[Expectation]) -> str | None:
    """The runs.expect column's value: the criteria as given."""
    return json.dumps([e.text for e in expectations]) if expectations else None


def of_run(row: Any) -> list[Expectation]:
    """A run's criteria from its row (runs.expect), as submitted."""
    texts = json.loads(row["expect"]) if row.get("expect") else []
    return [parse(text) for text in texts]


# -- judging ------------------------------------------------------------------------------------


@dataclass
class Judged:
    """One criterion's state, the numbers behind it, and where an `eval.` criterion was met."""

    criterion: str
    state: str
    why: str
    values: dict[str, Any] = field(default_factory=dict)
    step: int | None = None  # the evaluated checkpoint that decided it
    settled_at: str | None = None  # when it reached a settled state (kept while it stays there)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # each evaluated step: holds, left, right

    def to_json(self) -> dict[str, Any]:
        return {"criterion": self.criterion, "state": self.state, "why": self.why, "values": self.values,
                "step": self.step, "settled_at": self.settled_at, "checkpoints": self.checkpoints}


class _AtCheckpoint:
    """criteria.Lookup over a run whose `eval.` quantities read one evaluated checkpoint's numbers."""

    def __init__(self, numbers: RunNumbers, metrics: dict[str, float], step: int | None) -> None:
        self.numbers = numbers
        self.metrics = metrics
        self.step = step

    def __call__(self, quantity: Quantity, value_of):
        if quantity.kind != "eval":
            return self.numbers.value(quantity, value_of)
        if self.step is None:
            raise Missing(quantity, "the run has no completed evaluation")
        if quantity.metric not in self.metrics:
            raise Missing(quantity, f"the evaluation at step {self.step} has no {quantity.metric!r}")
        return self.metrics[quantity.metric]


def evaluated_steps(conn: Connection, run_id: str) -> dict[int, dict[str, float]]:
    """Each evaluated checkpoint's metrics, by step: `pass@1` and `SPEC.pass@1` (the newest completed evaluation's mean)."""
    rows = conn.execute(
        select(evaluations.c.checkpoint_step, evaluations.c.spec_name, evaluations.c.ended_at,
               eval_metrics.c.metric, eval_metrics.c.mean)
        .join(eval_metrics, eval_metrics.c.eval_id == evaluations.c.eval_id)
        .where(evaluations.c.run_id == run_id, evaluations.c.state == "completed")
        .order_by(evaluations.c.ended_at)
    ).mappings().all()
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:  # oldest first: a newer evaluation of the same step and metric wins
        if row["mean"] is None:
            continue
        metrics = by_step.setdefault(int(row["checkpoint_step"]), {})
        metrics[row["metric"]] = float(row["mean"])
        metrics[f"{row['spec_name']}.{row['metric']}"] = float(row["mean"])
    return dict(sorted(by_step.items()))


def _evaluations_going(conn: Connection, run_id: str) -> int:
    """Evaluations of the run still going, and its `--eval` specs that have yet to consider its newest checkpoint."""
    running = conn.execute(
        select(func.count()).select_from(evaluations)
        .where(evaluations.c.run_id == run_id, evaluations.c.state == IN_FLIGHT)
    ).scalar_one()
    newest = conn.execute(
        select(func.max(checkpoints.c.step)).where(checkpoints.c.run_id == run_id, checkpoints.c.committed_at.is_not(None))
    ).scalar()
    to_come = 0
    if newest is not None:
        to_come = conn.execute(
            select(func.count()).select_from(run_eval_specs)
            .where(run_eval_specs.c.run_id == run_id, run_eval_specs.c.trigger != "on_demand",
                   or_(run_eval_specs.c.considered_step.is_(None), run_eval_specs.c.considered_step < newest))
        ).scalar_one()
    return int(running) + int(to_come)


def judge(conn: Connection, run: Any, expectations: list[Expectation],
          before: dict[str, dict[str, Any]] | None = None) -> list[Judged]:
    """Judge a run's criteria now; `before` (criterion → last judged) keeps when a settled state was first reached."""
    ended = RunState(run["state"]).is_terminal()
    going = _evaluations_going(conn, run["run_id"])
    numbers = RunNumbers(conn, run["run_id"], "run")
    steps = evaluated_steps(conn, run["run_id"]) if any(e.reads_evaluations for e in expectations) else {}
    final = ended and not going  # nothing more will be logged or evaluated unless someone asks again
    out = []
    for expectation in expectations:
        judged = (_judge_evaluated(expectation, numbers, steps, final) if expectation.reads_evaluations
                  else _judge_run(expectation, numbers, ended))
        if not final and judged.state in (NOT_MET, NOT_KNOWN):
            judged.state = NOT_YET
            waiting = f"{going} evaluation(s) still going" if going else "the run is still going"
            judged.why = f"{judged.why}; {waiting}"
        earlier = (before or {}).get(expectation.text) or {}
        if judged.state in SETTLED:
            same = earlier.get("state") == judged.state and earlier.get("settled_at")
            judged.settled_at = earlier["settled_at"] if same else datetime.now(timezone.utc).isoformat()
        out.append(judged)
    return out


def _judge_run(expectation: Expectation, numbers: RunNumbers, ended: bool) -> Judged:
    outcome = language.evaluate(expectation.criterion, _AtCheckpoint(numbers, {}, None))
    if outcome.holds is None:
        return Judged(expectation.text, NOT_KNOWN, f"not known: {outcome.missing}", outcome.values)
    shown = f"{_number(outcome.left)} {expectation.criterion.op} {_number(outcome.right)}"
    if outcome.holds:
        # A run still going may fall back below it: met is met only once the run ended.
        return Judged(expectation.text, MET if ended else NOT_YET,
                      f"holds: {shown}" if ended else f"holds so far: {shown}", outcome.values)
    return Judged(expectation.text, NOT_MET, f"does not hold: {shown}", outcome.values)


def _judge_evaluated(expectation: Expectation, numbers: RunNumbers, steps: dict[int, dict[str, float]],
                     final: bool) -> Judged:
    checkpoints = []
    for step, metrics in steps.items():
        outcome = language.evaluate(expectation.criterion, _AtCheckpoint(numbers, metrics, step))
        checkpoints.append({"step": step, "holds": outcome.holds, "left": language._plain(outcome.left),
                            "right": language._plain(outcome.right), "missing": outcome.missing,
                            "values": {k: language._plain(v) for k, v in outcome.values.items()}})
    if not checkpoints:
        return Judged(expectation.text, NOT_KNOWN, "not known: no checkpoint of the run has a completed evaluation")
    if expectation.at == LATEST:
        latest = checkpoints[-1]
        if latest["holds"] is None:
            return Judged(expectation.text, NOT_KNOWN, f"not known at step {latest['step']}: {latest['missing']}",
                          latest["values"], latest["step"], checkpoints=checkpoints)
        shown = f"{latest['left']:.6g} {expectation.criterion.op} {latest['right']:.6g}"
        if latest["holds"]:
            state = MET if final else NOT_YET
            said = "holds" if final else "holds so far"
            return Judged(expectation.text, state, f"{said} at the latest evaluated checkpoint, step {latest['step']}: "
                          f"{shown}", latest["values"], latest["step"], checkpoints=checkpoints)
        return Judged(expectation.text, NOT_MET, f"does not hold at the latest evaluated checkpoint, step "
                      f"{latest['step']}: {shown}", latest["values"], latest["step"], checkpoints=checkpoints)
    met = next((c for c in checkpoints if c["holds"]), None)
    if met is not None:  # any checkpoint: one that meets it settles it
        return Judged(expectation.text, MET, f"met at step {met['step']}: {met['left']:.6g} "
                      f"{expectation.criterion.op} {met['right']:.6g}", met["values"], met["step"],
                      checkpoints=checkpoints)
    decided = [c for c in checkpoints if c["holds"] is False]
    if not decided:
        return Judged(expectation.text, NOT_KNOWN, f"not known: {checkpoints[-1]['missing']}",
                      checkpoints=checkpoints)
    best = decided[-1]
    return Judged(expectation.text, NOT_MET, f"not met at any of {len(checkpoints)} evaluated checkpoint(s); latest, "
                  f"step {best['step']}: {best['left']:.6g} {expectation.criterion.op} {best['right']:.6g}",
                  best["values"], best["step"], checkpoints=checkpoints)


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def judge_and_record(conn: Connection, run: Any) -> list[Judged]:
    """Judge one run's criteria and record the verdict on its row."""
    before = {c["criterion"]: c for c in verdict_of(run)} if run.get("expect_verdict") else {}
    judged = judge(conn, run, of_run(run), before)
    still_open = any(j.state == NOT_YET for j in judged) or not RunState(run["state"]).is_terminal()
    verdict = json.dumps({"criteria": [j.to_json() for j in judged]})
    if still_open and run.get("expect_open") and verdict == run.get("expect_verdict"):
        return judged  # judged each tick while open: written only when something changed
    conn.execute(update(runs).where(runs.c.run_id == run["run_id"]).values(
        expect_verdict=verdict, expect_judged_at=datetime.now(timezone.utc), expect_open=still_open,
    ))
    return judged


def judge_due(ledger) -> int:
    """Judge every run whose criteria can still change, or that got an evaluation since it was last judged."""
    newer_evaluation = exists().where(evaluations.c.run_id == runs.c.run_id,
                                      evaluations.c.ended_at > runs.c.expect_judged_at)
    with ledger.read() as conn:
        due = [row["run_id"] for row in conn.execute(
            select(runs.c.run_id).where(runs.c.expect.is_not(None),
                                        or_(runs.c.expect_open.is_not(False), runs.c.expect_judged_at.is_(None),
                                            and_(runs.c.expect_judged_at.is_not(None), newer_evaluation)))
        ).mappings()]
    for run_id in due:
        with ledger.write() as conn:
            row = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().first()
            if row is None:
                continue
            try:
                judge_and_record(conn, dict(row))
            except InputError as exc:
                # A criterion recorded that this version no longer parses: said once on the run, never a
                # supervisor that fails every tick.
                texts = json.loads(row["expect"])
                conn.execute(update(runs).where(runs.c.run_id == run_id).values(
                    expect_verdict=json.dumps({"criteria": [
                        {"criterion": text, "state": NOT_KNOWN, "why": f"not known: {exc}", "values": {}, "step": None,
                         "settled_at": None, "checkpoints": []} for text in texts]}),
                    expect_judged_at=datetime.now(timezone.utc), expect_open=False))
    return len(due)
