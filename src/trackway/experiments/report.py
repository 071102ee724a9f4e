"""An experiment described in full (`experiment show --json`) and as a markdown report (`experiment report`).

The report holds every number a reader needs to check the verdict by hand: each criterion
with the value of each quantity it read, the key quantities of both runs with their deltas,
the test run's checks, every attempt with why it ended, GPU-hours and cost, and the
evaluations per checkpoint.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from trackway.display import compute_unit_of
from trackway.experiments import criteria as language
from trackway.receipts.config_diff import change_text
from trackway.experiments.quantities import RunNumbers
from trackway.experiments.records import DRIVEN, loads
from trackway.experiments.verdict import judge
from trackway.ledger.reader import Reader
from trackway.ledger.schema import attempts, eval_metrics, evaluations, runs
from trackway.redaction import redact_argv

SCALAR_ROWS = ("steps", "wall_hours", "gpu_hours", "cost_usd", "throughput")


def describe(conn: Connection, experiment) -> dict[str, Any]:
    """Everything about the experiment, as plain data (what `--json` prints and the report renders)."""
    test_run = _run(conn, experiment["test_run_id"])
    full_run = _run(conn, experiment["full_run_id"])
    detail = loads(experiment, "verdict_detail")
    if detail is None and experiment["status"] in DRIVEN:
        # Not concluded yet: the criteria as they stand now, marked provisional.
        judged = judge(conn, loads(experiment, "criteria", []), full_run, experiment["baseline_run_id"],
                       experiment["experiment_id"])
        detail = {**judged.to_json(), "provisional": True}
    return {
        "experiment_id": experiment["experiment_id"],
        "name": experiment["name"],
        "project": experiment["project"],
        "title": experiment["title"],
        "hypothesis": experiment["hypothesis"],
        "status": experiment["status"],
        "stop_reason": experiment["stop_reason"],
        "baseline_run_id": experiment["baseline_run_id"],
        "parent_experiment_id": experiment["parent_experiment_id"],
        "command": redact_argv(json.loads(experiment["command"])),  # one recorded before redaction holds it as typed
        "changes": loads(experiment, "changes", []),
        "allow_multiple_changes": bool(experiment["allow_multiple_changes"]),
        "criteria": loads(experiment, "criteria", []),
        "skip_test": bool(experiment["skip_test"]) if experiment["skip_test"] is not None else None,
        "test_plan": loads(experiment, "test_plan"),
        "test_run": _run_facts(conn, test_run),
        "test_checks": loads(experiment, "test_checks"),
        # The test runs before the current one (`experiment start --again`), oldest first, with their checks.
        "earlier_test_runs": (loads(experiment, "test_plan", {}) or {}).get("earlier_test_runs") or [],
        "estimate": loads(experiment, "estimate"),
        "full_run": _run_facts(conn, full_run),
        "verdict": experiment["verdict"],
        "verdict_detail": detail,
        "quantities": _quantities(conn, experiment, full_run),
        "evaluations": _evaluations(conn, full_run["run_id"]) if full_run else [],
        "baseline_evaluations": _evaluations(conn, experiment["baseline_run_id"]),
        "created_at": experiment["created_at"],
        "started_at": experiment["started_at"],
        "concluded_at": experiment["concluded_at"],
    }


def _run(conn: Connection, run_id: str | None):
    if not run_id:
        return None
    return conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().first()


def _run_facts(conn: Connection, run) -> dict[str, Any] | None:
    if run is None:
        return None
    rows = conn.execute(
        select(attempts).where(attempts.c.run_id == run["run_id"]).order_by(attempts.c.attempt_number)
    ).mappings().all()
    listed = []
    for a in rows:
        decision = json.loads(a["retry_decision"]) if a["retry_decision"] else {}
        listed.append({
            "attempt_id": a["attempt_id"], "state": a["state"], "termination_reason": a["termination_reason"],
            "exit_code": a["exit_code"], "signal": a["signal"], "first_step": a["first_step"],
            "last_step": a["last_step"], "resumed_from": a["resumed_from_checkpoint"], "resource": a["resource"],
            "gpu_hours": (a["gpu_seconds"] or 0.0) / 3600, "cost_usd": a["cost_usd"], "gpu_count": a["gpu_count"],
            "decision": decision.get("action"), "rule": decision.get("rule"),
        })
    return {
        "run_id": run["run_id"], "name": run["name"], "kind": run["kind"], "state": run["state"],
        "termination_reason": run["termination_reason"], "resource": run["resource"],
        "code_commit": run["code_commit"], "code_dirty_sha256": run["code_dirty_sha256"],
        "config_sha256": run["config_sha256"], "attempts": listed,
        "gpu_hours": sum(a["gpu_hours"] for a in listed),
        # What those hours are: GPU-hours only where GPUs were used (the ledger counts a CPU attempt's wall time).
        "compute": compute_unit_of(a["gpu_count"] for a in listed),
        "cost_usd": sum(a["cost_usd"] or 0.0 for a in listed),
    }


def _quantities(conn: Connection, experiment, full_run) -> list[dict[str, Any]]:
    """Key quantities of the full run and the baseline, with the delta: the metrics the criteria read (and loss)."""
    metrics: list[str] = []
    for text in loads(experiment, "criteria", []):
        for q in language.parse(text).quantities():
            if q.metric and q.kind != "eval" and q.metric not in metrics:
                metrics.append(q.metric)
    keys = Reader.over(conn).metric_keys(experiment["baseline_run_id"])
    if "loss" in keys and "loss" not in metrics:
        metrics.insert(0, "loss")
    wanted = [language.Quantity(kind, m) for m in metrics for kind in ("final", "min")]
    wanted += [language.Quantity(name) for name in SCALAR_ROWS]
    base = RunNumbers(conn, experiment["baseline_run_id"], "baseline")
    run = RunNumbers(conn, full_run["run_id"]) if full_run else None
    rows = []
    for q in wanted:
        before = _try(base, q)
        after = _try(run, q) if run else None
        delta = after - before if before is not None and after is not None else None
        rows.append({"quantity": q.text(), "baseline": before, "run": after, "delta": delta,
                     "delta_pct": 100 * delta / abs(before) if delta is not None and before else None})
    return rows


def _try(numbers: RunNumbers, quantity: language.Quantity) -> float | None:
    try:
        return numbers.value(quantity, lambda node: float("nan"))
    except language.Missing:
        return None


def _evaluations(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(evaluations.c.checkpoint_step, evaluations.c.spec_name, evaluations.c.state, eval_metrics.c.metric,
               eval_metrics.c.mean, eval_metrics.c.std, eval_metrics.c.seeds)
        .join(eval_metrics, eval_metrics.c.eval_id == evaluations.c.eval_id)
        .where(evaluations.c.run_id == run_id)
        .order_by(evaluations.c.checkpoint_step, evaluations.c.spec_name, eval_metrics.c.metric)
    ).mappings().all()
    return [dict(r) for r in rows]


# -- markdown -------------------------------------------------------------------------------------


def markdown(d: dict[str, Any]) -> str:
    """The report of a described experiment: its header, then one section per part (each helper below writes one)."""
    detail = d["verdict_detail"] or {}
    parts = (_header(d), _changes(d), _expected_vs_observed(d, detail), _test_run(d), _attempts(d),
             _evaluations_table(d) if d["evaluations"] else [], _verdict(d, detail))
    return "\n".join(line for part in parts for line in part)


def _header(d: dict[str, Any]) -> list[str]:
    """The title and what the experiment is: hypothesis, status, verdict, baseline, command."""
    return [
        f"# Experiment {d['experiment_id']}: {d['title']}",
        "",
        f"- **Hypothesis:** {d['hypothesis']}",
        f"- **Status:** {d['status']}" + (f" ({d['stop_reason']})" if d["stop_reason"] else ""),
        f"- **Verdict:** {d['verdict'] or ('none: stopped' if d['status'] == 'stopped' else 'not yet')}",
        f"- **Baseline run:** `{d['baseline_run_id']}`" + (f"; follows experiment `{d['parent_experiment_id']}`"
                                                           if d["parent_experiment_id"] else ""),
        f"- **Command:** `{' '.join(d['command'])}`",
        "",
    ]


def _changes(d: dict[str, Any]) -> list[str]:
    """## Changes against the baseline."""
    out = ["## Changes against the baseline", ""]
    if d["changes"]:
        out += [f"- `{change_text(change)}`" for change in d["changes"]]
        if len(d["changes"]) > 1:
            out.append("- (more than one change, recorded as meant: --allow-multiple-changes)")
    else:
        out.append("- none in the config or the command (the code may differ: see the runs' commits below)")
    return out + [""]


