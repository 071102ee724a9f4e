"""The job API our users' scripts already speak: submit, list, look, read logs, cancel.

A job is a run: `POST /api/jobs` records it with its receipt and starts its first attempt exactly
as `trackway submit --detach` does, and a background supervisor drives it from there. `status`
is the run's state (queued, running, completed, failed, cancelled).
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select

from trackway import validation
from trackway.ledger.records import resolve_run
from trackway.ledger.schema import attempts, metric_points, metric_series, runs
from trackway.output_log import read_from, tail_offset
from trackway.resources.nodes import MAX_NODES
from trackway.redaction import LogRedactor, redact_argv
from trackway.taxonomy import RunState

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
FOLLOW_INTERVAL_S = 0.25
MAX_TAIL = 100_000
KEY_CONTEXT_LINES = 200  # a PEM private key of 8192 bits is about 100 lines


class JobRequest(BaseModel):
    """What a script posts to run a job; `script` runs with this server's Python, in `repo` when given."""

    model_config = ConfigDict(extra="forbid")

    script: str = Field(min_length=1, max_length=4096, description="The training script: a file inside the server's "
                        "working directory (relative to it), or a path relative to `repo`'s top; never an option.")
    args: list[str] = Field(default_factory=list, max_length=1000)
    repo: str | None = Field(None, max_length=4096, description="A git URL cloned into the run's workspace.")
    branch: str | None = Field(None, max_length=400)
    gpu_count: int = Field(0, ge=0, le=validation.MAX_GPUS, description="GPUs in all, over `nodes`.")
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Nodes the job spans, from 1 to its resource's (Slurm: nodes; SSH: hosts).")
    gpu_memory_min_gb: float | None = Field(None, gt=0, le=10_000)
    time_limit_hours: float | None = Field(None, gt=0, le=validation.TEN_YEARS_HOURS)
    prefer_resource: str | None = Field(
        None, max_length=200, description="A declared resource chosen first whenever it can take the job; when it "
        "cannot, another is chosen and the attempt's selection says why (`resource` pins one instead).")
    resource: str | None = Field(None, max_length=200, description="A declared resource the job must run on, or "
                                 "auto (as `submit --resource`).")
    model_family: str | None = Field(None, max_length=validation.MAX_TEXT)
    set: list[str] = Field(default_factory=list, max_length=1000,
                           description="Config overrides, KEY=VALUE (as `submit --set`), over `config`.")
    metric_patterns: list[str] = Field(
        default_factory=list, max_length=100,
        description="For a script without the SDK: regexes read from its output, group (?P<step>...) the step, every "
                    "other named group a metric, e.g. 'Step (?P<step>\\d+) \\| Loss: (?P<loss>\\S+)'.")
    checkpoint_paths: list[str] = Field(
        default_factory=list, max_length=100,
        description="For a script without the SDK: its checkpoint files or directories (globs relative to its "
                    "working directory), committed by trackway once complete and restored before a retry.")
    checkpoint_root: str | None = Field(None, max_length=4096, description="An fsspec URL (s3://bucket/prefix) "
                                        "or an absolute path the run's checkpoints are uploaded to.")
    retry_policy: str | None = Field(None, max_length=4096, description="A TOML retry policy file inside the "
                                     "server's working directory (as `submit --retry-policy`).")
    name: str | None = Field(None, max_length=validation.MAX_TEXT)
    project: str = Field("default", min_length=1, max_length=validation.MAX_TEXT)
    kind: Literal["test", "full"] = "full"
    config: dict[str, Any] | None = Field(None, description="The run's config, snapshotted into its receipt.")
    data: list[str] = Field(default_factory=list, max_length=1000, description="Data paths hashed into the manifest.")
    eval: list[str] = Field(default_factory=list, max_length=100, description="Eval spec files (TOML).")
    expect: list[str] = Field(
        default_factory=list, max_length=20,
        description="The run's own acceptance criteria (as `submit --expect`), judged as metrics and evaluations "
                    "land: 'eval.pass@1 > 0.05' (any evaluated checkpoint; 'at latest' for the newest), "
                    "'final.loss < 2.0'. `GET /api/jobs/{id}` gives each one's verdict.")
    watch: list[str] = Field(
        default_factory=list, max_length=50,
        description="The run's own watcher thresholds (as `submit --watch`), over trackway.toml's [watchers]: "
                    "KIND.KEY=VALUE, e.g. 'loss_rising.window=200 steps', 'gpu_underused.threshold=50'.")
    strict_memory_preflight: bool = Field(
        False, description="Refuse the job, recording nothing, when the memory preflight (the config's [preflight]) "
                           "predicts it runs out of GPU memory wherever it may go.")
    in_pieces: bool = Field(
        False, description="`time_limit_hours` is the job's total, run in pieces of the longest QoS tier, each "
                           "resumed from the last one's checkpoint (as `submit --in-pieces`).")
    dry_run: bool = Field(
        False, description="Record and start nothing: answer 200 with the resource that would be chosen and why, and "
                           "what its executor would be sent (the sbatch script, the SSH launch, the local command), "
                           "checked as a submit is (as `submit --dry-run`).")


