"""Submitting a run: validate what `trackway submit` was asked, capture the receipt, record the run queued.

Bad input is refused before anything is written: the config, the data manifest and the code
reference are captured first, and the run is recorded in one transaction only when all of
them succeeded. Its attempts are started by supervisor/launch.py.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from trackway.errors import InputError
from trackway.ledger import Ledger
from trackway.ledger.blobs import put_blob
from trackway.ledger.records import insert_run, name_taken, new_run_id
from trackway.ledger.store import make_private_dirs
from trackway.receipts import submitted_argv, submitted_config, submitted_env
from trackway.receipts.code import CodeRef, capture_code, clone_branch, clone_commit
from trackway.receipts.config import load_config
from trackway.receipts.data_manifest import build_data_manifest
from trackway.settings import Settings
from trackway.settings.run_watchers import parse_watch
from trackway.settings.run_watchers import recorded as recorded_watchers
from trackway.resources.nodes import MAX_NODES, check_nodes, node_limit
from trackway.resources.placement import candidates, place
from trackway.taxonomy import RunKind, RunState

if TYPE_CHECKING:
    from trackway.receipts.config import ConfigSnapshot
    from trackway.receipts.data_manifest import DataManifest
    from trackway.receipts.submitted_argv import SubmittedCommand
    from trackway.receipts.submitted_env import SubmittedEnvironment
    from trackway.resources.selection_record import Selection


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
    gpus: int = 0  # in all, over every node
    nodes: int = 1  # the nodes the run spans, up to its resource's (resources/nodes.py)
    time_limit_hours: float | None = None
    repo_url: str | None = None
    branch: str | None = None
    resource: str | None = None  # a declared resource's name, or "auto"; None: auto once any is declared
    prefer_resource: str | None = None  # chosen first among auto's when it can take the run (the API's)
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
    # The run's own acceptance criteria (`--expect`), as given; parsed and checked by the caller
    # (experiments/expectations.py, a floor above this one) before the run is submitted.
    expect: list[str] = field(default_factory=list)
    # The run's own watcher thresholds (`--watch KIND.KEY=VALUE`), over trackway.toml's [watchers].
    watch: list[str] = field(default_factory=list)
    # The script the command runs, relative to --repo's top (the API's `script`): refused at submit, with
    # nothing recorded, when the cloned branch does not hold it.
    repo_script: str | None = None
    # Who submits, as `started_by` says it (`trackway submit (ana@gpu3)`, `agent NAME via mcp (...)`).
    submitted_by: str | None = None
    # A code-change experiment's run: `repo_url` cloned at exactly this commit (no branch), the command run in
    # `repo_subdir` of the clone (the baseline's working directory, relative to its repository's top).
    code_commit: str | None = None
    repo_subdir: str | None = None
    # "awaiting": recorded with no attempt, until a person approves it (an agent's [agents.NAME] asked for it);
    # `approval_note` says what asked.
    approval: str | None = None
    approval_note: str | None = None
    # The time limit is the run's total, run in pieces of the longest QoS tier, each resumed from the last one's
    # checkpoint: `in_pieces = true` in the run's retry policy (supervisor/policy.py).
    in_pieces: bool = False


# Every option a run is submitted with: RunSpec's field -> (`trackway submit`'s flag, `POST /api/jobs`' field).
# Both front ends take them all (tests/server/test_submit_fields.py holds them to it), and an error names what
# the user typed: messages say the flag, and the API says its field instead (api_words).
SUBMIT_FIELDS: dict[str, tuple[str, str]] = {
    "name": ("--name", "name"),
    "project": ("--project", "project"),
    "model_family": ("--model-family", "model_family"),
    "kind": ("--kind", "kind"),
    "config_path": ("--config", "config"),
    "overrides": ("--set", "set"),
    "data_paths": ("--data", "data"),
    "gpus": ("--gpus", "gpu_count"),
    "nodes": ("--nodes", "nodes"),
    "time_limit_hours": ("--time-limit", "time_limit_hours"),
    "repo_url": ("--repo", "repo"),
    "branch": ("--branch", "branch"),
    "resource": ("--resource", "resource"),
    "prefer_resource": ("--prefer-resource", "prefer_resource"),
    "gpu_memory_min_gb": ("--gpu-memory-min", "gpu_memory_min_gb"),
    "retry_policy_path": ("--retry-policy", "retry_policy"),
    "eval_spec_paths": ("--eval", "eval"),
    "metric_patterns": ("--metric-pattern", "metric_patterns"),
    "checkpoint_paths": ("--checkpoint-path", "checkpoint_paths"),
    "checkpoint_root": ("--checkpoint-root", "checkpoint_root"),
    "preflight_strict": ("--strict", "strict_memory_preflight"),
    "expect": ("--expect", "expect"),
    "watch": ("--watch", "watch"),
    "in_pieces": ("--in-pieces", "in_pieces"),
}
# How a submit is carried out rather than what the run is: (`trackway submit`'s flag, `POST /api/jobs`' field).
SUBMIT_MODES: dict[str, tuple[str, str]] = {
    "dry_run": ("--dry-run", "dry_run"),  # supervisor/dry_run.py: say what would be submitted, record nothing
}
# RunSpec's fields no person sets by an option: the command and where it runs, what callers fill in.
INTERNAL_FIELDS = frozenset({"command", "cwd", "environ", "env", "repo_script", "submitted_by", "approval",
                             "approval_note", "code_commit", "repo_subdir"})
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)(?![\w-])")


def api_words(message: str) -> str:
    """A submit error as the API says it: each `trackway submit` flag named by its JSON field instead."""
    fields = {flag: api for flag, api in SUBMIT_FIELDS.values()}
    return _FLAG.sub(lambda match: fields.get(match[1], match[1]), message)


def _validate(spec: RunSpec) -> None:
    if not spec.command:
        raise InputError("COMMAND: expected the command to run after `--`, e.g. trackway submit -- python train.py")
    if spec.kind not in (RunKind.TEST.value, RunKind.FULL.value):
        raise InputError(f"--kind {spec.kind!r}: expected 'test' or 'full'")
    from trackway import validation

    validation.whole(spec.gpus, "--gpus", 0, validation.MAX_GPUS)
    validation.whole(spec.nodes, "--nodes", 1, MAX_NODES)
    if spec.time_limit_hours is not None:
        validation.finite(
            spec.time_limit_hours, "--time-limit", 0, validation.TEN_YEARS_HOURS, "hours", low_open=True,
            note=" (10 years)",
        )
    parse_watch(spec.watch)
    if bool(spec.repo_url) != bool(spec.branch or spec.code_commit):
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
    if spec.in_pieces and spec.time_limit_hours is None:
        raise InputError("--in-pieces: expected with --time-limit HOURS, the run's total time to run in pieces")


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
    if spec.prefer_resource is not None and spec.prefer_resource not in settings.resources:
        declared = ", ".join(sorted(settings.resources)) or "none"
        raise InputError(f"prefer_resource {spec.prefer_resource!r}: not declared in trackway.toml (declared: "
                         f"{declared})")
    if asked != AUTO and asked not in settings.resources and asked != "local":
        declared = ", ".join(sorted(settings.resources)) or "none"
        raise InputError(f"--resource {asked!r}: not declared in trackway.toml (declared: {declared}, or auto)")
    if asked != AUTO:
        check_nodes(settings.resource(asked), spec.nodes)
    elif spec.nodes > 1:
        # More nodes than any resource has is the option's fault, said as such (not as "no resource fits").
        most = max(candidates(settings), key=node_limit)
        if spec.nodes > node_limit(most):
            check_nodes(most, spec.nodes)
    run = {"resource_request": asked, "resource": asked, "kind": spec.kind, "gpus": spec.gpus, "nodes": spec.nodes,
           "time_limit_s": spec.time_limit_hours * 3600 if spec.time_limit_hours else None,
           "gpu_memory_min_gb": spec.gpu_memory_min_gb, "preflight": preflight,
           "resource_preferred": spec.prefer_resource, "in_pieces": _in_pieces(settings, spec)}
    return place(settings, run)


def _in_pieces(settings: Settings, spec: RunSpec) -> bool:
    """Whether the run goes in pieces: `--in-pieces`, or `in_pieces = true` in trackway.toml's [retry] or its
    --retry-policy (either is refused in one line here when it does not read)."""
    if spec.time_limit_hours is None:
        return False
    if spec.in_pieces:
        return True
    from trackway.supervisor.policy import load_policy

    return load_policy(spec.retry_policy_path, settings.retry).in_pieces


def pieces_policy(text: str | None, spec: RunSpec) -> str | None:
    """The run's retry policy as stored: its --retry-policy text, with `in_pieces = true` first for --in-pieces
    (top-level keys come before any table in TOML), so that the receipt says the pieces were asked for."""
    if not spec.in_pieces:
        return text
    import tomllib

    if text and tomllib.loads(text).get("in_pieces") is True:
        return text
    if text and "in_pieces" in tomllib.loads(text):
        raise InputError(f"--in-pieces: the --retry-policy {spec.retry_policy_path} says in_pieces = false")
    return "in_pieces = true  # submit --in-pieces\n" + (text or "")


def submit_run(ledger: Ledger, settings: Settings, spec: RunSpec, console: Console | None = None) -> str:
    """Capture the run's receipt and record the run (state queued); return its id."""
    receipt = capture_receipt(ledger, settings, spec, console)
    run_id = new_run_id()
    run_dir = settings.runs_dir / run_id
    workdir, code = _prepare_code(spec, run_dir)
    try:
        _keep_run_files(run_dir, receipt)
        with ledger.write() as conn:
            _insert_submitted_run(conn, settings, spec, run_id, receipt, workdir, code)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_id


