"""Evaluation specs (TOML): what to run against a checkpoint, on which tasks, how to decode, when, and how many seeds.

    name = "arith"
    command = ["{python}", "eval_arith.py"]   # {python}: the interpreter trackway runs under
    code = ["eval_arith.py"]                  # hashed into the evaluator's version (or: image = "repo@sha256:...")
    task_set = "arith_tasks.jsonl"            # optional: hashed into the task set's version; without it the
                                              # tasks are bundled with the evaluator (its version covers them)
    seeds = [0, 1, 2]
    metrics = ["pass@1", "pass@2"]            # pass@k for every k ≤ samples is stored; these are shown
    trigger = "every_commit"                  # or "on_demand", or every_n_commits = 2
    time_limit_hours = 1                      # optional
    resource = "inference-box"                # optional: where the seeds run (default: the training run's
                                              # resource); on another machine, the checkpoint is read
                                              # from the run's checkpoint_root (an object store)
    [decoding]                                # free-form; `samples` is samples per task
    samples = 4
    temperature = 0.8
    [escalation]                              # optional: one seed first, the rest only if it clears
    first_seeds = 1
    escalate_if = "pass@1 >= 0.05"
    [output]                                  # optional: the output lines' field names (evals/outputs.py)
    task_id = "doc_id"                        # e.g. lm-eval's per-sample lines
    correct = "acc"                           # true/false or 1/0
    sample = false                            # no such field: a task's lines are its samples, in order
    output = "filtered_resps"

A spec in two phases says `[inference]` and `[scoring]` instead of `command` (each with its own
command, code, resource, gpus and time_limit_hours; inference optionally with `server` and
`health_url`), and may pin a `[judge]` (model and version, or a local command; rubric; decoding):

    [inference]                               # generates outputs into $TRACKWAY_EVAL_OUTPUTS_DIR, once per seed
    command = ["{python}", "generate.py"]
    gpus = 1
    server = ["{python}", "serve.py", "--port", "{port}"]   # optional: started first, stopped after
    health_url = "http://127.0.0.1:{port}/health"
    [scoring]                                 # reads $TRACKWAY_EVAL_INFERENCE_OUTPUTS, writes $TRACKWAY_EVAL_OUTPUT
    command = ["{python}", "score.py"]
    [judge]
    command = ["{python}", "judge.py"]        # or: model = "grader", version = "2026-01-15"
    rubric = "rubric.md"

Relative paths (`workdir`, `code`, `task_set` and arguments that name files) resolve against
the spec file's directory; the command runs in `workdir` (default: that directory). Every error
names the file and the field. What each key takes is a typed model (evals/spec_model.py), whose
JSON Schema `trackway schema --for eval-spec` writes for editors.
"""

from __future__ import annotations

import operator
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trackway.errors import InputError
from trackway.evals.versions import content_version

COMPARATORS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Escalation:
    first_seeds: int
    metric: str
    op: str
    threshold: float

    @property
    def condition(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"

    def holds(self, value: float) -> bool:
        return COMPARATORS[self.op](value, self.threshold)


@dataclass(frozen=True)
class Phase:
    """One phase of a two-phase evaluation (`inference` or `scoring`), run as its own run per seed."""

    name: str
    command: list[str]
    code: list[Path]
    resource: str | None = None
    gpus: int = 0
    time_limit_hours: float | None = None
    server: list[str] | None = None  # inference only: the model server trackway starts first and stops after
    health_url: str | None = None  # with `{port}`: answers once the server is ready
    server_start_timeout_s: float = 600.0

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"command": self.command, "code": [str(p) for p in self.code], "gpus": self.gpus}
        if self.resource:
            record["resource"] = self.resource
        if self.time_limit_hours is not None:
            record["time_limit_hours"] = self.time_limit_hours
        if self.server is not None:
            record.update(server=self.server, health_url=self.health_url,
                          server_start_timeout_s=self.server_start_timeout_s)
        return record