class Submitted(BaseModel):
    id: str
    status: str
    attempt_id: str | None
    url: str


class DryRun(BaseModel):
    """What `dry_run` answers: where the job would go and what would be sent; nothing recorded or started."""

    dry_run: Literal[True]
    run_id: str = Field(description="Drawn for the preview only; a submit draws its own.")
    attempt_id: str
    resource: str
    executor: str
    qos: str | None
    selection: str = Field(description="The resource chosen, why, and every resource passed over.")
    submitted: str = Field(description="What the executor would be sent, as text, secrets masked.")


def need(request: Request, role: str) -> None:
    """403 unless the request's token has `role` (the router already asked for `read`)."""
    from starlette.exceptions import HTTPException

    caller = request.state.caller
    if not caller.may(role):
        raise HTTPException(403, f"token {caller.name!r} has the role {caller.role}; this needs {role} or above")


def inside(workdir: Path, value: str, field: str, what: str) -> str:
    """`value` (relative to the server's working directory, or absolute inside it) resolved; InputError outside it.

    The message names the field and what was sent, never where the server's directory is.
    """
    from trackway.errors import InputError

    if not value or value.startswith("-") or "\x00" in value:
        raise InputError(f"{field} {value!r}: expected {what} inside the server's working directory (a path, not an "
                         "interpreter option)")
    root = workdir.resolve()
    resolved = (root / value).resolve()
    if not resolved.is_relative_to(root):
        raise InputError(f"{field} {value!r}: expected {what} inside the server's working directory")
    return str(resolved)


@router.post("", status_code=201, response_model=Submitted | DryRun,
             responses={200: {"model": DryRun, "description": "`dry_run`: what would be submitted; nothing was."}})
