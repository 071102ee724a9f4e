"""Requesting evaluations: pin a committed checkpoint, compute the versions, queue one run of kind eval per seed.

An evaluation is identified by what decides its result: the checkpoint (run, step and manifest
hash), the evaluator's version, the task set's version, the command, the decoding parameters and
the output mapping (`[output]`). Asking again for the same identity and the same seeds is a
repeat: nothing runs, and the existing evaluation is returned. More seeds for the same identity
extend the existing evaluation.

The versions are computed again when each seed attempt launches (supervisor/launch.py): a seed
whose evaluator or task set changed since its evaluation was requested is never run under it.
A retry the policy decided continues as the evaluation of the new versions (found or made:
`evals.progress.continue_as_new_evaluation`); a person's `trackway resume` of the seed is refused, pointing at
`trackway eval RUN@STEP --spec FILE`. What ran under the old versions stays filed under them.

Each seed is its own run (kind `eval`) with its own attempts, retried by the supervisor's policy
(`evaluator_crash`: budget 2) and never touching the training run.

A spec in two phases (`[inference]`, `[scoring]`) gives each seed two runs: its inference run
(queued now, on the inference phase's resource and GPUs) and, once that committed its outputs
(evals/phases.py), its scoring run (on the scoring phase's resource), with their own attempts and
retry budgets: a scorer that crashes is retried against the same outputs and never generates again.
The generation has an identity of its own (`inference_key`: the checkpoint, the inference version,
command and server, the task set and the decoding); a seed whose outputs were already committed
under the same key (another scorer, another rubric) is scored from them at once
(`trackway eval rescore EVAL --spec FILE`). A `[judge]` (its model and version or its code hash, the
rubric's hash, its decoding) is part of the evaluation's identity.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from trackway.checkpoints.store import CheckpointStore
from trackway.errors import InputError, NotFound, TrackwayError
from trackway.evals.records import (
    FAILED,
    IN_FLIGHT,
    SEED_FAILED,
    SEED_PENDING,
    new_eval_id,
    store_spec,
)
from trackway.evals.spec import EvalSpec, spec_from_record
from trackway.ledger import Ledger
from trackway.ledger.blobs import get_blob
from trackway.ledger.records import insert_run, latest_attempt, name_taken, new_run_id, resolve_run
from trackway.ledger.schema import (
    attempts,
    checkpoints,
    evaluation_seeds,
    evaluations,
    run_eval_specs,
    runs,
)
from trackway.receipts.canonical import canonical_json, sha256_hex
from trackway.settings import Settings
from trackway.taxonomy import RunKind, RunState
from trackway.validation import MAX_TEXT

from trackway.evals.outputs import PARAMS_FILE  # noqa: E402  (one name for the writer and the reader)
from trackway.evals.phases import PHASE_ENV  # noqa: E402

RUN_CONFIG_FILE = "run-config.json"  # the training config the checkpoint was made with ($TRACKWAY_RUN_CONFIG)


@dataclass
class EvalRequest:
    """What a request for an evaluation led to."""

    eval_id: str
    queued_seeds: list[int] = field(default_factory=list)
    repeat: bool = False  # the same checkpoint, versions, decoding and seeds were evaluated before
    held_back_seeds: list[int] = field(default_factory=list)  # escalation: run only if the first seeds clear


@dataclass(frozen=True)
class PinnedCheckpoint:
    run_id: str
    step: int
    name: str
    path: str  # a directory under the run's checkpoints, or its URL in the run's object store
    manifest_sha256: str


def pin_checkpoint(settings: Settings, run: RowMapping, step: int | None) -> PinnedCheckpoint:
    """The committed checkpoint `step` of `run` (its newest when None), as storage holds it now.

    A run with a checkpoint_root is pinned in its object store (the URL is what the evaluator
    gets: it may run on another machine); any other run under trackway's home.
    """
    label = run["name"] or run["run_id"]
    if run["checkpoint_root"]:
        return _pin_remote(run, step, label)
    store = CheckpointStore(settings.runs_dir / run["run_id"] / "checkpoints")
    if step is None:
        info = store.latest_committed(verify_files=False) if store.root.is_dir() else None
        if info is None:
            raise NotFound(f"CHECKPOINT {label}: the run has no committed checkpoint")
    else:
        info = store.get(step) if store.root.is_dir() else None
        if info is None or not info.state.readable:
            held = [c.step for c in store.list() if c.state.readable] if store.root.is_dir() else []
            state = f"is {info.state.value}" if info is not None else "does not exist"
            raise NotFound(f"CHECKPOINT {label}@{step}: {state}; committed steps: {held or 'none'}")
    manifest = (info.path / "MANIFEST.json").read_bytes()
    return PinnedCheckpoint(run["run_id"], info.step, info.name, str(info.path), sha256_hex(manifest))


def _pin_remote(run: RowMapping, step: int | None, label: str) -> PinnedCheckpoint:
    from trackway.checkpoints.object_store import RemoteCheckpointStore

    store = RemoteCheckpointStore(run["checkpoint_root"])
    if step is None:
        info = store.latest_committed(verify=True)
        if info is None:
            raise NotFound(f"CHECKPOINT {label}: the run has no committed checkpoint in {store.url}")
    else:
        info = store.get(step)
        if info is None or not info.state.readable:
            held = [c.step for c in store.list() if c.state.readable]
            state = f"is {info.state.value}" if info is not None else "does not exist"
            raise NotFound(f"CHECKPOINT {label}@{step}: {state} in {store.url}; committed steps: {held or 'none'}")
    return PinnedCheckpoint(run["run_id"], info.step, info.name, info.url, info.manifest_sha256)


def eval_key(checkpoint: PinnedCheckpoint, spec: EvalSpec, evaluator_version: str, task_set_version: str,
             judge: dict | None = None) -> str:
    """The evaluation's identity; `judge` is the spec's judge identity (read now when not given)."""
    identity: dict = {
        "run_id": checkpoint.run_id,
        "step": checkpoint.step,
        "checkpoint_manifest_sha256": checkpoint.manifest_sha256,
        "evaluator_version": evaluator_version,
        "task_set_sha256": task_set_version,
        "command": spec.command,
        "decoding": spec.decoding,
        "gpus": spec.gpus,
    }
    if spec.output_fields:
        # How the output lines are read decides the result as much as the evaluator does. Only when
        # given, so that evaluations of specs without a mapping keep the identities they had.
        identity["output"] = spec.output_fields
    if spec.two_phase:
        assert spec.inference is not None and spec.scoring is not None
        identity["inference"] = _inference_identity(spec)
        identity["scoring"] = {"command": spec.scoring.command}
    judge = judge if judge is not None else spec.judge_identity()
    if judge is not None:
        identity["judge"] = judge
    return sha256_hex(canonical_json(identity))


def _inference_identity(spec: EvalSpec) -> dict:
    assert spec.inference is not None
    return {"command": spec.inference.command, "server": spec.inference.server,
            "health_url": spec.inference.health_url, "gpus": spec.inference.gpus}


def inference_key(checkpoint: PinnedCheckpoint, spec: EvalSpec, inference_version: str, task_set_version: str) -> str:
    """The identity of a two-phase evaluation's generation alone: equal keys, interchangeable outputs."""
    return sha256_hex(canonical_json({
        "run_id": checkpoint.run_id,
        "step": checkpoint.step,
        "checkpoint_manifest_sha256": checkpoint.manifest_sha256,
        "inference_version": inference_version,
        "task_set_sha256": task_set_version,
        "decoding": spec.decoding,
        **_inference_identity(spec),
    }))