def _expected_vs_observed(d: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    """## Expected vs observed: each criterion's outcome, then each quantity beside the baseline's."""
    out = ["## Expected vs observed", ""]
    if detail.get("provisional"):
        out += ["_Provisional: the experiment has not concluded._", ""]
    outcomes = detail.get("criteria") or []
    if outcomes:
        out += ["| criterion | observed | holds | quantities read |", "|---|---|---|---|"]
        for o in outcomes:
            observed = (f"{_n(o['left'])} vs {_n(o['right'])}" if o["missing"] is None else f"missing: {o['missing']}")
            values = ", ".join(f"`{k}` = {_n(v)}" for k, v in o["values"].items()) or "-"
            holds = {True: "yes", False: "**no**", None: "undecided"}[o["holds"]]
            out.append(f"| `{o['criterion']}` | {observed} | {holds} | {values} |")
    else:
        out.append("No criteria were stated (`--expect`).")
    out += ["", "| quantity | baseline | this experiment | delta |", "|---|---|---|---|"]
    for q in d["quantities"]:
        pct = f" ({q['delta_pct']:+.1f}%)" if q["delta_pct"] is not None else ""
        out.append(f"| `{q['quantity']}` | {_n(q['baseline'])} | {_n(q['run'])} | {_n(q['delta'], signed=True)}{pct} |")
    return out + [""]


def _test_run(d: dict[str, Any]) -> list[str]:
    """## Test run: how it went, its checks, and the full run's estimate taken from it."""
    out = ["## Test run", ""]
    plan = d["test_plan"] or {}
    for number, earlier in enumerate(d["earlier_test_runs"], 1):
        failed = ", ".join(c["check"] for c in earlier["checks"] if c["passed"] is False)
        out.append(f"Test run {number}: `{earlier['run_id']}`, max steps {earlier.get('max_steps')}: stopped: "
                   f"{_cell(earlier['stop_reason'] or 'not said')}" + (f" (failed: {failed})" if failed else "") + ".")
    if d["earlier_test_runs"]:
        out += [f"Test run {len(d['earlier_test_runs']) + 1} (`experiment start --again`):", ""]
    if d["skip_test"]:
        out.append("Skipped (`--skip-test`, recorded).")
    elif d["test_run"] is None:
        out.append("Not started.")
    else:
        out += [f"Run `{d['test_run']['run_id']}`: max steps {plan.get('max_steps')}, time limit "
                f"{plan.get('time_limit_hours')} h; ended {d['test_run']['state']}.", ""]
        if d["test_checks"]:
            out += ["| check | result | detail |", "|---|---|---|"]
            for c in d["test_checks"]:
                mark = {True: "pass", False: "**FAIL**", None: "skipped"}[c["passed"]]
                out.append(f"| {c['check']} | {mark} | {_cell(c['detail'])} |")
            out.append("")
    if d["estimate"]:
        e = d["estimate"]
        out += [f"Full-run estimate from the test run: {_n(e.get('gpu_hours'))} GPU-hours, {_n(e.get('wall_hours'))} "
                f"wall hours ({e.get('planned_steps')} planned steps at {_n(e.get('steps_per_second'))} steps/s after a "
                f"{_n(e.get('startup_seconds'))} s start-up; the test run: {e.get('test_steps')} steps, "
                f"{_n(e.get('test_gpu_hours'))} GPU-hours)"
                + (f"; budget {plan.get('budget_gpu_hours')} GPU-hours" if plan.get("budget_gpu_hours") else "") + ".",
                ""]
    return out


def _attempts(d: dict[str, Any]) -> list[str]:
    """## Attempts: the test and the full run, each with one row per attempt."""
    out = ["## Attempts", ""]
    for label, run in (("test", d["test_run"]), ("full", d["full_run"])):
        if run is None:
            continue
        out += [f"**{label} run `{run['run_id']}`** ({run['state']}, on {run['resource']}, commit "
                f"`{(run['code_commit'] or 'none')[:12]}`{' + diff' if run['code_dirty_sha256'] else ''}): "
                f"{run['gpu_hours']:.4g} {run['compute']}-hours, ${run['cost_usd']:.2f}",
                "",
                f"| attempt | ended | exit | steps | resumed from | {run['compute']}-h | decision |",
                "|---|---|---|---|---|---|---|"]
        for a in run["attempts"]:
            exit_text = f"signal {a['signal']}" if a["signal"] is not None else str(a["exit_code"])
            steps = f"{a['first_step']}..{a['last_step']}" if a["first_step"] is not None else "-"
            decision = f"{a['decision']} ({a['rule']})" if a["decision"] else "-"
            out.append(f"| {a['attempt_id']} | {a['termination_reason'] or a['state']} | {exit_text} | {steps} | "
                       f"{a['resumed_from'] or '-'} | {a['gpu_hours']:.4g} | {decision} |")
        out.append("")
    return out


def _evaluations_table(d: dict[str, Any]) -> list[str]:
    """## Evaluations per checkpoint: the baseline's beside the full run's, so `eval.<metric>` criteria can be checked by hand."""
    out = ["## Evaluations per checkpoint", ""]
    rows = [("baseline", r) for r in d["baseline_evaluations"]] + [("this", r) for r in d["evaluations"]]
    metrics = sorted({r["metric"] for _, r in rows})
    table: dict[tuple[str, int, str], dict[str, Any]] = {}
    for label, r in rows:
        table.setdefault((label, r["checkpoint_step"], r["spec_name"]), {"state": r["state"], "seeds": 0})
        entry = table[(label, r["checkpoint_step"], r["spec_name"])]
        entry[r["metric"]] = f"{r['mean']:.4g} ± {r['std']:.2g}"
        entry["seeds"] = max(entry["seeds"], r["seeds"])
    out += ["| run | step | spec | " + " | ".join(metrics) + " | seeds | state |",
            "|---|---|---|" + "---|" * len(metrics) + "---|---|"]
    for (label, step, spec), entry in table.items():
        cells = " | ".join(entry.get(m, "-") for m in metrics)
        out.append(f"| {label} | {step} | {spec} | {cells} | {entry['seeds']} | {entry['state']} |")
    return out + [""]


def _verdict(d: dict[str, Any], detail: dict[str, Any]) -> list[str]:
    """## Verdict, and the next step it suggests."""
    out = ["## Verdict", "",
           f"**{(d['verdict'] or detail.get('verdict') or ('none: stopped' if d['status'] == 'stopped' else 'not yet')).upper()}**"
           + (" (provisional)" if detail.get("provisional") else "") + f": {detail.get('why') or d['stop_reason'] or ''}",
           ""]
    if detail.get("next_step"):
        out.append(f"Next: {detail['next_step']}.")
    elif d["status"] == "stopped":
        out.append(f"Next: fix the bottleneck ({d['stop_reason']}), then plan it again with "
                   f"`trackway experiment new --from {d['experiment_id']}`.")
    return out + [""]


def _n(value: Any, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:+.6g}" if signed else f"{value:.6g}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
