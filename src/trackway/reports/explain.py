"""`trackway explain`: everything needed to understand a run and one of its attempts, from the ledger alone.

`explain()` gathers the facts as plain data (what `--json` prints: full hashes, every value):
the run, every attempt's timeline row, and one attempt in full, with what changed since the
attempt before it. `trackway.reports.explain_layout` lays them out for a person; it reads
nothing from the ledger.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from collections.abc import Mapping
from typing import Any

from trackway import display as d
from trackway.ledger.event_kinds import CONFLICTS_EVENT, PLACED_EVENT, QUEUED_EVENT, SUPERVISOR_RANK
from trackway.ledger.reader import Reader
from trackway.receipts import submitted_env
from trackway.settings.run_watchers import described as described_watchers
from trackway.receipts.config_diff import change_text, changes, flatten
from trackway.redaction import MASK, redact_argv, redact_structure
from trackway.reports.memory_facts import memory_facts
from trackway.supervisor.outside_sdk import visibility
from trackway.taxonomy import AttemptState, RunState
from trackway.taxonomy import TerminationReason as R


def _blob_json(reader: Reader, sha: str | None) -> Any:
    return json.loads(reader.blob(sha)) if sha else None


def config_diff(before: Any, after: Any) -> list[str]:
    """`key: old → new` for each flattened key whose value differs (values as JSON, as stored)."""
    return [change_text(c) for c in changes(before, after)]


def data_diff(before: Any, after: Any) -> list[str]:
    """Files added, removed or changed (by content) between two data manifests, with their sizes and hashes."""
    a = {f["path"]: f for f in (before or {}).get("files", [])}
    b = {f["path"]: f for f in (after or {}).get("files", [])}
    lines = [f"added {p} ({_sized(b[p])})" for p in sorted(b.keys() - a.keys())]
    lines += [f"removed {p} (was {_sized(a[p])})" for p in sorted(a.keys() - b.keys())]
    lines += [
        f"changed {p} ({_sized(a[p])} → {_sized(b[p])})"
        for p in sorted(a.keys() & b.keys())
        if a[p]["sha256"] != b[p]["sha256"]
    ]
    return lines


def _sized(entry: dict) -> str:
    size = entry.get("size")
    return f"{size:,} bytes, {d.short_hash(entry.get('sha256'))}" if isinstance(size, int) else d.short_hash(entry.get("sha256"))


def _evaluator_facts(reader: Reader, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """For an evaluation seed's attempt: the evaluator and task-set versions it ran (checked when it launched)."""
    from trackway.errors import NotFound
    try:
        evaluation = reader.evaluation(run["run_id"])
    except NotFound:
        return None
    spec = json.loads(reader.blob(evaluation["spec_sha256"]))
    return {"evaluator_version": evaluation["evaluator_version"], "task_set_sha256": evaluation["task_set_sha256"],
            "code": spec.get("code") or [], "image": spec.get("image"), "spec": spec.get("path"),
            "resource": spec.get("resource")}


def _code_facts(run: Mapping[str, Any], attempt: Mapping[str, Any]) -> dict[str, Any]:
    """The code the attempt ran: repo, branch, commit and diff as captured when it launched, and how it was taken.

    An attempt recorded before trackway captured code per attempt carries its run's code, taken at submit.
    """
    capture = json.loads(attempt["code_capture"]) if attempt["code_capture"] else None
    return {"repo": run["code_repo"], "branch": attempt["code_branch"] or run["code_branch"],
            "commit": attempt["code_commit"], "dirty_sha256": attempt["code_dirty_sha256"],
            "workdir": attempt["workdir"] or run["workdir"], "capture": capture}


def environment_diff(before: Any, after: Any) -> list[str]:
    """What differs between two environment descriptions: the image, versions, installed distributions."""
    if before == after:
        return []
    before, after = before or {}, after or {}
    if before.get("kind") == "image" or after.get("kind") == "image":
        return [f"image {d.text_or(before.get('image_digest'))} → {d.text_or(after.get('image_digest'))}"]
    lines = []
    for key in ("python", "torch", "nvidia_driver", "platform"):
        if before.get(key) != after.get(key):
            lines.append(f"{key}: {json.dumps(before.get(key))} → {json.dumps(after.get(key))}")
    a, b = before.get("distributions", {}), after.get("distributions", {})
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):
            lines.append(f"{name} {a.get(name, '-')} → {b.get(name, '-')}")
    return lines


# -- gathering ---------------------------------------------------------------------------------