@dataclass(frozen=True)
class VersionChange:
    """A seed's evaluation was requested with (evaluator, task set) `before`; the files say `after` now."""

    eval_id: str
    before: tuple[str, str]
    after: tuple[str, str]
    judge_changed: bool = False  # the judge (its code, model or version) or its rubric: the pinned judge is gone

    def text(self) -> str:
        parts = ["judge or rubric changed"] if self.judge_changed else []
        if self.before[0] != self.after[0]:
            parts.append(f"evaluator {_short(self.before[0])} → {_short(self.after[0])}")
        if self.before[1] != self.after[1]:
            parts.append(f"task set {_short(self.before[1])} → {_short(self.after[1])}")
        return ", ".join(parts)


def _short(version: str) -> str:
    kind, _, digest = version.rpartition(":")
    return f"{kind}:{digest[:12]}" if kind else version[:12]


def seed_version_change(conn: Connection, eval_run_id: str) -> VersionChange | None:
    """Whether the evaluator, task set or judge of the seed run's evaluation changed since it was requested, read now.

    None for a run that is no evaluation's seed, for unchanged versions, and when the files cannot
    be read (the launch then fails on its own, saying so).
    """
    row = conn.execute(
        select(evaluations.c.eval_id, evaluations.c.spec_sha256, evaluations.c.evaluator_version,
               evaluations.c.task_set_sha256, evaluations.c.judge)
        .join(evaluation_seeds, evaluation_seeds.c.eval_id == evaluations.c.eval_id)
        .where(evaluation_seeds.c.eval_run_id == eval_run_id)
    ).first()
    if row is None:
        return None
    spec = spec_from_record(json.loads(get_blob(conn, row.spec_sha256)))
    try:
        after = (spec.evaluator_version(), spec.task_set_version())
        judge = spec.judge_identity()
    except InputError:
        return None
    before = (row.evaluator_version, row.task_set_sha256)
    judge_changed = row.judge is not None and (judge is None or canonical_json(judge).decode() != row.judge)
    return VersionChange(row.eval_id, before, after, judge_changed) if after != before or judge_changed else None


