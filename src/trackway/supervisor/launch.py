"""Starting a run's attempts: place each, claim it under the run's row lock, hand it to an executor, record it.

Every attempt, the first and every retry, goes through start_attempt's steps: plan_attempt
(placement, code and data captured, no write), claim_attempt (recorded `starting`, or nothing
when another launcher took the run), submit_attempt (its files written, the executor given the
request; a failure ends the attempt with its reason) and record_started. Runs are submitted
by supervisor/submit.py.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update

from trackway.errors import ExecutorError, InputError, TrackwayError
from trackway.executors.base import Executor, LaunchRequest, Submission
from trackway.executors.registry import get_executor
from trackway.ledger import Ledger
from trackway.ledger.blobs import get_blob, put_blob
from trackway.ledger.schema import attempts, runs
from trackway.ledger.records import (
    attempt_count,
    get_attempt,
    insert_attempt,
    latest_attempt,
    resolve_run,
    record_attempt_end,
    update_run,
)
from trackway.receipts import submitted_argv, submitted_config, submitted_env
from trackway.receipts.config import load_config
from trackway.receipts.environment import capture_environment
from trackway.redaction import known_values
from trackway.resources.selection import NoResourceFits
from trackway.settings import Settings
from trackway.resources.placement import place, project_settings
from trackway.taxonomy import AttemptState, RunKind, RunState, TerminationReason

if TYPE_CHECKING:
    from trackway.evals.launch import VersionChange
    from trackway.receipts.config import ConfigSnapshot
    from trackway.receipts.environment import EnvironmentDigest
    from trackway.settings.resources import Resource
    from trackway.resources.selection_record import Selection
    from trackway.supervisor.launch_inputs import CodeGiven, DataGiven
    from trackway.supervisor.outside_checkpoints import Restored


def remote_resume_target(url: str) -> str | None:
    """The newest checkpoint committed under `url` whose marker, manifest and object sizes verify.

    A store that cannot be listed raises (a TrackwayError): starting from scratch because S3
    did not answer would silently throw the run's progress away.
    """
    from trackway.checkpoints.object_store import RemoteCheckpointStore

    latest = RemoteCheckpointStore(url).latest_committed(verify=True)
    return latest.name if latest else None


def _code_snapshot(run, code):
    """The attempt's code (its commit and diff), for an executor on another machine."""
    from trackway.executors.code_snapshot import build_snapshot

    return build_snapshot(Path(run["workdir"]), code.commit, code.dirty_diff)


def resume_target(checkpoint_dir: Path, verify_files: bool = False) -> str | None:
    """The checkpoint a new attempt resumes from: the newest whose commit marker verifies.

    Storage is the truth; the SDK's `restore_latest` also verifies every file before loading,
    and falls back to an older checkpoint if this one turns out corrupt. Checkpoints trackway
    restores itself (a run's `--checkpoint-path`) are verified here, with `verify_files`.
    """
    if not checkpoint_dir.is_dir():
        return None
    from trackway.checkpoints.store import CheckpointStore

    latest = CheckpointStore(checkpoint_dir).latest_committed(verify_files=verify_files)
    return latest.name if latest else None


def attempt_environment(
    settings: Settings,
    run_id: str,
    attempt_id: str,
    number: int,
    state_dir: Path,
    resume_from: str | None = None,
    config_path: Path | None = None,
    restored_path: str | None = None,
) -> dict[str, str]:
    """The TRACKWAY_* variables an attempt's process sees (TRACKWAY_RESUME_PATH: a declared checkpoint path restored)."""
    run_dir = settings.runs_dir / run_id
    env = {
        "TRACKWAY_RUN_ID": run_id,
        "TRACKWAY_ATTEMPT_ID": attempt_id,
        "TRACKWAY_ATTEMPT_NUMBER": str(number),
        "TRACKWAY_HOME": str(settings.home),
        "TRACKWAY_DB": settings.db_url,
        "TRACKWAY_SPOOL_DIR": str(state_dir / "spool"),
        "TRACKWAY_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
    }
    if config_path is not None:
        env["TRACKWAY_CONFIG"] = str(config_path)
    if resume_from:
        env["TRACKWAY_RESUME_FROM"] = resume_from
    if restored_path:
        env["TRACKWAY_RESUME_PATH"] = restored_path
    return env


def run_environment(run, state_dir: Path) -> dict[str, str]:
    """What a run adds to every attempt's environment: its own `env`, and for an evaluation (or a phase of one),
    where to write."""
    env = json.loads(run["env"]) if run["env"] else {}
    if run["kind"] == RunKind.EVAL.value:
        from trackway.evals.phases import phase_environment, run_phase

        env.update(phase_environment(run_phase(run), state_dir))
    return env


