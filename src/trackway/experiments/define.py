"""`experiment new`: a hypothesis recorded against its baseline run, with its changes computed and criteria parsed.

The changes are the experiment's config against the baseline's, as the baseline really ran
(its last attempt's config: the submitted one merged with what the script's `init(config=...)`
said), so `--set train.lr=6e-3` reads `train.lr: 0.003 → 0.006` even when the baseline never
set `lr` itself. A different command counts as a change too, and, when the config and command
are the baseline's, different code (commit or uncommitted diff). An experiment that changes
nothing is refused. More than one change is refused unless `--allow-multiple-changes` says it is
meant (and the experiment records that it was).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from trackway.errors import InputError
from trackway.experiments import criteria as criteria_language
from trackway.receipts.config_diff import change_text, changes as config_changes, flatten
from trackway.experiments.launch import experiment_dir
from trackway.experiments.records import (
    ExperimentStatus,
    Verdict,
    insert_experiment,
    new_experiment_id,
    resolve_experiment,
)
from trackway.ledger import Ledger
from trackway.ledger.blobs import get_blob, put_blob
from trackway.ledger.records import latest_attempt, resolve_run
from trackway.ledger.schema import experiments, run_eval_specs
from trackway.ledger.script_config import merge
from trackway.ledger.store import make_private_dirs
from trackway.receipts import submitted_argv, submitted_config, submitted_env
from trackway.receipts.config import apply_overrides, load_config
from trackway.redaction import redact, redact_structure
from trackway.settings import Settings
from trackway.taxonomy import RunKind


@dataclass
class ExperimentSpec:
    """What `trackway experiment new` was asked to record."""

    title: str
    hypothesis: str
    cwd: Path
    baseline: str | None = None  # a run id or name; None with `parent`: chosen from the parent's verdict
    parent: str | None = None  # `--from EXP`
    command: list[str] = field(default_factory=list)  # empty: the baseline's
    config_path: str | None = None  # empty: the baseline's submitted config
    overrides: list[str] = field(default_factory=list)
    criteria: list[str] = field(default_factory=list)
    allow_multiple_changes: bool = False
    name: str | None = None
    project: str | None = None
    data_paths: list[str] | None = None
    eval_spec_paths: list[str] = field(default_factory=list)
    no_evals: bool = False  # the full run gets no evaluations (default: the baseline's specs)
    gpus: int | None = None
    time_limit_hours: float | None = None
    resource: str | None = None
    # The code change, as `--branch B` or `--commit C` (kind "branch" or "commit"): the experiment's runs run
    # exactly that commit, cloned from the baseline's repository; None: the work tree as it is.
    code_ref: str | None = None
    code_ref_kind: str = "branch"


@dataclass
class Recorded:
    experiment_id: str
    baseline_run_id: str
    changes: list[dict[str, Any]]
    baseline_note: str  # how the baseline was chosen (`--from`), or ""


def new_experiment(ledger: Ledger, settings: Settings, spec: ExperimentSpec) -> Recorded:
    """Record the experiment (status planned); bad input is refused before anything is written."""
    parsed = _validated_criteria(spec)
    with ledger.read() as conn:
        parent, baseline, note = _baseline(conn, spec)
        if spec.name is not None and conn.execute(
            select(experiments.c.experiment_id).where(experiments.c.name == spec.name)
        ).first() is not None:
            raise InputError(f"--name {spec.name!r}: an experiment with that name exists; pick another")
        last = latest_attempt(conn, baseline["run_id"])
        effective = _config(conn, last["config_sha256"] if last else None) or _config(conn, baseline["config_sha256"])
        submitted_blob = get_blob(conn, baseline["config_sha256"]) if baseline["config_sha256"] else None
        inherited_specs = _eval_specs_of(conn, baseline["run_id"])
    if spec.resource and spec.resource not in settings.resources and spec.resource not in ("local", "auto"):
        raise InputError(f"--resource {spec.resource!r}: not declared in trackway.toml "
                         f"(declared: {', '.join(sorted(settings.resources)) or 'none'}, or auto)")
    config, command, changes = _against_baseline(settings, spec, baseline, submitted_blob, effective)
    if spec.code_ref is not None:
        changes.append(_code_ref_change(settings, spec, baseline, command.argv))
    elif not changes:
        changes = _code_change(settings, spec, baseline, effective)
    if len(changes) > 1 and not spec.allow_multiple_changes:
        listed = "; ".join(change_text(c) for c in changes[:6]) + ("; ..." if len(changes) > 6 else "")
        raise InputError(
            f"--set: this changes {len(changes)} things against the baseline ({listed}); one change at a time "
            "tells what worked. Split it, or pass --allow-multiple-changes to record that it is meant"
        )
    if spec.no_evals and spec.eval_spec_paths:
        raise InputError("--no-evals: cannot go with --eval; give one or the other")
    eval_specs = _eval_specs(spec.eval_spec_paths, settings) if spec.eval_spec_paths else None
    experiment_id = new_experiment_id()
    folder = experiment_dir(settings, experiment_id)
    try:
        _keep_experiment_files(folder, command, config)
        with ledger.write() as conn:
            config_sha = put_blob(conn, submitted_config.recorded(config.values), "config") if config else None
            specs = _specs_for(conn, spec, eval_specs, inherited_specs)
            _insert_planned(conn, spec, experiment_id, parent, baseline, config_sha, command, changes, parsed, specs)
    except BaseException:
        for kept in (submitted_argv.SECRET_FILE, submitted_config.CONFIG_FILE):
            (folder / kept).unlink(missing_ok=True)
        raise
    return Recorded(experiment_id, baseline["run_id"], changes, note)


def _validated_criteria(spec: ExperimentSpec) -> list:
    """The spec's criteria parsed, after its title, hypothesis, name, GPUs and time limit are checked (in that order)."""
    from trackway import validation

    for text, name in ((spec.title, "--title"), (spec.hypothesis, "--hypothesis")):
        if not text or not text.strip():
            raise InputError(f"{name}: expected a non-empty text")
    validation.printable_text(spec.title, "--title")
    if spec.name is not None:
        validation.run_name(spec.name)
    parsed = [criteria_language.parse(text) for text in spec.criteria]
    if spec.gpus is not None:
        validation.whole(spec.gpus, "--gpus", 0, validation.MAX_GPUS)
    if spec.time_limit_hours is not None:
        validation.finite(spec.time_limit_hours, "--time-limit", 0, validation.TEN_YEARS_HOURS, "hours", low_open=True)
    return parsed