def seeds_for(spec: EvalSpec, count: int | None) -> list[int]:
    """The spec's seeds, or its first `count`.

    Never more than the spec lists: a seed it does not name would be an evaluation nobody
    specified, aggregated with the ones they did.
    """
    if count is None:
        return list(spec.seeds)
    if not 1 <= count <= len(spec.seeds):
        raise InputError(
            f"--seeds {count}: expected a whole number from 1 to {len(spec.seeds)}; "
            f"{spec.name} lists the seeds {', '.join(str(s) for s in spec.seeds)}"
        )
    return list(spec.seeds[:count])


def request_evaluation(
    ledger: Ledger,
    settings: Settings,
    run_ref: str,
    step: int | None,
    spec: EvalSpec,
    seed_count: int | None = None,
    trigger: str = "on_demand",
    pinned: PinnedCheckpoint | None = None,
    seeds: list[int] | None = None,
) -> EvalRequest:
    """Evaluate a committed checkpoint with `spec`; see the module docstring for repeats and seeds.

    With the spec's escalation and no `seed_count`, only the first seeds are queued; the rest
    wait for the first ones' result (evals/progress.py). `pinned` is the checkpoint as an earlier
    evaluation pinned it (a rescore: not read from storage again), `seeds` the seeds to ask for.
    """
    with ledger.read() as conn:
        run = resolve_run(conn, run_ref)
    if run["kind"] == RunKind.EVAL.value:
        raise InputError(f"CHECKPOINT {run_ref}: is an evaluation run; evaluate a training run's checkpoint")
    checkpoint = pinned or pin_checkpoint(settings, run, step)
    evaluator_version, task_set_version = spec.evaluator_version(), spec.task_set_version()
    judge = spec.judge_identity()
    key = eval_key(checkpoint, spec, evaluator_version, task_set_version, judge)
    generation = (inference_key(checkpoint, spec, spec.inference_version(), task_set_version)
                  if spec.two_phase else None)
    wanted = list(seeds) if seeds is not None else seeds_for(spec, seed_count)
    escalate = spec.escalation is not None and seed_count is None and seeds is None
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        existing = conn.execute(select(evaluations).where(evaluations.c.eval_key == key)).mappings().first()
        if existing is not None:
            have = {int(s) for s in conn.execute(
                select(evaluation_seeds.c.seed).where(evaluation_seeds.c.eval_id == existing["eval_id"])).scalars()}
            escalation = json.loads(existing["escalation"]) if existing["escalation"] else None
            if escalation is not None and seed_count is None and seeds is None:
                # The escalation decided (or will decide) which of the spec's seeds run: not a new request.
                wanted = [s for s in wanted if s in have]
            missing = [s for s in wanted if s not in have]
            if existing["state"] == FAILED:
                # Asked again after its seeds failed (say, a dataset mount was fixed): each failed seed's
                # run gets one more attempt; what completed stays.
                retried = requeue_failed_seeds(conn, existing["eval_id"])
                if escalation is not None and escalation.get("value") is None:
                    escalation["decided"] = None  # it was held for want of a result: judge the retried seeds
                conn.execute(update(evaluations).where(evaluations.c.eval_id == existing["eval_id"])
                             .values(state=IN_FLIGHT, ended_at=None,
                                     escalation=json.dumps(escalation) if escalation is not None else None))
                if missing:
                    queue_seeds(conn, settings, existing, run, missing, now)
                return EvalRequest(existing["eval_id"], queued_seeds=sorted(retried + missing))
            if not missing:
                return EvalRequest(existing["eval_id"], repeat=True)
            queue_seeds(conn, settings, existing, run, missing, now)
            conn.execute(update(evaluations).where(evaluations.c.eval_id == existing["eval_id"])
                         .values(state=IN_FLIGHT, ended_at=None))
            return EvalRequest(existing["eval_id"], queued_seeds=missing)
        first = wanted[: spec.escalation.first_seeds] if escalate and spec.escalation else wanted
        eval_id = new_eval_id()
        values = dict(
            eval_id=eval_id,
            run_id=run["run_id"],
            checkpoint_step=checkpoint.step,
            checkpoint_name=checkpoint.name,
            checkpoint_path=str(checkpoint.path),
            checkpoint_manifest_sha256=checkpoint.manifest_sha256,
            spec_name=spec.name,
            spec_sha256=store_spec(conn, spec),
            evaluator_version=evaluator_version,
            task_set_sha256=task_set_version,
            decoding=json.dumps(spec.decoding, sort_keys=True),
            primary_metric=spec.metrics[0],
            eval_key=key,
            trigger=trigger,
            state=IN_FLIGHT,
            escalation=json.dumps({"condition": spec.escalation.condition, "first_seeds": first,
                                   "held_back": wanted[len(first):], "decided": None}) if escalate and spec.escalation else None,
            created_at=now,
            inference_key=generation,
            judge=canonical_json(judge).decode() if judge is not None else None,
        )
        conn.execute(insert(evaluations).values(**values))
        queue_seeds(conn, settings, values, run, first, now)
    return EvalRequest(eval_id, queued_seeds=first, held_back_seeds=wanted[len(first):])