def explain(reader: Reader | Any, ref: str, now: datetime | None = None) -> dict[str, Any]:
    """The facts about one attempt (the latest, for a run), its run and every attempt of the run.

    `reader`: a plain `Reader`, or a SQLAlchemy connection the same SQL runs through.
    """
    now = now or datetime.now(timezone.utc)
    reader = Reader.of(reader)  # a SQLAlchemy connection (the API's, an agent's): the same SQL through it
    attempt = reader.attempt(ref)
    run = reader.run(attempt["run_id"])
    history = reader.attempts(run_id=run["run_id"], limit=None)
    number = attempt["attempt_number"]
    previous = next((a for a in history if a["attempt_number"] == number - 1), None)
    first = history[0] if history and history[0]["attempt_number"] != number else None
    run_checkpoints = _run_checkpoints(reader, run["run_id"])
    lost = events_lost(reader, run["run_id"])
    evidence = json.loads(attempt["termination_evidence"]) if attempt["termination_evidence"] else {}
    config = _config_of(reader, attempt)
    facts = {
        "now": now,
        "run": {k: run[k] for k in ("run_id", "name", "project", "model_family", "kind", "state", "command", "workdir",
                                    "resource", "created_at", "ended_at", "not_before")}
        | {"command": json.dumps(redact_argv(json.loads(run["command"]))),  # a run recorded before redaction
           "own_retry_policy": bool(run["retry_policy"]), "attempts": len(history),
           "own_watchers": described_watchers(run.get("watchers")),
           "experiment": _experiment(reader, run)},
        "attempt": {
            k: attempt[k]
            for k in (
                "attempt_id", "attempt_number", "state", "started_by", "executor", "executor_job_id", "host", "gpu_ids",
                "gpu_model", "gpu_count", "started_at", "ended_at", "last_heartbeat_at", "exit_code", "signal",
                "first_step", "last_step", "gpu_seconds", "useful_gpu_seconds", "wasted_gpu_seconds", "cost_usd",
                "log_path",
            )
        },
        "ended_by": {"reason": attempt["termination_reason"], "rule": evidence.get("rule"),
                     "evidence": evidence.get("lines", []), "executor": evidence.get("executor", [])},
        "receipt": {
            "config_sha256": attempt["config_sha256"],
            "data_manifest_sha256": attempt["data_manifest_sha256"],
            "environment_sha256": attempt["environment_sha256"],
            "environment": _environment_summary(_blob_json(reader, attempt["environment_sha256"])),
            "environ": _environ_summary(reader, attempt["environ_sha256"]),
            "code": _code_facts(run, attempt),
            "evaluator": _evaluator_facts(reader, run) if run["kind"] == "eval" else None,
        },
        "config": _config_facts(reader, attempt, config, previous, first),
        "data": _data_facts(reader, attempt, previous),
        "placement": {k: attempt[k] for k in ("host", "executor", "executor_job_id", "gpu_count", "gpu_model", "gpu_ids")}
        | _chosen(attempt, run) | {"scheduler": _placed(reader, attempt["attempt_id"])}
        | {"kind": run["kind"]},
        "compared_with": previous["attempt_id"] if previous is not None else None,
        "changes": _changes(reader, previous, attempt) if previous is not None else {},
        "checkpoints": _checkpoint_facts(attempt, run_checkpoints, lost) | {"read_from": _read_from(reader, attempt),
                                                                      "not_taken_up": _not_taken_up(reader, attempt)},
        "watchers": _watched(reader, attempt["attempt_id"]),
        "memory": memory_facts(reader, run, attempt, evidence.get("lines", []) + evidence.get("executor", [])),
        "incidents": incidents(reader, attempt["attempt_id"]),
        "history": [_timeline_row(a, run_checkpoints, lost) for a in history],
        "evaluations": _evaluations(reader, run, run_checkpoints),
        "expectations": _expectations(run),
        # An evaluator answers through its output file, never the SDK: its missing heartbeat is no news.
        "visibility": visibility(reader, run, attempt) if run["kind"] != "eval" else [],
    }
    # Advice is about the run's latest attempt, whichever attempt is explained.
    latest_config = _config_of(reader, history[-1]) if history else None
    facts["next_steps"] = _next(reader, run, history, run_checkpoints, latest_config)
    evaluated = facts["evaluations"].get("of")
    if run["kind"] == "eval" and evaluated and facts["next_steps"]["person"]:
        facts["next_steps"]["person"] = _evaluation_advice(reader, evaluated)
    experiment = facts["run"]["experiment"]
    if experiment and experiment["role"] == "test" and experiment["status"] == "stopped" and not experiment["full_run_id"]:
        # The run itself may have completed; what stopped is the experiment, at this run's gate.
        facts["next_steps"] = _stopped_at_the_gate(experiment)
    facts["next"] = "; ".join(part for part in facts["next_steps"].values() if part)
    return facts


