"""`trackway explain`: everything needed to understand one attempt, gathered from the ledger and storage.

`explain()` returns plain data (so `--json` is the same facts as the screen); `to_markdown()`
lays it out for a person who never saw the run.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, RowMapping, select

from trackway.ledger.blobs import get_blob
from trackway.ledger.records import list_attempts, resolve_attempt, resolve_run
from trackway.ledger.ingest import SUPERVISOR_RANK
from trackway.ledger.schema import attempt_events, checkpoints
from trackway.taxonomy import RunState


def _blob_json(conn: Connection, sha: str | None) -> Any:
    return json.loads(get_blob(conn, sha)) if sha else None


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def config_diff(before: Any, after: Any) -> list[str]:
    a, b = _flatten(before or {}), _flatten(after or {})
    lines = []
    for key in sorted(a.keys() | b.keys()):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            lines.append(f"{key}: {json.dumps(a.get(key, '<absent>'))} → {json.dumps(b.get(key, '<absent>'))}")
    return lines


def data_diff(before: Any, after: Any) -> list[str]:
    a = {f["path"]: f for f in (before or {}).get("files", [])}
    b = {f["path"]: f for f in (after or {}).get("files", [])}
    lines = [f"added {p}" for p in sorted(b.keys() - a.keys())]
    lines += [f"removed {p}" for p in sorted(a.keys() - b.keys())]
    lines += [f"changed {p} ({a[p]['sha256'][:12]} → {b[p]['sha256'][:12]})" for p in sorted(a.keys() & b.keys()) if a[p]["sha256"] != b[p]["sha256"]]
    return lines


def environment_diff(before: Any, after: Any) -> list[str]:
    if before == after:
        return []
    lines = []
    if (before or {}).get("kind") == "image" or (after or {}).get("kind") == "image":
        return [f"image {(before or {}).get('image_digest')} → {(after or {}).get('image_digest')}"]
    for key in ("python", "torch", "nvidia_driver", "platform"):
        if (before or {}).get(key) != (after or {}).get(key):
            lines.append(f"{key}: {json.dumps((before or {}).get(key))} → {json.dumps((after or {}).get(key))}")
    a, b = (before or {}).get("distributions", {}), (after or {}).get("distributions", {})
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):
            lines.append(f"{name} {a.get(name, '-')} → {b.get(name, '-')}")
    return lines


def explain(conn: Connection, ref: str) -> dict[str, Any]:
    """The facts about one attempt (the latest, for a run) and its run."""
    attempt = resolve_attempt(conn, ref)
    run = resolve_run(conn, attempt["run_id"])
    history = list_attempts(conn, run_id=run["run_id"], limit=None)
    previous = next((a for a in history if a["attempt_number"] == attempt["attempt_number"] - 1), None)
    evidence = json.loads(attempt["termination_evidence"]) if attempt["termination_evidence"] else {}
    committed = [
        dict(row)
        for row in conn.execute(
            select(checkpoints.c.name, checkpoints.c.state, checkpoints.c.committed_at)
            .where(checkpoints.c.attempt_id == attempt["attempt_id"])
            .order_by(checkpoints.c.step)
        ).mappings()
    ]
    watched = [
        json.loads(payload)["message"]
        for payload in conn.execute(
            select(attempt_events.c.payload)
            .where(attempt_events.c.attempt_id == attempt["attempt_id"], attempt_events.c.rank == SUPERVISOR_RANK)
            .order_by(attempt_events.c.seq)
        ).scalars()
    ]
    changes: dict[str, list[str]] = {}
    if previous is not None:
        changes = {
            "config": config_diff(_config_of(conn, previous), _config_of(conn, attempt)),
            "data": data_diff(_blob_json(conn, previous["data_manifest_sha256"]), _blob_json(conn, attempt["data_manifest_sha256"])),
            "environment": environment_diff(
                _blob_json(conn, previous["environment_sha256"]), _blob_json(conn, attempt["environment_sha256"])
            ),
            "code": _code_diff(previous, attempt),
        }
    return {
        "run": {k: run[k] for k in ("run_id", "name", "project", "model_family", "kind", "state", "command", "workdir", "resource")},
        "attempt": {
            k: attempt[k]
            for k in (
                "attempt_id", "attempt_number", "state", "executor", "executor_job_id", "host", "gpu_ids", "gpu_model",
                "gpu_count", "started_at", "ended_at", "last_heartbeat_at", "exit_code", "signal", "first_step",
                "last_step", "gpu_seconds", "useful_gpu_seconds", "wasted_gpu_seconds", "cost_usd", "log_path",
            )
        },
        "ended_by": {"reason": attempt["termination_reason"], "rule": evidence.get("rule"), "evidence": evidence.get("lines", []),
                     "executor": evidence.get("executor", [])},
        "receipt": {
            "config_sha256": attempt["config_sha256"],
            "data_manifest_sha256": attempt["data_manifest_sha256"],
            "environment_sha256": attempt["environment_sha256"],
            "code": {"repo": run["code_repo"], "branch": run["code_branch"], "commit": attempt["code_commit"],
                     "dirty_sha256": attempt["code_dirty_sha256"]},
        },
        "compared_with": previous["attempt_id"] if previous is not None else None,
        "changes": changes,
        "checkpoints": {"resumed_from": attempt["resumed_from_checkpoint"], "committed": committed},
        "watchers": watched,
        "history": [
            {
                "attempt_id": a["attempt_id"],
                "reason": a["termination_reason"],
                "started_at": a["started_at"],
                "gpu_seconds": a["gpu_seconds"],
                "useful_gpu_seconds": a["useful_gpu_seconds"],
                "wasted_gpu_seconds": a["wasted_gpu_seconds"],
                "decision": json.loads(a["retry_decision"]) if a["retry_decision"] else None,
            }
            for a in history
        ],
        "next": _next(run, history),
        "evaluations": _evaluations(conn, run),
    }


def _evaluations(conn: Connection, run: RowMapping) -> list[str]:
    """For a training run: its checkpoints' evaluations; for an evaluation seed: what it evaluates."""
    from trackway.evals.records import evaluations_of_run, metrics_of, resolve_evaluation
    from trackway.errors import NotFound

    if run["kind"] == "eval":
        try:
            evaluation = resolve_evaluation(conn, run["run_id"])
        except NotFound:
            return []
        env = json.loads(run["env"]) if run["env"] else {}
        return [f"seed {env.get('TRACKWAY_EVAL_SEED')} of evaluation {evaluation['eval_id']} ({evaluation['spec_name']}, "
                f"{evaluation['state']}): checkpoint {evaluation['checkpoint_name']} of run {evaluation['run_id']}, "
                f"evaluator {evaluation['evaluator_version']}, task set {evaluation['task_set_sha256']}"]
    lines = []
    for evaluation in evaluations_of_run(conn, run["run_id"]):
        metrics = ", ".join(f"{m} {v['mean']:.4f}" for m, v in metrics_of(conn, evaluation["eval_id"]).items())
        lines.append(f"{evaluation['checkpoint_name']} by {evaluation['spec_name']}: {evaluation['state']}"
                     + (f", {metrics}" if metrics else "") + f" ({evaluation['eval_id']})")
    return lines


