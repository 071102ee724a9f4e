"""Laying out `trackway explain`'s facts for a person: blocks both renderers share, and Markdown.

`document()` lays the facts `explain()` gathered out as blocks, in the order a reader asks: a
timeline of every attempt, then one attempt in full answering seven questions (config, data,
placement, checkpoints, retries, evaluations, what happens next). `to_markdown()` renders the
blocks for pasting into an issue; the CLI renders the same blocks as text that fits the terminal.
Every people-facing value comes from `trackway.display`: short hashes, times to the second with
an age, CPU-hours when no GPU was used, and words where a value is missing.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from trackway import display as d
from trackway.reports.memory_facts import memory_lines
from trackway.taxonomy import RunState
from trackway.taxonomy import TerminationReason as R

# Beyond these, a list says how many more there are and that --json has them all.
CONFIG_SHOWN = 20
FILES_SHOWN = 20

# ("title", text) | ("heading", text) | ("item", depth, label, text) | ("para", label, text)
# | ("code", lines) | ("timeline", rows)
Block = tuple


def who_started(started_by: str | None) -> str:
    """Who started an attempt, said as such: the supervisor and the rule, or a person's command."""
    if not started_by:
        return "not recorded"
    if started_by.startswith("supervisor"):
        rest = started_by.partition(":")[2].strip()
        return f"the supervisor ({rest})" if rest else "the supervisor"
    return f"a person: {started_by}"


def _placement_text(p: dict[str, Any]) -> str:
    job = f"job {p['executor_job_id']}" if p["executor_job_id"] else "no job id yet"
    where = p.get("resource")
    where = f"{where}/{p['qos']}: " if where and p.get("qos") else f"{where}: " if where else ""
    return f"{where}{p['executor']} {job} on {d.text_or(p['host'], 'no host yet')}, {d.gpus_text(p['gpu_count'], p['gpu_model'], p['gpu_ids'])}"


def _ending_text(row: dict[str, Any]) -> str:
    return row["reason"] or row["state"]


def _decision_text(decision: dict[str, Any] | None, ended: bool) -> str:
    if decision is None:
        return "no decision recorded" if ended else "none yet"
    return f"{_action(decision)} (retry policy: `{decision['rule']}`)"


def _action(decision: dict[str, Any]) -> str:
    return "nothing to do" if decision["action"] == "none" else decision["action"]


def document(facts: dict[str, Any]) -> list[Block]:
    """The facts laid out for a person: the run, its timeline, then one attempt answering the seven questions."""
    run, attempt = facts["run"], facts["attempt"]
    blocks: list[Block] = [
        ("title", f"{run['name'] or run['run_id']}: attempt {attempt['attempt_number']} of {run['attempts']} "
                  f"({attempt['attempt_id']})"),
        ("item", 0, "Run", f"{run['run_id']}, project {run['project']}, model family "
                           f"{d.text_or(run['model_family'], 'not set')}, kind {run['kind']}, {run['state']}"),
        ("item", 0, "Command", f"`{shlex.join(json.loads(run['command']))}` in `{run['workdir']}`"),
    ]
    if run.get("experiment"):
        e = run["experiment"]
        outcome = e["verdict"] or e["status"] + (f" ({e['stop_reason']})" if e["stop_reason"] else "")
        blocks.append(("item", 0, "Experiment", f"the {e['role']} run of {e['experiment_id']} ({e['title']}): {outcome}; "
                                               f"`trackway experiment show {e['experiment_id']}`"))
        for check in e.get("gate") or []:
            verdict = "passed" if check.get("passed") else "FAILED"
            blocks.append(("item", 1, None, f"gate: {check['check']} {verdict}: {check['detail']}"))
        if e["role"] == "test" and e["status"] == "stopped" and not e.get("full_run_id"):
            blocks.append(("item", 1, None, "the full run was never started"))
    for i, judged in enumerate(facts.get("expectations") or []):
        blocks.append(("item", 0, "Expected" if i == 0 else None,
                       f"{judged['state']}: `{judged['criterion']}` ({judged['why']})"))
    blocks += [
        ("heading", "Attempts and decisions"),
        ("timeline", facts["history"]),
    ]
    blocks += _attempt_blocks(facts)
    blocks += _config_blocks(facts)
    blocks += _data_blocks(facts)
    blocks += _placement_blocks(facts)
    if facts["visibility"]:
        blocks += [("heading", "What trackway could see")] + [("item", 0, None, line) for line in facts["visibility"]]
    blocks += _checkpoint_blocks(facts)
    blocks += _retry_blocks(facts)
    blocks += [("heading", "Evaluations")] + [("item", 0, None, line) for line in facts["evaluations"]["lines"]]
    # What trackway will do, then what a person should change: each said once, here.
    blocks += [("para", "Next", facts["next_steps"]["trackway"])]
    if facts["next_steps"]["person"]:
        blocks.append(("para", "To go on", facts["next_steps"]["person"]))
    return blocks