def start_attempt(
    ledger: Ledger,
    settings: Settings,
    run_id: str,
    executor: Executor | Callable[[str], Executor],
    overrides: Sequence[str] = (),
    from_queue: bool = False,
    first: bool = False,
    started_by: str | None = None,
    code_from: str | None = None,
) -> str | None:
    """Record a new attempt of `run_id` and hand it to its executor; return the attempt id.

    The attempt goes where resources/placement.py places it (its resource, QoS tier and the
    reasons are recorded on it). `executor` is the executor to use, or a function from an
    executor's name to one (Supervisor.executor); an executor whose name is not the chosen
    resource's is replaced by the right one.

    `overrides` (`KEY=VALUE`, as `--set`) change the config from this attempt on: the new config
    is snapshotted for the attempt, and its memory footprint is what an OOM retry compares.
    With `from_queue`, the run is taken off the retry queue in the same transaction that records
    the attempt, and only if it is still queued with every attempt ended (else None): two
    supervisors, or a supervisor and a submit in flight, never launch the same retry twice.
    With `first`, only a run without any attempt gets one (else None): the submitter's own launch
    and a supervisor that adopted the run after the submitter died never both start attempt 1.

    Every attempt gets the environment the run was submitted with (receipts/submitted_env.py),
    whichever process launches it. `started_by` says who launched it (a command and its user, or
    the supervisor); a retry taken off the queue is credited to the rule that queued it.

    Its code and data are captured now (supervisor/launch_inputs.py): `code_from` is `submit`,
    `receipt` or `work_tree` (default: `receipt` for a retry off the queue, `submit` for a first
    attempt, else `work_tree`). A policy retry whose data changed since the previous attempt goes
    ahead, saying so, or is not launched at all with `[retry] on_data_change = "stop"` (None).

    The steps, each of its own: plan_attempt (read and decide, no write), claim_attempt (record
    it `starting` under the run's row lock), submit_attempt (write its files, hand it over; a
    failure ends it with a reason), record_started (what the executor said).
    """
    plan = plan_attempt(ledger, settings, run_id, executor, overrides, code_from=code_from, from_queue=from_queue,
                        first=first)
    claim = claim_attempt(ledger, settings, plan, from_queue=from_queue, first=first, started_by=started_by)
    if claim is None:
        return None
    launched = submit_attempt(ledger, settings, plan, claim)
    record_started(ledger, claim, launched)
    return claim.attempt_id


@dataclass(frozen=True)
class AttemptPlan:
    """What the next attempt of a run is to be, decided before it is claimed: where it goes, what it runs.

    Everything here is read or computed outside the write lock (placement may ask a cluster, the
    code capture may rebuild a workspace, an evaluator's files are hashed); claim_attempt records it.
    """

    run_id: str  # as the launcher named the run
    run: Mapping[str, Any]  # as read before the claim, with the preflight of this attempt's config when --set changed it
    previous: Mapping[str, Any] | None  # the run's latest attempt
    executor: Executor  # the chosen resource's
    placement: Selection
    resource: Resource
    environment: EnvironmentDigest  # this launcher's software environment, captured now
    config: ConfigSnapshot | None  # the config with this attempt's --set applied; None: no --set
    config_path: Path | None  # the config file the attempt reads when there is no --set
    lost_config: bool  # the ledger masks the run's config and its kept file is gone: the attempt ends config_error
    preflight: str | None  # the memory preflight run again for a config --set changed
    declared: list[str]  # the run's --checkpoint-path globs
    checkpoint_root: Path  # the run's local checkpoint directory
    resume_from: str | None  # the committed checkpoint the attempt resumes from
    moved: VersionChange | None  # an evaluation seed whose evaluator changed since it was requested
    evaluation: bool
    code: CodeGiven
    data: DataGiven | None  # None: the first attempt, which runs the run's own data manifest
    time_limit_s: float | None = None  # the attempt's own limit: the run's, or its piece's (--in-pieces)