def requeue_failed_seeds(conn: Connection, eval_id: str) -> list[int]:
    """Put the runs of an evaluation's failed seeds back on the retry queue; return those seeds."""
    failed = list(conn.execute(
        select(evaluation_seeds).where(evaluation_seeds.c.eval_id == eval_id, evaluation_seeds.c.state == SEED_FAILED)
    ).mappings())
    for row in failed:
        conn.execute(update(runs).where(runs.c.run_id == row["eval_run_id"])
                     .values(state=RunState.QUEUED.value, not_before=None, ended_at=None))
        conn.execute(update(evaluation_seeds)
                     .where(evaluation_seeds.c.eval_id == eval_id, evaluation_seeds.c.seed == row["seed"])
                     .values(state=SEED_PENDING, termination_reason=None, ended_at=None))
    return [int(row["seed"]) for row in failed]


def queue_seeds(conn: Connection, settings: Settings, evaluation, run: RowMapping, seeds: list[int], now: datetime) -> None:
    """One queued run of kind eval per seed; the supervisor starts them (`[evals] max_running` at once).

    In two phases, each seed's run is its inference run; a seed whose outputs were committed under
    the same generation (`inference_key`) before gets its scoring run at once instead.
    """
    spec = spec_from_record(json.loads(get_blob(conn, evaluation["spec_sha256"])))
    config = training_config(conn, run, evaluation["checkpoint_path"])
    for seed in seeds:
        stored = stored_outputs(conn, evaluation.get("inference_key"), seed) if spec.two_phase else None
        if stored is not None:
            scoring_run_id = queue_scoring(conn, settings, evaluation, seed, stored["inference_outputs"], now)
            conn.execute(insert(evaluation_seeds).values(
                eval_id=evaluation["eval_id"], seed=seed, eval_run_id=scoring_run_id, state=SEED_PENDING,
                created_at=now, inference_run_id=stored["inference_run_id"],
                inference_outputs=stored["inference_outputs"],
                inference_manifest_sha256=stored["inference_manifest_sha256"]))
            continue
        phase = spec.inference if spec.two_phase else None
        eval_run_id = new_run_id()
        params_path = settings.runs_dir / eval_run_id / PARAMS_FILE
        params = {**seed_params(evaluation, spec, seed), "checkpoint": evaluation["checkpoint_path"]}
        params_path.parent.mkdir(parents=True, exist_ok=True)
        params_path.write_text(json.dumps(params, indent=2, sort_keys=True))
        config_path = params_path.parent / RUN_CONFIG_FILE
        if config is not None:
            config_path.write_bytes(config)
        env = {
            "TRACKWAY_EVAL_ID": evaluation["eval_id"],
            "TRACKWAY_CHECKPOINT": evaluation["checkpoint_path"],
            "TRACKWAY_EVAL_STEP": str(evaluation["checkpoint_step"]),
            "TRACKWAY_EVAL_SEED": str(seed),
            "TRACKWAY_EVAL_DECODING": json.dumps(spec.decoding, sort_keys=True),
            "TRACKWAY_EVAL_PARAMS": str(params_path),
        }
        if spec.task_set is not None:
            env["TRACKWAY_EVAL_TASKS"] = str(spec.task_set)
        if config is not None:
            env["TRACKWAY_RUN_CONFIG"] = str(config_path)
        for key, value in spec.decoding.items():
            env[f"TRACKWAY_DECODING_{key.upper()}"] = json.dumps(value) if not isinstance(value, str) else value
        if phase is not None:
            env[PHASE_ENV] = phase.name
        resource = (phase.resource if phase is not None else spec.resource) or run["resource"]
        time_limit = phase.time_limit_hours if phase is not None else spec.time_limit_hours
        name = seed_run_name(conn, run, int(evaluation["checkpoint_step"]), evaluation["spec_name"], seed,
                             phase.name if phase is not None else None)
        insert_run(
            conn,
            dict(
                run_id=eval_run_id,
                name=name,
                project=run["project"],
                model_family=run["model_family"],
                kind=RunKind.EVAL.value,
                state=RunState.QUEUED.value,
                command=json.dumps(_seed_command(settings, spec, evaluation["checkpoint_path"], run["resource"])),
                workdir=str(spec.workdir),
                resource=resource,
                executor=settings.resource(resource).executor,
                gpus=phase.gpus if phase is not None else spec.gpus,
                time_limit_s=time_limit * 3600 if time_limit else None,
                created_at=now,
                env=json.dumps(env, sort_keys=True),
                # The evaluator runs with the environment its training run was submitted with.
                environ_sha256=run["environ_sha256"],
            ),
        )
        conn.execute(
            insert(evaluation_seeds).values(
                eval_id=evaluation["eval_id"], seed=seed, eval_run_id=eval_run_id, state=SEED_PENDING, created_at=now,
                inference_run_id=eval_run_id if phase is not None else None,
            )
        )