@dataclass(frozen=True)
class Judge:
    """The judge a scorer asks: a model pinned by version or digest, or a local command whose code is hashed."""

    rubric: Path
    model: str | None = None
    version: str | None = None
    command: list[str] | None = None
    code: list[Path] = field(default_factory=list)
    decoding: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"rubric": str(self.rubric), "decoding": self.decoding}
        if self.command is not None:
            record.update(command=self.command, code=[str(p) for p in self.code])
        else:
            record.update(model=self.model, version=self.version)
        return record

    def identity(self, where: Path) -> dict[str, Any]:
        """What the judge is, read now: its model and version or its command and code hash; the rubric's hash."""
        identity: dict[str, Any] = {
            "rubric_sha256": "sha256:" + content_version([self.rubric], f"{where}: judge.rubric"),
            "decoding": self.decoding,
        }
        if self.command is not None:
            identity.update(command=self.command,
                            code_sha256="sha256:" + content_version(self.code, f"{where}: judge.code"))
        else:
            identity.update(model=self.model, version=self.version)
        return identity


@dataclass(frozen=True)
class EvalSpec:
    name: str
    path: Path
    command: list[str]
    workdir: Path
    code: list[Path]
    image: str | None
    task_set: Path | None  # None: the tasks are bundled with the evaluator
    seeds: list[int]
    metrics: list[str]
    trigger: str
    every_n_commits: int
    decoding: dict[str, Any] = field(default_factory=dict)
    escalation: Escalation | None = None
    time_limit_hours: float | None = None
    gpus: int = 0
    output_fields: dict[str, Any] = field(default_factory=dict)  # [output]: contract field → the evaluator's name
    resource: str | None = None  # a declared resource the seeds run on; None: the training run's
    inference: Phase | None = None  # a two-phase spec: generation, then scoring (command is then empty)
    scoring: Phase | None = None
    judge: Judge | None = None

    @property
    def two_phase(self) -> bool:
        return self.inference is not None and self.scoring is not None

    def record(self) -> dict[str, Any]:
        """The spec as stored in the ledger (a blob), with every path resolved."""
        return {
            "name": self.name,
            "path": str(self.path),
            "command": self.command,
            "workdir": str(self.workdir),
            "code": [str(p) for p in self.code],
            "image": self.image,
            "task_set": None if self.task_set is None else str(self.task_set),
            "seeds": self.seeds,
            "metrics": self.metrics,
            "trigger": self.trigger,
            "every_n_commits": self.every_n_commits,
            "decoding": self.decoding,
            "escalation": None if self.escalation is None else {
                "first_seeds": self.escalation.first_seeds, "escalate_if": self.escalation.condition},
            "time_limit_hours": self.time_limit_hours,
            "gpus": self.gpus,
            **({"output": dict(self.output_fields)} if self.output_fields else {}),
            **({"resource": self.resource} if self.resource else {}),
            **({"inference": self.inference.record()} if self.inference else {}),
            **({"scoring": self.scoring.record()} if self.scoring else {}),
            **({"judge": self.judge.record()} if self.judge else {}),
        }

    def evaluator_version(self) -> str:
        """The image digest when given, else `sha256:` over the code files (read now: edits show)."""
        if self.image:
            return self.image
        return "sha256:" + content_version(self.code, f"{self.path}: code")

    def inference_version(self) -> str:
        """The inference phase's version: the image digest when given, else `sha256:` over its code files."""
        assert self.inference is not None
        if self.image:
            return self.image
        return "sha256:" + content_version(self.inference.code, f"{self.path}: inference.code")

    def judge_identity(self) -> dict[str, Any] | None:
        """The judge as it is now (rubric and local judge code hashed); None without a `[judge]`."""
        return None if self.judge is None else self.judge.identity(self.path)

    def task_set_version(self) -> str:
        """The task set's content hash; with no task_set (tasks bundled with the evaluator), the evaluator's version."""
        if self.task_set is None:
            return self.evaluator_version()
        return "sha256:" + content_version([self.task_set], f"{self.path}: task_set")

    def due_for_commit(self, ordinal: int) -> bool:
        """Whether the `ordinal`-th committed checkpoint of a run (1-based) triggers this spec."""
        if self.trigger == "every_commit":
            return True
        if self.trigger == "every_n_commits":
            return ordinal % self.every_n_commits == 0
        return False


