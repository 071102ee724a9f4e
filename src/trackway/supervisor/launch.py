"""Submitting a run and starting its attempts: capture the receipt, record it, hand the command to an executor.

Bad input is refused before anything is written: the config, the data manifest and the code
reference are captured first, and the run is recorded in one transaction only when all of
them succeeded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from sqlalchemy import select, update

from trackway.errors import ExecutorError, InputError, TrackwayError
from trackway.executors.base import Executor, LaunchRequest, get_executor
from trackway.ledger import Ledger
from trackway.ledger.blobs import get_blob, put_blob
from trackway.ledger.schema import attempts, runs
from trackway.ledger.store import make_private_dirs
from trackway.ledger.records import (
    attempt_count,
    get_attempt,
    insert_attempt,
    insert_run,
    latest_attempt,
    name_taken,
    new_run_id,
    resolve_run,
    record_attempt_end,
    update_run,
)
from trackway.receipts import submitted_argv, submitted_config, submitted_env
from trackway.receipts.code import CodeRef, capture_code, clone_branch
from trackway.receipts.config import load_config
from trackway.receipts.data_manifest import build_data_manifest
from trackway.receipts.environment import capture_environment
from trackway.redaction import known_values
from trackway.resources.selection import NoResourceFits
from trackway.settings import Settings
from trackway.supervisor.placement import place, project_settings
from trackway.taxonomy import AttemptState, RunKind, RunState, TerminationReason


@dataclass
class RunSpec:
    """What `trackway submit` was asked to run."""

    command: list[str]
    cwd: Path
    name: str | None = None
    project: str = "default"
    model_family: str | None = None
    kind: str = RunKind.FULL.value
    config_path: str | None = None
    overrides: list[str] = field(default_factory=list)
    data_paths: list[str] = field(default_factory=list)
    gpus: int = 0
    time_limit_hours: float | None = None
    repo_url: str | None = None
    branch: str | None = None
    resource: str | None = None  # a declared resource's name, or "auto"; None: auto once any is declared
    gpu_memory_min_gb: float | None = None  # per GPU; resources with less are passed over
    retry_policy_path: str | None = None
    eval_spec_paths: list[str] = field(default_factory=list)  # evaluate committed checkpoints with these
    environ: dict[str, str] | None = None  # the submitter's environment variables; None: this process's
    # Scripts without the SDK; None: trackway.toml's [logs] metrics / [checkpoints] path.
    metric_patterns: list[str] | None = None  # regexes read from output.log (supervisor/log_metrics.py)
    checkpoint_paths: list[str] | None = None  # globs committed as checkpoints (supervisor/outside_checkpoints.py)
    # Where checkpoints outlive the machine (an fsspec URL; the run's id is appended); None: the resource's, if any.
    checkpoint_root: str | None = None
    # Extra environment for every attempt (an experiment's test run: TRACKWAY_MAX_STEPS, TRACKWAY_RESTORE_CHECK).
    env: dict[str, str] | None = None
    # Refuse, before recording anything, a run the memory preflight predicts to OOM wherever it may go.
    preflight_strict: bool = False


def _validate(spec: RunSpec) -> None:
    if not spec.command:
        raise InputError("COMMAND: expected the command to run after `--`, e.g. trackway submit -- python train.py")
    if spec.kind not in (RunKind.TEST.value, RunKind.FULL.value):
        raise InputError(f"--kind {spec.kind!r}: expected 'test' or 'full'")
    from trackway import validation

    validation.whole(spec.gpus, "--gpus", 0, validation.MAX_GPUS)
    if spec.time_limit_hours is not None:
        validation.finite(
            spec.time_limit_hours, "--time-limit", 0, validation.TEN_YEARS_HOURS, "hours", low_open=True,
            note=" (10 years)",
        )
    if bool(spec.repo_url) != bool(spec.branch):
        raise InputError("--repo/--branch: expected both together (--repo URL --branch B) or neither")
    if spec.name is not None:
        validation.run_name(spec.name)
    validation.printable_text(spec.project, "--project")
    if spec.model_family is not None:
        validation.printable_text(spec.model_family, "--model-family")
    from trackway.supervisor.log_metrics import compile_patterns
    from trackway.supervisor.outside_checkpoints import validate_paths

    if spec.metric_patterns:
        compile_patterns(spec.metric_patterns, "--metric-pattern")
    if spec.checkpoint_paths:
        validate_paths(spec.checkpoint_paths, "--checkpoint-path")
    if spec.gpu_memory_min_gb is not None:
        validation.finite(spec.gpu_memory_min_gb, "--gpu-memory-min", 0, 10_000, "GB", low_open=True)
    if spec.checkpoint_root is not None:
        checkpoint_root_url(spec.checkpoint_root, "--checkpoint-root")


def checkpoint_root_url(root: str, field: str) -> str:
    """A checkpoint root as given (an fsspec URL, or an absolute path: a mounted network volume); InputError if neither."""
    text = root.strip()
    if not text or any(c in text for c in "\n\r\0") or not ("://" in text or text.startswith("/")):
        raise InputError(f"{field} {root!r}: expected an fsspec URL such as s3://bucket/prefix, or an absolute path")
    return text.rstrip("/")


def preview_placement(settings: Settings, spec: RunSpec, preflight: str | None = None):
    """Where the run's first attempt would go now; InputError (naming each resource's reason) when nowhere fits.

    The attempt itself is placed when it launches (availability may change in between); this
    refuses, before anything is recorded, a run that no declared resource could ever take.
    """
    from trackway.resources.selection import AUTO

    asked = spec.resource or (AUTO if settings.resources else "local")
    if not settings.resources and spec.gpus > 0:
        # No resources declared: the run goes to this machine, and the answer is about it.
        from trackway.receipts.placement import gpu_inventory

        available = len(gpu_inventory())
        if available < spec.gpus:
            raise InputError(f"--gpus {spec.gpus}: this machine has {available} GPU(s)")
    if asked != AUTO and asked not in settings.resources and asked != "local":
        declared = ", ".join(sorted(settings.resources)) or "none"
        raise InputError(f"--resource {asked!r}: not declared in trackway.toml (declared: {declared}, or auto)")
    run = {"resource_request": asked, "resource": asked, "kind": spec.kind, "gpus": spec.gpus,
           "time_limit_s": spec.time_limit_hours * 3600 if spec.time_limit_hours else None,
           "gpu_memory_min_gb": spec.gpu_memory_min_gb, "preflight": preflight}
    return place(settings, run)


def submit_run(ledger: Ledger, settings: Settings, spec: RunSpec, console: Console | None = None) -> str:
    """Capture the run's receipt and record the run (state queued); return its id."""
    _validate(spec)
    config = load_config(spec.config_path, spec.overrides)
    from trackway.supervisor.submit_preflight import submit_preflight

    preflight = submit_preflight(
        ledger, settings, config.values if config else None, strict=spec.preflight_strict, resource=spec.resource,
        cwd=spec.cwd, gpus=spec.gpus, model_family=spec.model_family, console=console,
    )
    selection = preview_placement(settings, spec, preflight)
    if spec.name:
        with ledger.read() as conn:
            if name_taken(conn, spec.name):
                raise InputError(f"--name {spec.name!r}: a run with that name exists; names address runs, so pick another")
    from trackway.supervisor.policy import load_policy
    from trackway.supervisor.retry import read_policy_file

    load_policy(None, settings.retry)  # a broken [retry] in trackway.toml is refused now, not after an attempt
    log_patterns, checkpoint_paths = _outside_sdk(spec, settings)
    retry_policy = read_policy_file(spec.retry_policy_path)
    eval_specs = load_eval_specs(spec.eval_spec_paths, settings)
    data = build_data_manifest(spec.data_paths, console=console)
    environ = submitted_env.capture(spec.environ)
    command = submitted_argv.capture(spec.command, list(environ.secret.values()))
    run_id = new_run_id()
    run_dir = settings.runs_dir / run_id
    workdir, code = _prepare_code(spec, run_dir)
    try:
        # Before the run exists: a run whose secrets were not kept could never start as submitted.
        if environ.secret:
            submitted_env.write_secret_file(run_dir, environ.secret)
        if command.needs_file:
            submitted_argv.write_secret_file(run_dir, command)
        if config:
            make_private_dirs(run_dir)  # a run's files hold what it printed and was given: only its owner reads them
            submitted_config.write_file(run_dir / submitted_config.CONFIG_FILE, config.canonical)
        with ledger.write() as conn:
            environ_sha = put_blob(conn, environ.canonical(owner=run_id), "environ")
            config_sha = put_blob(conn, submitted_config.recorded(config.values), "config") if config else None
            data_sha = put_blob(conn, data.canonical, "data_manifest") if data else None
            diff_sha = put_blob(conn, code.dirty_diff, "git_diff") if code.dirty_diff else None
            insert_run(
                conn,
                dict(
                    run_id=run_id,
                    name=spec.name,
                    project=spec.project,
                    model_family=spec.model_family,
                    kind=spec.kind,
                    state=RunState.QUEUED.value,
                    command=json.dumps(command.recorded),
                    workdir=str(workdir),
                    resource=selection.resource,
                    resource_request=selection.requested,
                    gpu_memory_min_gb=spec.gpu_memory_min_gb,
                    executor=settings.resource(selection.resource).executor,
                    gpus=spec.gpus,
                    time_limit_s=spec.time_limit_hours * 3600 if spec.time_limit_hours else None,
                    config_sha256=config_sha,
                    data_manifest_sha256=data_sha,
                    data_paths=json.dumps(data.roots) if data else None,
                    code_repo=code.repo,
                    code_branch=code.branch,
                    code_commit=code.commit,
                    code_dirty_sha256=diff_sha,
                    created_at=datetime.now(timezone.utc),
                    retry_policy=retry_policy,
                    environ_sha256=environ_sha,
                    log_patterns=json.dumps(log_patterns) if log_patterns else None,
                    checkpoint_paths=json.dumps(checkpoint_paths) if checkpoint_paths else None,
                    checkpoint_root=_run_checkpoint_root(spec, settings.resource(selection.resource), run_id),
                    env=json.dumps(spec.env) if spec.env else None,
                    preflight=preflight,
                ),
            )
            if eval_specs:
                from trackway.evals.records import attach_specs

                attach_specs(conn, run_id, eval_specs)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_id


