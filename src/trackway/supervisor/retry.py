"""Applying the retry policy to a run whose attempt just ended: the decision, written down, and the queue.

A decision to resume leaves the run `queued` with `not_before` (the backoff); the control loop
launches it when due (see `start_attempt(from_queue=True)` for why it is launched only once).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, RowMapping, select

from trackway.errors import InputError
from trackway.ledger.bulk import rows_where_in, update_many
from trackway.ledger.schema import attempts, runs
from trackway.resources.placement import project_settings
from trackway.settings import Settings
from trackway.supervisor.classify import DiskFull
from trackway.supervisor.policy import (
    PROJECT_SOURCE,
    AttemptOutcome,
    Decision,
    Pieces,
    RetryPolicy,
    decide,
    memory_fingerprint,
    parse_policy_text,
    policy_from_layers,
    read_policy_text,
)
from trackway.taxonomy import AttemptState, RunState, TerminationReason


def run_policy(settings: Settings, run: RowMapping) -> RetryPolicy:
    """The [retry] of the run's own project's trackway.toml, then the run's own --retry-policy (stored at submit).

    Its project's, as its end is priced and its retry placed (`project_settings`): a supervisor started
    in another project (a background one) must not decide by its own.
    """
    layers: list[tuple[dict, str]] = [(project_settings(settings, run).retry, PROJECT_SOURCE)]
    if run["retry_policy"]:
        layers.append((tomllib.loads(run["retry_policy"]), f"run {run['run_id']}: its --retry-policy"))
    return policy_from_layers(layers)


def effective_config_path(settings: Settings, run_id: str) -> Path | None:
    """The config the run's next attempt gets: the newest attempt's (after `resume --set`), else the run's."""
    # os.scandir and os.path, not Path.glob and Paths: every end of a burst asks this, and the glob cost more
    # than the decision, the Paths a third of it.
    run_dir = os.path.join(settings.runs_dir, run_id)
    attempts_dir = os.path.join(run_dir, "attempts")
    try:
        numbers = sorted((int(entry.name) for entry in os.scandir(attempts_dir) if entry.name.isdigit()),
                         reverse=True)
    except (FileNotFoundError, NotADirectoryError):  # no attempt yet, or its directory could not be made
        numbers = []
    for number in numbers:
        path = os.path.join(attempts_dir, str(number), "config.json")
        if os.path.exists(path):
            return Path(path)
    path = os.path.join(run_dir, "config.json")
    return Path(path) if os.path.isfile(path) else None


def run_config(settings: Settings, run_id: str) -> dict | None:
    path = effective_config_path(settings, run_id)
    return json.loads(path.read_text()) if path is not None else None


def next_fingerprint(settings: Settings, run: RowMapping, previous: RowMapping | None = None,
                     moves_to: str | None = None) -> str:
    """The memory footprint of the run's next attempt: its config, and where it would run.

    A retry runs where `previous` ran, unless `moves_to` names the resource an OOM moves it to
    (resources/placement.py's `resource_after_oom`, asked before the ledger's write lock is taken).
    """
    resource = moves_to or (previous["resource"] if previous is not None else None) or run["resource"]
    return memory_fingerprint(run_config(settings, run["run_id"]), resource, run["gpus"])


def decide_after_end(
    conn: Connection, settings: Settings, run: RowMapping, attempt_id: str, moves_to: str | None = None
) -> Decision:
    """Decide what follows `attempt_id`'s end, store the decision on it, and queue a retry if resuming.

    `moves_to`: the resource an OOM retry would move to, if any (see `next_fingerprint`).
    """
    return decide_after_ends(conn, settings, [(run, attempt_id, moves_to)])[attempt_id]


# What deciding reads of a run's attempts (here, `outcome_of`, `pieces_of`, `next_fingerprint`): a burst
# reads the attempts of thousands of runs, and these are a quarter of an attempt's columns.
DECIDED_BY = ("run_id", "attempt_number", "termination_reason", "termination_evidence", "checkpoints_committed",
              "memory_fingerprint", "gpu_seconds", "resource", "started_at", "ended_at", "selection")