def _expectations(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run's own criteria (`submit --expect`) as last judged: each one's state, numbers and why."""
    from trackway.experiments.expectation_verdicts import verdict_of

    return verdict_of(dict(run))


def _experiment(reader: Reader, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The experiment this run is the test or full run of, if any."""
    found = reader.first("SELECT * FROM experiments WHERE test_run_id = :run_id OR full_run_id = :run_id",
                         {"run_id": run["run_id"]})
    if found is None:
        return None
    role = "test" if found["test_run_id"] == run["run_id"] else "full"
    checks = json.loads(found["test_checks"]) if found["test_checks"] else []
    return {"experiment_id": found["experiment_id"], "title": found["title"], "role": role,
            "status": found["status"], "verdict": found["verdict"], "stop_reason": found["stop_reason"],
            "gate": checks if role == "test" else [], "full_run_id": found["full_run_id"]}


def _run_checkpoints(reader: Reader, run_id: str) -> list[dict[str, Any]]:
    """The ledger's mirror of the run's checkpoints, oldest step first."""
    return reader.dicts("SELECT name, step, state, attempt_id, committed_at FROM checkpoints WHERE run_id = :run_id"
                        " ORDER BY step", {"run_id": run_id})


def _config_of(reader: Reader, attempt: Mapping[str, Any]) -> Any:
    # A config may hold a token a person pasted into it: what explain shows (and what gets pasted
    # into an issue) carries it masked.
    config = _blob_json(reader, attempt["config_sha256"])
    return None if config is None else redact_structure(config)


def _config_facts(reader: Reader, attempt: Mapping[str, Any], config: Any, previous: Mapping[str, Any] | None,
                  first: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config the attempt ran with, every value, and the keys that differ from the previous and first attempts."""
    def against(other: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if other is None:
            return None
        return {"attempt_id": other["attempt_id"], "keys": config_diff(_config_of(reader, other), config)}

    return {
        "sha256": attempt["config_sha256"],
        "values": None if config is None else flatten(config),
        # The ledger holds these masked (receipts/submitted_config.py): a change to one shows in no comparison.
        "secret_keys": [] if config is None else sorted(k for k, v in flatten(config).items() if MASK in json.dumps(v)),
        "differs_from_previous": against(previous),
        "differs_from_first": against(first),
        "from_script": _script_config(reader, attempt["attempt_id"]),
    }


def _data_facts(reader: Reader, attempt: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The data manifest the attempt ran with: every file with its size, and what changed since the previous attempt."""
    manifest = _blob_json(reader, attempt["data_manifest_sha256"])
    files = (manifest or {}).get("files", [])
    changes = None
    if previous is not None:
        changes = data_diff(_blob_json(reader, previous["data_manifest_sha256"]), manifest)
    return {
        "sha256": attempt["data_manifest_sha256"],
        "files": [{"path": f["path"], "size": f.get("size"), "sha256": f.get("sha256")} for f in files],
        "total_bytes": sum(f.get("size") or 0 for f in files),
        "changed_since_previous": changes,
    }


def _changes(reader: Reader, previous: Mapping[str, Any], attempt: Mapping[str, Any]) -> dict[str, list[str]]:
    """Everything an attempt ran with that differs from the previous attempt, by kind."""
    return {
        "config": config_diff(_config_of(reader, previous), _config_of(reader, attempt)),
        "data": data_diff(_blob_json(reader, previous["data_manifest_sha256"]), _blob_json(reader, attempt["data_manifest_sha256"])),
        "environment": environment_diff(
            _blob_json(reader, previous["environment_sha256"]), _blob_json(reader, attempt["environment_sha256"])
        ),
        "environment variables": submitted_env.diff(
            _blob_json(reader, previous["environ_sha256"]), _blob_json(reader, attempt["environ_sha256"])
        ),
        "code": _code_diff(previous, attempt),
    }


def _checkpoint_facts(attempt: Mapping[str, Any], run_checkpoints: list[dict[str, Any]],
                      events_lost: Mapping[str, list[str]]) -> dict[str, Any]:
    """Resumed from, committed during this attempt, the newest committed checkpoint of the run; events that never came.

    `events_lost`: where each attempt's events never arrived (`events_lost()`). Then a resume or a
    commit it made may be among them: no checkpoint named is "not known", not "the start".
    """
    committed = [c for c in run_checkpoints if c["attempt_id"] == attempt["attempt_id"]]
    newest = [c for c in run_checkpoints if c["state"] == "committed"]
    return {
        "resumed_from": attempt["resumed_from_checkpoint"],
        "committed": committed,
        "newest_of_run": newest[-1] if newest else None,
        "events_lost": events_lost.get(attempt["attempt_id"], []),
    }


def events_lost(reader: Reader | Any, run_id: str) -> dict[str, list[str]]:
    """Each attempt of the run whose events file lost bytes on the way here: `events.jsonl bytes A-B` for each range.

    `reader`: a plain `Reader`, or a SQLAlchemy connection the same SQL runs through.
    """
    reader = Reader.of(reader)
    lost: dict[str, list[str]] = {}
    for row in reader.dicts("SELECT e.attempt_id, e.payload FROM attempt_events e JOIN attempts a"
                            " ON a.attempt_id = e.attempt_id WHERE a.run_id = :run_id AND e.kind = 'spool_bytes_lost'"
                            " ORDER BY e.attempt_id, e.rank, e.seq", {"run_id": run_id}):
        event = json.loads(row["payload"])
        if event.get("held") == "events":
            lost.setdefault(row["attempt_id"], []).append(f"{event.get('file')} bytes {event.get('from')}-{event.get('to')}")
    return lost


def _not_taken_up(reader: Reader, attempt: Mapping[str, Any]) -> str | None:
    """Why the logs say the attempt did not resume from the checkpoint it was given, when they do."""
    payload = reader.scalar("SELECT payload FROM attempt_events WHERE attempt_id = :attempt_id"
                            " AND kind = 'resume_not_taken_up'", {"attempt_id": attempt["attempt_id"]})
    return json.loads(payload)["message"] if payload else None


def _read_from(reader: Reader, attempt: Mapping[str, Any]) -> str | None:
    """Where the resumed checkpoint was read (an object store's URL on a new host), as the SDK's restore said."""
    payload = reader.scalar("SELECT payload FROM attempt_events WHERE attempt_id = :attempt_id"
                            " AND kind = 'checkpoint_restored' ORDER BY rank, seq", {"attempt_id": attempt["attempt_id"]})
    return (json.loads(payload).get("source") or None) if payload else None


def _watched(reader: Reader, attempt_id: str) -> list[str]:
    """What the supervisor's watchers noticed while the attempt ran."""
    rows = reader.dicts(
        "SELECT payload FROM attempt_events WHERE attempt_id = :attempt_id AND rank = :rank"
        # Shown with what they are about: the config, where the job was placed, its data and checkpoint.
        " AND kind NOT IN (:conflicts, :placed, 'data_changed', 'resume_not_taken_up') ORDER BY seq",
        {"attempt_id": attempt_id, "rank": SUPERVISOR_RANK, "conflicts": CONFLICTS_EVENT, "placed": PLACED_EVENT})
    return [json.loads(row["payload"])["message"] for row in rows]


def _placed(reader: Reader, attempt_id: str) -> dict[str, Any] | None:
    """Where a queued job started, as its executor reported it (Slurm: job id, nodes, partition, QoS, GPUs)."""
    payload = reader.scalar("SELECT payload FROM attempt_events WHERE attempt_id = :attempt_id AND kind = :placed"
                            " ORDER BY seq", {"attempt_id": attempt_id, "placed": PLACED_EVENT})
    return json.loads(payload) if payload else None


def _script_config(reader: Reader, attempt_id: str) -> dict[str, Any]:
    """Whether the script handed trackway.init() a config (merged into the receipt), and where it overrode."""
    kinds = {
        row["kind"]: row["payload"]
        for row in reader.dicts("SELECT kind, payload FROM attempt_events WHERE attempt_id = :attempt_id"
                                " AND kind IN ('init_config', :conflicts)",
                                {"attempt_id": attempt_id, "conflicts": CONFLICTS_EVENT})
    }
    conflicts = json.loads(kinds[CONFLICTS_EVENT])["conflicts"] if CONFLICTS_EVENT in kinds else []
    return {"merged": "init_config" in kinds, "conflicts": redact_structure(conflicts)}


def _timeline_row(a: Mapping[str, Any], run_checkpoints: list[dict[str, Any]],
                  events_lost: Mapping[str, list[str]]) -> dict[str, Any]:
    """One attempt as one row of the run's timeline: who started it, where, what it did, how it ended, what followed."""
    evidence = json.loads(a["termination_evidence"]) if a["termination_evidence"] else {}
    return {
        "attempt_id": a["attempt_id"],
        "number": a["attempt_number"],
        "started_by": a["started_by"],
        "started_at": a["started_at"],
        "ended_at": a["ended_at"],
        "placement": {k: a[k] for k in ("host", "executor", "executor_job_id", "gpu_count", "gpu_model", "gpu_ids")}
        | {"resource": a["resource"], "qos": a["qos"]},
        "first_step": a["first_step"],
        "last_step": a["last_step"],
        "resumed_from": a["resumed_from_checkpoint"],
        "committed": [c["name"] for c in run_checkpoints if c["attempt_id"] == a["attempt_id"]],
        "events_lost": events_lost.get(a["attempt_id"], []),
        "state": a["state"],
        "reason": a["termination_reason"],
        "rule": evidence.get("rule"),
        "evidence": (evidence.get("lines") or evidence.get("executor") or [None])[0],
        "gpu_seconds": a["gpu_seconds"],
        "useful_gpu_seconds": a["useful_gpu_seconds"],
        "wasted_gpu_seconds": a["wasted_gpu_seconds"],
        "decision": json.loads(a["retry_decision"]) if a["retry_decision"] else None,
    }


# What the training process or the ingester recorded that a reader of a failure must not miss.
INCIDENT_KINDS = ("checkpoint_restored", "spool_line_quarantined", "spool_write_failed", "spool_bytes_lost")


def incidents(reader: Reader | Any, attempt_id: str) -> list[str]:
    """Checkpoints set aside on restore, spool lines quarantined, spool writes that failed: one line each.

    `reader`: a plain `Reader`, or a SQLAlchemy connection the same SQL runs through.
    """
    reader = Reader.of(reader)
    lines = []
    kinds = ", ".join(f"'{kind}'" for kind in INCIDENT_KINDS)
    for row in reader.dicts(f"SELECT payload FROM attempt_events WHERE attempt_id = :attempt_id AND kind IN ({kinds})"
                            " ORDER BY at, rank, seq", {"attempt_id": attempt_id}):
        event = json.loads(row["payload"])
        line = _incident_line(event)
        if line:
            lines.append(line)
    return lines


def _incident_line(event: dict[str, Any]) -> str | None:
    kind = event.get("kind")
    if kind == "checkpoint_restored":
        skipped = event.get("fallback_from") or []
        if not skipped:
            return None
        set_aside = "; ".join(f"{s.get('name')} set aside ({s.get('reason')})" for s in skipped)
        return f"restore fell back to {event.get('name') or 'the start (no usable checkpoint)'}: {set_aside}"
    if kind == "spool_line_quarantined":
        return (f"a spool line was quarantined: {event.get('file')} at byte {event.get('offset')} "
                f"({event.get('error')}): {str(event.get('preview', ''))[:120]!r}")
    if kind == "spool_bytes_lost":
        if event.get("whole"):
            return (f"{event.get('file')}, as the attempt last wrote it where it ran, never arrived here "
                    f"({event.get('why')}): what it said is not known")
        return (f"{event.get('file')} bytes {event.get('from')}-{event.get('to')} never arrived from where the attempt "
                f"ran ({event.get('why')}): the {event.get('held') or 'lines'} they held are not known")
    if kind == "spool_write_failed":
        details = ", ".join(f"{k} {v}" for k, v in event.items() if k not in ("kind", "t", "seq", "rank"))
        return f"the spool could not be written for a while: {details}"
    return None


def _environ_summary(reader: Reader, sha: str | None) -> dict[str, Any] | None:
    description = _blob_json(reader, sha)
    if description is None:
        return None
    return {
        "sha256": sha,
        "variables": len(description.get("variables") or {}),
        "secrets": sorted(description.get("secrets") or {}),
    }


def _environment_summary(description: dict[str, Any] | None) -> str:
    """The software an attempt ran in, in one line: the image, or python, torch and the NVIDIA driver."""
    if description is None:
        return "not recorded"
    python = (description.get("python") or {}).get("version")
    if description.get("kind") == "image":
        return f"image {description.get('image_digest')}, python {d.text_or(python)}"
    torch = description.get("torch") or {}
    parts = [f"python {d.text_or(python)}"]
    if torch.get("version"):
        parts.append(f"torch {torch['version']}" + (f" (CUDA {torch['cuda']})" if torch.get("cuda") else " (no CUDA)"))
    else:
        parts.append("no torch")
    driver = description.get("nvidia_driver")
    parts.append(f"NVIDIA driver {driver}" if driver else "no NVIDIA driver")
    parts.append(d.plural(len(description.get("distributions") or {}), "distribution"))
    return ", ".join(parts)


def _phase_facts(reader: Reader, run: Mapping[str, Any], evaluation: Mapping[str, Any]) -> dict[str, Any] | None:
    """For a phase of a two-phase evaluation's seed: the outputs it made or read, the other phase's cost, the judge."""
    from trackway.evals.phases import INFERENCE, run_phase
    phase = run_phase(run)
    if phase is None:
        return None
    seed = reader.first("SELECT * FROM evaluation_seeds WHERE eval_id = :eval_id"
                        " AND (eval_run_id = :run_id OR inference_run_id = :run_id)",
                        {"eval_id": evaluation["eval_id"], "run_id": run["run_id"]})
    facts: dict[str, Any] = {"phase": phase, "inference_run_id": seed["inference_run_id"] if seed else None,
                             "inference_outputs": seed["inference_outputs"] if seed else None,
                             "inference_manifest_sha256": seed["inference_manifest_sha256"] if seed else None}
    lines = []
    outputs = facts["inference_outputs"]
    manifest = d.short_hash(facts["inference_manifest_sha256"], "not known")
    if phase == INFERENCE:
        lines.append(f"its outputs: committed at {outputs} (manifest {manifest})" if outputs
                     else "its outputs: none committed (the scoring phase starts once they are)")
    else:
        other = reader.attempts(facts["inference_run_id"], limit=None) if facts["inference_run_id"] else []
        gpu_h = sum(a["gpu_seconds"] or 0.0 for a in other) / 3600
        lines.append(f"scores the inference outputs committed at {d.text_or(outputs)} (manifest {manifest}), made by "
                     f"run {d.text_or(facts['inference_run_id'])} in {len(other)} attempt(s), {gpu_h:.3f} GPU-h; "
                     f"a retry of this phase reads the same outputs")
    if evaluation["judge"]:
        judge = json.loads(evaluation["judge"])
        who = (f"{judge['model']} version {judge['version']}" if judge.get("model")
               else f"a local judge, code {d.short_hash((judge.get('code_sha256') or '').removeprefix('sha256:'))}")
        lines.append(f"judge: {who}, rubric {d.short_hash((judge.get('rubric_sha256') or '').removeprefix('sha256:'))}")
        facts["judge"] = judge
    facts["lines"] = lines
    return facts


def _evaluations(reader: Reader, run: Mapping[str, Any], run_checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    """For a training run: the specs attached, each evaluation's state and headline metric, checkpoints not
    evaluated; for an evaluation seed: what it evaluates. `lines` says it for people."""
    from trackway.errors import NotFound
    if run["kind"] == "eval":
        try:
            evaluation = reader.evaluation(run["run_id"])
        except NotFound:
            return {"of": None, "lines": ["an evaluation run whose evaluation is not recorded"]}
        env = json.loads(run["env"]) if run["env"] else {}
        line = (f"seed {d.text_or(env.get('TRACKWAY_EVAL_SEED'))} of evaluation {evaluation['eval_id']} "
                f"({evaluation['spec_name']}, {evaluation['state']}): checkpoint {evaluation['checkpoint_name']} of run "
                f"{evaluation['run_id']}, evaluator {evaluation['evaluator_version']}, "
                f"task set {d.short_hash(evaluation['task_set_sha256'])}")
        phase = _phase_facts(reader, run, evaluation)
        if phase is None:
            return {"of": dict(evaluation), "lines": [line]}
        return {"of": dict(evaluation), "phase": phase, "lines": [f"the {phase['phase']} phase of {line}", *phase["lines"]]}
    specs = reader.dicts("SELECT name, trigger FROM run_eval_specs WHERE run_id = :run_id ORDER BY name",
                         {"run_id": run["run_id"]})
    results = []
    for evaluation in reader.evaluations_of_run(run["run_id"]):
        metrics = reader.eval_metrics(evaluation["eval_id"])
        reasons = sorted({s["termination_reason"] for s in reader.seeds_of(evaluation["eval_id"])
                          if s["state"] == "failed" and s["termination_reason"]})
        results.append({k: evaluation[k] for k in ("eval_id", "checkpoint_name", "checkpoint_step", "spec_name", "state",
                                                    "primary_metric", "created_at", "ended_at", "evaluator_version")}
                       | {"metrics": metrics, "failed_because": reasons})
    evaluated = {r["checkpoint_name"] for r in results}
    waiting = [c["name"] for c in run_checkpoints if c["state"] == "committed" and c["name"] not in evaluated]
    facts = {"specs": specs, "results": results, "not_evaluated": waiting if specs else []}
    facts["lines"] = _evaluation_lines(facts)
    return facts


def _evaluation_lines(facts: dict[str, Any]) -> list[str]:
    """Each evaluation with its state and headline metric; or why there is none."""
    specs, results = facts["specs"], facts["results"]
    if not specs and not results:
        return ["no evaluation configured for this run"]
    lines = []
    if specs:
        lines.append("configured: " + ", ".join(f"{s['name']} ({s['trigger']})" for s in specs))
    for r in results:
        headline = r["metrics"].get(r["primary_metric"])
        # The mean as stored, not rounded: 0.925 and 0.9249 are different results.
        metric = f", {r['primary_metric']} {headline['mean']!r} over {d.plural(headline['seeds'], 'seed')}" if headline else ""
        why = f" ({', '.join(r['failed_because'])})" if r["state"] == "failed" and r["failed_because"] else ""
        version = d.short_hash(str(r["evaluator_version"]).rpartition(":")[2])
        lines.append(f"{r['checkpoint_name']} by {r['spec_name']} (evaluator {version}): {r['state']}{why}{metric} "
                     f"({r['eval_id']})")
    if facts["not_evaluated"]:
        lines.append("not evaluated (yet): " + ", ".join(facts["not_evaluated"]))
    if specs and not results and not facts["not_evaluated"]:
        lines.append("nothing evaluated: no checkpoint was committed")
    return lines


def _code_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    lines = []
    if before["code_commit"] != after["code_commit"]:
        lines.append(f"commit {d.short_hash(before['code_commit'], 'none')} → {d.short_hash(after['code_commit'], 'none')}")
    if before["code_dirty_sha256"] != after["code_dirty_sha256"]:
        lines.append(f"uncommitted diff {d.short_hash(before['code_dirty_sha256'], 'none')} → "
                     f"{d.short_hash(after['code_dirty_sha256'], 'none')}")
    return lines


# -- what happens next -------------------------------------------------------------------------


def _next(reader: Reader, run: Mapping[str, Any], history: list[Mapping[str, Any]], run_checkpoints: list[dict[str, Any]],
          config: Any) -> dict[str, str | None]:
    """What trackway will do with the run, and what a person should change (only advice that can apply)."""
    state = RunState(run["state"])
    last = history[-1] if history else None
    decision = json.loads(last["retry_decision"]) if last is not None and last["retry_decision"] else None
    newest = next((c for c in reversed(run_checkpoints) if c["state"] == "committed"), None)
    start = f"from {newest['name']}, the newest committed checkpoint" if newest else "from the start: no checkpoint was committed"
    rule = f" (rule `{decision['rule']}`)" if decision else ""
    if state is RunState.QUEUED and last is not None and last["state"] == AttemptState.QUEUED.value:
        said = reader.supervisor_event(last["attempt_id"], QUEUED_EVENT) or {}
        why = said.get("message") or f"{last['executor']}'s queue gave no reason"
        return {"trackway": f"{last['attempt_id']} waits in {last['executor']}'s queue ({why}); it starts when the "
                            f"scheduler places it, {start}", "person": None}
    if state is RunState.QUEUED:
        at = f" at {d.utc(run['not_before'])}" if run["not_before"] else ""
        return {"trackway": f"the supervisor will start attempt {len(history) + 1}{at}, {start}{rule}", "person": None}
    if state is RunState.RUNNING:
        running = last["attempt_id"] if last is not None else "an attempt"
        return {"trackway": f"{running} is running; when it ends, its ending is classified and the retry policy decides",
                "person": None}
    if state is RunState.COMPLETED:
        return {"trackway": f"nothing: the run is {state.value}", "person": None}
    ref = run["name"] or run["run_id"]
    reason = R(last["termination_reason"]) if last is not None and last["termination_reason"] in set(R) else None
    stopped = f"nothing: the run is {state.value}"
    if decision and decision["action"] == "stop":
        stopped += f"; the retry policy stopped it{rule}"
    evidence = json.loads(last["termination_evidence"]) if last is not None and last["termination_evidence"] else {}
    return {"trackway": stopped, "person": _advice(ref, reason, decision, start, config, evidence.get("rule") or "")}


# What to change after a watcher in `[supervisor] stop_on` ended a run, by watcher: its finding, with the numbers
# and the rule, is the receipt's evidence.
WATCHER_ADVICE = {
    "loss_rising": "the loss rose well above its own noise (the evidence has the numbers and the window): lower the "
                   "learning rate or check the data the rise began on",
    "plateau": "the loss stopped improving over the watcher's window: the run may be done; if it is not, change the "
               "schedule (the learning rate) or the model",
    "throughput_falling": "steps slowed down: look for what took the machine (another job, the data loader, a "
                          "full or slow disk, thermal throttling)",
    "memory_growing": "host memory kept growing (a leak: tensors kept with their graph, a cache that only grows, "
                      "data loader workers): fix it",
    "gpu_underused": "the GPUs sat below the watcher's threshold: feed them faster (more data loader workers, pinned "
                     "memory) or give the run fewer GPUs or a larger batch",
}


def _advice(ref: str, reason: R | None, decision: dict[str, Any] | None, start: str, config: Any, rule: str = "") -> str:
    """What a person should change before the run can go on, and the command that goes on (and where from)."""
    resume = f"`trackway resume {ref}`"
    if decision and decision["rule"].endswith("disk full"):
        return decision["message"]  # names where to free space and the command
    if reason is R.WATCHER_STOP:
        watcher = rule.removeprefix("watcher:")
        said = WATCHER_ADVICE.get(watcher, f"read the {watcher or 'watcher'}'s finding in the evidence")
        return (f"{said}; then {resume} goes on {start} (to keep it running next time, take {watcher or 'the watcher'} "
                "out of `[supervisor] stop_on` or widen its rule: `submit --watch` or `[watchers]`)")
    if reason is R.NAN_LOSS:
        keys = _keys_like(config, ("lr", "learning_rate"))
        return (f"lower the learning rate{_values(keys)} or fix the data, then "
                f"`trackway resume {ref} --set {keys[0][0] if keys else 'KEY'}=...`; it resumes {start}")
    if reason is R.OOM:
        keys = _keys_like(config, ("batch",))
        return (f"lower the memory footprint{_values(keys)}: a smaller batch, activation checkpointing, lower precision "
                f"or a resource with more GPU memory, then `trackway resume {ref} --set {keys[0][0] if keys else 'KEY'}=...`; "
                f"it resumes {start}")
    if reason is R.BAD_DATA:
        return (f"fix or exclude the input the evidence names, then {resume}: the data is hashed again when the "
                f"attempt launches, and its receipt names the files it read; it resumes {start}")
    if reason is R.CODE_ERROR:
        return f"fix the exception the evidence shows, then {resume}; it resumes {start}"
    if reason is R.CONFIG_ERROR:
        return f"the command could not start as configured: fix the import, path or argument the evidence names, then {resume}"
    if reason is R.UNKNOWN:
        return f"read the evidence and the log before spending more GPU time; {resume} goes on {start}"
    if reason is R.USER_CANCELLED:
        return f"{resume} starts it again, {start}"
    if reason is R.INFRA_TRANSIENT and rule.endswith("port-in-use"):
        return ("another process held the port the evidence names (a second job on this machine, or what is left of "
                "an earlier attempt): let the launcher choose a free one (`torchrun --standalone`, `accelerate launch "
                f"--main_process_port 0`) or set another MASTER_PORT, then {resume}; it resumes {start}")
    if decision:
        return f"{decision['message']}; to go on anyway: {resume}, {start}"
    return f"{resume} starts a new attempt, {start}"


def _stopped_at_the_gate(experiment: dict[str, Any]) -> dict[str, str | None]:
    """What follows a test run whose experiment stopped at its gate: no full run, and what to change."""
    failed = [c for c in experiment["gate"] if not c.get("passed")]
    said = "; ".join(f"{c['check']}: {c['detail']}" for c in failed) or experiment["stop_reason"] or "stopped"
    return {
        "trackway": f"nothing: experiment {experiment['experiment_id']} stopped at this test run's gate, and its full "
                    "run was never started",
        "person": f"change what the failed check names ({said}), then try the next iteration: `trackway experiment "
                  f"new --from {experiment['experiment_id']} ...`",
    }


def _evaluation_advice(reader: Reader, evaluation: dict[str, Any]) -> str:
    """What a person does after an evaluation seed failed: fix the evaluator and ask again, which evaluates the
    fixed version as an evaluation of its own (resuming the seed would file its result under the old version)."""
    training = reader.run(evaluation["run_id"])
    checkpoint = f"{training['name'] or training['run_id']}@{evaluation['checkpoint_step']}"
    spec_path = json.loads(reader.blob(evaluation["spec_sha256"])).get("path") or "SPEC"
    advice = (f"fix the evaluator (the evidence shows where it failed), then ask for the evaluation again: "
              f"`trackway eval {checkpoint} --spec {spec_path}`; the fixed evaluator is a new version, evaluated as "
              "an evaluation of its own")
    done = [e for e in reader.evaluations_of_run(evaluation["run_id"], evaluation["spec_name"])
            if e["checkpoint_step"] == evaluation["checkpoint_step"] and e["state"] == "completed"
            and e["evaluator_version"] != evaluation["evaluator_version"]]
    if done:
        advice += (f"; {checkpoint} already has a completed evaluation by another version of the evaluator: "
                   + ", ".join(f"{e['eval_id']} ({d.short_hash(e['evaluator_version'].rpartition(':')[2])})" for e in done))
    return advice


def _keys_like(config: Any, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """The config keys whose last part is, or contains as a word, one of `names` (`optim.lr`, `train.batch_size`)."""
    found = []
    for key, value in flatten(config or {}).items():
        words = key.rsplit(".", 1)[-1].lower().split("_")
        last = "_".join(words)
        if any(name == last or name in words or (len(name) > 3 and name in last) for name in names):
            found.append((key, value))
    return found


def _values(keys: list[tuple[str, Any]]) -> str:
    """` (optim.lr is 10)`: the values advice is about, as stored."""
    return " (" + ", ".join(f"{k} is {d.as_stored(v)}" for k, v in keys) + ")" if keys else ""


def _chosen(attempt, run) -> dict[str, Any]:
    """Where the attempt was sent and why (attempts recorded before selection: the run's resource, no reasons)."""
    from trackway.resources.selection_record import Selection

    placement = Selection.from_json(attempt["selection"])
    return {
        "resource": attempt["resource"] or run["resource"],
        "qos": attempt["qos"],
        "selection": None if placement is None else {
            "requested": placement.requested, "reason": placement.reason,
            "skipped": [{"resource": name, "reason": why} for name, why in placement.skipped],
            "text": placement.text(),
        },
    }