def load_spec(path: str | Path) -> EvalSpec:
    """Read and check an eval spec file; InputError names the field and what was expected."""
    path = Path(path).resolve()
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"--spec {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"--spec {path}: expected an eval spec file (TOML), found a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise InputError(f"--spec {path}: cannot be read as a TOML file ({reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--spec {path}: not valid TOML: {exc}") from None
    return spec_from_mapping(doc, path)


def spec_from_record(record: Mapping[str, Any]) -> EvalSpec:
    """A spec back from its stored record (paths are already absolute)."""
    doc = {k: v for k, v in record.items() if k != "path"}
    if "inference" in doc or "scoring" in doc:
        # A two-phase spec's record keeps the top-level keys each phase says for itself: a file may not.
        for key in ("command", "code", "gpus", "resource", "time_limit_hours"):
            doc.pop(key, None)
    if doc.get("trigger") != "every_n_commits":
        doc.pop("every_n_commits", None)
    if doc.get("code") == []:  # an image, and no files named in the command: a file may not say `code = []`
        doc.pop("code")
    return spec_from_mapping({k: v for k, v in doc.items() if v is not None}, Path(record["path"]), placeholders=False)


def spec_from_mapping(doc: Mapping[str, Any], path: Path, placeholders: bool = True) -> EvalSpec:
    """`doc` (the spec at `path`) checked whole (evals/spec_model.py), its paths resolved against its directory."""
    # Imported here: pydantic and the model are for reading a spec file; records of stored specs, listings
    # and every command that touches an evaluation import this module without reading one.
    from trackway.evals.spec_model import SpecPlace, read_spec_file, resolve

    place = SpecPlace(path.parent, placeholders)
    spec = read_spec_file(dict(doc), path, place)
    workdir = place.workdir(spec.workdir)
    escalation = spec.escalation
    inference = scoring = None
    if spec.inference is not None and spec.scoring is not None:
        inference, scoring = _phase(spec.inference, place, workdir), _phase(spec.scoring, place, workdir)
        command: list[str] = []
        code = list(inference.code) + [p for p in scoring.code if p not in inference.code]
    else:
        assert spec.command is not None  # the model refuses a spec with neither
        command = place.command(spec.command)
        code = place.code(spec.code, workdir, command)
    judge = None
    if spec.judge is not None:
        judge_command = place.command(spec.judge.command) if spec.judge.command is not None else None
        judge = Judge(
            rubric=resolve(workdir, spec.judge.rubric), model=spec.judge.model, version=spec.judge.version,
            command=judge_command,
            code=place.phase_code(spec.judge.code, workdir, [judge_command]) if judge_command is not None else [],
            decoding=spec.judge.decoding.model_dump(exclude_unset=True))
    return EvalSpec(
        name=spec.name, path=path, command=command, workdir=workdir, code=code,
        image=spec.image, task_set=place.task_set(spec.task_set, workdir), seeds=list(spec.seeds),
        metrics=list(spec.metrics), trigger=spec.when, every_n_commits=spec.every_n_commits or 1,
        decoding=spec.decoding.model_dump(exclude_unset=True),
        escalation=None if escalation is None else Escalation(escalation.first_seeds, *escalation.condition),
        time_limit_hours=spec.time_limit_hours, gpus=spec.gpus,
        output_fields={} if spec.output is None else spec.output.model_dump(exclude_unset=True),
        resource=spec.resource, inference=inference, scoring=scoring, judge=judge,
    )


def _phase(phase: Any, place: Any, workdir: Path) -> Phase:
    """A phase table as it runs: `{python}` replaced, its code found (its files, else those its commands name)."""
    from trackway.evals.spec_model import Inference

    command = place.command(phase.command)
    server = place.command(phase.server) if isinstance(phase, Inference) and phase.server is not None else None
    return Phase(
        name=phase.table, command=command,
        code=place.phase_code(phase.code, workdir, [command] + ([server] if server else [])),
        resource=phase.resource, gpus=phase.gpus, time_limit_hours=phase.time_limit_hours, server=server,
        health_url=phase.health_url if server else None,
        server_start_timeout_s=phase.server_start_timeout_s if server else 600.0,
    )