def stored_outputs(conn: Connection, generation: str | None, seed: int) -> RowMapping | None:
    """A seed's inference outputs committed under the generation `generation` by any evaluation, if there are."""
    if generation is None:
        return None
    return conn.execute(
        select(evaluation_seeds.c.inference_run_id, evaluation_seeds.c.inference_outputs,
               evaluation_seeds.c.inference_manifest_sha256)
        .join(evaluations, evaluations.c.eval_id == evaluation_seeds.c.eval_id)
        .where(evaluations.c.inference_key == generation, evaluation_seeds.c.seed == seed,
               evaluation_seeds.c.inference_outputs.is_not(None))
        .order_by(evaluation_seeds.c.created_at)
    ).mappings().first()


def queue_scoring(conn: Connection, settings: Settings, evaluation, seed: int, outputs: str, now: datetime) -> str:
    """Queue the scoring run of an evaluation's seed, reading the inference outputs committed at `outputs`; its id.

    The caller names it as the seed's run (`eval_run_id`): what ends it ends the seed.
    """
    spec = spec_from_record(json.loads(get_blob(conn, evaluation["spec_sha256"])))
    assert spec.scoring is not None
    run = resolve_run(conn, evaluation["run_id"])
    scoring_run_id = new_run_id()
    params_path = settings.runs_dir / scoring_run_id / PARAMS_FILE
    params = {
        **seed_params(evaluation, spec, seed),
        "inference_outputs": outputs,
        "judge": spec.judge.record() if spec.judge is not None else None,
    }
    params_path.parent.mkdir(parents=True, exist_ok=True)
    params_path.write_text(json.dumps(params, indent=2, sort_keys=True))
    env = {
        "TRACKWAY_EVAL_ID": evaluation["eval_id"],
        "TRACKWAY_EVAL_STEP": str(evaluation["checkpoint_step"]),
        "TRACKWAY_EVAL_SEED": str(seed),
        "TRACKWAY_EVAL_DECODING": json.dumps(spec.decoding, sort_keys=True),
        "TRACKWAY_EVAL_PARAMS": str(params_path),
        "TRACKWAY_EVAL_INFERENCE_OUTPUTS": outputs,
        PHASE_ENV: spec.scoring.name,
    }
    if spec.task_set is not None:
        env["TRACKWAY_EVAL_TASKS"] = str(spec.task_set)
    if spec.judge is not None:
        env["TRACKWAY_EVAL_JUDGE"] = json.dumps(spec.judge.record(), sort_keys=True)
        env["TRACKWAY_EVAL_JUDGE_RUBRIC"] = str(spec.judge.rubric)
    resource = spec.scoring.resource or run["resource"]
    limit = spec.scoring.time_limit_hours
    insert_run(conn, dict(
        run_id=scoring_run_id,
        name=seed_run_name(conn, run, int(evaluation["checkpoint_step"]), evaluation["spec_name"], seed, "scoring"),
        project=run["project"],
        model_family=run["model_family"],
        kind=RunKind.EVAL.value,
        state=RunState.QUEUED.value,
        command=json.dumps(list(spec.scoring.command)),
        workdir=str(spec.workdir),
        resource=resource,
        executor=settings.resource(resource).executor,
        gpus=spec.scoring.gpus,
        time_limit_s=limit * 3600 if limit else None,
        created_at=now,
        env=json.dumps(env, sort_keys=True),
        environ_sha256=run["environ_sha256"],
    ))
    return scoring_run_id


