"""Writing attempt ends: each end's receipt prepared (evidence, classification), then many written in one transaction.

A burst of ends (a node lost, a sweep failing at its first step, a thousand short runs) is what a
supervisor tick meets at its busiest. Each receipt is prepared on its own, from what the attempt
left and what its run holds; the receipts of a batch are then written together: one write
transaction: the runs' attempts read once, locked, then one UPDATE per kind of row, each attempt's
end and its retry decision together (records.end_rows, retry.decide_ends), instead of several
transactions and a dozen statements per end.

Every receipt stays whole and every one is recorded: a batch whose transaction fails for anything
but the ledger itself (a bug, bad data in one attempt) is written again one end per transaction,
so that one attempt's failure leaves the others' receipts recorded, and is raised after them. A
ledger failure (locked past its timeout, a full disk) writes nothing: the ends stay for the next tick.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select

from trackway.errors import LedgerError
from trackway.executors.base import JobPhase, JobStatus
from trackway.ledger import Ledger
from trackway.ledger.bulk import chunks, rows_where_in
from trackway.ledger.records import AttemptEndRecord, end_rows, write_end_rows
from trackway.ledger.schema import attempt_events, attempts, runs
from trackway.resources.placement import project_settings, resource_after_oom
from trackway.settings import Settings
from trackway.supervisor.classify import Classification, Evidence, classify
from trackway.supervisor.launch import pieces_asked
from trackway.supervisor.policy import Decision
from trackway.supervisor.retry import DECIDED_BY, attempts_of_runs, decide_ends
from trackway.supervisor.watchers import STOP_MARKER
from trackway.spool import read_json
from trackway.taxonomy import AttemptState, RunKind, TerminationReason

@dataclass(frozen=True)
class AttemptEnd:
    """One attempt end that a tick recorded."""

    attempt_id: str
    run_id: str
    reason: TerminationReason
    rule: str
    exit_code: int | None
    signal: int | None
    gpu_seconds: float
    decision: Decision


@dataclass(frozen=True)
class PreparedEnd:
    """An end classified and ready to write: everything read and computed outside the write lock."""

    attempt: Mapping[str, Any]  # as it will be recorded (its start corrected where the executor knows better)
    run: Mapping[str, Any]  # its run as read for it (see write_ends)
    status: JobStatus
    evidence: Evidence
    verdict: Classification
    ended_at: datetime
    secrets: tuple[str, ...]
    moves_to: str | None  # where an OOM retry would go
    output: Any = None  # an evaluation's scoring output
    committed: Any = None  # an evaluation's committed inference outputs


def runs_by_id(conn, run_ids: Iterable[str]) -> dict[str, dict]:
    """Runs by id, as `resolve_run` reads each (the same columns and times)."""
    return {row["run_id"]: row for row in rows_where_in(conn, runs, "run_id", sorted(set(run_ids)))}


def attempts_by_id(conn, attempt_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
    """Attempt rows by id, as `get_attempt` reads each."""
    return {row["attempt_id"]: row for row in rows_where_in(conn, attempts, "attempt_id", attempt_ids)}


def notices_without_finish(conn, attempt_ids: Sequence[str]) -> set[str]:
    """Those of the attempts whose SDK recorded a preemption notice that no `run.finish()` followed."""
    kinds: dict[str, set[str]] = {}
    for part in chunks(list(attempt_ids)):
        for attempt_id, kind in conn.execute(select(attempt_events.c.attempt_id, attempt_events.c.kind).where(
                attempt_events.c.attempt_id.in_(part), attempt_events.c.rank >= 0,
                attempt_events.c.kind.in_(("preemption_notice", "finished")))):
            kinds.setdefault(attempt_id, set()).add(kind)
    return {attempt_id for attempt_id, seen in kinds.items() if "preemption_notice" in seen and "finished" not in seen}


def prepare_end(ledger: Ledger, settings: Settings, attempt: Mapping[str, Any], status: JobStatus,
                note: dict | None, run: Mapping[str, Any], secrets: tuple[str, ...], notice: bool,
                log_tail: list[str]) -> PreparedEnd:
    """Classify an end from what the attempt left (its log's last lines, its SDK's note, a stop marker) and what its
    executor said.

    `notice`: the attempt's SDK recorded a preemption notice without a `finish()` after it. Outside
    the write lock: an evaluation's outputs are moved and hashed here, and an OOM's roomier resource found.
    """
    is_eval = run["kind"] == RunKind.EVAL.value
    output = committed = phase = None
    if is_eval:
        from trackway.evals.phases import run_phase

        phase = run_phase(run)
    if is_eval and status.exit_code == 0:
        from trackway.evals.outputs import OUTPUT_FILE, read_output
        from trackway.evals.phases import INFERENCE, commit_inference_outputs, judge_answers

        state_dir = Path(attempt["state_dir"])
        if phase == INFERENCE:
            committed = commit_inference_outputs(settings.runs_dir / run["run_id"], state_dir, run["run_id"],
                                                 attempt["attempt_id"], int(attempt["attempt_number"]))
        else:
            output = read_output(state_dir / OUTPUT_FILE)
            output.judge_answers = judge_answers(state_dir)
    evidence = Evidence(
        exit_code=status.exit_code,
        signal=status.signal,
        timed_out=status.timed_out,
        cancelled=status.cancelled,
        vanished=status.phase is JobPhase.VANISHED,
        executor_reason=status.reason,
        executor_lines=status.evidence,
        log_tail=log_tail,
        made_progress=attempt["last_step"] is not None,
        last_step=_reached_step(attempt),
        sdk_note=note,
        stopped_by=_stop_marker(attempt["state_dir"]),
        evaluation=is_eval,
        phase=phase,
        output_problem=(output.problem if output is not None else committed.problem if committed is not None
                        else None),
        unfinished_notice=status.exit_code == 0 and notice,
    )
    verdict = classify(evidence)
    ended_at = status.ended_at or datetime.now(timezone.utc)
    if attempt["started_at"] is None and status.started_at is not None:
        attempt = {**attempt, "started_at": status.started_at}
    if status.never_started:
        # The time it waited in a queue is no compute: none was held, none is charged. (An attempt still
        # `queued` here may have run between two polls: its executor's own start time says so, not its state.)
        attempt = {**attempt, "started_at": ended_at}
    moves_to = None
    if verdict.reason is TerminationReason.OOM:
        # Finding a roomier resource may ask a cluster, which may be slow to answer.
        ran = {**run, "in_pieces": True} if pieces_asked(project_settings(settings, run), run) else run
        moves_to = resource_after_oom(settings, ran, attempt)
    return PreparedEnd(attempt=attempt, run=run, status=status, evidence=evidence, verdict=verdict, ended_at=ended_at,
                       secrets=secrets, moves_to=moves_to, output=output, committed=committed)


def write_ends(ledger: Ledger, settings: Settings, prepared: Sequence[PreparedEnd]) -> list[AttemptEnd]:
    """Write the receipts, one per run at most, in one transaction: the ends not recorded yet by another process.

    Each run as it was read to prepare its end, not again under the write lock: what is read of it
    here (its id and name, kind, project, resource, GPUs, time limit and retry policy) is set at
    submit and never changed, while what does change (the run's state, its attempts) is read and
    written here, under the lock.
    """
    runs = {p.attempt["run_id"]: p.run for p in prepared}
    records = []
    prices: dict[tuple[Any, Any], float] = {}  # a burst's runs share a few projects and resources
    for p in prepared:
        run = runs[p.attempt["run_id"]]
        resource = p.attempt["resource"] or run["resource"]
        if (run["workdir"], resource) not in prices:
            # Priced where it ran, as the run's own project declares that resource.
            prices[run["workdir"], resource] = project_settings(settings, run).resource(resource).cost_per_gpu_hour
        records.append(AttemptEndRecord(
            p.attempt, ended_at=p.ended_at, reason=p.verdict.reason,
            evidence=p.verdict.evidence_record(p.evidence, p.secrets),
            exit_code=p.status.exit_code, signal=p.status.signal,
            cost_per_gpu_hour=prices[run["workdir"], resource],
            secrets=p.secrets))
    with ledger.write() as conn:
        # The runs' attempts first, locked: which of these are still open, and what the retry decisions read.
        rows_of = attempts_of_runs(conn, list(runs), columns=(*DECIDED_BY, "attempt_id", "state"), lock=True)
        rows = end_rows(conn, records, still_open={row["attempt_id"] for rows in rows_of.values() for row in rows
                                                   if row["state"] != AttemptState.ENDED.value})
        written = rows.written
        recorded = [p for p in prepared if p.attempt["attempt_id"] in written]
        # Decided from the attempts as they are with these ends, then written with them: one UPDATE per attempt.
        ending = {row["attempt_id"]: row for row in rows.attempts}
        for run_rows in rows_of.values():
            run_rows[:] = [{**row, **ending[row["attempt_id"]]} if row["attempt_id"] in ending else row
                           for row in run_rows]
        decided = decide_ends(settings, [(runs[p.attempt["run_id"]], p.attempt["attempt_id"], p.moves_to)
                                         for p in recorded], rows_of)
        decisions = decided.decisions
        for row in rows.attempts:
            row.update(decided.attempt_values[row["attempt_id"]])
        rows.runs = [decided.queued_runs.get(row["run_id"], row) for row in rows.runs]
        write_end_rows(conn, rows)
        for p in recorded:
            run = runs[p.attempt["run_id"]]
            if run["kind"] == RunKind.EVAL.value:
                from trackway.evals.progress import after_eval_attempt

                after_eval_attempt(conn, settings, run["run_id"], p.verdict.reason,
                                   decisions[p.attempt["attempt_id"]].action == "resume", p.output, p.committed)
    return [AttemptEnd(attempt_id=p.attempt["attempt_id"], run_id=p.attempt["run_id"], reason=p.verdict.reason,
                       rule=p.verdict.rule, exit_code=p.status.exit_code, signal=p.status.signal,
                       gpu_seconds=written[p.attempt["attempt_id"]], decision=decisions[p.attempt["attempt_id"]])
            for p in recorded]


def record_ends(ledger: Ledger, settings: Settings, prepared: Sequence[PreparedEnd]) -> list[AttemptEnd]:
    """Write the receipts together; where that fails for anything but the ledger, each on its own (see the module)."""
    try:
        return write_ends(ledger, settings, prepared)
    except LedgerError:
        raise
    except Exception:
        if len(prepared) == 1:
            raise
    ends: list[AttemptEnd] = []
    failure: Exception | None = None
    for p in prepared:
        try:
            ends += write_ends(ledger, settings, [p])
        except LedgerError:
            raise
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return ends


def _reached_step(attempt) -> int | None:
    """The run's step when the attempt ended: its last logged step, else the step it resumed from.

    A resumed attempt that fails before logging anything failed right after its checkpoint's step:
    that is the step an earlier attempt failed at too, when the failure repeats.
    """
    import re

    if attempt["last_step"] is not None:
        return attempt["last_step"]
    match = re.fullmatch(r"step-(\d+)", attempt["resumed_from_checkpoint"] or "")
    return int(match[1]) if match else None


def _stop_marker(state_dir: str) -> tuple[str, str] | None:
    path = os.path.join(state_dir, STOP_MARKER)
    # Asked first: most attempts were never stopped, and a failed open costs an exception.
    marker = read_json(path) if os.access(path, os.F_OK) else None
    return (str(marker.get("kind", "stalled")), str(marker.get("why", ""))) if marker else None