def _attempt_blocks(facts: dict[str, Any]) -> list[Block]:
    """How the attempt ended, with its evidence, when it ran, what it cost, and what was noticed on the way."""
    attempt, ended, now = facts["attempt"], facts["ended_by"], facts["now"]
    n, total = attempt["attempt_number"], facts["run"]["attempts"]
    why = "the latest" if n == total else f"attempt {total} is the latest"
    blocks: list[Block] = [("heading", f"Attempt {n} in full ({why})")]
    failed = [h for h in facts["history"] if h["reason"] not in (None, R.COMPLETED.value) and h["number"] != n]
    if n == total and attempt["state"] == "ended" and ended["reason"] == R.COMPLETED.value and failed:
        last = failed[-1]
        ref = facts["run"]["name"] or facts["run"]["run_id"]
        blocks.append(("item", 0, None, f"attempt {last['number']} is the last that did not complete ({last['reason']}): "
                                        f"`trackway explain {ref}/{last['number']}` shows it in full"))
    ending = "not yet: " + attempt["state"] if not ended["reason"] else ended["reason"]
    ending += f" (rule `{ended['rule']}`)" if ended["rule"] else ""
    if ended["reason"]:
        ending += f", {d.exit_text(attempt['exit_code'])}, {d.signal_text(attempt['signal'])}"
    ran = f"{d.when(attempt['started_at'], now)} → " + (
        f"{d.utc(attempt['ended_at'])}, {d.span((attempt['ended_at'] - attempt['started_at']).total_seconds())}"
        if attempt["ended_at"] and attempt["started_at"] else "not ended"
    )
    blocks += [
        ("item", 0, "Ended", ending),
        ("item", 0, "Started by", who_started(attempt["started_by"])),
        ("item", 0, "Ran", f"{ran}; steps logged: {d.steps_text(attempt['first_step'], attempt['last_step'])}"),
        ("item", 0, "Compute", _compute_text(attempt)),
        ("item", 0, "Log", f"`{attempt['log_path']}`"),
    ]
    # The deciding lines, then the executor's others: a rule decided by the executor quotes its lines already.
    evidence = ended["evidence"] + [line for line in ended["executor"] if line not in ended["evidence"]]
    if evidence:
        blocks += [("para", "Evidence", ""), ("code", evidence)]
    memory = memory_lines(facts.get("memory"))
    if memory:
        blocks += [("heading", "GPU memory")] + [("item", 0, None, line) for line in memory]
    if facts["incidents"]:
        blocks += [("heading", "Incidents")] + [("item", 0, None, line) for line in facts["incidents"]]
    own = facts["run"].get("own_watchers")
    if facts["watchers"] or own:
        blocks += [("heading", "What the watchers noticed")] + [("item", 0, None, line) for line in facts["watchers"]]
        if own:
            blocks.append(("item", 0, "thresholds", f"this run's own (--watch {', '.join(own)}), the rest "
                                                    "trackway.toml's [watchers]"))
    return blocks