def submit_job(job: JobRequest, request: Request, response: Response) -> Submitted | DryRun:
    """Start a job as `trackway submit --detach` would, from a script that is a file in the working directory.

    The API runs only what the CLI would: a script file (in the working directory, or in `repo` when
    given), never an interpreter option such as `-c`; `data` and `eval` paths inside the working
    directory. Needs a token with the role `submit`.
    """
    from trackway.errors import InputError
    from trackway.experiments.expectations import parse_all
    from trackway.supervisor.launch import command_by, start_attempt
    from trackway.supervisor.submit import RunSpec, api_words, submit_run

    need(request, "submit")
    try:
        parse_all(job.expect)  # refused (400, naming the criterion) before anything is recorded
    except InputError as exc:
        exc.args = (api_words(str(exc)), *exc.args[1:])
        raise
    state = request.app.state
    if job.repo:
        script = PurePosixPath(job.script)
        if job.script.startswith("-") or script.is_absolute() or ".." in script.parts:
            raise InputError(f"script {job.script!r}: expected a path relative to the repository's top, e.g. train.py")
        script_path = job.script
    else:
        script_path = inside(state.workdir, job.script, "script", "a script file")
        if not Path(script_path).is_file():
            raise InputError(f"script {job.script!r}: expected a script file inside the server's working directory")
    data = [inside(state.workdir, path, "data", "a data file or directory") for path in job.data]
    evals = [inside(state.workdir, path, "eval", "an eval spec file (TOML)") for path in job.eval]
    config_path = None
    if job.config is not None:
        from trackway.receipts.submitted_config import write_file

        config_path = state.settings.home / "server" / "configs" / f"{uuid.uuid4().hex}.json"
        write_file(config_path, json.dumps(job.config).encode())  # owner only: it may hold an API key
    for path, given in zip(evals, job.eval):
        if not Path(path).is_file():
            raise InputError(f"eval {given!r}: expected an eval spec file (TOML) inside the server's working directory")
    policy = inside(state.workdir, job.retry_policy, "retry_policy", "a TOML retry policy file") \
        if job.retry_policy is not None else None
    prefer = job.prefer_resource if job.prefer_resource not in (None, "auto") else None
    client = request.client.host if request.client else "unknown"
    submitter = command_by(f"POST /api/jobs with token {request.state.caller.name} from {client}")
    spec = RunSpec(
        command=[sys.executable, script_path, *job.args], cwd=state.workdir, name=job.name, project=job.project,
        model_family=job.model_family, kind=job.kind, config_path=str(config_path) if config_path else None,
        overrides=list(job.set), data_paths=data, gpus=job.gpu_count, nodes=job.nodes,
        time_limit_hours=job.time_limit_hours, resource=job.resource, prefer_resource=prefer,
        gpu_memory_min_gb=job.gpu_memory_min_gb, repo_url=job.repo, branch=job.branch, eval_spec_paths=evals,
        retry_policy_path=policy, metric_patterns=list(job.metric_patterns) or None,
        checkpoint_paths=list(job.checkpoint_paths) or None, checkpoint_root=job.checkpoint_root,
        preflight_strict=job.strict_memory_preflight, expect=[text.strip() for text in job.expect],
        watch=list(job.watch), repo_script=script_path if job.repo else None, submitted_by=submitter,
        in_pieces=job.in_pieces,
    )
    try:
        if job.dry_run:
            from trackway.supervisor.dry_run import preview_submit

            response.status_code = 200
            return DryRun(**preview_submit(state.ledger, state.settings, spec).as_json())
        run_id = submit_run(state.ledger, state.settings, spec)
    except InputError as exc:
        # The checks are the CLI's, which name its flags: here the caller sent JSON fields.
        exc.args = (api_words(str(exc)), *exc.args[1:])
        raise
    finally:
        if config_path is not None:
            config_path.unlink(missing_ok=True)  # the receipt holds the snapshot now (or nothing was recorded)
    attempt_id = start_attempt(state.ledger, state.settings, run_id, state.supervisor.executor, first=True,
                               started_by=submitter)
    state.after_submit()
    with state.ledger.read() as conn:
        status = resolve_run(conn, run_id)["state"]
    return Submitted(id=run_id, status=status, attempt_id=attempt_id, url=f"/api/jobs/{run_id}")


@router.get("")
def list_jobs(
    request: Request,
    state: Literal["queued", "running", "completed", "failed", "cancelled"] | None = None,
    project: str | None = Query(None, max_length=validation.MAX_TEXT),
    kind: Literal["test", "full", "eval"] | None = None,
    search: str | None = Query(None, max_length=200, description="Runs whose id, name or command holds this text."),
    sort: Literal["created", "name", "state", "project"] = Query("created", description="The order, newest first "
                                                                "for `created`, else ascending."),
    offset: int = Query(0, ge=0, le=10_000_000, description="Skip this many runs (pages of `limit`)."),
    limit: int = Query(100, ge=1, le=10_000),
) -> list[dict[str, Any]]:
    count = select(func.count()).where(attempts.c.run_id == runs.c.run_id).scalar_subquery()
    order = {"created": (runs.c.created_at.desc(), runs.c.run_id.desc()), "name": (runs.c.name, runs.c.run_id),
             "state": (runs.c.state, runs.c.created_at.desc()), "project": (runs.c.project, runs.c.created_at.desc())}
    query = select(runs, count.label("attempt_count")).order_by(*order[sort])
    if search:
        # A literal text, never a pattern: % and _ typed by a person match themselves.
        needle = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        query = query.where(runs.c.run_id.like(needle, escape="\\") | runs.c.name.like(needle, escape="\\")
                            | runs.c.command.like(needle, escape="\\"))
    if state:
        query = query.where(runs.c.state == state)
    if project:
        query = query.where(runs.c.project == project)
    query = query.where(runs.c.kind == kind) if kind else query.where(runs.c.kind != "eval")
    with request.app.state.ledger.read() as conn:
        rows = conn.execute(query.offset(offset).limit(limit)).mappings().all()
        return [{**_summary(r), "last_metric": _last_metric(conn, r["run_id"])} for r in rows]