def plan_attempt(
    ledger: Ledger,
    settings: Settings,
    run_id: str,
    executor: Executor | Callable[[str], Executor],
    overrides: Sequence[str] = (),
    code_from: str | None = None,
    from_queue: bool = False,
    first: bool = False,
) -> AttemptPlan:
    """Plan the next attempt of `run_id` (see start_attempt for the arguments), writing nothing but a held retry.

    A retry off the queue that no resource can take now is held (`retry_not_placed` on the attempt
    it follows, tried again later) and NoResourceFits raised, as for any launch that cannot be placed.
    """
    from trackway.supervisor.launch_inputs import CODE_FROM, code_for_attempt, data_for_attempt
    from trackway.supervisor.outside_checkpoints import paths_of
    from trackway.supervisor.retry import effective_config_path

    code_from = code_from or ("receipt" if from_queue else "submit" if first else "work_tree")
    if code_from not in CODE_FROM:
        raise ValueError(f"code_from {code_from!r}: expected one of {', '.join(CODE_FROM)}")
    environment = capture_environment()
    with ledger.read() as conn:
        found = resolve_run(conn, run_id)
        declared = paths_of(found)
        previous = latest_attempt(conn, found["run_id"])
        submitted_blob = get_blob(conn, found["config_sha256"]) if found["config_sha256"] else None
    project = project_settings(settings, found)
    config_path = effective_config_path(settings, run_id)
    # The ledger hides values of the run's config and its file is gone: the attempt ends config_error at launch.
    lost_config = config_path is None and submitted_config.is_masked(submitted_blob)
    config = load_config(config_path, overrides) if overrides and not lost_config else None
    preflight = _preflight_of(ledger, project, found, config) if config is not None else None
    if preflight is not None:
        found = {**found, "preflight": preflight}  # placement judges the config this attempt runs, not the submitted
    in_pieces = pieces_asked(project, found)
    if in_pieces:
        found = {**found, "in_pieces": True}  # placement plans pieces of the longest tier (resources/selection.py)
    placement = _place_or_hold(ledger, project, found, previous, from_queue)
    time_limit_s = found["time_limit_s"]
    if placement.piece_hours is not None and time_limit_s:
        placement, time_limit_s = _piece(ledger, found, placement)
    resource = project.resource(placement.resource)
    executor = _executor_for(executor, resource.executor, settings)
    checkpoint_root = settings.runs_dir / run_id / "checkpoints"
    resume_from = _resume_point(found["checkpoint_root"], checkpoint_root, declared)
    evaluation = found["kind"] == RunKind.EVAL.value
    moved = _seed_moved(ledger, run_id) if evaluation else None
    with ledger.read() as conn:
        # An evaluation's code is its evaluator's, versioned by the evaluation itself (evals/launch.py).
        code = code_for_attempt(conn, settings, found, "submit" if evaluation else code_from, executor.remote)
        data = (data_for_attempt(conn, settings, found, previous["data_manifest_sha256"] if previous else None)
                if code_from != "submit" else None)
    return AttemptPlan(
        run_id=run_id, run=found, previous=previous, executor=executor, placement=placement, resource=resource,
        environment=environment, config=config, config_path=config_path, lost_config=lost_config,
        preflight=preflight, declared=declared, checkpoint_root=checkpoint_root, resume_from=resume_from,
        moved=moved, evaluation=evaluation, code=code, data=data, time_limit_s=time_limit_s,
    )


def pieces_asked(settings: Settings, run) -> bool:
    """Whether the run goes in pieces (`in_pieces` in its retry policy: `submit --in-pieces`); a policy that no
    longer reads is no plan (its end says so)."""
    from trackway.supervisor.retry import run_policy

    if not run["time_limit_s"]:
        return False
    try:
        return run_policy(settings, run).in_pieces
    except InputError:
        return False


def _piece(ledger: Ledger, run, placement: Selection) -> tuple[Selection, float]:
    """The next piece of a run in pieces: its time limit (the piece, or what is left of the run's time) and the
    placement saying which piece it is, so that the attempt's receipt says it was planned."""
    import math
    from dataclasses import replace

    from trackway.supervisor.policy import PIECE_MIN_S
    from trackway.supervisor.retry import attempt_seconds

    with ledger.read() as conn:
        rows = list(conn.execute(select(attempts).where(attempts.c.run_id == run["run_id"])).mappings())
    total, piece = float(run["time_limit_s"]), placement.piece_hours * 3600
    left = total - sum(attempt_seconds(row) for row in rows)
    number = 1 + sum(1 for row in rows if row["termination_reason"] == TerminationReason.TIMEOUT.value)
    planned = f"piece {number} of {math.ceil(total / piece - 1e-9)} (--in-pieces)"
    if left < PIECE_MIN_S:
        # Only a person starts an attempt past the total (the policy stops there): theirs is one more whole piece.
        said = f"{planned}: the run's {total / 3600:g} h are spent, so this resume runs one more piece of {piece / 3600:.3g} h"
        return replace(placement, reason=f"{said}; {placement.reason}"), piece
    limit = max(min(piece, left), PIECE_MIN_S)
    said = f"{planned}: at most {limit / 3600:.3g} h of the run's {total / 3600:g} h, {left / 3600:.2f} h left"
    return replace(placement, reason=f"{said}; {placement.reason}"), limit


def _place_or_hold(ledger: Ledger, settings: Settings, run, previous, from_queue: bool) -> Selection:
    """Where the attempt goes; a retry off the queue that fits nowhere now is held before NoResourceFits is raised."""
    try:
        return place(settings, run, previous)
    except NoResourceFits as exc:
        if from_queue and previous is not None:
            _hold_unplaced(ledger, run, previous, exc)
        raise