@dataclass(frozen=True)
class Receipt:
    """What submit captured and checked for a run before anything of it is written."""

    preflight: str | None
    selection: Selection
    config: ConfigSnapshot | None
    log_patterns: list[str]
    checkpoint_paths: list[str]
    retry_policy: str | None
    eval_specs: list
    data: DataManifest | None
    environ: SubmittedEnvironment
    command: SubmittedCommand


def capture_receipt(ledger: Ledger, settings: Settings, spec: RunSpec, console: Console | None) -> Receipt:
    """The run's receipt, every part validated: bad input raises InputError here, before anything is written."""
    _validate(spec)
    config = load_config(spec.config_path, spec.overrides)
    from trackway.resources.submit_preflight import submit_preflight

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
    retry_policy = pieces_policy(read_policy_file(spec.retry_policy_path), spec)
    eval_specs = load_eval_specs(spec.eval_spec_paths, settings)
    data = build_data_manifest(spec.data_paths, console=console)
    environ = submitted_env.capture(spec.environ)
    command = submitted_argv.capture(spec.command, list(environ.secret.values()))
    return Receipt(preflight, selection, config, log_patterns, checkpoint_paths, retry_policy, eval_specs, data,
                    environ, command)


def _keep_run_files(run_dir: Path, receipt: Receipt) -> None:
    """What the ledger must not hold, kept in the run's directory: its secrets, its config as given.

    Written before the run exists: a run whose secrets were not kept could never start as submitted.
    """
    if receipt.environ.secret:
        submitted_env.write_secret_file(run_dir, receipt.environ.secret)
    if receipt.command.needs_file:
        submitted_argv.write_secret_file(run_dir, receipt.command)
    if receipt.config:
        make_private_dirs(run_dir)  # a run's files hold what it printed and was given: only its owner reads them
        submitted_config.write_file(run_dir / submitted_config.CONFIG_FILE, receipt.config.canonical)


