"""Read-only endpoints over the ledger: resources, metric curves, checkpoints, evaluations, explain, experiments, SQL."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from trackway.ledger.records import resolve_run
from trackway.ledger.schema import checkpoints
from trackway.server.charts import DEFAULT_POINTS, MAX_POINTS, run_chart

router = APIRouter(prefix="/api", tags=["reads"])


@router.get("/resources")
def resources(request: Request) -> list[dict[str, Any]]:
    """Each resource runs may go to, with free GPUs and jobs running and pending now."""
    from trackway.resources.availability import look_up, resource_record
    from trackway.resources.placement import candidates

    declared = candidates(request.app.state.settings)
    from trackway.resources.own_queue import own_jobs

    with request.app.state.ledger.read() as conn:
        jobs = own_jobs(conn)
    found = look_up(declared, home=request.app.state.settings.home, own_jobs=jobs)
    return [resource_record(resource, found[resource.name]) for resource in declared]


@router.get("/runs/{run_id}/metrics")
def metrics(
    run_id: str, request: Request,
    keys: str | None = Query(None, max_length=10_000, description="Comma-separated metric keys (default: all)."),
    max_points: int = Query(DEFAULT_POINTS, ge=2, le=MAX_POINTS, description="Points per key, at most."),
    rank: int = Query(0, ge=0, le=2**31 - 1, description="Whose values: the rank that logged them (`ranks` lists them)."),
) -> dict[str, Any]:
    """One rank's curves (rank 0's by default) on the run's continuous step axis, downsampled on the server,
    with each attempt's bounds and the ranks that logged metrics."""
    wanted = [k.strip() for k in keys.split(",") if k.strip()] if keys else None
    return run_chart(request.app.state.ledger, run_id, wanted, max_points, rank)


@router.get("/runs/{run_id}/checkpoints")
def run_checkpoints(run_id: str, request: Request) -> list[dict[str, Any]]:
    """The ledger's mirror of the run's checkpoints (state, step, size, attempt, parent: the lineage)."""
    import json

    with request.app.state.ledger.read() as conn:
        run = resolve_run(conn, run_id)
        rows = conn.execute(
            select(checkpoints).where(checkpoints.c.run_id == run["run_id"]).order_by(checkpoints.c.step)
        ).mappings().all()
    return [{**dict(r), "metrics": json.loads(r["metrics"]) if r["metrics"] else None} for r in rows]


@router.get("/runs/{run_id}/evals")
def run_evals(run_id: str, request: Request) -> dict[str, Any]:
    """Every evaluation of the run's checkpoints, per seed and aggregated (what `trackway evals --json` prints)."""
    from trackway.evals.tables import run_table
    from trackway.supervisor.retry import run_config

    state = request.app.state
    with state.ledger.read() as conn:
        run = resolve_run(conn, run_id)
        return run_table(conn, run["run_id"], run_config(state.settings, run["run_id"]))


@router.get("/evaluations/{eval_id}")
def evaluation(eval_id: str, request: Request) -> dict[str, Any]:
    """One evaluation (`trackway eval show EV --json`): pinned versions and judge, each seed with its attempts; in two
    phases, each seed's inference and scoring runs apart, with their attempts, placement, reasons and cost."""
    from trackway.evals.tables import evaluation_detail

    with request.app.state.ledger.read() as conn:
        return evaluation_detail(conn, eval_id)


@router.get("/attempts/{run_id}/{number}/explain")
def explain_attempt(run_id: str, request: Request,
                    number: int = PathParam(ge=1, le=1_000_000_000, description="The attempt's number, from 1.")
                    ) -> dict[str, Any]:
    """The 15-minute answer for one attempt: the same facts as `trackway explain RUN/N --json`."""
    from trackway.reports.explain import explain

    with request.app.state.ledger.read() as conn:
        return explain(conn, f"{run_id}/{number}")


@router.get("/runs/{run_id}/explain")
def explain_run(run_id: str, request: Request) -> dict[str, Any]:
    """The run's latest attempt explained (`trackway explain RUN --json`)."""
    from trackway.reports.explain import explain

    with request.app.state.ledger.read() as conn:
        return explain(conn, run_id)


@router.get("/compare")
def compare_runs(request: Request, runs: str = Query(..., max_length=10_000,
                                                    description="Comma-separated runs (ids or names), the first the "
                                                                "baseline: at least two.")) -> dict[str, Any]:
    """Runs side by side (what `trackway compare --json` prints): config keys that differ, code, data, final metrics."""
    from trackway.reports.compare import compare

    with request.app.state.ledger.read() as conn:
        return compare(conn, [r.strip() for r in runs.split(",") if r.strip()])


