"""The research loop as tools an agent calls: each a plain function over the ledger, answering JSON-ready values.

The MCP server (agents/mcp_server.py) registers them with their schemas; they are plain so that
they can be read and tested without a protocol in between. They do what the CLI does, with the
guardrails of agents/guardrails.py before anything starts: a run is started only from a script
file inside the server's working directory (as the REST API), by a declared agent, inside its
budget and its cap, and credited to it. An agent cancels only its own runs.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from collections.abc import Callable
from typing import Any

from trackway.agents.approval import AWAITING
from trackway.agents.guardrails import Agent, AgentRefused, admit, agents_runs, is_agents_run, needs_approval, standing
from trackway.errors import InputError
from trackway.ledger import Ledger
from trackway.settings import Settings
from trackway.taxonomy import RunState

MAX_WAIT_S = 600.0
WAIT_POLL_S = 0.5
MAX_POINTS = 2000
MAX_LOG_LINES = 2000


@dataclass
class AgentSession:
    """What every tool works with: the ledger, the settings, the agent calling and the directory scripts live in."""

    ledger: Ledger
    settings: Settings
    agent: Agent
    workdir: Path
    _supervisor: Any = None
    submitting: threading.Lock = field(default_factory=threading.Lock)
    ticking: threading.Lock = field(default_factory=threading.Lock)

    def tick(self) -> None:
        """One pass of the control loop: the MCP SDK runs tools in threads, and one loop is driven by one at a time."""
        with self.ticking:
            self.supervisor().tick()

    def wait_until(self, timeout_s: float, look: Callable[[Any], tuple[Any, bool]]) -> Any:
        """Tick and read until `look(conn)` says done (its second value) or `timeout_s` passes; its last answer."""
        deadline = _deadline(timeout_s)
        while True:
            self.tick()
            with self.ledger.read() as conn:
                seen, done = look(conn)
            if done or time.monotonic() >= deadline:
                return seen
            time.sleep(WAIT_POLL_S)

    def supervisor(self):
        """A control loop this session ticks while it waits (as a following `submit` does)."""
        if self._supervisor is None:
            from trackway.supervision import supervisor_for

            self._supervisor = supervisor_for(self.ledger, self.settings)
        return self._supervisor


def jsonable(value: Any) -> Any:
    """A ledger row's values as JSON holds them: times in ISO 8601 UTC."""
    def convert(item: Any) -> Any:
        if isinstance(item, datetime):
            return item.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        if isinstance(item, bytes | memoryview):
            return bytes(item).hex()
        return str(item)

    return json.loads(json.dumps(value, default=convert))


# -- looking ----------------------------------------------------------------------------------------


def resources(session: AgentSession) -> dict[str, Any]:
    """The declared resources with what each can take now (free GPUs, jobs running and pending)."""
    from trackway.resources.availability import look_up, resource_record
    from trackway.resources.placement import candidates

    declared = candidates(session.settings)
    found = look_up(declared, home=session.settings.home)
    return {"resources": jsonable([resource_record(resource, found[resource.name]) for resource in declared])}


def budget(session: AgentSession) -> dict[str, Any]:
    """The agent's GPU-hours spent, held by its unfinished runs and left, and its cap on runs at once."""
    with session.ledger.read() as conn:
        return standing(conn, session.agent).to_json(session.agent)


def runs(session: AgentSession, mine_only: bool = True, limit: int = 20) -> dict[str, Any]:
    """Runs newest first (the agent's own, unless `mine_only` is false)."""
    from sqlalchemy import select

    from trackway.ledger.schema import runs as runs_table

    _whole(limit, "limit", 1, 500)
    query = select(runs_table.c.run_id, runs_table.c.name, runs_table.c.kind, runs_table.c.state,
                   runs_table.c.approval, runs_table.c.resource, runs_table.c.gpus, runs_table.c.created_at,
                   runs_table.c.ended_at, runs_table.c.submitted_by)
    if mine_only:
        query = query.where(runs_table.c.run_id.in_(agents_runs(session.agent)))
    with session.ledger.read() as conn:
        rows = conn.execute(query.order_by(runs_table.c.created_at.desc()).limit(limit)).mappings().all()
    return {"runs": jsonable([dict(row) for row in rows])}


def explain(session: AgentSession, ref: str) -> dict[str, Any]:
    """Every fact `trackway explain RUN|RUN/N --json` gives: the ending, its reason and evidence, the decision."""
    from trackway.reports.explain import explain as gather
    from trackway.validation import attempt_ref

    attempt_ref(ref)
    session.tick()  # an end nobody recorded yet is recorded before it is explained
    with session.ledger.read() as conn:
        return jsonable(gather(conn, ref))