def _against_baseline(settings: Settings, spec: ExperimentSpec, baseline, submitted_blob: bytes | None,
                      effective: dict | None):
    """(the experiment's config as given or None, its command, its changes against the baseline as it really ran)."""
    # The baseline's config as given, not as recorded: the experiment's script must get its real API key.
    submitted = _given_config(settings, baseline, submitted_blob, needed=not spec.config_path)
    base = load_config(spec.config_path).values if spec.config_path else json.loads(json.dumps(submitted or {}))
    config = apply_overrides(base, spec.overrides) if (base or spec.overrides) else None
    # Compared as recorded (secret values `***`), like every config comparison; a secret that changed
    # is a change all the same, said as `***`.
    effective = redact_structure(effective or {})  # a baseline recorded before configs were masked holds them as given
    after, _ = merge(effective, redact_structure(config.values) if config else {})
    changes = config_changes(effective, after)
    if submitted is not None and config is not None:
        changes += _secret_changes(submitted, config.values)
    baseline_command = _typed_command(settings, baseline)
    command = submitted_argv.capture(list(spec.command) or baseline_command.argv,
                                     list(submitted_env.capture().secret.values()))
    if command.argv != baseline_command.argv:
        # Said as recorded: a changed token reads `--token *** → --token ***`, a change all the same.
        changes.append({"key": "command", "before": " ".join(baseline_command.recorded),
                        "after": " ".join(command.recorded)})
    return config, command, changes


def _code_change(settings: Settings, spec: ExperimentSpec, baseline, effective: dict | None) -> list[dict[str, Any]]:
    """With the config and the command the baseline's, the code must differ (said as the one change); an
    experiment that changes nothing, or nothing trackway can see, is refused."""
    from trackway.receipts.code import capture_code

    workdir = spec.cwd if spec.command else Path(baseline["workdir"])
    now = capture_code(workdir, home=settings.home)
    before = (baseline["code_commit"], baseline["code_dirty_sha256"])
    compared = (f"same config ({len(flatten(effective or {}))} keys compared with what baseline "
                f"{baseline['name'] or baseline['run_id']} ran), same command")
    if now.commit is None or before[0] is None:
        where = "here" if now.commit is None else "for the baseline"
        raise InputError(f"no change against the baseline: {compared}, and no git commit {where} to compare the "
                         "code by; give one change (--set KEY=VALUE, a command after `--`, or committed code)")
    if (now.commit, now.dirty_sha256) == before:
        raise InputError(f"no change against the baseline: {compared}, same code (commit {now.commit[:12]}"
                         + (", same uncommitted diff" if now.dirty_sha256 else ", clean")
                         + "); give one change (--set KEY=VALUE, a command after `--`, or new code)")

    def said(commit: str, dirty: str | None) -> str:
        return f"commit {commit[:12]}" + (" with an uncommitted diff" if dirty else "")

    return [{"key": "code", "before": said(*before), "after": said(now.commit, now.dirty_sha256)}]