@router.get("/experiments")
def experiments(request: Request, limit: int = Query(100, ge=1, le=10_000)) -> list[dict[str, Any]]:
    """Experiments, newest first, with status and verdict."""
    from trackway.experiments.records import list_experiments

    keep = ("experiment_id", "name", "project", "title", "hypothesis", "status", "verdict", "stop_reason",
            "baseline_run_id", "parent_experiment_id", "test_run_id", "full_run_id", "created_at", "concluded_at")
    with request.app.state.ledger.read() as conn:
        return [{k: row[k] for k in keep} for row in list_experiments(conn, limit=limit)]


@router.get("/experiments/{experiment_id}")
def experiment(experiment_id: str, request: Request) -> dict[str, Any]:
    """One experiment in full (`trackway experiment show --json`)."""
    from trackway.experiments.records import resolve_experiment
    from trackway.experiments.report import describe

    with request.app.state.ledger.read() as conn:
        return describe(conn, resolve_experiment(conn, experiment_id))


@router.get("/waste")
def waste(request: Request, weeks: int = Query(8, ge=1, le=520)) -> list[dict[str, Any]]:
    """GPU-hours of ended attempts by ISO week and termination reason, with how much of it was wasted."""
    from datetime import datetime, timedelta, timezone

    from trackway.ledger.schema import attempts

    since = datetime.now(timezone.utc) - timedelta(weeks=weeks)
    with request.app.state.ledger.read() as conn:
        rows = conn.execute(
            select(attempts.c.started_at, attempts.c.termination_reason, attempts.c.gpu_seconds,
                   attempts.c.wasted_gpu_seconds)
            .where(attempts.c.started_at >= since, attempts.c.termination_reason.is_not(None))
        ).all()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for started, reason, gpu_seconds, wasted in rows:
        monday = (started - timedelta(days=started.weekday())).date().isoformat()
        entry = groups.setdefault((monday, reason), {"week": monday, "termination_reason": reason, "attempts": 0,
                                                     "gpu_hours": 0.0, "wasted_gpu_hours": 0.0})
        entry["attempts"] += 1
        entry["gpu_hours"] += (gpu_seconds or 0.0) / 3600
        entry["wasted_gpu_hours"] += (wasted or 0.0) / 3600
    return sorted(groups.values(), key=lambda e: (e["week"], -e["gpu_hours"]), reverse=True)


class SqlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=100_000, description="One read-only statement, PostgreSQL dialect.")
    timeout_s: float = Field(30.0, gt=0, le=3600)
    max_rows: int = Field(10_000, ge=1, le=100_000, description="Rows to return at most; `truncated` says if there were more.")


@router.post("/sql")
def sql(body: SqlRequest, request: Request) -> dict[str, Any]:
    """One read-only query, refused as `trackway sql` refuses it (writes, DDL, the server's secrets)."""
    from trackway.ledger.reader import sqlite_file
    from trackway.ledger.sql.readonly import run_readonly_query

    ledger = request.app.state.ledger
    url = ledger.engine.url.render_as_string(hide_password=False)
    if sqlite_file(url) is not None:  # a step of SQLite's no time limit breaks into: in a worker killed at the deadline
        result = _sql_workers(request.app).run(url, body.query, body.timeout_s, body.max_rows)
    else:  # PostgreSQL stops the statement itself (statement_timeout)
        result = run_readonly_query(ledger, body.query, body.timeout_s, max_rows=body.max_rows)
    answer: dict[str, Any] = {"columns": result.columns, "rows": [list(row) for row in result.rows]}
    if result.truncated:  # said only when rows were left out, so an answer that is whole keeps its shape
        answer.update(truncated=True, max_rows=body.max_rows)
    return answer


_workers_lock = threading.Lock()


def _sql_workers(app):
    """The app's SQL worker processes (ledger/sql/worker.py), made on the first query."""
    from trackway.ledger.sql.worker import SqlWorkers

    with _workers_lock:
        if getattr(app.state, "sql_workers", None) is None:
            app.state.sql_workers = SqlWorkers()
        return app.state.sql_workers


def close_sql_workers(app) -> None:
    """Stop the app's SQL workers, if a query started any: at the server's shutdown, not at the worker's EOF."""
    with _workers_lock:
        workers, app.state.sql_workers = getattr(app.state, "sql_workers", None), None
    if workers is not None:
        workers.close()