def _outside_sdk(spec: RunSpec, settings: Settings) -> tuple[list[str], list[str]]:
    """The run's log patterns and checkpoint paths: the submit options, else trackway.toml's, validated."""
    from trackway.supervisor.log_metrics import compile_patterns
    from trackway.supervisor.outside_checkpoints import validate_paths

    patterns = list(spec.metric_patterns) if spec.metric_patterns else list(settings.log_metric_patterns)
    compile_patterns(patterns, "--metric-pattern" if spec.metric_patterns else "[logs] metrics")
    paths = list(spec.checkpoint_paths) if spec.checkpoint_paths else list(settings.checkpoint_paths)
    paths = validate_paths(paths, "--checkpoint-path" if spec.checkpoint_paths else "[checkpoints] path")
    return patterns, paths


def load_eval_specs(paths: Sequence[str], settings: Settings):
    if not paths:
        return []
    from trackway.evals.spec import load_spec

    specs = [load_spec(p) for p in paths]
    for spec in specs:
        spec.evaluator_version()  # an evaluator or task set that cannot be hashed is refused now
        spec.task_set_version()
        check_eval_resource(spec, settings)
    return specs


def check_eval_resource(spec, settings: Settings) -> None:
    """An eval spec's `resource` must be declared: refused at submit, not when the first checkpoint commits."""
    if spec.resource and spec.resource not in settings.resources and spec.resource != "local":
        declared = ", ".join(sorted(settings.resources)) or "none"
        raise InputError(f"{spec.path}: resource: {spec.resource!r} is not declared in trackway.toml "
                         f"(declared: {declared})")