def _executor_for(executor: Executor | Callable[[str], Executor], name: str, settings: Settings) -> Executor:
    """The executor named `name`: the one given when it is that one, else made (by the function given, or anew)."""
    if not isinstance(executor, Executor):
        return executor(name)
    if executor.name != name:
        return get_executor(name, settings.home)
    return executor


def _resume_point(checkpoint_url: str | None, checkpoint_root: Path, declared: Sequence[str]) -> str | None:
    """The checkpoint the attempt resumes from: in the run's remote store when it has one, else its local directory."""
    if checkpoint_url:
        return remote_resume_target(checkpoint_url)
    return resume_target(checkpoint_root, verify_files=bool(declared))


def _seed_moved(ledger: Ledger, run_id: str) -> VersionChange | None:
    """How an evaluation seed's evaluator changed since its evaluation was requested (None: it did not)."""
    from trackway.evals.launch import seed_version_change

    with ledger.read() as conn:
        return seed_version_change(conn, run_id)  # hashes the evaluator's files: before the write lock


@dataclass(frozen=True)
class ClaimedAttempt:
    """An attempt recorded `starting` under its run's row lock, and what its launch takes from that transaction."""

    attempt_id: str
    number: int
    run: Mapping[str, Any]  # the run as read under its row lock
    state_dir: Path
    config_path: Path | None  # the config file the attempt reads: its own (state_dir/config.json) when --set changed it
    environ_description: dict | None  # the run's submitted environment; None: recorded before environments were


def claim_attempt(
    ledger: Ledger,
    settings: Settings,
    plan: AttemptPlan,
    *,
    from_queue: bool = False,
    first: bool = False,
    started_by: str | None = None,
) -> ClaimedAttempt | None:
    """Record the planned attempt `starting` and its run running, in one transaction under the run's row lock.

    None, with nothing recorded, when the claim is lost or refused: another launcher took the
    run (`from_queue`: it is no longer queued, or an attempt is unfinished; `first`: an attempt
    exists). None too when a policy retry's data changed under `on_data_change = "stop"` (the
    stop is recorded on the previous attempt, the run fails), or an evaluation seed's evaluator
    moved (a queued seed continues as the new evaluation; a person is refused with InputError).
    """
    with ledger.write() as conn:
        run = _locked_run(conn, plan.run_id)
        number = _number_to_claim(conn, settings, plan, run, from_queue, first)
        if number is None:
            return None
        if from_queue and started_by is None:
            started_by = _queued_by(conn, run)
        return _insert_starting(conn, settings, plan, run, number, started_by)


def _number_to_claim(conn, settings: Settings, plan: AttemptPlan, run, from_queue: bool, first: bool) -> int | None:
    """The new attempt's number, or None where this launcher must not start it (see claim_attempt)."""
    if from_queue and (run["state"] != RunState.QUEUED.value or _has_unfinished_attempt(conn, plan.run_id)):
        return None
    number = attempt_count(conn, plan.run_id) + 1
    if first and number != 1:
        return None
    data, previous = plan.data, plan.previous
    if from_queue and previous is not None and data is not None and (data.changes or data.problem):
        if _data_change_stops(conn, settings, run, previous, data):
            return None
    if plan.moved is not None:
        return _evaluator_moved(conn, settings, run, plan.moved, from_queue)
    return number


def _insert_starting(conn, settings: Settings, plan: AttemptPlan, run, number: int,
                     started_by: str | None) -> ClaimedAttempt:
    """The attempt's row (state starting) with its receipt's blobs, the run set running, and the launch's events."""
    from trackway.supervisor.policy import memory_fingerprint

    run_id, config, code = plan.run_id, plan.config, plan.code
    state_dir = settings.runs_dir / run_id / "attempts" / str(number)
    env_sha = put_blob(conn, plan.environment.canonical, "environment")
    config_sha = put_blob(conn, submitted_config.recorded(config.values), "config") if config else None
    environ_description, environ_sha = _environ_of(conn, run)
    if config is not None:
        config_path = state_dir / "config.json"
        values = json.loads(config.canonical)
    else:
        config_path = plan.config_path
        values = json.loads(config_path.read_text()) if config_path is not None else None
    attempt_id = insert_attempt(
        conn,
        dict(
            run_id=run_id,
            attempt_number=number,
            state=AttemptState.STARTING.value,
            executor=plan.executor.name,
            state_dir=str(state_dir),
            log_path=str(state_dir / "output.log"),
            gpu_count=run["gpus"],
            config_sha256=config_sha or _previous_config_sha(conn, run),
            data_manifest_sha256=_data_sha(conn, run, plan.data),
            environment_sha256=env_sha,
            environ_sha256=environ_sha,
            code_commit=code.commit,
            code_dirty_sha256=put_blob(conn, code.dirty_diff, "git_diff") if code.dirty_diff else None,
            code_branch=code.branch,
            code_capture=None if plan.evaluation else json.dumps(code.record),
            workdir=str(code.cwd),
            resumed_from_checkpoint=plan.resume_from,
            memory_fingerprint=memory_fingerprint(values, plan.resource.name, run["gpus"]),
            started_at=datetime.now(timezone.utc),  # the launch; replaced by when the command started
            started_by=started_by,
            resource=plan.resource.name,
            qos=plan.placement.qos,
            selection=plan.placement.to_json(),
        ),
    )
    # A run going again has not ended: the reason its last attempt ended is that attempt's, not the run's.
    update_run(conn, run_id, state=RunState.RUNNING.value, not_before=None, ended_at=None, termination_reason=None)
    _add_launch_events(conn, plan, attempt_id)
    return ClaimedAttempt(attempt_id, number, run, state_dir, config_path, environ_description)