def metrics(session: AgentSession, run: str, key: str = "loss", max_points: int = 200) -> dict[str, Any]:
    """A metric's history, evenly thinned to at most `max_points` points (the last point always kept)."""
    from trackway.read_api import Api

    _whole(max_points, "max_points", 2, MAX_POINTS)
    history = Api(db=session.settings.db_url, home=session.settings.home).history(run, key)
    count = len(history.steps)
    stride = max(1, -(-count // max_points))
    keep = list(range(0, count, stride))
    if count and keep[-1] != count - 1:
        keep[-1] = count - 1
    return {"run_id": history.run_id, "key": key, "points_logged": count,
            "steps": [history.steps[i] for i in keep], "values": [history.values[i] for i in keep],
            "attempts": [history.attempt_numbers[i] for i in keep]}


def logs(session: AgentSession, ref: str, lines: int = 50) -> dict[str, Any]:
    """The last `lines` lines of an attempt's output (a run: its newest attempt)."""
    from trackway.ledger.records import resolve_attempt
    from trackway.supervisor.loop import read_log_tail
    from trackway.validation import attempt_ref

    attempt_ref(ref)
    _whole(lines, "lines", 1, MAX_LOG_LINES)
    with session.ledger.read() as conn:
        attempt = resolve_attempt(conn, ref)
    tail = read_log_tail(Path(attempt["log_path"]), max_bytes=lines * 400, max_lines=lines)
    return {"attempt_id": attempt["attempt_id"], "state": attempt["state"], "lines": tail}


def sql(session: AgentSession, query: str, max_rows: int = 200) -> dict[str, Any]:
    """One read-only statement over the ledger (PostgreSQL dialect), at most `max_rows` rows, 30 s at most."""
    from trackway.ledger.sql.readonly import DEFAULT_TIMEOUT_S, check_max_rows, run_readonly_query

    _whole(max_rows, "max_rows", 1, 10_000)
    result = run_readonly_query(session.settings.db_url, query, timeout_s=DEFAULT_TIMEOUT_S,
                                remember_in=session.settings.home / "cache" / "sql", max_rows=check_max_rows(max_rows))
    return {"columns": list(result.columns), "rows": jsonable([list(row) for row in result.rows]),
            "truncated": bool(result.truncated)}


def explain_markdown(session: AgentSession, ref: str) -> str:
    """`trackway explain RUN|RUN/N --markdown`: the attempt's story as a person reads it."""
    from trackway.reports.explain import explain as gather
    from trackway.reports.explain_layout import to_markdown
    from trackway.validation import attempt_ref

    attempt_ref(ref)
    with session.ledger.read() as conn:
        return to_markdown(gather(conn, ref))


def receipt(session: AgentSession, ref: str) -> dict[str, Any]:
    """One attempt's receipt as the ledger holds it (`trackway attempts RUN --json`'s row)."""
    from trackway.ledger.records import resolve_attempt
    from trackway.validation import attempt_ref

    attempt_ref(ref)
    with session.ledger.read() as conn:
        row = dict(resolve_attempt(conn, ref))
    for key in ("termination_evidence", "retry_decision", "selection", "code_capture"):
        if isinstance(row.get(key), str):
            try:
                row[key] = json.loads(row[key])
            except ValueError:
                pass
    return _finite(jsonable(row))


def preflight(session: AgentSession, config: dict[str, Any], gpu_count: int = 1, resource: str | None = None,
              model_family: str | None = None) -> dict[str, Any]:
    """The memory preflight a submit of this config would run: peak GPU memory per GPU at the median, p99 and
    longest batch, judged on each resource it may go to, with the fixes ranked (the config's [preflight] section,
    or trackway.toml's [preflight] keys, declares the model and batch shape)."""
    from trackway.resources.submit_preflight import submit_preflight

    _whole(gpu_count, "gpu_count", 0, 100_000)
    if not isinstance(config, dict):
        raise AgentRefused("config", "an object: the run's config", "config: expected an object: the run's config")
    recorded = submit_preflight(session.ledger, session.settings, config, strict=False, resource=resource,
                                cwd=session.workdir, gpus=gpu_count, model_family=model_family)
    if recorded is None:
        return {"declared": False, "note": "the config declares no model and batch shape: add a [preflight] section "
                                           "(layers, hidden, heads, vocab, batch_size, max_length, precision, ...)"}
    return {"declared": True, "preflight": _finite(json.loads(recorded))}


# -- acting -----------------------------------------------------------------------------------------


def submit(session: AgentSession, script: str, args: list[str] | None = None, kind: str = "test", gpu_count: int = 0,
           time_limit_hours: float | None = None, name: str | None = None, project: str = "default",
           config: dict[str, Any] | None = None, set: list[str] | None = None, resource: str | None = None,
           expect: list[str] | None = None, watch: list[str] | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Start `script` (a Python file in the working directory) as a run credited to the agent, inside its limits;
    with `dry_run`, say what would be submitted (the resource and why, what its executor would be sent), checked as
    a submit checks it, recording and starting nothing."""
    from trackway.experiments.expectations import parse_all
    from trackway.supervisor.launch import command_by, start_attempt
    from trackway.supervisor.submit import RunSpec, api_words, submit_run

    script_path = _script(session.workdir, script)
    parse_all(expect or [])
    config_path = None
    try:
        if config is not None:
            from trackway.receipts.submitted_config import write_file
            import uuid

            config_path = session.settings.home / "agents" / "configs" / f"{uuid.uuid4().hex}.json"
            write_file(config_path, json.dumps(config).encode())
        spec = RunSpec(
            command=[sys.executable, script_path, *(args or [])], cwd=session.workdir, name=name, project=project,
            kind=kind, config_path=str(config_path) if config_path else None, overrides=list(set or []),
            gpus=gpu_count, time_limit_hours=time_limit_hours, resource=resource,
            expect=[text.strip() for text in expect or []], watch=list(watch or []),
            submitted_by=command_by(session.agent.credit),
        )
        waits_for = needs_approval(session.agent, kind, gpu_count, time_limit_hours)
        if waits_for is not None:
            spec.approval, spec.approval_note = AWAITING, waits_for
        if dry_run:
            from trackway.supervisor.dry_run import preview_submit

            with session.ledger.read() as conn:
                admit(conn, session.agent, gpu_count, time_limit_hours)
            try:
                shown = preview_submit(session.ledger, session.settings, spec).as_json()
            except InputError as exc:
                exc.args = (api_words(str(exc)), *exc.args[1:])
                raise
            return {**jsonable(shown), "awaiting_approval_if_submitted": waits_for}
        # The check and the record are one step per session: two calls racing could otherwise both fit in
        # what is left. (Two servers for one agent are two sessions: each is checked against the ledger.)
        with session.submitting:
            with session.ledger.read() as conn:
                admit(conn, session.agent, gpu_count, time_limit_hours)
            try:
                run_id = submit_run(session.ledger, session.settings, spec)
            except InputError as exc:
                exc.args = (api_words(str(exc)), *exc.args[1:])  # the CLI's flags named as the tool's arguments
                raise
    finally:
        if config_path is not None:
            config_path.unlink(missing_ok=True)  # the receipt holds the snapshot now (or nothing was recorded)
    if waits_for is not None:
        return {"run_id": run_id, "attempt_id": None, "state": RunState.QUEUED.value, "awaiting_approval": True,
                "note": f"recorded, nothing started: it waits for a person (`trackway approve {run_id}`), because "
                        f"{waits_for}", "budget": budget(session)}
    attempt_id = start_attempt(session.ledger, session.settings, run_id, session.supervisor().executor, first=True,
                               started_by=spec.submitted_by)
    _background(session)
    with session.ledger.read() as conn:
        from trackway.ledger.records import resolve_run

        state = resolve_run(conn, run_id)["state"]
    return {"run_id": run_id, "attempt_id": attempt_id, "state": state, "awaiting_approval": False,
            "budget": budget(session)}


def wait(session: AgentSession, run: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until `run` ends (or one attempt `RUN/N`) or `timeout_s` passes; the ending with its reason, evidence
    and decision, or where it is."""
    from trackway.ledger.records import latest_attempt, resolve_attempt, resolve_run

    run_ref, slash, number = run.rpartition("/")
    one_attempt = bool(slash) and number.isdigit()

    def look(conn):
        row = resolve_run(conn, run_ref if one_attempt else run)
        attempt = resolve_attempt(conn, run) if one_attempt else latest_attempt(conn, row["run_id"])
        ended = attempt["state"] == "ended" if one_attempt else RunState(row["state"]).is_terminal()
        return (row, attempt, ended), ended or row["approval"] == AWAITING

    row, attempt, ended = session.wait_until(timeout_s, look)
    answer: dict[str, Any] = {"run_id": row["run_id"], "state": row["state"], "ended": ended,
                              "waited_out": not ended and row["approval"] != AWAITING,
                              "awaiting_approval": row["approval"] == AWAITING, "approval": row["approval_note"]}
    if row["approval"] == AWAITING:
        answer["note"] = (f"waiting for a person's approval (`trackway approve {row['run_id']}`): "
                          f"{row['approval_note']}; nothing has started")
        return answer
    if attempt is not None:
        evidence = json.loads(attempt["termination_evidence"]) if attempt["termination_evidence"] else {}
        decision = json.loads(attempt["retry_decision"]) if attempt["retry_decision"] else None
        answer["attempt"] = jsonable({
            "attempt_id": attempt["attempt_id"], "state": attempt["state"],
            "termination_reason": attempt["termination_reason"], "exit_code": attempt["exit_code"],
            "rule": evidence.get("rule"), "evidence": evidence.get("lines", []), "decision": decision,
            "last_step": attempt["last_step"], "gpu_seconds": attempt["gpu_seconds"],
        })
    if not ended:
        answer["note"] = (f"still {attempt['state'] if one_attempt else row['state']} after {timeout_s:g} s; call wait "
                          f"again, or explain {run} for where it is")
    return answer


def cancel(session: AgentSession, run: str) -> dict[str, Any]:
    """End one of the agent's own runs (SIGTERM, SIGKILL after the grace period); another's is refused."""
    row = _own_run(session, run, "cancels", " (a person can: trackway cancel)")
    with session.ticking:
        cancelled = session.supervisor().cancel(row["run_id"])
    return {"run_id": row["run_id"], "cancel_requested_for": cancelled,
            "note": "the end is recorded as user_cancelled" if cancelled else "it had no running attempt; marked cancelled"}


def resume(session: AgentSession, run: str, set: list[str] | None = None) -> dict[str, Any]:
    """A new attempt of one of the agent's own runs that ended without completing, from its latest committed
    checkpoint, with the code it was submitted with; inside the agent's cap and budget like a new run."""
    from trackway.ledger.records import get_attempt
    from trackway.supervisor.launch import command_by, start_attempt

    session.tick()
    with session.submitting:
        row = _own_run(session, run, "resumes")
        if row["state"] in (RunState.RUNNING.value, RunState.QUEUED.value, RunState.COMPLETED.value):
            raise AgentRefused("run", "a run that ended without completing",
                               f"run {run!r}: is {row['state']}; only a run that ended without completing can be resumed")
        hours = row["time_limit_s"] / 3600 if row["time_limit_s"] else None
        with session.ledger.read() as conn:
            admit(conn, session.agent, row["gpus"] or 0, hours)
        attempt_id = start_attempt(session.ledger, session.settings, row["run_id"], session.supervisor().executor,
                                   overrides=list(set or []), started_by=command_by(f"{session.agent.credit}, resume"),
                                   code_from="receipt")
    _background(session)
    with session.ledger.read() as conn:
        resumed_from = get_attempt(conn, attempt_id)["resumed_from_checkpoint"] if attempt_id else None
    return {"run_id": row["run_id"], "attempt_id": attempt_id,
            "resumed_from": resumed_from or "the start (no committed checkpoint)"}


def report_waste(session: AgentSession, by: str = "reason", days: float = 7.0,
                 kind: str | None = None) -> dict[str, Any]:
    """Useful and wasted GPU-hours of ended attempts per termination reason, run, resource or phase."""
    from trackway.reports.waste import check, kinds_for, waste_rows

    check(by, days, kind)
    with session.ledger.read() as conn:
        rows = waste_rows(conn, by, days, kinds_for(by, kind))
    return {"by": by, "days": days, "rows": _finite(jsonable(rows))}


def evaluate(session: AgentSession, checkpoint: str, spec: str, seeds: int | None = None) -> dict[str, Any]:
    """Evaluate a committed checkpoint (`RUN@STEP`, or RUN for its newest) with an eval spec file in the working
    directory; the same checkpoint and versions again is a repeat, answered with the earlier evaluation.

    Evaluation seeds are runs of their own that no agent's budget counts yet: an agent with a GPU-hour budget may
    evaluate on CPUs only (a spec whose phases ask GPUs is refused, for a person to run with `trackway eval`).
    """
    from trackway.evals.launch import request_evaluation, seeds_for
    from trackway.evals.records import parse_checkpoint_ref
    from trackway.evals.spec import load_spec
    from trackway.supervisor.submit import check_eval_resource

    path = _script(session.workdir, spec)
    loaded = load_spec(path)
    gpus = max([loaded.gpus] + [p.gpus for p in (loaded.inference, loaded.scoring) if p is not None])
    if gpus and session.agent.gpu_hours_budget is not None:
        raise AgentRefused("spec", "an eval spec without GPUs (seeds are not counted against budgets yet)",
                           f"spec {spec!r}: expected an eval spec without GPUs: it asks {gpus} GPU(s) a seed, and "
                           f"evaluation seeds are not counted against agent {session.agent.name!r}'s GPU-hour budget "
                           "yet; a person runs it (`trackway eval`)")
    seeds_for(loaded, seeds)
    check_eval_resource(loaded, session.settings)
    from trackway.validation import checkpoint_ref

    run_ref, step = parse_checkpoint_ref(checkpoint_ref(checkpoint, "checkpoint"))
    session.tick()
    request = request_evaluation(session.ledger, session.settings, run_ref, step, loaded, seed_count=seeds)
    _background(session)
    return {"eval_id": request.eval_id, "repeat": bool(request.repeat), "queued_seeds": list(request.queued_seeds),
            "held_back_seeds": list(request.held_back_seeds or []),
            "note": "a repeat: nothing new to run" if request.repeat else "eval_show gives its state and metrics"}


def eval_show(session: AgentSession, evaluation: str) -> dict[str, Any]:
    """An evaluation: its checkpoint, pinned versions, each seed's state and metrics, aggregated metrics."""
    from trackway.evals.tables import evaluation_detail

    session.tick()
    with session.ledger.read() as conn:
        return _finite(jsonable(evaluation_detail(conn, evaluation)))


# -- helpers ----------------------------------------------------------------------------------------


def _finite(node: Any) -> Any:
    """NaN and infinities as JSON cannot hold them: as text."""
    if isinstance(node, float) and node != node:
        return "nan"
    if isinstance(node, float) and node in (float("inf"), float("-inf")):
        return "inf" if node > 0 else "-inf"
    if isinstance(node, dict):
        return {k: _finite(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_finite(v) for v in node]
    return node


def _own_run(session: AgentSession, run: str, verb: str, aside: str = ""):
    """The run `run` names, refused unless the agent submitted it: an agent `verb` only its own runs."""
    from trackway.ledger.records import resolve_run

    with session.ledger.read() as conn:
        row = resolve_run(conn, run)
        mine = is_agents_run(conn, session.agent, row["run_id"])
    if not mine:
        raise AgentRefused("run", f"a run agent {session.agent.name!r} started",
                           f"run {run!r}: expected a run agent {session.agent.name!r} started; an agent {verb} only "
                           f"its own runs{aside}")
    return row


def _script(workdir: Path, script: str) -> str:
    """`script` as a file inside the working directory (never an interpreter option or a path outside it)."""
    path = PurePosixPath(script)
    if not script or script.startswith("-") or "\x00" in script or path.is_absolute() or ".." in path.parts:
        raise AgentRefused("script", "a Python file's path relative to the server's working directory",
                           f"script {script!r}: expected a Python file's path relative to the server's working "
                           "directory, e.g. train.py")
    resolved = (workdir / script).resolve()
    if not resolved.is_relative_to(workdir.resolve()) or not resolved.is_file():
        raise AgentRefused("script", "a file inside the server's working directory",
                           f"script {script!r}: expected a file inside the server's working directory")
    return str(resolved)


def _deadline(timeout_s: float) -> float:
    """When a wait of `timeout_s` seconds ends (monotonic clock); a wait of nothing or of over MAX_WAIT_S is refused."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not (0 < timeout_s <= MAX_WAIT_S):
        raise AgentRefused("timeout_s", f"a number of seconds above 0 and at most {MAX_WAIT_S:g}",
                           f"timeout_s {timeout_s!r}: expected a number of seconds above 0 and at most {MAX_WAIT_S:g}")
    return time.monotonic() + timeout_s


def _whole(value: Any, field: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
        raise AgentRefused(field, f"a whole number from {low} to {high}",
                           f"{field} {value!r}: expected a whole number from {low} to {high}")


def _background(session: AgentSession) -> None:
    """A background supervisor drives the run's retries once this call returns (when the machine allows one)."""
    from trackway.errors import TrackwayError
    from trackway.supervisor.background import autostart_enabled, ensure_running

    if autostart_enabled():
        try:
            ensure_running(session.settings)
        except TrackwayError:
            pass  # `wait` ticks a supervisor itself: the run is driven while the agent waits for it