def _compute_text(attempt: dict[str, Any]) -> str:
    """GPU-hours (CPU-hours without a GPU), how much of it was useful, and the cost; counted once it ended."""
    if attempt["gpu_seconds"] is None:
        return "counted when the attempt ends"
    return (f"{d.hours(attempt['gpu_seconds'], attempt['gpu_count'])}; useful {d.span(attempt['useful_gpu_seconds'])}, "
            f"wasted {d.span(attempt['wasted_gpu_seconds'])}; cost ${attempt['cost_usd'] or 0:.2f}")


def _more(count: int, shown: int, ref: str) -> list[Block]:
    if count <= shown:
        return []
    return [("item", 1, None, f"… {count - shown} more (`trackway explain {ref} --json` for all)")]


def _config_blocks(facts: dict[str, Any]) -> list[Block]:
    """Question 1, which config: every value when it fits, the keys that differ; with the code and environment."""
    config, receipt = facts["config"], facts["receipt"]
    blocks: list[Block] = [("heading", "Config")]
    values = config["values"]
    if values is None:
        blocks.append(("item", 0, None, "no config declared"))
    else:
        blocks.append(("item", 0, None, f"config `{d.short_hash(config['sha256'])}`, {d.plural(len(values), 'value')}:"))
        blocks += [("item", 1, None, f"{key} = {d.as_stored(values[key])}") for key in sorted(values)[:CONFIG_SHOWN]]
        blocks += _more(len(values), CONFIG_SHOWN, facts["attempt"]["attempt_id"])
    if config["secret_keys"]:
        blocks.append(("item", 0, None, f"secret, kept outside the ledger as `***`: {', '.join(config['secret_keys'])}; "
                                        "a change to one shows in no comparison here"))
    script = config["from_script"]
    if script["merged"]:
        blocks.append(("item", 0, None, "includes what the script passed to trackway.init(config=...)"
                       + ("; where it overrides the submitted config, the script's value is what ran:"
                          if script["conflicts"] else "; no key conflicts with the submitted config")))
        blocks += [("item", 1, None, f"{c['key']}: submitted {d.as_stored(c['submitted'])}, script {d.as_stored(c['script'])}")
                   for c in script["conflicts"]]
    blocks += _differs(config["differs_from_previous"], config["differs_from_first"])
    blocks += [
        *_code_lines(receipt),
        ("item", 0, None, f"environment `{d.short_hash(receipt['environment_sha256'])}`: {receipt['environment']}"),
        ("item", 0, None, _environ_line(receipt["environ"])),
    ]
    if facts["compared_with"]:
        blocks.append(("item", 0, None, f"other changes since {facts['compared_with']}:"))
        for kind in ("environment", "environment variables", "code"):
            lines = facts["changes"][kind]
            blocks.append(("item", 1, None, f"{kind}:" + ("" if lines else " none")))
            blocks += [("item", 2, None, line) for line in lines]
    return blocks


def _code_lines(receipt: dict[str, Any]) -> list[Block]:
    """The code the attempt ran: an evaluation's evaluator version, else the repository, commit and diff."""
    evaluator = receipt.get("evaluator")
    if evaluator is not None:
        files = ", ".join(evaluator["code"]) if evaluator["code"] else f"image {evaluator['image']}"
        return [("item", 0, None, f"code: the evaluator, version {evaluator['evaluator_version']} ({files}), checked "
                                  f"when this attempt launched; task set {d.short_hash(evaluator['task_set_sha256'].rpartition(':')[2])}")]
    code = receipt["code"]
    return [("item", 0, None, f"code: {d.code_text(code['repo'], code['branch'], code['commit'], code['dirty_sha256'])}"),
            *_code_capture_blocks(code)]