def _config_of(conn: Connection, attempt: RowMapping) -> Any:
    return _blob_json(conn, attempt["config_sha256"])


def _code_diff(before: RowMapping, after: RowMapping) -> list[str]:
    lines = []
    if before["code_commit"] != after["code_commit"]:
        lines.append(f"commit {before['code_commit'] or '-'} → {after['code_commit'] or '-'}")
    if before["code_dirty_sha256"] != after["code_dirty_sha256"]:
        lines.append(f"uncommitted diff {before['code_dirty_sha256'] or 'none'} → {after['code_dirty_sha256'] or 'none'}")
    return lines


def _next(run: RowMapping, history: list[RowMapping]) -> str:
    state = RunState(run["state"])
    last = history[-1] if history else None
    decision = json.loads(last["retry_decision"]) if last is not None and last["retry_decision"] else None
    if state is RunState.QUEUED:
        when = f" at {run['not_before'].isoformat()}" if run["not_before"] else ""
        return f"a new attempt will start{when}, resuming from the latest committed checkpoint ({decision['rule'] if decision else 'retry'})"
    if state is RunState.RUNNING:
        return f"{last['attempt_id'] if last else 'an attempt'} is running; its end will be classified and decided by the policy"
    if decision:
        return f"nothing: the run is {state.value}; {decision['message']} [{decision['rule']}]"
    return f"nothing: the run is {state.value}"