def decide_after_ends(
    conn: Connection, settings: Settings, ended: Sequence[tuple[RowMapping, str, str | None]]
) -> dict[str, Decision]:
    """`decide_after_end` for many ends at once, (run, attempt id, moves_to) each, one end per run: by attempt id.

    The runs' attempts are read in one query and the decisions written in one statement each.
    """
    decided = decide_ends(settings, ended, attempts_of_runs(conn, [run["run_id"] for run, _, _ in ended]))
    update_many(conn, attempts, "attempt_id", [{"attempt_id": attempt_id, **values}
                                               for attempt_id, values in decided.attempt_values.items()])
    update_many(conn, runs, "run_id", list(decided.queued_runs.values()))
    return decided.decisions


def attempts_of_runs(conn: Connection, run_ids: Sequence[str], columns: Sequence[str] = DECIDED_BY,
                     lock: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Each run's attempts in order, with the columns deciding reads (and any more asked); `lock`: for update."""
    rows_of: dict[str, list] = {run_id: [] for run_id in run_ids}
    for row in rows_where_in(conn, attempts, "run_id", run_ids, order_by=("run_id", "attempt_number"),
                             columns=columns, for_update=lock):
        rows_of[row["run_id"]].append(row)
    return rows_of


@dataclass
class Decided:
    """Decisions after ends, and what they write: each attempt's decision, each run queued for its retry."""

    decisions: dict[str, Decision]
    attempt_values: dict[str, dict[str, Any]]  # attempt id → its retry_decision column
    queued_runs: dict[str, dict[str, Any]]  # run id → the run's row as queued (state, end cleared, not_before)


def decide_ends(settings: Settings, ended: Sequence[tuple[RowMapping, str, str | None]],
                rows_of: Mapping[str, list[Mapping[str, Any]]]) -> Decided:
    """The decisions after `ended`'s ends from each run's attempts as they are with those ends (`attempts_of_runs`).

    Reads and writes nothing: the caller holds the rows, and writes what is decided.
    """
    policies: dict[tuple[str | None, str | None], RetryPolicy] = {}
    read: dict[str, dict] = {}
    decided = Decided({}, {}, {})
    now = datetime.now(timezone.utc)
    for run, attempt_id, moves_to in ended:
        rows = rows_of.get(run["run_id"], [])
        history = [outcome_of(row, read) for row in rows if row["termination_reason"]]
        spent = sum(row["gpu_seconds"] or 0.0 for row in rows)
        run_ref = run["name"] or run["run_id"]
        # Runs submitted alike share a policy: their project's [retry] parsed once, not once per end.
        key = (run["workdir"], run["retry_policy"])
        policy = policies.get(key)
        if policy is None:
            try:
                policy = policies[key] = run_policy(settings, run)
            except InputError as exc:
                # A policy stored before validation tightened, or a trackway.toml edited since: stopping costs
                # no GPU time; guessing what was meant might.
                policy = None
                decision = Decision("stop", "retry policy invalid", f"{exc}; fix it, then `trackway resume {run_ref}`")
        if policy is not None:
            # Read only where the rule compares it (an OOM's, by default): it costs reading the run's config.
            compared = bool(history) and policy.rule(history[-1].reason).requires == "changed_memory_fingerprint"
            decision = decide(
                policy,
                history,
                next_memory_fingerprint=(next_fingerprint(settings, run, rows[-1] if rows else None, moves_to)
                                         if compared else None),
                run_gpu_seconds=float(spent),
                run_ref=run_ref,
                pieces=pieces_of(run, rows) if policy.in_pieces else None,
            )
        decided.decisions[attempt_id] = decision
        decided.attempt_values[attempt_id] = {"retry_decision": json.dumps(decision.as_record())}
        if decision.action == "resume":
            # The run has not ended: its attempt's reason is on the attempt.
            decided.queued_runs[run["run_id"]] = {
                "run_id": run["run_id"], "state": RunState.QUEUED.value, "ended_at": None,
                "termination_reason": None, "not_before": now + timedelta(seconds=decision.delay_s)}
    return decided


def pieces_of(run: RowMapping, rows: list) -> Pieces | None:
    """Where a run in pieces stands: its total time, the time its attempts ran, the piece its latest attempt planned."""
    from trackway.resources.selection_record import Selection

    if not run["time_limit_s"]:
        return None
    used = sum(attempt_seconds(row) for row in rows)
    planned = Selection.from_json(rows[-1]["selection"]) if rows else None
    piece = planned.piece_hours * 3600 if planned is not None and planned.piece_hours else None
    return Pieces(total_s=float(run["time_limit_s"]), used_s=used, piece_s=piece)


def attempt_seconds(row) -> float:
    """How long an attempt's command ran (its start to its end); 0 for one that never started."""
    start, end = row["started_at"], row["ended_at"]
    if start is None or end is None:
        return 0.0
    if (start.tzinfo is None) != (end.tzinfo is None):
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    return max(0.0, (end - start).total_seconds())


def due_retries(conn: Connection, now: datetime) -> list[str]:
    """Queued runs whose attempts all ended (retries; first attempts are started by their submitter), due now."""
    has_attempt = select(attempts.c.run_id).where(attempts.c.run_id == runs.c.run_id).exists()
    unfinished = (
        select(attempts.c.run_id)
        .where(attempts.c.run_id == runs.c.run_id, attempts.c.state != AttemptState.ENDED.value)
        .exists()
    )
    query = (
        select(runs.c.run_id)
        .where(runs.c.state == RunState.QUEUED.value, has_attempt, ~unfinished)
        .where((runs.c.not_before.is_(None)) | (runs.c.not_before <= now))
        .order_by(runs.c.not_before)
    )
    return list(conn.execute(query).scalars())


def _evidence(evidence_json: str | None) -> dict | None:
    if not evidence_json:
        return None
    try:
        evidence = json.loads(evidence_json)
    except ValueError:
        return None
    return evidence if isinstance(evidence, dict) else None


def outcome_of(row: RowMapping, read: dict[str, dict] | None = None) -> AttemptOutcome:
    """What the policy needs of one ended attempt, from its row.

    `read`: what was read of evidence texts already, by text, kept by a caller deciding many ends
    at once (a burst's completed attempts share one evidence text).
    """
    text = row["termination_evidence"]
    said = read.get(text) if read is not None and text else None
    if said is None:
        said = _said_in(_evidence(text) or {})
        if read is not None and text:
            read[text] = said
    return AttemptOutcome(reason=TerminationReason(row["termination_reason"]),
                          committed_checkpoint=bool(row["checkpoints_committed"]),
                          memory_fingerprint=row["memory_fingerprint"], **said)


def _said_in(evidence: dict) -> dict:
    """The outcome's fields that its termination evidence gives."""
    signature = evidence.get("signature") if isinstance(evidence.get("signature"), dict) else {}
    return dict(disk_full=_disk_full_in(evidence), rule=_rule_in(evidence),
                signature=signature.get("key") if isinstance(signature.get("key"), str) else None,
                failure=_failure_text(signature),
                step=signature.get("step") if isinstance(signature.get("step"), int) else None)


def _failure_text(signature: dict) -> str | None:
    """`RuntimeError: shape mismatch 128 vs 64 (train.py:54 in step)`: the last such failure, as it was said."""
    message = signature.get("message") or signature.get("shape")
    if not isinstance(message, str):
        return None
    said = f"{signature['exception']}: {message}" if signature.get("exception") else message
    return said + (f" ({signature['where']})" if signature.get("where") else "")


def rule_of(evidence_json: str | None) -> str | None:
    """The classification rule stored in an attempt's termination evidence."""
    return _rule_in(_evidence(evidence_json) or {})


def _rule_in(evidence: dict) -> str | None:
    rule = evidence.get("rule")
    return rule if isinstance(rule, str) else None


def disk_full_of(evidence_json: str | None) -> DiskFull | None:
    """Whether an attempt's stored termination evidence says it met a full disk, and where."""
    evidence = _evidence(evidence_json)
    return _disk_full_in(evidence) if evidence is not None else None


def _disk_full_in(evidence: dict) -> DiskFull | None:
    found = evidence.get("disk_full")
    if isinstance(found, dict):
        free = found.get("free_bytes")
        path = found.get("path")
        return DiskFull(path if isinstance(path, str) else None, free if isinstance(free, int) else None)
    lines = evidence.get("lines") or []
    # Evidence written without the structured field still starts its first line with the words.
    return DiskFull() if any(isinstance(line, str) and line.startswith("disk full:") for line in lines) else None


def read_policy_file(path: str | None) -> str | None:
    """The text of a --retry-policy file, validated now so that bad input is refused before anything is recorded."""
    if not path:
        return None
    text = read_policy_text(path)
    policy_from_layers([(parse_policy_text(text, path), f"--retry-policy {path}")])
    return text