def _code_capture_blocks(code: dict[str, Any]) -> list[Block]:
    """How the attempt's code was taken when it launched, and where it ran when that was not the work tree."""
    capture = code.get("capture")
    if capture is None:
        return [("item", 1, None, "taken when the run was submitted (this attempt predates per-attempt capture)")]
    blocks: list[Block] = [("item", 1, None, f"ran: {capture['said']}")]
    workspace = capture.get("workspace")
    if workspace:
        blocks.append(("item", 1, None, f"in `{workspace['cwd']}`"))
        if workspace.get("changed_since"):
            blocks.append(("item", 1, None, "changed since the submit, taken as they are now (the receipt lists them "
                                            "by hash): " + ", ".join(workspace["changed_since"])))
        if workspace.get("submodules"):
            blocks.append(("item", 1, None, "submodules, taken as they are now: " + ", ".join(workspace["submodules"])))
    return blocks


def _differs(previous: dict[str, Any] | None, first: dict[str, Any] | None) -> list[Block]:
    """The config keys that differ from the previous attempt and from the first (once when they are one)."""
    if previous is None:
        return [("item", 0, None, "differs from: nothing (the first attempt)")]
    blocks: list[Block] = []
    same_attempt = first is None or first["attempt_id"] == previous["attempt_id"]
    against = [(previous, "the previous and the first" if same_attempt else "the previous")]
    if not same_attempt:
        against.append((first, "the first"))
    for other, role in against:
        keys = other["keys"]
        blocks.append(("item", 0, None, f"differs from {other['attempt_id']} ({role}):" + ("" if keys else " no key")))
        blocks += [("item", 1, None, line) for line in keys]
    return blocks


def _environ_line(environ: dict[str, Any] | None) -> str:
    if environ is None:
        return "environment variables: not recorded (run submitted before trackway kept them)"
    secrets = environ["secrets"]
    kept = f"; secret, kept outside the ledger: {', '.join(secrets)}" if secrets else ""
    return f"environment variables `{d.short_hash(environ['sha256'])}` ({environ['variables']} as submitted{kept})"


def _data_blocks(facts: dict[str, Any]) -> list[Block]:
    """Question 2, which data: the files with their sizes, and what changed since the previous attempt."""
    data = facts["data"]
    blocks: list[Block] = [("heading", "Data")]
    if data["sha256"] is None:
        return blocks + [("item", 0, None, "no data declared")]
    files = data["files"]
    blocks.append(("item", 0, None, f"data manifest `{d.short_hash(data['sha256'])}`: {d.plural(len(files), 'file')}, "
                                    f"{d.size_text(data['total_bytes'])}"))
    blocks += [("item", 1, None, f"{f['path']}  {d.size_text(f['size'])}") for f in files[:FILES_SHOWN]]
    blocks += _more(len(files), FILES_SHOWN, facts["attempt"]["attempt_id"])
    changes = data["changed_since_previous"]
    if changes is not None:
        blocks.append(("item", 0, None, f"since {facts['compared_with']}:" + ("" if changes else " no file changed")))
        blocks += [("item", 1, None, line) for line in changes]
    return blocks


