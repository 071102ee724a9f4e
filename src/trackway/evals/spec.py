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
        }

    def evaluator_version(self) -> str:
        """The image digest when given, else `sha256:` over the code files (read now: edits show)."""
        if self.image:
            return self.image
        return "sha256:" + content_version(self.code, f"{self.path}: code")

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
    if doc.get("trigger") != "every_n_commits":
        doc.pop("every_n_commits", None)
    if doc.get("code") == []:  # an image, and no files named in the command: a file may not say `code = []`
        doc.pop("code")
    return spec_from_mapping({k: v for k, v in doc.items() if v is not None}, Path(record["path"]), placeholders=False)


def spec_from_mapping(doc: Mapping[str, Any], path: Path, placeholders: bool = True) -> EvalSpec:
    """`doc` (the spec at `path`) checked whole (evals/spec_model.py), its paths resolved against its directory."""
    # Imported here: pydantic and the model are for reading a spec file; records of stored specs, listings
    # and every command that touches an evaluation import this module without reading one.
    from trackway.evals.spec_model import SpecPlace, read_spec_file

    place = SpecPlace(path.parent, placeholders)
    spec = read_spec_file(dict(doc), path, place)
    workdir = place.workdir(spec.workdir)
    command = place.command(spec.command)
    escalation = spec.escalation
    return EvalSpec(
        name=spec.name, path=path, command=command, workdir=workdir, code=place.code(spec.code, workdir, command),
        image=spec.image, task_set=place.task_set(spec.task_set, workdir), seeds=list(spec.seeds),
        metrics=list(spec.metrics), trigger=spec.when, every_n_commits=spec.every_n_commits or 1,
        decoding=spec.decoding.model_dump(exclude_unset=True),
        escalation=None if escalation is None else Escalation(escalation.first_seeds, *escalation.condition),
        time_limit_hours=spec.time_limit_hours, gpus=spec.gpus,
        output_fields={} if spec.output is None else spec.output.model_dump(exclude_unset=True),
        resource=spec.resource,
    )