def _insert_submitted_run(conn, settings: Settings, spec: RunSpec, run_id: str, receipt: Receipt, workdir: Path,
                          code: CodeRef) -> None:
    """The run's row (state queued), its receipt's blobs and its eval specs, in the caller's transaction."""
    blobs = {kind: put_blob(conn, content, kind) for kind, content in receipt_blobs(receipt, run_id, code).items()}
    insert_run(conn, run_row(settings, spec, run_id, receipt, workdir, code, blobs))
    if receipt.eval_specs:
        from trackway.evals.records import attach_specs

        attach_specs(conn, run_id, receipt.eval_specs)


def receipt_blobs(receipt: Receipt, run_id: str, code: CodeRef) -> dict[str, bytes]:
    """The run's blobs by kind (environ, config, data_manifest, git_diff): what the ledger stores, and a dry run hashes."""
    config, data = receipt.config, receipt.data
    blobs = {"environ": receipt.environ.canonical(owner=run_id)}
    if config:
        blobs["config"] = submitted_config.recorded(config.values)
    if data:
        blobs["data_manifest"] = data.canonical
    if code.dirty_diff:
        blobs["git_diff"] = code.dirty_diff
    return blobs


def run_row(settings: Settings, spec: RunSpec, run_id: str, receipt: Receipt, workdir: Path, code: CodeRef,
            blobs: dict[str, str]) -> dict:
    """The run's row as submit records it (state queued); `blobs`: the sha256 of each of receipt_blobs()."""
    data, selection = receipt.data, receipt.selection
    return dict(
        run_id=run_id,
        name=spec.name,
        project=spec.project,
        model_family=spec.model_family,
        kind=spec.kind,
        state=RunState.QUEUED.value,
        command=json.dumps(receipt.command.recorded),
        workdir=str(workdir),
        resource=selection.resource,
        resource_request=selection.requested,
        gpu_memory_min_gb=spec.gpu_memory_min_gb,
        executor=settings.resource(selection.resource).executor,
        gpus=spec.gpus,
        nodes=spec.nodes,
        time_limit_s=spec.time_limit_hours * 3600 if spec.time_limit_hours else None,
        config_sha256=blobs.get("config"),
        data_manifest_sha256=blobs.get("data_manifest"),
        data_paths=json.dumps(data.roots) if data else None,
        code_repo=code.repo,
        code_branch=code.branch,
        code_commit=code.commit,
        code_dirty_sha256=blobs.get("git_diff"),
        created_at=datetime.now(timezone.utc),
        retry_policy=receipt.retry_policy,
        environ_sha256=blobs["environ"],
        log_patterns=json.dumps(receipt.log_patterns) if receipt.log_patterns else None,
        checkpoint_paths=json.dumps(receipt.checkpoint_paths) if receipt.checkpoint_paths else None,
        checkpoint_root=_run_checkpoint_root(spec, settings.resource(selection.resource), run_id),
        env=json.dumps(spec.env) if spec.env else None,
        preflight=receipt.preflight,
        expect=json.dumps(list(spec.expect)) if spec.expect else None,
        resource_preferred=spec.prefer_resource,
        expect_open=True if spec.expect else None,
        watchers=recorded_watchers(parse_watch(spec.watch)),
        submitted_by=spec.submitted_by,
        approval=spec.approval,
        approval_note=spec.approval_note,
    )


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
    """An eval spec's `resource` (each phase's) must be declared: refused at submit, not when the first checkpoint commits."""
    named = [("resource", spec.resource)]
    named += [(f"{p.name}.resource", p.resource) for p in (spec.inference, spec.scoring) if p is not None]
    for key, resource in named:
        if resource and resource not in settings.resources and resource != "local":
            declared = ", ".join(sorted(settings.resources)) or "none"
            raise InputError(f"{spec.path}: {key}: {resource!r} is not declared in trackway.toml "
                             f"(declared: {declared})")
        if resource and key != "resource" and resource in settings.resources:
            from trackway.executors.registry import is_remote

            if is_remote(settings.resources[resource].executor):
                # The outputs are committed, and read by the scorer, on trackway's own file system.
                raise InputError(f"{spec.path}: {key}: expected a resource on this machine's file system (local or "
                                 f"Slurm); {resource!r} runs over SSH, where a phase's outputs are not committed yet")