def _seed_command(settings: Settings, spec: EvalSpec, checkpoint_path: str, training_resource: str) -> list[str]:
    """The evaluator's (or the inference phase's) command; for a checkpoint in an object store, started through
    checkpoints/fetch.py; with an inference server, through evals/serve.py.

    The fetch step downloads and verifies the checkpoint where the seed runs, so the evaluator
    reads a local directory in $TRACKWAY_CHECKPOINT wherever that is. The serve step starts the
    model server there, waits until it answers and stops it after. On another machine it runs
    as `python3` from the host's PATH (the resource's `setup` activates an environment with
    trackway); here, with this interpreter.
    """
    import sys

    from trackway.executors.registry import is_remote

    phase = spec.inference if spec.two_phase else None
    command = list(phase.command if phase is not None else spec.command)
    resource = settings.resource((phase.resource if phase is not None else spec.resource) or training_resource)
    python = "python3" if is_remote(resource.executor) else sys.executable
    if phase is not None and phase.server is not None:
        command = [python, "-m", "trackway.evals.serve", "--server", json.dumps(phase.server),
                   "--health-url", phase.health_url or "", "--timeout", f"{phase.server_start_timeout_s:g}",
                   "--", *command]
    if "://" not in checkpoint_path:
        return command
    return [python, "-m", "trackway.checkpoints.fetch", "--", *command]