def _add_launch_events(conn, plan: AttemptPlan, attempt_id: str) -> None:
    """What the launch noticed, on the new attempt: a preflight run again for its config, its data changed."""
    from trackway.ledger.supervisor_events import add_supervisor_event

    if plan.preflight is not None:
        from trackway.resources.run_preflight import PREFLIGHT_AT_LAUNCH_EVENT

        add_supervisor_event(conn, attempt_id, PREFLIGHT_AT_LAUNCH_EVENT, {
            "message": "memory preflight run again for this attempt's config (--set changed it)",
            "preflight": plan.preflight})
    data, previous = plan.data, plan.previous
    if previous is not None and data is not None and (data.changes or data.problem):
        add_supervisor_event(conn, attempt_id, "data_changed", {
            "message": data.message(previous["attempt_id"]), "changes": data.changes, "problem": data.problem,
            "since": previous["attempt_id"]})


@dataclass(frozen=True)
class BuiltRequest:
    """A claimed attempt's launch request, and what restoring its declared checkpoint paths did (None: none declared)."""

    request: LaunchRequest
    restored: Restored | None


def build_request(settings: Settings, plan: AttemptPlan, claim: ClaimedAttempt) -> BuiltRequest:
    """The claimed attempt's LaunchRequest, after writing the files it reads: its state directory, its config.

    Raises InputError where what the run keeps outside the ledger is gone (its config, its secret
    variables or command words), OSError where a file cannot be written: submit_attempt records either.
    """
    from trackway.supervisor.outside_checkpoints import restore_declared, substitute_command

    run, code, resource, executor = claim.run, plan.code, plan.resource, plan.executor
    state_dir = claim.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    if plan.lost_config:
        kept = settings.runs_dir / plan.run_id / submitted_config.CONFIG_FILE
        raise InputError(str(submitted_config.MissingConfig(kept)))
    if plan.config is not None:
        submitted_config.write_file(claim.config_path, plan.config.canonical)
    submitted = _submitted_environment(settings, run, claim.environ_description)
    typed = _submitted_command(settings, run)
    # A script without the SDK finds its own checkpoint file where it left it (or none, if none was committed).
    restored = (restore_declared(plan.checkpoint_root, code.cwd, plan.declared, plan.resume_from, claim.number)
                if plan.declared else None)
    command = substitute_command(typed, restored, plan.checkpoint_root / plan.resume_from if plan.resume_from else None)
    request = launch_request(
        settings, run, plan.run_id, claim.attempt_id, claim.number, state_dir, resource=resource,
        qos=plan.placement.qos, executor=executor, code=code, config_path=claim.config_path,
        variables=submitted.variables if submitted is not None else None, command=command,
        resume_from=plan.resume_from, checkpoint_url=plan.run["checkpoint_root"],
        restored_path=restored.restored[0] if restored is not None and restored.restored else None,
        time_limit_s=plan.time_limit_s,
    )
    return BuiltRequest(request, restored)