def _code_ref_change(settings: Settings, spec: ExperimentSpec, baseline, argv: list[str]) -> dict[str, Any]:
    """The change `--branch B` / `--commit C` makes against the code the baseline ran: its commit, the files and
    lines it changes, and where its runs clone it from."""
    from trackway.receipts.code import capture_code, changed_files, resolve_commit

    flag = f"--{spec.code_ref_kind}"
    if spec.command:
        raise InputError(f"{flag}: cannot go with a command after `--`: a code-change experiment runs the baseline's "
                         "command on the other code, so that the code is the one change")
    if not baseline["code_commit"]:
        raise InputError(f"{flag} {spec.code_ref!r}: baseline {baseline['name'] or baseline['run_id']} has no "
                         "recorded commit to compare the code with (it was not run from a git work tree)")
    workdir = Path(baseline["workdir"])
    here = capture_code(workdir, home=settings.home)
    if here.root is None:
        raise InputError(f"{flag} {spec.code_ref!r}: the baseline's working directory {workdir} is no longer in a "
                         "git work tree to find it in")
    commit = resolve_commit(here.root, spec.code_ref)
    if commit is None:
        raise InputError(f"{flag} {spec.code_ref!r}: expected a {spec.code_ref_kind} of the repository at {here.root}")
    if commit == baseline["code_commit"] and not baseline["code_dirty_sha256"]:
        raise InputError(f"{flag} {spec.code_ref!r}: is commit {commit[:12]}, the code the baseline ran: no change")
    root = here.root.resolve()
    for word in argv:
        if word.startswith("/") and Path(word).resolve().is_relative_to(root):
            raise InputError(f"{flag}: the baseline's command names {word}, inside the work tree, by its absolute "
                             "path: the experiment's runs clone the other code elsewhere and would run this file. "
                             "Name it relative to the working directory (start a baseline that does)")
    files = changed_files(root, baseline["code_commit"], commit)
    added = sum(f["added"] or 0 for f in files)
    deleted = sum(f["deleted"] or 0 for f in files)
    before = f"commit {baseline['code_commit'][:12]}" + (" with an uncommitted diff" if baseline["code_dirty_sha256"] else "")
    return {"key": "code", "before": before,
            "after": f"commit {commit[:12]} ({spec.code_ref_kind} {spec.code_ref}; {len(files)} file(s), +{added} "
                     f"-{deleted} lines)",
            "commit": commit, "ref": spec.code_ref, "repo": str(root),
            "subdir": workdir.resolve().relative_to(root).as_posix() if workdir.resolve() != root else "",
            "files": files}


def _keep_experiment_files(folder: Path, command: submitted_argv.SubmittedCommand, config) -> None:
    """What the ledger must not hold, kept in the experiment's folder: the command's hidden words, the config as given."""
    if command.needs_file:
        make_private_dirs(folder)
        submitted_argv.write_secret_file(folder, command)
    if config:
        make_private_dirs(folder)
        submitted_config.write_file(folder / submitted_config.CONFIG_FILE, config.canonical)