def _last_metric(conn, run_id: str) -> dict[str, Any] | None:
    """The run's newest `loss` point (else of its first key): what a runs list shows beside the state."""
    keys = dict(conn.execute(
        select(metric_series.c.key, metric_series.c.series_id)
        .where(metric_series.c.run_id == run_id, metric_series.c.rank == 0)  # rank 0's, as everywhere by default
    ).all())
    if not keys:
        return None
    key = "loss" if "loss" in keys else sorted(keys)[0]
    row = conn.execute(
        select(metric_points.c.step, metric_points.c.value).where(metric_points.c.series_id == keys[key])
        .order_by(metric_points.c.step.desc()).limit(1)
    ).first()
    return {"key": key, "step": row[0], "value": row[1]} if row else None


@router.get("/{job_id}")
def get_job(job_id: str, request: Request) -> dict[str, Any]:
    with request.app.state.ledger.read() as conn:
        run = resolve_run(conn, job_id)
        tried = conn.execute(
            select(attempts).where(attempts.c.run_id == run["run_id"]).order_by(attempts.c.attempt_number)
        ).mappings().all()
        from trackway.reports.explain import events_lost

        lost = events_lost(conn, run["run_id"])
    from trackway.experiments.expectation_verdicts import verdict_of

    return {**_summary({**run, "attempt_count": len(tried)}), "expectations": verdict_of(dict(run)),
            "attempts": [_attempt(a, lost.get(a["attempt_id"], [])) for a in tried]}


@router.get("/{job_id}/logs", response_class=StreamingResponse,
            responses={200: {"content": {"text/plain": {}}, "description": "The job's output, attempt by attempt."}})
def job_logs(
    job_id: str, request: Request,
    follow: bool = Query(False, description="Keep streaming across the job's attempts until it ends."),
    tail: int | None = Query(None, ge=1, le=MAX_TAIL, description="Only the last N lines (of what is there now)."),
) -> StreamingResponse:
    ledger = request.app.state.ledger
    with ledger.read() as conn:
        run_id = resolve_run(conn, job_id)["run_id"]
    stream = _log_stream(ledger, request.app.state.settings, run_id, follow, tail)
    return StreamingResponse(stream, media_type="text/plain; charset=utf-8")


@router.post("/{job_id}/cancel", status_code=202)
def cancel_job(job_id: str, request: Request) -> dict[str, Any]:
    """End a job's attempts (as `trackway cancel`); needs a token with the role `submit`."""
    need(request, "submit")
    state = request.app.state
    with state.ledger.read() as conn:
        run_id = resolve_run(conn, job_id)["run_id"]
    cancelling = state.supervisor.cancel(run_id)
    return {"id": run_id, "cancelling": cancelling}


# -- shapes ---------------------------------------------------------------------------------------


def _summary(run) -> dict[str, Any]:
    return {
        "id": run["run_id"], "name": run["name"], "project": run["project"], "kind": run["kind"],
        "status": run["state"], "termination_reason": run["termination_reason"], "attempts": run["attempt_count"],
        "resource": run["resource"], "gpu_count": run["gpus"],
        "nodes": run["nodes"] or 1, "command": redact_argv(json.loads(run["command"])),
        "created_at": run["created_at"], "ended_at": run["ended_at"],
        # An agent's run waiting for `trackway approve` (agents/approval.py): awaiting, approved, refused or null.
        "approval": run.get("approval"), "submitted_by": run.get("submitted_by"),
    }


def _attempt(a, events_lost: list[str]) -> dict[str, Any]:
    """An attempt as the API shows it; `events_lost`: ranges of its events that never arrived (its resume not known)."""
    decision = json.loads(a["retry_decision"]) if a["retry_decision"] else None
    return {
        "attempt_id": a["attempt_id"], "number": a["attempt_number"], "state": a["state"],
        "termination_reason": a["termination_reason"], "exit_code": a["exit_code"], "signal": a["signal"],
        "started_at": a["started_at"], "ended_at": a["ended_at"], "resource": a["resource"], "host": a["host"],
        "gpu_ids": a["gpu_ids"], "first_step": a["first_step"], "last_step": a["last_step"],
        "resumed_from": a["resumed_from_checkpoint"], "events_lost": events_lost, "started_by": a["started_by"],
        "decision": decision,
    }