def _prepare_code(spec: RunSpec, run_dir: Path) -> tuple[Path, CodeRef]:
    """Where the command runs and the code reference it runs with (cloning `--repo` when given)."""
    if not spec.repo_url:
        # run_dir is HOME/runs/RUN: trackway's own home never counts as the user's uncommitted work.
        return spec.cwd, capture_code(spec.cwd, home=run_dir.parent.parent)
    make_private_dirs(run_dir.parent)
    # Clone beside the final place and move it in, so a failed clone leaves no run directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}-", dir=run_dir.parent))
    try:
        code = clone_branch(spec.repo_url, spec.branch or "", staging / "workspace")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    make_private_dirs(run_dir)
    workspace = run_dir / "workspace"
    (staging / "workspace").rename(workspace)
    staging.rmdir()
    return workspace, CodeRef(
        root=workspace,
        repo=code.repo,
        commit=code.commit,
        branch=code.branch,
        dirty_diff=code.dirty_diff,
        dirty_sha256=code.dirty_sha256,
    )


def _run_checkpoint_root(spec: RunSpec, resource, run_id: str) -> str | None:
    """The run's own checkpoint URL: --checkpoint-root, else the chosen resource's, with the run's id appended."""
    root = spec.checkpoint_root or resource.checkpoint_root
    if not root:
        return None
    field = "--checkpoint-root" if spec.checkpoint_root else f"[resources.{resource.name}] checkpoint_root"
    return f"{checkpoint_root_url(root, field)}/{run_id}"


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
    """What a run adds to every attempt's environment: its own `env`, and for an evaluation, where to write."""
    env = json.loads(run["env"]) if run["env"] else {}
    if run["kind"] == RunKind.EVAL.value:
        from trackway.evals.outputs import OUTPUT_FILE

        env["TRACKWAY_EVAL_OUTPUT"] = str(state_dir / OUTPUT_FILE)
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

    The attempt goes where supervisor/placement.py places it (its resource, QoS tier and the
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
    """
    from trackway.supervisor.launch_inputs import CODE_FROM, code_for_attempt, data_for_attempt
    from trackway.supervisor.policy import memory_fingerprint
    from trackway.supervisor.retry import effective_config_path

    from trackway.supervisor.outside_checkpoints import paths_of, restore_declared, substitute_command

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
    # The ledger hides values of the run's config and its file is gone: the attempt ends config_error below.
    lost_config = config_path is None and submitted_config.is_masked(submitted_blob)
    config = load_config(config_path, overrides) if overrides and not lost_config else None
    preflight = _preflight_of(ledger, project, found, config) if config is not None else None
    if preflight is not None:
        found = {**found, "preflight": preflight}  # placement judges the config this attempt runs, not the submitted
    try:
        placement = place(project, found, previous)
    except NoResourceFits as exc:
        if from_queue and previous is not None:
            _hold_unplaced(ledger, found, previous, exc)
        raise
    resource = project.resource(placement.resource)
    if not isinstance(executor, Executor):
        executor = executor(resource.executor)
    elif executor.name != resource.executor:
        executor = get_executor(resource.executor, settings.home)
    checkpoint_root = settings.runs_dir / run_id / "checkpoints"
    checkpoint_url = found["checkpoint_root"]
    if checkpoint_url:
        resume_from = remote_resume_target(checkpoint_url)
    else:
        resume_from = resume_target(checkpoint_root, verify_files=bool(declared))
    evaluation = found["kind"] == RunKind.EVAL.value
    moved = None
    if evaluation:
        from trackway.evals.launch import seed_version_change

        with ledger.read() as conn:
            moved = seed_version_change(conn, run_id)  # hashes the evaluator's files: before the write lock
    with ledger.read() as conn:
        # An evaluation's code is its evaluator's, versioned by the evaluation itself (evals/launch.py).
        code = code_for_attempt(conn, settings, found, "submit" if evaluation else code_from, executor.remote)
        data = (data_for_attempt(conn, settings, found, previous["data_manifest_sha256"] if previous else None)
                if code_from != "submit" else None)
    with ledger.write() as conn:
        run = _locked_run(conn, run_id)
        if from_queue and (run["state"] != RunState.QUEUED.value or _has_unfinished_attempt(conn, run_id)):
            return None
        number = attempt_count(conn, run_id) + 1
        if first and number != 1:
            return None
        if from_queue and previous is not None and data is not None and (data.changes or data.problem):
            if _data_change_stops(conn, settings, run, previous, data):
                return None
        if moved is not None:
            return _evaluator_moved(conn, settings, run, moved, from_queue)
        if from_queue and started_by is None:
            started_by = _queued_by(conn, run)
        state_dir = settings.runs_dir / run_id / "attempts" / str(number)
        env_sha = put_blob(conn, environment.canonical, "environment")
        config_sha = put_blob(conn, submitted_config.recorded(config.values), "config") if config else None
        environ_description, environ_sha = _environ_of(conn, run)
        if config is not None:
            config_path = state_dir / "config.json"
            values = json.loads(config.canonical)
        else:
            values = json.loads(config_path.read_text()) if config_path is not None else None
        attempt_id = insert_attempt(
            conn,
            dict(
                run_id=run_id,
                attempt_number=number,
                state=AttemptState.STARTING.value,
                executor=executor.name,
                state_dir=str(state_dir),
                log_path=str(state_dir / "output.log"),
                gpu_count=run["gpus"],
                config_sha256=config_sha or _previous_config_sha(conn, run),
                data_manifest_sha256=_data_sha(conn, run, data),
                environment_sha256=env_sha,
                environ_sha256=environ_sha,
                code_commit=code.commit,
                code_dirty_sha256=put_blob(conn, code.dirty_diff, "git_diff") if code.dirty_diff else None,
                code_branch=code.branch,
                code_capture=None if evaluation else json.dumps(code.record),
                workdir=str(code.cwd),
                resumed_from_checkpoint=resume_from,
                memory_fingerprint=memory_fingerprint(values, resource.name, run["gpus"]),
                started_at=datetime.now(timezone.utc),  # the launch; replaced by when the command started
                started_by=started_by,
                resource=resource.name,
                qos=placement.qos,
                selection=placement.to_json(),
            ),
        )
        update_run(conn, run_id, state=RunState.RUNNING.value, not_before=None, ended_at=None)
        if preflight is not None:
            from trackway.ledger.ingest import add_supervisor_event

            from trackway.resources.run_preflight import PREFLIGHT_AT_LAUNCH_EVENT

            add_supervisor_event(conn, attempt_id, PREFLIGHT_AT_LAUNCH_EVENT, {
                "message": "memory preflight run again for this attempt's config (--set changed it)",
                "preflight": preflight})
        if previous is not None and data is not None and (data.changes or data.problem):
            from trackway.ledger.ingest import add_supervisor_event

            add_supervisor_event(conn, attempt_id, "data_changed", {
                "message": data.message(previous["attempt_id"]), "changes": data.changes, "problem": data.problem,
                "since": previous["attempt_id"]})
    try:
        # Files after the transaction: a full disk here ends this attempt with a reason instead of
        # leaving it `starting` until a supervisor declares the launch interrupted.
        state_dir.mkdir(parents=True, exist_ok=True)
        if lost_config:
            kept = settings.runs_dir / run_id / submitted_config.CONFIG_FILE
            raise InputError(str(submitted_config.MissingConfig(kept)))
        if config is not None:
            submitted_config.write_file(config_path, config.canonical)
        submitted = _submitted_environment(settings, run, environ_description)
        typed = _submitted_command(settings, run)
        # A script without the SDK finds its own checkpoint file where it left it (or none, if none was committed).
        restored = restore_declared(checkpoint_root, code.cwd, declared, resume_from, number) if declared else None
        command = substitute_command(typed, restored, checkpoint_root / resume_from if resume_from else None)
        own_env = {
            **({"TRACKWAY_CHECKPOINT_URL": checkpoint_url} if checkpoint_url else {}),
            **run_environment(run, state_dir),
            **attempt_environment(
                settings, run_id, attempt_id, number, state_dir, resume_from, config_path,
                restored.restored[0] if restored is not None and restored.restored else None,
            ),
        }
        request = LaunchRequest(
            attempt_id=attempt_id,
            command=command,
            cwd=code.cwd,
            env={**(submitted.variables if submitted is not None else {}), **own_env},
            state_dir=state_dir,
            log_path=state_dir / "output.log",
            gpus=run["gpus"],
            time_limit_s=run["time_limit_s"],
            grace_s=resource.grace_seconds,
            env_is_complete=submitted is not None,
            resource=resource if resource.declared else None,
            qos=placement.qos,
            run_env=own_env if executor.remote else None,
            code=_code_snapshot(run, code) if executor.remote else None,
        )
        submission = executor.submit(request)
    except TrackwayError as exc:
        _record_launch_failure(ledger, settings, attempt_id, run_id, exc)
        raise
    except OSError as exc:
        failure = ExecutorError(f"attempt {attempt_id}: the launch failed: {_os_error_text(exc)}")
        _record_launch_failure(ledger, settings, attempt_id, run_id, failure, _disk_full(exc, state_dir))
        raise failure from exc
    with ledger.write() as conn:
        # Only a still-starting attempt: one whose launch a supervisor declared interrupted stays ended.
        conn.execute(
            update(attempts)
            .where(attempts.c.attempt_id == attempt_id, attempts.c.state == AttemptState.STARTING.value)
            .values(
                state=AttemptState.RUNNING.value,
                executor_job_id=submission.handle.job_id,
                host=submission.host,
                gpu_ids=",".join(str(i) for i in submission.gpu_ids) or None,
                gpu_model=submission.gpu_model,
                # A queued job's GPUs are not known yet (Slurm): the count asked for until its placement is.
                gpu_count=len(submission.gpu_ids) or run["gpus"],
                started_at=submission.started_at,
            )
        )
        if restored is not None and (restored.restored or restored.moved_aside):
            from trackway.ledger.ingest import add_supervisor_event

            add_supervisor_event(conn, attempt_id, "checkpoint_path_restored", restored.as_event())
    return attempt_id


# How long a queued retry that no resource can take now waits before it is placed again.
UNPLACED_RETRY_S = 30.0


def _hold_unplaced(ledger: Ledger, run, previous, exc: NoResourceFits) -> None:
    """A retry no resource can take now (a cluster unreachable, a declaration changed): said on the attempt
    it follows, and tried again later rather than every tick."""
    from datetime import timedelta

    from trackway.ledger.ingest import add_supervisor_event

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


def run_secret_values(conn, settings: Settings, run) -> tuple[str, ...]:
    """The values the run holds that its records must never show: its secret variables' and the words its
    command hides, for `redaction` to mask wherever the run's output repeats them."""
    description = json.loads(get_blob(conn, run["environ_sha256"])) if run["environ_sha256"] else None
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
    from trackway.supervisor.submit_preflight import submit_preflight

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
    from trackway.ledger.ingest import add_supervisor_event
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