def training_config(conn: Connection, run: RowMapping, checkpoint_path: str) -> bytes | None:
    """The config (JSON) the checkpoint's training attempt ran with; the run's config when the attempt has none.

    The attempt is the one the checkpoint's manifest names (storage is the truth for checkpoints),
    else the one the ledger's checkpoint row names. None when the run was submitted without a config.
    """
    attempt_id = None
    try:
        if "://" in checkpoint_path:
            from trackway.checkpoints.layout import parse_step
            from trackway.checkpoints.object_store import RemoteCheckpointStore

            parent, _, name = checkpoint_path.rpartition("/")
            remote = RemoteCheckpointStore(parent).get(parse_step(name) or -1)
            attempt_id = (remote.manifest or {}).get("attempt_id") if remote is not None else None
        else:
            attempt_id = json.loads((Path(checkpoint_path) / "MANIFEST.json").read_text()).get("attempt_id")
    except (OSError, ValueError, AttributeError, TrackwayError):
        pass
    if attempt_id is None:
        attempt_id = conn.execute(select(checkpoints.c.attempt_id).where(
            checkpoints.c.run_id == run["run_id"], checkpoints.c.path == str(checkpoint_path))).scalar()
    digests = []
    if attempt_id is not None:
        digests.append(conn.execute(select(attempts.c.config_sha256).where(attempts.c.attempt_id == attempt_id)).scalar())
    digests.append(run["config_sha256"])
    for digest in digests:
        if not digest:
            continue
        try:
            content = get_blob(conn, digest)
        except (LookupError, NotFound):
            continue
        try:
            json.loads(content)
        except ValueError:
            continue
        return content
    return None


def seed_run_name(conn: Connection, run: RowMapping, step: int, spec_name: str, seed: int,
                  phase: str | None = None) -> str:
    """`RUN@STEP/SPEC/seed-N` (`/inference`, `/scoring` for a phase's run), the name a seed's run is listed by
    (RUN: the training run's name, else its id).

    A person's run name holds neither '@' nor '/', so this never takes one. The same checkpoint,
    spec and seed evaluated again (a changed evaluator) gets `~2`, `~3`: names are unique.
    """
    tail = f"/{phase}" if phase else ""
    base = f"{run['name'] or run['run_id']}@{step}/{spec_name}/seed-{seed}{tail}"
    if len(base) > MAX_TEXT - 8:  # room for `~N` within the name column
        base = f"{run['run_id']}@{step}/{spec_name}/seed-{seed}{tail}"
    name, n = base, 1
    while name_taken(conn, name):
        n += 1
        name = f"{base}~{n}"
    return name


def evaluate_new_checkpoints(ledger: Ledger, settings: Settings) -> tuple[list[EvalRequest], list[tuple[str, str]]]:
    """Request the evaluations that runs' attached specs call for on checkpoints committed since the last look.

    Returns the requests and, for each that could not be made, (training attempt, why): a missing
    evaluator file or a checkpoint already gone is said, not swallowed.
    """
    newest = (
        select(func.max(checkpoints.c.step))
        .where(checkpoints.c.run_id == run_eval_specs.c.run_id, checkpoints.c.committed_at.is_not(None))
        .scalar_subquery()
    )
    with ledger.read() as conn:
        attached = list(conn.execute(
            select(run_eval_specs).where(
                run_eval_specs.c.trigger != "on_demand",
                and_(newest.is_not(None), func.coalesce(run_eval_specs.c.considered_step, -1) < newest),
            )
        ).mappings())
    requests: list[EvalRequest] = []
    problems: list[tuple[str, str]] = []
    for row in attached:
        with ledger.read() as conn:
            spec = spec_from_record(json.loads(get_blob(conn, row["spec_sha256"])))
            committed = select(checkpoints.c.step).where(
                checkpoints.c.run_id == row["run_id"], checkpoints.c.committed_at.is_not(None))
            root = conn.execute(select(runs.c.checkpoint_root).where(runs.c.run_id == row["run_id"])).scalar()
            if root:
                # In an object store a checkpoint is evaluable once uploaded (its row then holds its URL).
                committed = committed.where(checkpoints.c.path.startswith(root + "/", autoescape=True))
            steps = list(conn.execute(committed.order_by(checkpoints.c.step)).scalars())
            last = latest_attempt(conn, row["run_id"])
        if not steps:
            continue
        considered = row["considered_step"] if row["considered_step"] is not None else -1
        for ordinal, step in enumerate(steps, start=1):
            if step <= considered or not spec.due_for_commit(ordinal):
                continue
            try:
                requests.append(request_evaluation(ledger, settings, row["run_id"], int(step), spec, trigger=spec.trigger))
            except IntegrityError:
                continue  # another supervisor requested the same evaluation a moment earlier
            except InputError as exc:
                problems.append((last["attempt_id"] if last is not None else row["run_id"],
                                 f"evaluation {spec.name} of step {step} not started: {exc}"))
        with ledger.write() as conn:
            conn.execute(
                update(run_eval_specs)
                .where(run_eval_specs.c.run_id == row["run_id"], run_eval_specs.c.name == row["name"])
                .values(considered_step=max(steps))
            )
    return requests, problems


