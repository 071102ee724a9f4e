"""The experiment tools an agent calls: a hypothesis, its gated test run, its verdict; batches; the chain.

As agents/tools.py's, each is a plain function over the ledger answering JSON-ready values, with the
guardrails before anything starts: an experiment's runs are credited to the agent, held to its budget,
and its full run waits for a person where the agent's settings say so.
"""

from __future__ import annotations

from typing import Any

from trackway.agents.approval import AWAITING
from trackway.agents.guardrails import AgentRefused, admit, needs_approval
from trackway.agents.tools import (
    AgentSession,
    _background,
    _finite,
    _whole,
    jsonable,
)


def experiment_new(session: AgentSession, title: str, hypothesis: str, baseline: str | None = None,
                   parent: str | None = None, set: list[str] | None = None, expect: list[str] | None = None,
                   name: str | None = None, gpus: int | None = None, time_limit_hours: float | None = None,
                   resource: str | None = None, branch: str | None = None, commit: str | None = None) -> dict[str, Any]:
    """Record a hypothesis against a baseline run: its one change (config overrides, or the code of a branch or
    commit of the baseline's repository), its criteria. Nothing runs.

    An agent never gives a command: the runs run the baseline's (a person may give another on the CLI).
    """
    if branch is not None and commit is not None:
        raise AgentRefused("commit", "branch or commit, not both", "branch/commit: expected one of them, not both")
    from trackway.experiments.define import ExperimentSpec, new_experiment

    recorded = new_experiment(session.ledger, session.settings, ExperimentSpec(
        title=title, hypothesis=hypothesis, cwd=session.workdir, baseline=baseline, parent=parent,
        overrides=list(set or []), criteria=list(expect or []), name=name, gpus=gpus,
        time_limit_hours=time_limit_hours, resource=resource, code_ref=branch if branch is not None else commit,
        code_ref_kind="branch" if branch is not None else "commit"))
    return jsonable({"experiment_id": recorded.experiment_id, "baseline_run_id": recorded.baseline_run_id,
                     "changes": recorded.changes, "baseline_note": recorded.baseline_note or None,
                     "note": None if expect else "no criteria: the verdict will be inconclusive"})


def experiment_start(session: AgentSession, experiment: str, max_steps: int | None = None,
                     test_time_limit_hours: float = 1.0, budget_gpu_hours: float | None = None,
                     skip_test: bool = False, again: bool = False, test_resource: str | None = None,
                     test_gpus: int | None = None) -> dict[str, Any]:
    """Submit the experiment's gated test run (its full run follows when every check passes), inside the agent's limits.

    The test run is admitted as `submit` admits a run. The full run the supervisor submits after it is
    credited to the agent too, held to what the agent's budget had left when the experiment started
    (the experiment's own budget_gpu_hours, if lower), and waits for a person when the agent's settings
    say so.
    """
    from trackway.experiments.launch import TestPlan, default_test_steps, logging_interval, planned_steps
    from trackway.experiments.progress import start
    from trackway.experiments.records import resolve_experiment
    from trackway.supervisor.launch import command_by

    if max_steps is not None:
        _whole(max_steps, "max_steps", 1, 2**31 - 1)
    if test_gpus is not None:
        _whole(test_gpus, "test_gpus", 0, 100_000)
    with session.ledger.read() as conn:
        record = resolve_experiment(conn, experiment)
    if max_steps is None:
        max_steps, _ = default_test_steps(planned_steps(session.ledger, record),
                                          logging_interval(session.ledger, record["baseline_run_id"], "loss"))
    gpus = record["gpus"] or 0
    full_hours = record["time_limit_s"] / 3600 if record["time_limit_s"] else None
    with session.submitting:
        with session.ledger.read() as conn:
            test_gpus_given = gpus if test_gpus is None else test_gpus
            first_gpus, first_hours = (gpus, full_hours) if skip_test else (test_gpus_given, test_time_limit_hours)
            now = admit(conn, session.agent, first_gpus, first_hours)
        left = None
        if session.agent.gpu_hours_budget is not None:
            left = session.agent.gpu_hours_budget - now.spent_gpu_hours - now.held_gpu_hours - first_gpus * (first_hours or 0)
            left = max(left, 0.0)
        limits = [x for x in (budget_gpu_hours, left) if x is not None]
        cap = min(limits) if limits else None
        plan = TestPlan(max_steps=max_steps, time_limit_hours=test_time_limit_hours, budget_gpu_hours=cap,
                        skip_test=skip_test, submitted_by=command_by(session.agent.credit),
                        full_run_approval=needs_approval(session.agent, "full", gpus, full_hours),
                        test_resource=test_resource, test_gpus=test_gpus)
        started = start(session.ledger, session.settings, record["experiment_id"], plan, session.supervisor().executor,
                        started_by=plan.submitted_by, again=again)
    _background(session)
    return {"experiment_id": started.experiment_id, "run_id": started.run_id, "kind": started.kind,
            "attempt_id": started.attempt_id, "awaiting_approval": started.attempt_id is None,
            "full_run_budget_gpu_hours": cap, "full_run_needs_approval": plan.full_run_approval,
            "note": "wait for the experiment with experiment_wait, or for this run with wait"}