def _placement_blocks(facts: dict[str, Any]) -> list[Block]:
    """Question 3, which machine: host, GPUs and their model, executor and its job id."""
    p = facts["placement"]
    chosen = p["selection"]
    resource = f"{p['resource']}" + (f", QoS {p['qos']}" if p["qos"] else "")
    if chosen is None:
        why = "chosen before trackway recorded its reasons"
    elif p.get("kind") == "eval":
        # Nobody typed --resource: an evaluation seed goes where its spec says, else where its training ran.
        evaluator = facts["receipt"].get("evaluator") or {}
        source = (f"the eval spec's resource = {evaluator['resource']!r}" if evaluator.get("resource")
                  else "the resource its training run was placed on")
        why = f"{source}: {chosen['reason']}"
    elif chosen["requested"] != "auto":
        why = f"asked for by name (--resource {chosen['requested']}): {chosen['reason']}"
    else:
        why = f"chosen: {chosen['reason']}"
    blocks: list[Block] = [
        ("heading", "Placement"),
        ("item", 0, "resource", f"{resource} ({why})"),
    ]
    for skipped in (chosen or {}).get("skipped", []):
        blocks.append(("item", 1, "passed over", f"{skipped['resource']}: {skipped['reason']}"))
    scheduler = p["scheduler"]
    if scheduler:
        said = [f"job {scheduler['slurm_job_id']}"] if scheduler.get("slurm_job_id") else []
        said += [f"{label} {scheduler[key]}" for key, label in (("partition", "partition"), ("qos", "QoS"),
                                                                   ("node_list", "nodes")) if scheduler.get(key)]
        # Kubernetes: the pod, its node, and the image it ran by the digest the kubelet pulled.
        said += [f"{label} {scheduler[key]}" for key, label in (("namespace", "namespace"), ("pod", "pod"),
                                                                   ("node", "node"), ("image", "image"))
                 if scheduler.get(key)]
        blocks.append(("item", 0, "scheduler", ", ".join(said) or "placed"))
        # A run over several nodes: every node with its GPUs, as each node's task said where it ran.
        for node in scheduler.get("nodes") or ():
            gpus = ",".join(str(gpu) for gpu in node.get("gpu_ids") or ()) or "none"
            blocks.append(("item", 1, f"node {node['node_rank']}", f"{d.text_or(node.get('host'))}, GPUs {gpus}"))
        expected = scheduler.get("nodes_expected")
        if expected and len(scheduler.get("nodes") or ()) < expected:
            blocks.append(("item", 1, "nodes", f"{len(scheduler.get('nodes') or ())} of {expected} said where they "
                                               "ran (the others had not started when the job ended)"))
    return blocks + [
        ("item", 0, "host", d.text_or(p["host"], "no host yet (the attempt had not started)")),
        ("item", 0, "GPUs", d.gpus_text(p["gpu_count"], p["gpu_model"], p["gpu_ids"])),
        ("item", 0, "executor", f"{p['executor']}, job {d.text_or(p['executor_job_id'], 'not started')}"),
    ]


def _checkpoint_blocks(facts: dict[str, Any]) -> list[Block]:
    """Question 4, which checkpoint: resumed from, committed during, the newest committed one of the run."""
    ckpt, now = facts["checkpoints"], facts["now"]
    committed = ", ".join(c["name"] + ("" if c["state"] == "committed" else f" ({c['state']})") for c in ckpt["committed"])
    newest = ckpt["newest_of_run"]
    newest_text = (
        f"{newest['name']} (step {newest['step']}, by {d.text_or(newest['attempt_id'])}, "
        f"{d.when(newest['committed_at'], now)})" if newest else "none: the run has no committed checkpoint"
    )
    lost = ckpt.get("events_lost") or []
    if lost:  # the resume, or a commit, may be among the events that never came
        committed = f"{committed}; perhaps more: {_lost_text(lost)}" if committed else f"not known: {_lost_text(lost)}"
    return [
        ("heading", "Checkpoints"),
        ("item", 0, "resumed from", ckpt["resumed_from"] or ("not known: " + _lost_text(lost) if lost
                                                             else "the start (no checkpoint)")),
        *([("item", 1, "read from", ckpt["read_from"])] if ckpt.get("read_from") and ckpt["resumed_from"] else []),
        *([("item", 1, None, ckpt["not_taken_up"])] if ckpt.get("not_taken_up") else []),
        ("item", 0, "committed during this attempt", committed or "none"),
        ("item", 0, "newest committed of the run", newest_text),
    ]


def _lost_text(lost: list[str]) -> str:
    return f"this attempt's events never arrived from where it ran ({', '.join(lost)})"