def rescore_evaluation(ledger: Ledger, settings: Settings, eval_ref: str, spec: EvalSpec) -> EvalRequest:
    """Score the inference outputs an evaluation committed with `spec`'s scorer (and judge): no generation, no GPU.

    The spec's generation must be the one that made the outputs (same inference version, command,
    server, task set and decoding): scoring outputs a spec did not generate would file a result
    under versions that never produced it. The result is the evaluation of `spec`'s identity (a
    repeat when it exists already), of the seeds whose outputs were committed.
    """
    from trackway.evals.records import resolve_evaluation

    if not spec.two_phase:
        raise InputError(f"--spec {spec.path}: expected a spec with [inference] and [scoring]; a rescore runs its "
                         f"scoring phase on stored inference outputs")
    with ledger.read() as conn:
        old = resolve_evaluation(conn, eval_ref)
        stored = [int(s) for s in conn.execute(
            select(evaluation_seeds.c.seed).where(evaluation_seeds.c.eval_id == old["eval_id"],
                                                  evaluation_seeds.c.inference_outputs.is_not(None))
            .order_by(evaluation_seeds.c.seed)).scalars()]
    if old["inference_key"] is None:
        raise InputError(f"evaluation {old['eval_id']}: ran in one command; it kept no inference outputs to score "
                         f"again (evaluate the checkpoint with `trackway eval RUN@STEP --spec FILE`)")
    if not stored:
        raise InputError(f"evaluation {old['eval_id']}: no seed's inference outputs were committed; nothing to score")
    pinned = PinnedCheckpoint(old["run_id"], int(old["checkpoint_step"]), old["checkpoint_name"],
                              old["checkpoint_path"], old["checkpoint_manifest_sha256"])
    generation = inference_key(pinned, spec, spec.inference_version(), spec.task_set_version())
    if generation != old["inference_key"]:
        raise InputError(
            f"--spec {spec.path}: its inference (version, command, server, task set or decoding) is not the one that "
            f"generated evaluation {old['eval_id']}'s outputs; a rescore scores only outputs the spec would have "
            f"generated (evaluate anew with `trackway eval RUN@STEP --spec FILE`)")
    return request_evaluation(ledger, settings, old["run_id"], int(old["checkpoint_step"]), spec,
                              trigger="rescore", pinned=pinned, seeds=stored)


def seed_params(evaluation, spec, seed: int) -> dict[str, Any]:
    """What every seed's params file says, one command or either phase: the evaluation, its pins and the seed."""
    return {
        "evaluation": evaluation["eval_id"],
        "step": int(evaluation["checkpoint_step"]),
        "seed": seed,
        "task_set": None if spec.task_set is None else str(spec.task_set),
        "decoding": spec.decoding,
        "evaluator_version": evaluation["evaluator_version"],
        "task_set_sha256": evaluation["task_set_sha256"],
        "output_fields": spec.output_fields,
    }