def launch_request(
    settings: Settings, run: Mapping[str, Any], run_id: str, attempt_id: str, number: int, state_dir: Path, *,
    resource: Resource, qos: str | None, executor: Executor, code: CodeGiven, config_path: Path | None,
    variables: dict[str, str] | None, command: list[str], resume_from: str | None, checkpoint_url: str | None,
    restored_path: str | None, time_limit_s: float | None,
) -> LaunchRequest:
    """The request an executor is handed for one attempt, built from what is decided, writing nothing.

    build_request() hands it to submit(); `submit --dry-run` (supervisor/dry_run.py) to preview(),
    so what a dry run shows is what a submit sends. `variables`: the run's submitted environment
    (None: recorded before environments were, so added to the launcher's own).
    """
    own_env = {
        **({"TRACKWAY_CHECKPOINT_URL": checkpoint_url} if checkpoint_url else {}),
        **run_environment(run, state_dir),
        **attempt_environment(settings, run_id, attempt_id, number, state_dir, resume_from, config_path,
                              restored_path),
    }
    return LaunchRequest(
        attempt_id=attempt_id,
        command=command,
        cwd=code.cwd,
        env={**(variables if variables is not None else {}), **own_env},
        state_dir=state_dir,
        log_path=state_dir / "output.log",
        gpus=run["gpus"],
        time_limit_s=time_limit_s,
        grace_s=resource.grace_seconds,
        nodes=run.get("nodes") or 1,  # runs recorded before 0018: one node
        env_is_complete=variables is not None,
        resource=resource if resource.declared else None,
        qos=qos,
        run_env=own_env if executor.remote else None,
        code=_code_snapshot(run, code) if executor.remote else None,
    )


@dataclass(frozen=True)
class Launched:
    """What the executor answered for a claimed attempt, and what its launch restored."""

    submission: Submission
    restored: Restored | None


def submit_attempt(ledger: Ledger, settings: Settings, plan: AttemptPlan, claim: ClaimedAttempt) -> Launched:
    """Hand the claimed attempt to its executor; a launch that fails ends the attempt with its reason, then raises.

    Building the request is inside: its files are written after the claim's transaction, so a full
    disk there ends this attempt with a reason (an ExecutorError naming the path) instead of leaving
    it `starting` until a supervisor declares the launch interrupted. The executor's TrackwayError
    is recorded and raised as it is (see _record_launch_failure for the reasons).
    """
    try:
        built = build_request(settings, plan, claim)
        submission = plan.executor.submit(built.request)
    except TrackwayError as exc:
        _record_launch_failure(ledger, settings, claim.attempt_id, plan.run_id, exc)
        raise
    except OSError as exc:
        failure = ExecutorError(f"attempt {claim.attempt_id}: the launch failed: {_os_error_text(exc)}")
        _record_launch_failure(ledger, settings, claim.attempt_id, plan.run_id, failure,
                               _disk_full(exc, claim.state_dir))
        raise failure from exc
    return Launched(submission, built.restored)


def record_started(ledger: Ledger, claim: ClaimedAttempt, launched: Launched) -> None:
    """Record what the executor said of the started attempt (job id, host, GPUs, start) and set it running.

    Only a still-starting attempt: one whose launch a supervisor declared interrupted meanwhile
    stays ended. What the launch restored at a declared checkpoint path is an event on the attempt.
    """
    submission, restored = launched.submission, launched.restored
    with ledger.write() as conn:
        conn.execute(
            update(attempts)
            .where(attempts.c.attempt_id == claim.attempt_id, attempts.c.state == AttemptState.STARTING.value)
            .values(
                state=AttemptState.RUNNING.value,
                executor_job_id=submission.handle.job_id,
                host=submission.host,
                gpu_ids=",".join(str(i) for i in submission.gpu_ids) or None,
                gpu_model=submission.gpu_model,
                # A queued job's GPUs are not known yet (Slurm): the count asked for until its placement is.
                gpu_count=len(submission.gpu_ids) or claim.run["gpus"],
                started_at=submission.started_at,
            )
        )
        if restored is not None and (restored.restored or restored.moved_aside):
            from trackway.ledger.supervisor_events import add_supervisor_event

            add_supervisor_event(conn, claim.attempt_id, "checkpoint_path_restored", restored.as_event())


# How long a queued retry that no resource can take now waits before it is placed again.
UNPLACED_RETRY_S = 30.0


def _hold_unplaced(ledger: Ledger, run, previous, exc: NoResourceFits) -> None:
    """A retry no resource can take now (a cluster unreachable, a declaration changed): said on the attempt
    it follows, and tried again later rather than every tick."""
    from datetime import timedelta

    from trackway.ledger.supervisor_events import add_supervisor_event

    with ledger.write() as conn:
        add_supervisor_event(conn, previous["attempt_id"], "retry_not_placed", {
            "message": f"the retry could not be placed: {exc}; it stays queued and is tried again every "
                       f"{UNPLACED_RETRY_S:g} s",
        })
        update_run(conn, run["run_id"], not_before=datetime.now(timezone.utc) + timedelta(seconds=UNPLACED_RETRY_S))