def _retry_blocks(facts: dict[str, Any]) -> list[Block]:
    """Question 5, what was retried and why: each decision, who made it and its rule, and who started what followed."""
    rows = facts["history"]
    policy = ("this run's own --retry-policy, over trackway.toml's [retry] and the defaults"
              if facts["run"]["own_retry_policy"] else "trackway.toml's [retry] over the defaults")
    blocks: list[Block] = [("heading", "Retries"), ("item", 0, "decided by", f"the supervisor's retry policy ({policy})")]
    for row, following in zip(rows, rows[1:] + [None]):
        if row["state"] != "ended":
            continue
        decision = row["decision"]
        said = (f"{_action(decision)}, rule `{decision['rule']}`" if decision else "no decision recorded")
        then = (f"; attempt {following['number']} was started by {who_started(following['started_by'])}" if following
                else ("; a new attempt is queued" if facts["run"]["state"] == RunState.QUEUED.value else ""))
        blocks.append(("item", 0, None, f"after attempt {row['number']} ({_ending_text(row)}): {said}{then}"))
    return blocks


# -- markdown --------------------------------------------------------------------------------------


def to_markdown(facts: dict[str, Any]) -> str:
    """The facts as Markdown, for pasting into an issue or a notebook."""
    out: list[str] = []
    previous = None
    for block in document(facts):
        kind = block[0]
        if kind != "item" or previous != "item":
            if out:
                out.append("")
        if kind == "title":
            out.append(f"# {block[1]}")
        elif kind == "heading":
            out.append(f"## {block[1]}")
        elif kind == "item":
            _, depth, label, text = block
            out.append("  " * depth + "- " + (f"**{label}:** " if label else "") + text)
        elif kind == "para":
            out.append(f"**{block[1]}:** {block[2]}".rstrip())
        elif kind == "code":
            out += ["```", *block[1], "```"]
        elif kind == "timeline":
            out += _markdown_timeline(block[1])
        previous = kind
    return "\n".join(out) + "\n"


TIMELINE_HEADERS = ("#", "started by", "placement", "steps", "resumed from", "committed", "ending", "decision")


def timeline_cells(row: dict[str, Any]) -> dict[str, str]:
    """One timeline row as the texts people read, by column."""
    ending = _ending_text(row)
    if row["evidence"] and row["reason"] != R.COMPLETED.value:
        ending += f": {row['evidence']}"
    lost = bool(row.get("events_lost"))
    return {
        "#": str(row["number"]),
        "started by": who_started(row["started_by"]),
        "placement": _placement_text(row["placement"]),
        "steps": d.steps_text(row["first_step"], row["last_step"]),
        "resumed from": row["resumed_from"] or ("not known (events lost)" if lost else "the start"),
        "committed": _committed_cell(row["committed"], lost),
        "ending": ending,
        "decision": _decision_text(row["decision"], row["state"] == "ended"),
    }


def _committed_cell(names: list[str], events_lost: bool) -> str:
    if not events_lost:
        return ", ".join(names) or "none"
    return f"{', '.join(names)} (perhaps more: events lost)" if names else "not known (events lost)"


def timeline_entry(row: dict[str, Any]) -> tuple[str, list[str]]:
    """One timeline row as text lines for a narrow screen: the ending and decision first, then the rest."""
    cells = timeline_cells(row)
    lines = [
        f"started by {cells['started by']}",
        f"{cells['placement']}; " + (f"steps {cells['steps']}" if row["last_step"] is not None else "no step logged"),
        f"resumed from {cells['resumed from']}; committed {cells['committed']}",
    ]
    if row["evidence"] and row["reason"] != R.COMPLETED.value:
        lines.append(f"evidence: {row['evidence']}")
    return f"{_ending_text(row)} → {cells['decision']}", lines


def _markdown_timeline(rows: list[dict[str, Any]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(TIMELINE_HEADERS) + " |", "|" + "---|" * len(TIMELINE_HEADERS)]
    for row in rows:
        cells = timeline_cells(row)
        lines.append("| " + " | ".join(cell(cells[h]) for h in TIMELINE_HEADERS) + " |")
    return lines
