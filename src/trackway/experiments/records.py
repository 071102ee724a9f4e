"""The experiments table: an experiment's states, and reading and writing its row.

    planned ──start──► testing ──checks pass──► running ──full run ends──► analyzing ──► concluded
       │                  │ checks fail, over budget                │ evaluations pending     (verdict)
       │                  ▼                                          ▼
       └──start --skip-test──► running                            stopped (with the reason)

`experiment stop` ends any state that is not final as `stopped`, cancelling its runs. An experiment
stopped before its full run starts again with `experiment start --again` (stopped ──► testing): a new
test run, the earlier ones kept in its test plan (`earlier_test_runs`) with their checks.
"""

from __future__ import annotations

import enum
import json
import secrets
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.engine import Connection, RowMapping

from trackway.errors import Ambiguous, NotFound
from trackway.ledger.schema import experiments


class ExperimentStatus(str, enum.Enum):
    PLANNED = "planned"
    TESTING = "testing"
    RUNNING = "running"
    ANALYZING = "analyzing"
    CONCLUDED = "concluded"
    STOPPED = "stopped"

    def is_final(self) -> bool:
        return self in (ExperimentStatus.CONCLUDED, ExperimentStatus.STOPPED)


class Verdict(str, enum.Enum):
    SUPPORTED = "supported"
    REJECTED = "rejected"
    INCONCLUSIVE = "inconclusive"


DRIVEN = (ExperimentStatus.TESTING.value, ExperimentStatus.RUNNING.value, ExperimentStatus.ANALYZING.value)


def new_experiment_id() -> str:
    return "x" + secrets.token_hex(5)


def insert_experiment(conn: Connection, values: Mapping[str, Any]) -> str:
    now = datetime.now(timezone.utc)
    experiment_id = values.get("experiment_id") or new_experiment_id()
    conn.execute(experiments.insert().values(
        **{**values, "experiment_id": experiment_id, "created_at": now, "updated_at": now}
    ))
    return experiment_id


def update_experiment(conn: Connection, experiment_id: str, expected_status: str | None = None, **values: Any) -> bool:
    """Write `values`; with `expected_status`, only if the row is still in it (True if written)."""
    statement = update(experiments).where(experiments.c.experiment_id == experiment_id)
    if expected_status is not None:
        statement = statement.where(experiments.c.status == expected_status)
    result = conn.execute(statement.values(**values, updated_at=datetime.now(timezone.utc)))
    return result.rowcount == 1


def resolve_experiment(conn: Connection, ref: str) -> RowMapping:
    """The experiment with id or name `ref` (or a unique id prefix); NotFound / Ambiguous otherwise."""
    ref = ref.strip()
    row = conn.execute(
        select(experiments).where(or_(experiments.c.experiment_id == ref, experiments.c.name == ref))
    ).mappings().first()
    if row is not None:
        return row
    if len(ref) >= 3:
        escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = conn.execute(
            select(experiments).where(experiments.c.experiment_id.like(f"{escaped}%", escape="\\")).limit(2)
        ).mappings().all()
        if len(rows) == 1:
            return rows[0]
        if len(rows) > 1:
            raise Ambiguous(f"experiment {ref!r}: matches more than one experiment; give more of its id")
    raise NotFound(f"experiment {ref!r}: no experiment has that id or name (`trackway experiments` lists them)")


def list_experiments(conn: Connection, project: str | None = None, limit: int = 50) -> list[RowMapping]:
    query = select(experiments).order_by(experiments.c.created_at.desc(), experiments.c.experiment_id.desc())
    if project is not None:
        query = query.where(experiments.c.project == project)
    if limit:
        query = query.limit(limit)
    return list(conn.execute(query).mappings())


def driven_experiments(conn: Connection) -> list[RowMapping]:
    """The experiments a supervisor moves on: testing, running, analyzing."""
    return list(conn.execute(
        select(experiments).where(experiments.c.status.in_(DRIVEN)).order_by(experiments.c.created_at)
    ).mappings())


def experiment_of_run(conn: Connection, run_id: str) -> RowMapping | None:
    """The experiment whose test or full run `run_id` is, if any."""
    return conn.execute(
        select(experiments).where(or_(experiments.c.test_run_id == run_id, experiments.c.full_run_id == run_id))
    ).mappings().first()


def chain_of(conn: Connection, ref: str) -> list[RowMapping]:
    """The iterations leading to experiment `ref` and those that followed from it, oldest first."""
    start = resolve_experiment(conn, ref)
    chain = [start]
    seen = {start["experiment_id"]}
    node = start
    while node["parent_experiment_id"] and node["parent_experiment_id"] not in seen:
        parent = conn.execute(
            select(experiments).where(experiments.c.experiment_id == node["parent_experiment_id"])
        ).mappings().first()
        if parent is None:
            break
        chain.insert(0, parent)
        seen.add(parent["experiment_id"])
        node = parent
    node = start
    while True:
        child = conn.execute(
            select(experiments).where(experiments.c.parent_experiment_id == node["experiment_id"])
            .order_by(experiments.c.created_at)
        ).mappings().first()
        if child is None or child["experiment_id"] in seen:
            break
        chain.append(child)
        seen.add(child["experiment_id"])
        node = child
    return chain


def loads(row: Mapping[str, Any], column: str, default: Any = None) -> Any:
    """A JSON column of the row, decoded (`default` when NULL)."""
    text = row[column]
    return json.loads(text) if text else default
