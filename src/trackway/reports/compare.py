"""Runs side by side: what differs in their config, code and data, where their metrics ended, what they cost.

`compare(conn, refs)` gives the facts `trackway compare` prints and `--json` returns; the first run
is the one the others are measured against (differences in metrics are theirs minus its).
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy import Connection, select

from trackway.display import compute_unit_of
from trackway.errors import InputError
from trackway.experiments.criteria import Missing, Quantity
from trackway.experiments.expectation_verdicts import verdict_of
from trackway.experiments.quantities import NODE_PREFIX, RunNumbers
from trackway.experiments.records import experiment_of_run
from trackway.ledger.blobs import get_blob
from trackway.ledger.records import list_attempts, resolve_run
from trackway.ledger.schema import metric_series
from trackway.receipts.config_diff import flatten
from trackway.redaction import redact_structure
from trackway.taxonomy import RunState

MAX_RUNS = 20
ABSENT = "not set"


def compare(conn: Connection, refs: list[str]) -> dict[str, Any]:
    """The facts of comparing `refs` (ids or names, at least two; the first is the baseline)."""
    if len(refs) < 2:
        raise InputError(f"RUN...: expected at least two runs to compare, got {len(refs)}")
    if len(refs) > MAX_RUNS:
        raise InputError(f"RUN...: expected at most {MAX_RUNS} runs, got {len(refs)}")
    rows = [resolve_run(conn, ref) for ref in refs]
    ids = [row["run_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise InputError("RUN...: the same run was given twice")
    configs = [_config(conn, row) for row in rows]
    keys = sorted(set().union(*configs))
    config = [{"key": key, "values": [c.get(key, ABSENT) for c in configs],
               "same": len({json.dumps(c.get(key, ABSENT), sort_keys=True, default=str) for c in configs}) == 1}
              for key in keys]
    return {
        "runs": [_run(conn, row) for row in rows],
        "config": config,
        "config_same": sum(1 for entry in config if entry["same"]),
        "code": _code(rows),
        "data": {"manifests": [row["data_manifest_sha256"] for row in rows],
                 "same": len({row["data_manifest_sha256"] for row in rows}) == 1},
        "metrics": _metrics(conn, ids),
    }


def _config(conn: Connection, row: Any) -> dict[str, Any]:
    """The config the run's newest attempt ran with (the submitted one merged with what its script said),
    secrets masked, flattened to dotted keys."""
    attempts = list_attempts(conn, run_id=row["run_id"])
    digest = next((a["config_sha256"] for a in reversed(attempts) if a["config_sha256"]), None) or row["config_sha256"]
    if not digest:
        return {}
    try:
        config = json.loads(get_blob(conn, digest))
    except (ValueError, InputError):
        return {}
    return flatten(redact_structure(config)) if isinstance(config, dict) else {}


def _run(conn: Connection, row: Any) -> dict[str, Any]:
    attempts = list_attempts(conn, run_id=row["run_id"])
    numbers = RunNumbers(conn, row["run_id"])
    steps = _number(lambda: numbers.value(Quantity("steps"), lambda node: 0.0))
    wall = _number(lambda: numbers.wall_hours(Quantity("wall_hours")))
    experiment = experiment_of_run(conn, row["run_id"])
    return {
        "run_id": row["run_id"], "name": row["name"], "kind": row["kind"], "state": row["state"],
        "ended_as": attempts[-1]["termination_reason"] if attempts else None,
        "attempts": len(attempts),
        "steps": int(steps) if steps is not None else None,
        "wall_hours": wall,
        "compute_hours": sum((a["gpu_seconds"] or 0.0) for a in attempts) / 3600,
        "compute": compute_unit_of(a["gpu_count"] for a in attempts),
        "cost_usd": sum((a["cost_usd"] or 0.0) for a in attempts),
        "expectations": verdict_of(dict(row)),
        "experiment": None if experiment is None else {
            "experiment_id": experiment["experiment_id"], "title": experiment["title"],
            "role": "test" if experiment["test_run_id"] == row["run_id"] else "full",
            "status": experiment["status"], "verdict": experiment["verdict"],
            "baseline_run_id": experiment["baseline_run_id"]},
        "ended": RunState(row["state"]).is_terminal(),
    }


def _code(rows: list[Any]) -> dict[str, Any]:
    said = [{"repo": row["code_repo"], "branch": row["code_branch"], "commit": row["code_commit"],
             "uncommitted_diff": row["code_dirty_sha256"]} for row in rows]
    known = all(entry["commit"] for entry in said)
    same = known and len({(entry["commit"], entry["uncommitted_diff"]) for entry in said}) == 1
    # Without a commit (not a git work tree) nothing says whether the code was the same: not known, never "same".
    return {"runs": said, "same": same if known else None}


def _metrics(conn: Connection, ids: list[str]) -> list[dict[str, Any]]:
    """Each key any of the runs logged (rank 0, not the executor's node/ samples): final and best per run, and
    the final's difference from the first run's."""
    keys = sorted(set(conn.execute(
        select(metric_series.c.key).where(metric_series.c.run_id.in_(ids), metric_series.c.rank == 0,
                                          metric_series.c.key.not_like(NODE_PREFIX + "%"))
        .group_by(metric_series.c.key)).scalars()))
    out = []
    for key in keys:
        per_run = []
        for run_id in ids:
            numbers = RunNumbers(conn, run_id)
            final = _number(lambda: numbers.metric("final", key, Quantity("final", key)))
            best = _number(lambda: numbers.metric("best", key, Quantity("best", key)))
            per_run.append({"final": final, "best": best})
        base = per_run[0]["final"]
        for entry in per_run:
            numeric = isinstance(entry["final"], float) and isinstance(base, float)
            delta = entry["final"] - base if numeric else None
            entry["delta"] = delta
            entry["delta_pct"] = (100 * delta / abs(base)) if delta is not None and base not in (0, None) else None
        out.append({"key": key, "runs": per_run})
    return out


def _number(read) -> float | str | None:
    """The number `read()` gives; None where the run cannot give it; a diverged NaN or infinity as text."""
    try:
        value = float(read())
    except Missing:
        return None
    return value if math.isfinite(value) else str(value)