# -- logs -----------------------------------------------------------------------------------------


async def _log_stream(ledger, settings, run_id: str, follow: bool, tail: int | None) -> AsyncIterator[bytes]:
    """The run's attempts' output in order, a separator line before each; with `follow`, until the run has ended.

    With `tail`, the last N lines of what is there now come first (across attempts, separators
    included); following then goes on from the end of the newest attempt's log. An async generator:
    a follower waits on the event loop, and each read borrows a pool thread only for its length.

    Redacted line by line as the ledger's records are (redaction.LogRedactor): any `read` token
    reads this, and a script prints its token or `$MY_PASSWORD` as easily as its loss. A line is
    sent once it is whole, its last unfinished one once its attempt has ended.
    """
    known = await run_in_threadpool(_secret_values, ledger, settings, run_id)
    number, offset, redactor = 0, 0, LogRedactor(known)
    tried = (await run_in_threadpool(_attempts, ledger, run_id))[1]
    if tail is not None:
        text, number, offset, redactor = await run_in_threadpool(_last_lines, run_id, tried, tail, known)
        yield text
    if not follow and tail is not None:
        return
    while True:
        run_state, tried = await run_in_threadpool(_attempts, ledger, run_id)
        for attempt_number, log_path, attempt_state in tried:
            if attempt_number < number:
                continue
            if attempt_number != number:
                number, offset, redactor = attempt_number, 0, LogRedactor(known)
                yield _separator(run_id, attempt_number)
            ended = attempt_state == "ended"
            read, text = await run_in_threadpool(_read_redacted, Path(log_path), offset, redactor, ended)
            offset += read
            if text:
                yield text
            if not ended:
                break  # its successor, if any, is read once it has ended
        everything = bool(tried) and tried[-1][0] == number and tried[-1][2] == "ended"
        if not follow or (RunState(run_state).is_terminal() and everything):
            return
        await asyncio.sleep(FOLLOW_INTERVAL_S)


def _secret_values(ledger, settings, run_id: str) -> tuple[str, ...]:
    from trackway.supervisor.launch import run_secret_values

    with ledger.read() as conn:
        return run_secret_values(conn, settings, resolve_run(conn, run_id))


def _read_redacted(path: Path, offset: int, redactor: LogRedactor, ended: bool) -> tuple[int, bytes]:
    """(bytes read after `offset`, what of them may be sent); an ended attempt's last line goes too."""
    chunk = read_from(path, offset)
    return len(chunk), redactor.feed(chunk) + (redactor.end() if ended else b"")


def _attempts(ledger, run_id: str) -> tuple[str, list[tuple[int, str, str]]]:
    with ledger.read() as conn:
        state = conn.execute(select(runs.c.state).where(runs.c.run_id == run_id)).scalar()
        tried = conn.execute(
            select(attempts.c.attempt_number, attempts.c.log_path, attempts.c.state)
            .where(attempts.c.run_id == run_id).order_by(attempts.c.attempt_number)
        ).all()
    return state, [tuple(row) for row in tried]


def _last_lines(run_id: str, tried, count: int, known: Sequence[str]) -> tuple[bytes, int, int, LogRedactor]:
    """The last `count` lines across the attempts' logs and their separators, redacted, reading back from the newest
    attempt only as far as it takes; and where following goes on: the newest attempt, its offset and redactor.

    Each log is read from KEY_CONTEXT_LINES before where its last lines begin: a private key's
    body lines are masked only when its BEGIN line is seen.
    """
    kept: list[bytes] = []
    newest: tuple[int, int, LogRedactor] = (0, 0, LogRedactor(known))
    for attempt_number, log_path, attempt_state in reversed(tried):
        path, wanted = Path(log_path), count - len(kept)
        start = tail_offset(path, wanted + KEY_CONTEXT_LINES)
        redactor = LogRedactor(known)
        read, text = _read_redacted(path, start, redactor, attempt_state == "ended")
        if attempt_number == tried[-1][0]:
            newest = (attempt_number, start + read, redactor)
        kept[:0] = text.splitlines(keepends=True)[-wanted:]
        kept.insert(0, _separator(run_id, attempt_number))
        if len(kept) >= count:
            break
    return b"".join(kept[-count:]), *newest


def _separator(run_id: str, number: int) -> bytes:
    return f"=== {run_id}/{number} ===\n".encode()