def command_by(command: str) -> str:
    """`command` credited to the person running it: `trackway resume --set lr=1e-4 (ana@gpu3)`."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's random uid)
        user = "uid" + str(os.getuid())
    return f"{command} ({user}@{socket.gethostname()})"


def _queued_by(conn, run) -> str:
    """Who queued a run the supervisor now launches: the rule on its last attempt, or the evaluation trigger."""
    latest = latest_attempt(conn, run["run_id"])
    if latest is None:
        return _evaluation_queued_by(conn, run) if run["kind"] == RunKind.EVAL.value else "supervisor"
    decision = json.loads(latest["retry_decision"]) if latest["retry_decision"] else {}
    return f"supervisor: {decision.get('rule') or 'retry'}"


def _evaluation_queued_by(conn, run) -> str:
    """Who asked for the evaluation a seed belongs to: a person's `trackway eval`, or the spec's trigger."""
    from trackway.ledger.schema import evaluation_seeds, evaluations

    trigger = conn.execute(
        select(evaluations.c.trigger).join(evaluation_seeds, evaluation_seeds.c.eval_id == evaluations.c.eval_id)
        .where(evaluation_seeds.c.eval_run_id == run["run_id"])).scalar()
    if trigger == "on_demand":
        return "supervisor: an evaluation a person asked for (`trackway eval`)"
    if trigger == "rescore":
        return "supervisor: a rescore a person asked for (`trackway eval rescore`)"
    if trigger is None:
        return "supervisor: a run of kind eval"
    return f"supervisor: evaluation of a committed checkpoint (trigger {trigger})"


def _locked_run(conn, run_id: str):
    """The run, read after taking its row lock: on PostgreSQL two launchers at READ COMMITTED would
    otherwise both see it queued and both start an attempt (SQLite's write lock already serialises)."""
    run = resolve_run(conn, run_id)
    conn.execute(select(runs.c.run_id).where(runs.c.run_id == run["run_id"]).with_for_update())
    return resolve_run(conn, run["run_id"])


def _environ_of(conn, run) -> tuple[dict | None, str]:
    """The run's submitted environment (its description and blob); for a run recorded before
    environments were stored, a description of this launcher's, so the receipt says what it got."""
    if run["environ_sha256"]:
        return json.loads(get_blob(conn, run["environ_sha256"])), run["environ_sha256"]
    inherited = submitted_env.capture()
    return None, put_blob(conn, inherited.canonical(owner=run["run_id"]), "environ")


def _submitted_environment(settings: Settings, run, description: dict | None):
    if description is None:
        return None
    try:
        return submitted_env.restore(description, settings.runs_dir)
    except submitted_env.MissingSecrets as exc:
        raise InputError(str(exc)) from None


def _submitted_command(settings: Settings, run) -> list[str]:
    """The run's command as typed: the ledger's form with the words it hides read back from the run's directory."""
    try:
        return submitted_argv.read(json.loads(run["command"]), settings.runs_dir / run["run_id"]).argv
    except submitted_argv.MissingArguments as exc:
        raise InputError(str(exc)) from None


def run_secret_values(conn, settings: Settings, run, descriptions: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The values the run holds that its records must never show: its secret variables' and the words its
    command hides, for `redaction` to mask wherever the run's output repeats them.

    `descriptions`: submitted environments already read, by digest (runs submitted alike share one), added to.
    """
    digest = run["environ_sha256"]
    if descriptions is not None and digest in descriptions:
        description = descriptions[digest]
    else:
        description = json.loads(get_blob(conn, digest)) if digest else None
        if descriptions is not None:
            descriptions[digest] = description
    values = submitted_env.kept_values(description, settings.runs_dir)
    values += submitted_argv.hidden(json.loads(run["command"]), settings.runs_dir / run["run_id"])
    return known_values(values)


def _disk_full(exc: OSError, writing_under: Path):
    """Where a launch met a full disk and the room left there, or None for any other OSError.

    A write names no file (`f.write` raises without one): the launch was writing the attempt's
    files under `writing_under`, so that is where the disk is full.
    """
    import errno

    from trackway.supervisor.classify import DiskFull

    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = exc.filename2 or exc.filename or writing_under
    probe = Path(where)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return DiskFull(str(where), shutil.disk_usage(probe).free)
    except OSError:
        return DiskFull(str(where))


def _os_error_text(exc: OSError) -> str:
    """An OSError in plain words; a full disk says so, with the path and what is left on it."""
    import errno

    where = exc.filename or ""
    text = f"{exc.strerror or exc}" + (f": {where}" if where else "")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and where:
        probe = Path(where)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            text += f" (disk full: {shutil.disk_usage(probe).free} bytes free)"
        except OSError:
            text += " (disk full)"
    return text


def _preflight_of(ledger: Ledger, settings: Settings, run, config) -> str | None:
    """The memory preflight for a config `resume --set` changed, as submit runs it (None: nothing to estimate)."""
    from trackway.resources.submit_preflight import submit_preflight

    return submit_preflight(ledger, settings, config.values, strict=False, resource=run["resource_request"],
                            cwd=Path(run["workdir"]), gpus=run["gpus"], model_family=run["model_family"])


def _data_sha(conn, run, data) -> str | None:
    """The attempt's data manifest: resolved at this launch, else (the first attempt) the run's, taken at submit."""
    if data is None:
        return run["data_manifest_sha256"]
    return put_blob(conn, data.canonical, "data_manifest") if data.canonical is not None else None


def _data_change_stops(conn, settings: Settings, run, previous, data) -> bool:
    """With `[retry] on_data_change = "stop"`, a policy retry whose data changed is not launched: the decision
    on the attempt it follows becomes a stop that lists the changes, and the run ends failed."""
    from trackway.ledger.supervisor_events import add_supervisor_event
    from trackway.supervisor.retry import run_policy

    try:
        on_change = run_policy(settings, run).on_data_change
    except InputError:
        on_change = "stop"  # a policy that no longer reads: stopping costs no GPU time
    if on_change != "stop":
        return False
    run_ref = run["name"] or run["run_id"]
    said = data.message(previous["attempt_id"])
    decision = {"action": "stop", "rule": "data changed: stop", "delay_s": 0.0,
                "message": f"{said}; [retry] on_data_change = \"stop\", so the retry was not launched: check the "
                           f"data, then `trackway resume {run_ref}`"}
    conn.execute(update(attempts).where(attempts.c.attempt_id == previous["attempt_id"])
                 .values(retry_decision=json.dumps(decision)))
    add_supervisor_event(conn, previous["attempt_id"], "data_changed", {
        "message": said, "changes": data.changes, "problem": data.problem, "since": previous["attempt_id"]})
    update_run(conn, run["run_id"], state=RunState.FAILED.value, not_before=None,
               ended_at=datetime.now(timezone.utc))
    return True


def _evaluator_moved(conn, settings: Settings, run, moved, from_queue: bool) -> None:
    """A seed whose evaluator changed is never run under its evaluation: a queued one continues as the
    evaluation of the new versions; a person asking to resume it is told how to ask for that evaluation."""
    from trackway.evals.progress import continue_as_new_evaluation

    if not from_queue:
        raise InputError(
            f"run {run['name'] or run['run_id']!r}: is a seed of evaluation {moved.eval_id}, and its {moved.text()} since "
            "that evaluation was requested; a new attempt would file the new evaluator's results under the old "
            "version: ask for the evaluation again, `trackway eval RUN@STEP --spec FILE`")
    continue_as_new_evaluation(conn, settings, run["run_id"], moved)
    return None


def _has_unfinished_attempt(conn, run_id: str) -> bool:
    query = select(attempts.c.attempt_id).where(
        attempts.c.run_id == run_id, attempts.c.state != AttemptState.ENDED.value
    )
    return conn.execute(query).first() is not None


def _previous_config_sha(conn, run) -> str | None:
    """The config of the run's latest attempt (it may have been changed by `resume --set`), else the run's."""
    latest = latest_attempt(conn, run["run_id"])
    return latest["config_sha256"] if latest is not None else run["config_sha256"]


def _record_launch_failure(ledger: Ledger, settings: Settings, attempt_id: str, run_id: str, exc: TrackwayError,
                           disk_full=None) -> None:
    """An attempt the executor refused still ends with a reason, the executor's words and the policy's decision.

    A launch that failed is an attempt like any other: an ExecutorError (hosts not answering, a
    queue refusing) is `infra_transient` and the policy decides, with its budget and backoff, whether
    to try again; a full disk stops, naming the path and the room left; bad input (a secrets file
    gone) is `config_error`.
    """
    from trackway.supervisor.retry import decide_after_end

    reason = TerminationReason.INFRA_TRANSIENT if isinstance(exc, ExecutorError) else TerminationReason.CONFIG_ERROR
    now = datetime.now(timezone.utc)
    evidence: dict = {"rule": "executor:submit-refused", "lines": [str(exc)], "exit_code": None, "signal": None,
                      "executor_state": None, "executor": []}
    if disk_full is not None:
        evidence["disk_full"] = disk_full.as_record()
    with ledger.write() as conn:
        attempt = get_attempt(conn, attempt_id)
        if attempt["state"] == AttemptState.ENDED.value:
            return
        run = resolve_run(conn, run_id)
        # Nothing ran: the attempt's time is none, whenever it was recorded.
        record_attempt_end(conn, {**attempt, "started_at": now}, ended_at=now, reason=reason,
                           evidence_json=json.dumps(evidence), exit_code=None, signal=None, cost_per_gpu_hour=0.0,
                           secrets=run_secret_values(conn, settings, run))
        decision = decide_after_end(conn, settings, run, attempt_id)
        if run["kind"] == RunKind.EVAL.value:
            from trackway.evals.progress import after_eval_attempt

            after_eval_attempt(conn, settings, run_id, reason, decision.action == "resume", None)