def check_repo_script(spec: RunSpec, workspace: Path, code: CodeRef) -> None:
    """The API's `script` must be a file of the cloned branch: refused at submit, with nothing recorded."""
    if spec.repo_script is not None and not (workspace / spec.repo_script).is_file():
        raise InputError(f"script {spec.repo_script!r}: not a file in {spec.repo_url} at branch {spec.branch} "
                         f"(commit {code.commit[:12] if code.commit else 'not known'})")


def _prepare_code(spec: RunSpec, run_dir: Path) -> tuple[Path, CodeRef]:
    """Where the command runs and the code reference it runs with (cloning `--repo` when given)."""
    if not spec.repo_url:
        # run_dir is HOME/runs/RUN: trackway's own home never counts as the user's uncommitted work.
        return spec.cwd, capture_code(spec.cwd, home=run_dir.parent.parent)
    make_private_dirs(run_dir.parent)
    # Clone beside the final place and move it in, so a failed clone leaves no run directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}-", dir=run_dir.parent))
    try:
        code = clone_commit(spec.repo_url, spec.code_commit, staging / "workspace") if spec.code_commit \
            else clone_branch(spec.repo_url, spec.branch or "", staging / "workspace")
        check_repo_script(spec, staging / "workspace", code)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    make_private_dirs(run_dir)
    workspace = run_dir / "workspace"
    (staging / "workspace").rename(workspace)
    staging.rmdir()
    return workspace / (spec.repo_subdir or ""), CodeRef(
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