def _specs_for(conn, spec: ExperimentSpec, eval_specs, inherited: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eval specs the full run gets: those given (stored now), none with --no-evals, else the baseline's."""
    if eval_specs is not None:
        from trackway.evals.records import store_spec

        return [{"name": s.name, "spec_sha256": store_spec(conn, s), "trigger": s.trigger} for s in eval_specs]
    return [] if spec.no_evals else inherited


def _insert_planned(conn, spec: ExperimentSpec, experiment_id: str, parent, baseline, config_sha: str | None,
                    command: submitted_argv.SubmittedCommand, changes: list[dict[str, Any]], parsed: list,
                    specs: list[dict[str, Any]]) -> None:
    """The experiment's row, status planned; what the spec leaves out is the baseline's."""
    insert_experiment(conn, dict(
        experiment_id=experiment_id,
        name=spec.name,
        project=spec.project or baseline["project"],
        title=spec.title.strip(),
        hypothesis=spec.hypothesis.strip(),
        baseline_run_id=baseline["run_id"],
        parent_experiment_id=parent["experiment_id"] if parent else None,
        command=json.dumps(command.recorded),
        workdir=str(spec.cwd if spec.command else Path(baseline["workdir"])),
        config_sha256=config_sha,
        overrides=json.dumps([redact(item) for item in spec.overrides]),  # `--set api_key=***`
        changes=json.dumps(changes),
        allow_multiple_changes=bool(spec.allow_multiple_changes),
        criteria=json.dumps([c.source for c in parsed]),
        eval_specs=json.dumps(specs) if specs else None,
        data_paths=json.dumps(spec.data_paths if spec.data_paths is not None
                              else json.loads(baseline["data_paths"] or "[]")),
        gpus=spec.gpus if spec.gpus is not None else baseline["gpus"],
        time_limit_s=spec.time_limit_hours * 3600 if spec.time_limit_hours else baseline["time_limit_s"],
        resource_request=spec.resource or baseline["resource_request"],
        status=ExperimentStatus.PLANNED.value,
    ))


def _typed_command(settings: Settings, baseline) -> submitted_argv.SubmittedCommand:
    """The baseline's command as typed: an experiment that keeps it must run its real `--token`, not `***`."""
    try:
        return submitted_argv.read(json.loads(baseline["command"]), settings.runs_dir / baseline["run_id"])
    except submitted_argv.MissingArguments as exc:
        raise InputError(f"baseline {baseline['name'] or baseline['run_id']}: {exc}") from None


def _given_config(settings: Settings, baseline, blob: bytes | None, needed: bool) -> dict | None:
    """The baseline's submitted config as given, read back from its run's directory (None: it had none, or, when not
    `needed`, its hidden values are gone)."""
    if blob is None:
        return None
    try:
        values = submitted_config.read(blob, settings.runs_dir / baseline["run_id"] / submitted_config.CONFIG_FILE)
    except submitted_config.MissingConfig as exc:
        if needed:
            raise InputError(f"baseline {baseline['name'] or baseline['run_id']}: {exc}") from None
        return None
    return values if isinstance(values, dict) else None


def _secret_changes(before: dict, after: dict) -> list[dict[str, Any]]:
    """The keys whose value changed where the ledger shows both sides alike (`***`), said as it shows them."""
    given_before, given_after = flatten(before), flatten(after)
    shown_before, shown_after = flatten(redact_structure(before)), flatten(redact_structure(after))
    return [
        {"key": key, "before": shown_before[key], "after": shown_after[key]}
        for key in sorted(given_before.keys() & given_after.keys() & shown_before.keys() & shown_after.keys())
        if given_before[key] != given_after[key] and shown_before[key] == shown_after[key]
    ]


def _baseline(conn, spec: ExperimentSpec):
    """(parent experiment or None, the baseline run, how it was chosen)."""
    parent = resolve_experiment(conn, spec.parent) if spec.parent else None
    if spec.baseline:
        baseline = resolve_run(conn, spec.baseline)
        note = ""
    elif parent is None:
        raise InputError("--baseline: expected the run this hypothesis is measured against (or --from EXP)")
    elif parent["verdict"] == Verdict.SUPPORTED.value and parent["full_run_id"]:
        baseline = resolve_run(conn, parent["full_run_id"])
        note = f"{parent['experiment_id']} was supported: its full run {baseline['run_id']} is the new baseline"
    else:
        baseline = resolve_run(conn, parent["baseline_run_id"])
        outcome = parent["verdict"] or parent["status"]
        note = (f"{parent['experiment_id']} is {outcome}: its change is reverted and its baseline "
                f"{baseline['run_id']} stays the baseline")
    if baseline["kind"] == RunKind.EVAL.value:
        raise InputError(f"--baseline {spec.baseline or baseline['run_id']!r}: is an evaluation run; "
                         "expected a training run")
    return parent, baseline, note


def _config(conn, sha: str | None) -> dict | None:
    if not sha:
        return None
    values = json.loads(get_blob(conn, sha))
    return values if isinstance(values, dict) else None


def _eval_specs_of(conn, run_id: str) -> list[dict[str, Any]]:
    """The baseline's attached eval specs, so the experiment's full run is evaluated the same way."""
    rows = conn.execute(
        select(run_eval_specs.c.name, run_eval_specs.c.spec_sha256, run_eval_specs.c.trigger)
        .where(run_eval_specs.c.run_id == run_id).order_by(run_eval_specs.c.name)
    ).mappings()
    return [dict(r) for r in rows]


def _eval_specs(paths: Sequence[str], settings: Settings):
    from trackway.supervisor.submit import load_eval_specs

    return load_eval_specs(paths, settings)