def to_markdown(facts: dict[str, Any]) -> str:
    run, attempt, ended = facts["run"], facts["attempt"], facts["ended_by"]
    hours = lambda s: "-" if s is None else f"{s / 3600:.3f}"  # noqa: E731
    out = [
        f"# {attempt['attempt_id']} ({run['name'] or run['run_id']}, project {run['project']}, {run['kind']})",
        "",
        f"- **Ended:** {ended['reason'] or 'not yet'}" + (f" (rule `{ended['rule']}`)" if ended["rule"] else ""),
        f"- **Command:** `{' '.join(json.loads(run['command']))}` in `{run['workdir']}`",
        f"- **Placement:** {attempt['executor']} job {attempt['executor_job_id']} on {attempt['host']}, "
        f"{attempt['gpu_count']} GPU(s) {attempt['gpu_model'] or ''} {attempt['gpu_ids'] or ''}".rstrip(),
        f"- **Time:** {attempt['started_at']} → {attempt['ended_at']}; steps {attempt['first_step']}..{attempt['last_step']}; "
        f"exit {attempt['exit_code']}, signal {attempt['signal']}",
        f"- **GPU-hours:** {hours(attempt['gpu_seconds'])} (useful {hours(attempt['useful_gpu_seconds'])}, "
        f"wasted {hours(attempt['wasted_gpu_seconds'])}), cost ${attempt['cost_usd'] or 0:.2f}",
        f"- **Log:** `{attempt['log_path']}`",
        "",
    ]
    evidence = ended["evidence"] + ended["executor"]
    if evidence:
        out += ["Evidence:", "", "```", *evidence, "```", ""]
    out += [
        "## Receipt",
        f"- config `{facts['receipt']['config_sha256']}`",
        f"- data manifest `{facts['receipt']['data_manifest_sha256']}`",
        f"- environment `{facts['receipt']['environment_sha256']}`",
        f"- code {facts['receipt']['code']['repo']} @ {facts['receipt']['code']['branch']} "
        f"`{facts['receipt']['code']['commit']}`, uncommitted diff `{facts['receipt']['code']['dirty_sha256']}`",
        "",
        f"## Changes against {facts['compared_with'] or 'nothing (first attempt)'}",
    ]
    for kind, lines in facts["changes"].items():
        out.append(f"- {kind}: " + ("none" if not lines else ""))
        out += [f"  - {line}" for line in lines]
    ckpt = facts["checkpoints"]
    out += ["", "## Checkpoints", f"- resumed from: {ckpt['resumed_from'] or 'the start'}"]
    out += [f"- committed {c['name']} ({c['state']}) at {c['committed_at']}" for c in ckpt["committed"]] or ["- committed none"]
    out += ["", "## What the watchers noticed"]
    out += [f"- {line}" for line in facts["watchers"]] or ["- nothing"]
    out += ["", "## Attempts and decisions"]
    for h in facts["history"]:
        d = h["decision"]
        out.append(
            f"- {h['attempt_id']}: {h['reason'] or 'running'}, {hours(h['gpu_seconds'])} GPU-h "
            f"(wasted {hours(h['wasted_gpu_seconds'])})" + (f" → {d['action']} [{d['rule']}]: {d['message']}" if d else "")
        )
    out += ["", f"- **Next:** {facts['next']}", "", "## Evaluations"]
    out += [f"- {line}" for line in facts["evaluations"]] or ["- none"]
    return "\n".join(out) + "\n"
