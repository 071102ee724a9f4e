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
names the file and the field.
"""

from __future__ import annotations

import operator
import re
import shlex
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trackway.errors import InputError
from trackway.evals.outputs import FIELDS
from trackway.evals.passk import metric_k
from trackway.evals.versions import content_version
from trackway.validation import MAX_GPUS, TEN_YEARS_HOURS

TRIGGERS = ("every_commit", "every_n_commits", "on_demand")
KNOWN_KEYS = frozenset(
    {"name", "command", "workdir", "code", "image", "task_set", "seeds", "metrics", "trigger", "every_n_commits",
     "decoding", "escalation", "time_limit_hours", "gpus", "output", "resource"}
)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CONDITION_PATTERN = re.compile(r"^\s*(pass@[0-9]+)\s*(>=|<=|==|>|<)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")
COMPARATORS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt}
IMAGE_DIGEST = re.compile(r"(^|@)sha256:[0-9a-f]{64}$")


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
    return spec_from_mapping({k: v for k, v in doc.items() if v is not None}, Path(record["path"]), placeholders=False)


def spec_from_mapping(doc: Mapping[str, Any], path: Path, placeholders: bool = True) -> EvalSpec:
    where = str(path)

    def bad(key: str, expected: str) -> InputError:
        return InputError(f"{where}: {key}: expected {expected}")

    unknown = sorted(set(doc) - KNOWN_KEYS)
    if unknown:
        raise bad(unknown[0], f"one of {', '.join(sorted(KNOWN_KEYS))}")
    name = doc.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise bad("name", "a short name of letters, digits, '.', '_' or '-' (e.g. \"arith\")")
    base = path.parent
    workdir = _resolve(base, doc.get("workdir", "."), "workdir", bad)
    if not workdir.is_dir():
        raise bad("workdir", f"a directory (no such directory: {workdir})")
    command = doc.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        raise bad("command", "the evaluator's command as a list of strings, e.g. [\"{python}\", \"eval.py\"]")
    if placeholders:
        command = [sys.executable if a == "{python}" else a for a in command]
    image = doc.get("image")
    if image is not None and (not isinstance(image, str) or not IMAGE_DIGEST.search(image)):
        raise bad("image", "a container image pinned by digest, e.g. \"ghcr.io/org/eval@sha256:<64 hex>\"")
    code = doc.get("code")
    if code is None:
        # The evaluator's own files, as named in its command: the version follows their content.
        code_paths = [workdir / a for a in command[1:] if not a.startswith("-") and (workdir / a).is_file()]
    elif isinstance(code, list) and code and all(isinstance(c, str) and c for c in code):
        code_paths = [_resolve(workdir, c, "code", bad) for c in code]
        missing = [p for p in code_paths if not p.exists()]
        if missing:
            raise bad("code", f"files or directories that exist (no such path: {missing[0]})")
    else:
        raise bad("code", "a list of the evaluator's files or directories, hashed into its version")
    if not code_paths and image is None:
        raise bad("code", "the evaluator's files (hashed into its version) or `image` with a digest; none found in command")
    task_set_value = doc.get("task_set")
    task_set: Path | None = None
    if task_set_value is not None:
        if not isinstance(task_set_value, str) or not task_set_value:
            raise bad("task_set", "the path of the task set (a file or a directory), or no task_set when the "
                                  "evaluator bundles its tasks")
        task_set = _resolve(workdir, task_set_value, "task_set", bad)
        if not task_set.exists():
            raise bad("task_set", f"a file or directory that exists (no such path: {task_set})")
    output_fields = _output_fields(doc.get("output"), bad)
    seeds = doc.get("seeds", [0])
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise bad("seeds", "a non-empty list of distinct integers, e.g. [0, 1, 2]")
    decoding = doc.get("decoding", {})
    if not isinstance(decoding, Mapping) or not all(_scalar(v) for v in decoding.values()):
        raise bad("decoding", "a table of scalar decoding parameters, e.g. samples = 4, temperature = 0.8")
    samples = decoding.get("samples")
    if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 1):
        raise bad("decoding.samples", "a whole number ≥ 1 (samples per task)")
    metrics = doc.get("metrics", ["pass@1"])
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) for m in metrics):
        raise bad("metrics", "a list of pass@K metrics, e.g. [\"pass@1\", \"pass@2\"]")
    for metric in metrics:
        try:
            k = metric_k(metric)
        except ValueError as exc:
            raise bad("metrics", str(exc)) from None
        if samples is not None and k > samples:
            raise bad("metrics", f"pass@K with K ≤ decoding.samples ({samples}); {metric} needs {k} samples per task")
    trigger, every_n = _trigger(doc, bad)
    escalation = _escalation(doc.get("escalation"), seeds, metrics, bad)
    time_limit = doc.get("time_limit_hours")
    # TOML spells inf and nan; a timer takes neither.
    if time_limit is not None and (
        not isinstance(time_limit, int | float) or isinstance(time_limit, bool)
        or not 0 < time_limit <= TEN_YEARS_HOURS
    ):
        raise bad("time_limit_hours", f"a number of hours above 0 and at most {TEN_YEARS_HOURS} (10 years)")
    gpus = doc.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= MAX_GPUS:
        raise bad("gpus", f"a whole number from 0 to {MAX_GPUS}")
    resource = doc.get("resource")
    if resource is not None and (not isinstance(resource, str) or not NAME_PATTERN.match(resource)):
        raise bad("resource", "the name of a resource declared in trackway.toml")
    return EvalSpec(
        name=name, path=path, command=command, workdir=workdir, code=code_paths, image=image, task_set=task_set,
        seeds=seeds, metrics=metrics, trigger=trigger, every_n_commits=every_n, decoding=dict(decoding),
        escalation=escalation, time_limit_hours=float(time_limit) if time_limit is not None else None, gpus=gpus,
        output_fields=output_fields, resource=resource,
    )


def _output_fields(doc: Any, bad) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise bad("output", "a table mapping task_id, sample, correct, output to the evaluator's field names")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise bad(f"output.{unknown[0]}", f"one of {', '.join(FIELDS)}")
    fields: dict[str, Any] = {}
    for key, value in doc.items():
        optional = key in ("sample", "output")
        if value is False and optional:
            fields[key] = False
        elif isinstance(value, str) and value:
            fields[key] = value
        else:
            also = " or false (the lines have no such field)" if optional else ""
            raise bad(f"output.{key}", f"the name of the evaluator's field (a non-empty string){also}")
    names = [v for v in fields.values() if isinstance(v, str)]
    renamed = {**{k: k for k in FIELDS}, **fields}
    used = [v for v in renamed.values() if isinstance(v, str)]
    if len(used) != len(set(used)):
        raise bad("output", f"a different field for each of {', '.join(FIELDS)} (got {sorted(names)})")
    return fields


def _trigger(doc: Mapping[str, Any], bad) -> tuple[str, int]:
    every_n = doc.get("every_n_commits")
    trigger = doc.get("trigger", "every_n_commits" if every_n is not None else "every_commit")
    if trigger not in TRIGGERS:
        raise bad("trigger", f"one of {', '.join(TRIGGERS)}")
    if trigger == "every_n_commits":
        if not isinstance(every_n, int) or isinstance(every_n, bool) or every_n < 1:
            raise bad("every_n_commits", "a whole number ≥ 1 (evaluate every N-th committed checkpoint)")
        return trigger, every_n
    if every_n is not None:
        raise bad("every_n_commits", f"no value with trigger = {trigger!r} (use trigger = \"every_n_commits\")")
    return trigger, 1


def _escalation(doc: Any, seeds: list[int], metrics: list[str], bad) -> Escalation | None:
    if doc is None:
        return None
    if not isinstance(doc, Mapping) or set(doc) - {"first_seeds", "escalate_if"}:
        raise bad("escalation", "a table with first_seeds and escalate_if")
    first = doc.get("first_seeds", 1)
    if not isinstance(first, int) or isinstance(first, bool) or not 1 <= first < len(seeds):
        raise bad("escalation.first_seeds", f"a whole number from 1 to {len(seeds) - 1} (fewer than the {len(seeds)} seeds)")
    condition = doc.get("escalate_if")
    match = CONDITION_PATTERN.match(condition) if isinstance(condition, str) else None
    if match is None:
        raise bad("escalation.escalate_if", "a condition like \"pass@1 >= 0.05\" (pass@K, one of >= > <= < ==, a number)")
    metric, op, threshold = match.group(1), match.group(2), float(match.group(3))
    if metric not in metrics:
        raise bad("escalation.escalate_if", f"a metric listed in metrics ({', '.join(metrics)}), got {metric}")
    return Escalation(first_seeds=first, metric=metric, op=op, threshold=threshold)


def _resolve(base: Path, value: Any, key: str, bad) -> Path:
    if not isinstance(value, str) or not value:
        raise bad(key, "a path")
    path = Path(value).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))
