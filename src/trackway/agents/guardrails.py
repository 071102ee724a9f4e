"""What an agent may start: its identity, its GPU-hour budget and its cap on unfinished runs, checked before anything starts.

An agent is declared by a person (`[agents.NAME]` in trackway.toml); an undeclared name starts
nothing. Every run an agent submits is credited `agent NAME via mcp (user@host)` in its
`submitted_by` (and its first attempt's `started_by`), which is how its runs are found again.
Where its settings say so, a run waits for a person's approval before anything starts
(agents/approval.py).

The budget counts GPU-hours, as `report waste` does: the GPU-seconds every ended attempt of the
agent's runs spent (retries included), plus, for each unfinished run, what its current attempt may
still take (its GPUs × its time limit). A run the agent asks for must fit in what is left at its
own GPUs × time limit, so an agent with a budget must give a time limit to any run with GPUs.
Retries the supervisor decides for a run already admitted are counted as they spend, never
refused: the run was admitted whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from trackway.errors import InputError
from trackway.ledger.schema import attempts, runs
from trackway.settings import Settings
from trackway.taxonomy import RunState

UNFINISHED = (RunState.QUEUED.value, RunState.RUNNING.value)


class AgentRefused(InputError):
    """A request an agent may not make: `field` is the argument it sent, `expected` what would be taken."""

    def __init__(self, field: str, expected: str, message: str):
        super().__init__(message)
        self.field = field
        self.expected = expected


@dataclass(frozen=True)
class Agent:
    """One declared agent and its limits (`[agents.NAME]`)."""

    name: str
    gpu_hours_budget: float | None
    max_running: int
    approve_full_runs: bool = False
    approve_over_gpu_hours: float | None = None

    @property
    def credit(self) -> str:
        """The start of `started_by` on every attempt this agent starts (the user and host follow)."""
        return f"agent {self.name} via mcp"


def agent_of(settings: Settings, name: str) -> Agent:
    """The agent called `name` as trackway.toml declares it; InputError when it is not declared."""
    table = settings.agents.get(name)
    if table is None:
        known = ", ".join(sorted(settings.agents)) or "none is declared"
        raise InputError(f"--agent {name!r}: expected an agent declared as [agents.NAME] in trackway.toml ({known})")
    return Agent(name, table.get("gpu_hours_budget"), int(table.get("max_running") or 2),
                 bool(table.get("approve_full_runs")), table.get("approve_over_gpu_hours"))


@dataclass(frozen=True)
class Standing:
    """What the agent has spent and holds now."""

    spent_gpu_hours: float  # ended attempts of its runs
    held_gpu_hours: float  # what its unfinished runs' current attempts may still take
    unfinished: list[str]  # its runs still queued or running

    def to_json(self, agent: Agent) -> dict[str, Any]:
        left = None if agent.gpu_hours_budget is None else \
            max(agent.gpu_hours_budget - self.spent_gpu_hours - self.held_gpu_hours, 0.0)
        return {"agent": agent.name, "gpu_hours_budget": agent.gpu_hours_budget,
                "spent_gpu_hours": round(self.spent_gpu_hours, 4), "held_gpu_hours": round(self.held_gpu_hours, 4),
                "left_gpu_hours": None if left is None else round(left, 4), "max_running": agent.max_running,
                "unfinished_runs": self.unfinished}


def agents_runs(agent: Agent):
    """The ids of the runs the agent submitted, as a subquery."""
    return select(runs.c.run_id).where(runs.c.submitted_by.startswith(f"{agent.credit} (", autoescape=True))


def is_agents_run(conn: Connection, agent: Agent, run_id: str) -> bool:
    return conn.execute(agents_runs(agent).where(runs.c.run_id == run_id)).first() is not None


def needs_approval(agent: Agent, kind: str, gpus: int, time_limit_hours: float | None) -> str | None:
    """Why a person must approve this run before it starts (None: it starts at once)."""
    if agent.approve_full_runs and kind == "full":
        return f"[agents.{agent.name}] approve_full_runs: a full run waits for a person"
    limit = agent.approve_over_gpu_hours
    if limit is not None and gpus > 0:
        if time_limit_hours is None:
            return (f"[agents.{agent.name}] approve_over_gpu_hours = {limit:g}: a run of {gpus} GPU(s) without a "
                    "time limit may spend more")
        if gpus * time_limit_hours > limit:
            return (f"[agents.{agent.name}] approve_over_gpu_hours = {limit:g}: this run asks {gpus} × "
                    f"{time_limit_hours:g} h = {gpus * time_limit_hours:g} GPU-hours")
    return None


def standing(conn: Connection, agent: Agent, now: float | None = None) -> Standing:
    now = now or time.time()
    mine = agents_runs(agent)
    # An attempt without GPUs counts CPU time under gpu_seconds (display.compute_unit_of): not GPU-hours.
    spent = conn.execute(select(func.coalesce(func.sum(attempts.c.gpu_seconds), 0.0)).where(
        attempts.c.run_id.in_(mine), attempts.c.gpu_seconds.is_not(None), attempts.c.gpu_count > 0)).scalar() or 0.0
    rows = conn.execute(select(runs.c.run_id, runs.c.gpus, runs.c.time_limit_s).where(
        and_(runs.c.run_id.in_(mine), runs.c.state.in_(UNFINISHED))).order_by(runs.c.created_at)).all()
    held = sum((row.gpus or 0) * (row.time_limit_s or 0.0) for row in rows) / 3600.0
    return Standing(float(spent) / 3600.0, held, [row.run_id for row in rows])


def admit(conn: Connection, agent: Agent, gpus: int, time_limit_hours: float | None) -> Standing:
    """Refuse, before anything is recorded, a run the agent's cap or budget cannot take; its standing otherwise."""
    now = standing(conn, agent)
    if len(now.unfinished) >= agent.max_running:
        raise AgentRefused(
            "max_running", f"at most {agent.max_running} unfinished run(s)",
            f"agent {agent.name!r} has {len(now.unfinished)} unfinished runs ({', '.join(now.unfinished)}) and "
            f"[agents.{agent.name}] max_running is {agent.max_running}: wait for one to end or cancel one")
    if agent.gpu_hours_budget is None or gpus == 0:
        return now
    if time_limit_hours is None:
        raise AgentRefused(
            "time_limit_hours", "a time limit in hours",
            f"time_limit_hours: expected a time limit: agent {agent.name!r} has a budget of "
            f"{agent.gpu_hours_budget:g} GPU-hours, and a run of {gpus} GPU(s) without one could spend all of it")
    asked = gpus * time_limit_hours
    left = agent.gpu_hours_budget - now.spent_gpu_hours - now.held_gpu_hours
    if asked > left + 1e-9:
        raise AgentRefused(
            "time_limit_hours", f"at most {max(left, 0) / gpus:.3g} hours on {gpus} GPU(s)",
            f"gpu_count × time_limit_hours: expected at most {max(left, 0):.3g} GPU-hours, the rest of agent "
            f"{agent.name!r}'s budget of {agent.gpu_hours_budget:g} ({now.spent_gpu_hours:.3g} spent, "
            f"{now.held_gpu_hours:.3g} held by unfinished runs); this run asks {gpus} × {time_limit_hours:g} h = "
            f"{asked:.3g}")
    return now