def experiment_show(session: AgentSession, experiment: str) -> dict[str, Any]:
    """The experiment: hypothesis, changes, criteria with their numbers, the test run's checks, its runs, the verdict."""
    from trackway.experiments.records import resolve_experiment
    from trackway.experiments.report import describe

    session.tick()
    with session.ledger.read() as conn:
        return _finite(jsonable(describe(conn, resolve_experiment(conn, experiment))))


def experiment_wait(session: AgentSession, experiment: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until the experiment concludes or stops (or its full run waits for a person), then show it."""
    from trackway.experiments.records import ExperimentStatus, resolve_experiment
    from trackway.ledger.records import resolve_run

    def look(conn):
        record = resolve_experiment(conn, experiment)
        full = resolve_run(conn, record["full_run_id"]) if record["full_run_id"] else None
        final = ExperimentStatus(record["status"]).is_final()
        held = full is not None and full["approval"] == AWAITING
        return (record, final, held), final or held

    record, final, held = session.wait_until(timeout_s, look)
    shown = experiment_show(session, experiment)
    return {"experiment_id": record["experiment_id"], "status": record["status"], "verdict": record["verdict"],
            "concluded": final, "waited_out": not final and not held, "full_run_awaiting_approval": held,
            "experiment": shown}


def experiment_batch(session: AgentSession, baseline: str, hypotheses: list[dict[str, Any]],
                     expect: list[str] | None = None, budget_gpu_hours: float | None = None, max_running: int = 2,
                     test_time_limit_hours: float = 1.0, name: str | None = None) -> dict[str, Any]:
    """Record a wave of hypotheses against one baseline and start them as room allows, inside the agent's limits.

    The batch shares what is left of the agent's budget (its own budget_gpu_hours, if lower), runs at most as
    many members at once as the agent's cap leaves room for, and each member's full run waits for a person
    where the agent's settings say so (judged on the baseline's GPUs and time limit, which members keep).
    """
    from trackway.experiments.batch import Hypothesis, advance_batches, new_batch
    from trackway.experiments.launch import TestPlan
    from trackway.ledger.records import resolve_run
    from trackway.supervisor.launch import command_by

    members = []
    for number, given in enumerate(hypotheses, 1):
        if not isinstance(given, dict) or set(given) - {"title", "hypothesis", "set", "expect"} \
                or not given.get("title") or not given.get("hypothesis"):
            raise AgentRefused(f"hypotheses[{number - 1}]", "an object with title, hypothesis, set and expect",
                               f"hypotheses[{number - 1}]: expected an object with title, hypothesis, set (config "
                               "overrides) and expect (criteria)")
        members.append(Hypothesis(str(given["title"]), str(given["hypothesis"]), list(given.get("set") or []),
                                  [*(expect or []), *(given.get("expect") or [])]))
    with session.submitting:
        with session.ledger.read() as conn:
            base = resolve_run(conn, baseline)
            now = admit(conn, session.agent, 0, None)  # the cap: one more unfinished run must fit
        room = session.agent.max_running - len(now.unfinished)
        left = None if session.agent.gpu_hours_budget is None else max(
            session.agent.gpu_hours_budget - now.spent_gpu_hours - now.held_gpu_hours, 0.0)
        limits = [x for x in (budget_gpu_hours, left) if x is not None]
        hours = base["time_limit_s"] / 3600 if base["time_limit_s"] else None
        plan = TestPlan(max_steps=None, time_limit_hours=test_time_limit_hours,  # type: ignore[arg-type]
                        submitted_by=command_by(session.agent.credit),
                        full_run_approval=needs_approval(session.agent, "full", base["gpus"] or 0, hours))
        running, shared = max(1, min(max_running, room)), min(limits) if limits else None
        batch_id, recorded = new_batch(session.ledger, session.settings, baseline, members, session.workdir, plan,
                                       max_running=running, budget_gpu_hours=shared, name=name)
        said = advance_batches(session.ledger, session.settings, session.supervisor().executor)
    _background(session)
    return {"batch_id": batch_id, "experiments": recorded, "max_running": running,
            "budget_gpu_hours": shared, "started": [m for _, m in said],
            "note": "wait with experiment_batch_wait; the batch goes on while you wait or not"}


def experiment_batch_wait(session: AgentSession, batch: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until every member of the batch concluded or stopped (or timeout_s passed); then its table of verdicts."""
    from trackway.experiments.batch import DONE, batch_of
    from trackway.experiments.batch import table as batch_table

    session.wait_until(timeout_s, lambda conn: (None, batch_of(conn, batch)["status"] == DONE))
    with session.ledger.read() as conn:
        shown = batch_table(conn, batch_of(conn, batch))
    return _finite(jsonable({**shown, "done": shown["status"] == DONE}))


def experiments_chain(session: AgentSession, experiment: str, metric: str = "loss") -> dict[str, Any]:
    """The iterations leading to and following `experiment`: each verdict, key metric, compute and what followed."""
    from trackway.experiments.chain import chain_rows
    from trackway.experiments.records import chain_of

    with session.ledger.read() as conn:
        return {"metric": metric, "iterations": _finite(jsonable(chain_rows(conn, chain_of(conn, experiment), metric)))}
