"""An experiment chain as people read it: each iteration's verdict, key metric, compute and what followed."""

from __future__ import annotations

NEXT = {"supported": "build on it", "rejected": "revert", "inconclusive": "measure again"}


def chain_rows(conn, rows, metric: str) -> list[dict]:
    """The iterations as a table: the first experiment's baseline run, then each experiment, with what followed."""
    root = rows[0]["baseline_run_id"]
    first = {
        "iteration": 1, "experiment_id": None, "run_id": root, "hypothesis": "the baseline", "status": "baseline",
        "verdict": None, "key_metric": final_metric(conn, root, metric), "gpu_hours": compute_hours(conn, [root]),
        "next": "",
    }
    listed = [first]
    for i, row in enumerate(rows, 2):
        entry = listed_row(conn, row, metric)
        entry.update(iteration=i, run_id=row["full_run_id"],
                     next=NEXT.get(row["verdict"] or "", f"fix: {row['stop_reason']}" if row["stop_reason"] else ""))
        listed.append(entry)
    return listed


def final_metric(conn, run_id: str | None, metric: str) -> float | None:
    from trackway.experiments.criteria import Missing, Quantity
    from trackway.experiments.quantities import RunNumbers

    if not run_id:
        return None
    try:
        return RunNumbers(conn, run_id).metric("final", metric, Quantity("final", metric))
    except Missing:
        return None


def compute_hours(conn, run_ids: list[str]) -> float:
    from sqlalchemy import func, select

    from trackway.ledger.schema import attempts

    if not run_ids:
        return 0.0
    seconds = conn.execute(select(func.sum(attempts.c.gpu_seconds)).where(attempts.c.run_id.in_(run_ids))).scalar()
    return (seconds or 0.0) / 3600


def listed_row(conn, row, metric: str) -> dict:
    return {
        "experiment_id": row["experiment_id"], "name": row["name"], "project": row["project"], "title": row["title"],
        "hypothesis": row["hypothesis"], "status": row["status"], "verdict": row["verdict"],
        "stop_reason": row["stop_reason"], "baseline_run_id": row["baseline_run_id"],
        "parent_experiment_id": row["parent_experiment_id"], "test_run_id": row["test_run_id"],
        "full_run_id": row["full_run_id"], "key_metric": final_metric(conn, row["full_run_id"], metric),
        "baseline_metric": final_metric(conn, row["baseline_run_id"], metric),
        "gpu_hours": compute_hours(conn, [r for r in (row["test_run_id"], row["full_run_id"]) if r]),
        "created_at": row["created_at"],
    }
