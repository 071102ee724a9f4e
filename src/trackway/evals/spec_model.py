"""An eval spec file as a typed model: what each key may hold, checked whole when a spec is read.

Every field's description says what it expects. The same words refuse a bad value, in one line
that names the file and the key (`{path}: {key}: expected {description}`: read_spec_file), and
describe the key in the JSON Schema that `trackway schema --for eval-spec` writes for editors.
Unknown keys are refused, so a misspelt key is never silently ignored.

Relations between keys (pass@K within decoding.samples, the escalation against the seeds and
the metrics, every_n_commits with its trigger) and the paths a spec names (read against the
spec's directory, given as the validation context: a SpecPlace) are checked in validators on the
key they are said of, which see the keys read before it. When a file has more than one thing
wrong, the first one in reading order is refused: an unknown key first, then the keys in the
order of the fields below, and in a table its unknown keys first, then its keys as the file
writes them.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from trackway.errors import InputError
from trackway.evals.outputs import FIELDS
from trackway.evals.passk import METRIC_PATTERN, metric_k
from trackway.settings.model import refuse
from trackway.settings.refusal import fields_of
from trackway.validation import MAX_GPUS, TEN_YEARS_HOURS

TRIGGERS = ("every_commit", "every_n_commits", "on_demand")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CONDITION_PATTERN = re.compile(r"^\s*(pass@[0-9]+)\s*(>=|<=|==|>|<)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")
IMAGE_DIGEST = re.compile(r"(^|@)sha256:[0-9a-f]{64}$")
# What a table expects, said of the table and of its unknown keys or values.
DECODING = "a table of scalar decoding parameters, e.g. samples = 4, temperature = 0.8"
ESCALATION = "a table with first_seeds and escalate_if"
FIELD_NAME = "the name of the evaluator's field (a non-empty string)"
OR_NONE = " or false (the lines have no such field)"

NonEmpty = Annotated[str, StringConstraints(min_length=1)]
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN.pattern)]
Metric = Annotated[str, WithJsonSchema({"type": "string", "pattern": METRIC_PATTERN.pattern})]


def _split(command: Any) -> Any:
    """A command may be written as one string, split as a shell would (a quote left open refuses it)."""
    return shlex.split(command) if isinstance(command, str) else command


def _distinct(seeds: list[int]) -> list[int]:
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds repeat")
    return seeds


Command = Annotated[
    list[NonEmpty], Field(min_length=1),
    BeforeValidator(_split, json_schema_input_type=NonEmpty | Annotated[list[NonEmpty], Field(min_length=1)]),
]
Seeds = Annotated[list[int], Field(min_length=1, json_schema_extra={"uniqueItems": True}), AfterValidator(_distinct)]


@dataclass(frozen=True)
class SpecPlace:
    """Where a spec is read: relative paths resolve against its directory; `{python}` is replaced or kept."""

    directory: Path
    placeholders: bool = True

    def workdir(self, workdir: str) -> Path:
        return resolve(self.directory, workdir)

    def command(self, command: list[str]) -> list[str]:
        """The command as it runs: `{python}` is the interpreter trackway runs under."""
        return [sys.executable if self.placeholders and a == "{python}" else a for a in command]

    @staticmethod
    def code(code: list[str] | None, workdir: Path, command: list[str]) -> list[Path]:
        """The files hashed into the evaluator's version: `code`, else its own files as named in its command."""
        if code is None:
            return [workdir / a for a in command[1:] if not a.startswith("-") and (workdir / a).is_file()]
        return [resolve(workdir, c) for c in code]

    @staticmethod
    def phase_code(code: list[str] | None, workdir: Path, commands: list[list[str]]) -> list[Path]:
        """A phase's (or a local judge's) files: its `code`, else the files its commands name, each once."""
        if code is not None:
            return [resolve(workdir, c) for c in code]
        found: list[Path] = []
        for command in commands:
            found += [p for p in SpecPlace.code(None, workdir, command) if p not in found]
        return found

    @staticmethod
    def task_set(task_set: str | None, workdir: Path) -> Path | None:
        return None if task_set is None else resolve(workdir, task_set)


def resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


class SpecTable(BaseModel):
    """One table of an eval spec file: strict types, no unknown keys, no inf or nan."""

    # strict: TOML's "3" is not 3 and true is not 1; no inf/nan: a timer must end.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    # How an unknown key is told: the key the message names ({name}: the unknown one) and what was
    # expected ({known}: the table's keys in order, {sorted}: alphabetically).
    unknown: ClassVar[tuple[str, str]] = ("{name}", "one of {sorted}")


class Decoding(SpecTable):
    """`[decoding]`: free-form scalar decoding parameters handed to the evaluator; `samples` is samples per task."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, str | int | float | bool]  # type: ignore[assignment]

    samples: int | None = Field(None, ge=1, description="a whole number ≥ 1 (samples per task)")

    @model_validator(mode="before")
    @classmethod
    def _scalars(cls, doc: Any) -> Any:
        if isinstance(doc, dict) and not all(isinstance(v, str | int | float | bool) for v in doc.values()):
            raise refuse("decoding", DECODING)
        return doc


class Escalation(SpecTable):
    """`[escalation]`: run the first seeds, and the rest only if they clear a condition."""

    unknown: ClassVar[tuple[str, str]] = ("escalation", ESCALATION)

    first_seeds: int = Field(1, ge=1, description="a whole number ≥ 1, fewer than the seeds")
    escalate_if: Annotated[str, StringConstraints(pattern=CONDITION_PATTERN.pattern)] = Field(
        description='a condition like "pass@1 >= 0.05" (pass@K, one of >= > <= < ==, a number)')

    @property
    def condition(self) -> tuple[str, str, float]:
        """The metric, the comparison and the threshold of escalate_if."""
        match = CONDITION_PATTERN.match(self.escalate_if)
        assert match is not None  # the field's pattern
        return match.group(1), match.group(2), float(match.group(3))


class Output(SpecTable):
    """`[output]`: the evaluator's names for the fields of its output lines (evals/outputs.py)."""

    unknown: ClassVar[tuple[str, str]] = ("output.{name}", "one of {known}")

    task_id: NonEmpty | None = Field(None, description=FIELD_NAME)
    sample: NonEmpty | Literal[False] | None = Field(None, description=f"{FIELD_NAME}{OR_NONE}")
    correct: NonEmpty | None = Field(None, description=FIELD_NAME)
    output: NonEmpty | Literal[False] | None = Field(None, description=f"{FIELD_NAME}{OR_NONE}")

    @model_validator(mode="after")
    def _distinct(self) -> Output:
        given = self.model_dump(exclude_unset=True)
        renamed = {**{k: k for k in FIELDS}, **given}
        used = [v for v in renamed.values() if isinstance(v, str)]
        if len(used) != len(set(used)):
            names = sorted(v for v in given.values() if isinstance(v, str))
            raise refuse("output", f"a different field for each of {', '.join(FIELDS)} (got {names})")
        return self


class Phase(SpecTable):
    """`[inference]` or `[scoring]`: one phase of a two-phase evaluation, run as its own run with its own attempts."""

    command: Command = Field(description="the phase's command as a list of strings, e.g. [\"{python}\", \"generate.py\"]")
    code: Annotated[list[NonEmpty], Field(min_length=1)] | None = Field(
        None, description="a list of the phase's files or directories, hashed into its version")
    resource: Name | None = Field(None, description="the name of a resource declared in trackway.toml")
    gpus: int = Field(0, ge=0, le=MAX_GPUS, description=f"a whole number from 0 to {MAX_GPUS}")
    time_limit_hours: float | None = Field(
        None, gt=0, le=TEN_YEARS_HOURS, description=f"a number of hours above 0 and at most {TEN_YEARS_HOURS} (10 years)")

    table: ClassVar[str] = "phase"  # the table's name in the file, said in refusals


class Inference(Phase):
    """`[inference]`: generate the model's outputs from the checkpoint (into $TRACKWAY_EVAL_OUTPUTS_DIR), on a GPU.

    With `server`, trackway starts that command first (`{port}` in it and in `health_url` is a free
    port), waits until `health_url` answers, gives its URL as $TRACKWAY_EVAL_SERVER_URL, and stops it after.
    """

    table: ClassVar[str] = "inference"
    unknown: ClassVar[tuple[str, str]] = ("inference.{name}", "one of {known}")

    server: Command | None = Field(None, description="the model server's command as a list of strings, "
                                                     "e.g. [\"{python}\", \"serve.py\", \"--port\", \"{port}\"]")
    health_url: Annotated[str, StringConstraints(pattern=r"^https?://.*\{port\}")] | None = Field(
        None, validate_default=True,
        description="the URL that answers once the server is ready, with {port}, e.g. \"http://127.0.0.1:{port}/health\"")
    server_start_timeout_s: float = Field(600, gt=0, le=86400, description="a number of seconds above 0, at most 86400")

    @field_validator("health_url")
    @classmethod
    def _with_its_server(cls, url: str | None, info: ValidationInfo) -> str | None:
        if "server" not in info.data:
            return url  # the server was refused, and said there
        if info.data["server"] is not None and url is None:
            raise refuse("inference.health_url", "the URL that answers once the server is ready, with {port}, "
                                                 "e.g. \"http://127.0.0.1:{port}/health\" (server is given)")
        if info.data["server"] is None and url is not None:
            raise refuse("inference.health_url", "no value without inference.server (the command that serves it)")
        return url


class Scoring(Phase):
    """`[scoring]`: score the committed inference outputs ($TRACKWAY_EVAL_INFERENCE_OUTPUTS), usually without a GPU."""

    table: ClassVar[str] = "scoring"
    unknown: ClassVar[tuple[str, str]] = ("scoring.{name}", "one of {known}")


class Judge(SpecTable):
    """`[judge]`: the model that grades outputs, pinned: a model with its version, or a local command whose code is hashed."""

    unknown: ClassVar[tuple[str, str]] = ("judge.{name}", "one of {known}")

    model: NonEmpty | None = Field(None, description="the judge model's name, e.g. \"gpt-judge\"")
    version: NonEmpty | None = Field(
        None, validate_default=True,
        description="the judge model's version or digest, e.g. \"2026-01-15\" or \"sha256:...\" (a name alone may change)")
    command: Command | None = Field(
        None, validate_default=True, description="a local judge's command as a list of strings, e.g. [\"{python}\", \"judge.py\"]")
    code: Annotated[list[NonEmpty], Field(min_length=1)] | None = Field(
        None, description="a list of the local judge's files or directories, hashed into the evaluation's identity")
    rubric: NonEmpty = Field(description="the path of the rubric file the judge grades by (hashed)")
    decoding: Decoding = Field(default_factory=Decoding, description=DECODING)

    @field_validator("version")
    @classmethod
    def _with_its_model(cls, version: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("model") is not None and version is None:
            raise refuse("judge.version", "the judge model's version or digest, e.g. \"2026-01-15\" or \"sha256:...\" "
                                          "(a model name alone may change under you)")
        if info.data.get("model") is None and version is not None:
            raise refuse("judge.version", "no value without judge.model")
        return version

    @field_validator("command")
    @classmethod
    def _a_model_or_a_command(cls, command: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if "model" not in info.data:
            return command
        if (info.data["model"] is None) == (command is None):
            raise refuse("judge", "either model (with version) or command (a local judge), not "
                                  + ("both" if command is not None else "neither"))
        return command


# Top-level keys that a two-phase spec says per phase instead.
PER_PHASE = ("code", "gpus", "resource", "time_limit_hours")


class EvalSpecFile(SpecTable):
    """An eval spec (TOML): what to run against a checkpoint, on which tasks, how to decode, when, how many seeds."""

    name: Name = Field(description="a short name of letters, digits, '.', '_' or '-' (e.g. \"arith\")")
    workdir: NonEmpty = Field(".", description="a path")
    command: Command | None = Field(
        None, description="the evaluator's command as a list of strings, e.g. [\"{python}\", \"eval.py\"]")
    inference: Inference | None = Field(None, description="a table with the inference phase's command, resource, "
                                                          "gpus and time_limit_hours (and optionally server, health_url)")
    scoring: Scoring | None = Field(
        None, validate_default=True,
        description="a table with the scoring phase's command (it reads $TRACKWAY_EVAL_INFERENCE_OUTPUTS), resource, "
                    "gpus and time_limit_hours")
    judge: Judge | None = Field(None, description="a table with the judge's model and version (or a local command), "
                                                  "rubric and decoding")
    image: Annotated[str, StringConstraints(pattern=IMAGE_DIGEST.pattern)] | None = Field(
        None, description="a container image pinned by digest, e.g. \"ghcr.io/org/eval@sha256:<64 hex>\"")
    code: Annotated[list[NonEmpty], Field(min_length=1)] | None = Field(
        None, validate_default=True, description="a list of the evaluator's files or directories, hashed into its version")
    task_set: NonEmpty | None = Field(None, description="the path of the task set (a file or a directory), or no "
                                                        "task_set when the evaluator bundles its tasks")
    output: Output | None = Field(
        None, description=f"a table mapping {', '.join(FIELDS)} to the evaluator's field names")
    seeds: Seeds = Field([0], description="a non-empty list of distinct integers, e.g. [0, 1, 2]")
    decoding: Decoding = Field(default_factory=Decoding, description=DECODING)
    metrics: Annotated[list[Metric], Field(min_length=1)] = Field(
        ["pass@1"], description="a list of pass@K metrics, e.g. [\"pass@1\", \"pass@2\"]")
    trigger: Literal["every_commit", "every_n_commits", "on_demand"] | None = Field(
        None, description=f"one of {', '.join(TRIGGERS)}")
    every_n_commits: int | None = Field(None, ge=1, validate_default=True,
                                        description="a whole number ≥ 1 (evaluate every N-th committed checkpoint)")
    escalation: Escalation | None = Field(None, description=ESCALATION)
    time_limit_hours: float | None = Field(
        None, gt=0, le=TEN_YEARS_HOURS, description=f"a number of hours above 0 and at most {TEN_YEARS_HOURS} (10 years)")
    gpus: int = Field(0, ge=0, le=MAX_GPUS, description=f"a whole number from 0 to {MAX_GPUS}")
    resource: Name | None = Field(None, description="the name of a resource declared in trackway.toml")

    @property
    def when(self) -> str:
        """The trigger, every_n_commits when only every_n_commits is given."""
        return self.trigger or ("every_n_commits" if self.every_n_commits is not None else "every_commit")

    @model_validator(mode="before")
    @classmethod
    def _phases_say_their_own(cls, doc: Any) -> Any:
        if isinstance(doc, dict) and ("inference" in doc or "scoring" in doc):
            for key in PER_PHASE:
                if key in doc:
                    raise refuse(key, f"no top-level {key} in a spec with [inference] and [scoring] "
                                      f"(each phase says its own {key})")
        return doc

    @field_validator("scoring", mode="wrap")
    @classmethod
    def _one_command_or_two_phases(cls, value: Any, handler: Any, info: ValidationInfo) -> Scoring | None:
        data = info.data
        if "command" not in data or "inference" not in data:
            return handler(value)  # refused there, and said there
        command, inference = data["command"], data["inference"]
        if command is not None and (inference is not None or value is not None):
            raise refuse("command", "no top-level command in a spec with [inference] and [scoring] "
                                    "(each phase has its own command)")
        if command is None and inference is None and value is None:
            raise refuse("command", "the evaluator's command as a list of strings, e.g. [\"{python}\", \"eval.py\"], "
                                    "or an [inference] and a [scoring] table")
        if inference is None and value is not None:
            raise refuse("scoring", "an [inference] table too: the scoring phase reads the outputs the inference "
                                    "phase commits ($TRACKWAY_EVAL_INFERENCE_OUTPUTS)")
        if inference is not None and value is None:
            raise refuse("scoring", "a [scoring] table with the command that scores the inference outputs")
        return handler(value)

    @field_validator("workdir")
    @classmethod
    def _a_directory(cls, workdir: str, info: ValidationInfo) -> str:
        place = info.context
        if isinstance(place, SpecPlace) and not place.workdir(workdir).is_dir():
            raise refuse("workdir", f"a directory (no such directory: {place.workdir(workdir)})")
        return workdir

    @field_validator("code")
    @classmethod
    def _files_that_exist(cls, code: list[str] | None, info: ValidationInfo) -> list[str] | None:
        place, data = info.context, info.data
        if not isinstance(place, SpecPlace) or "workdir" not in data or data.get("command") is None:
            return code  # no place to look, said of the workdir or command, or a two-phase spec (checked per phase)
        paths = place.code(code, place.workdir(data["workdir"]), place.command(data["command"]))
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise refuse("code", f"files or directories that exist (no such path: {missing[0]})")
        if not paths and data.get("image") is None:
            raise refuse("code", "the evaluator's files (hashed into its version) or `image` with a digest; "
                                 "none found in command")
        return code

    @field_validator("inference", "scoring")
    @classmethod
    def _phase_files_that_exist(cls, phase: Phase | None, info: ValidationInfo) -> Phase | None:
        place = info.context
        if not isinstance(place, SpecPlace) or phase is None or "workdir" not in info.data:
            return phase
        workdir = place.workdir(info.data["workdir"])
        commands = [place.command(phase.command)]
        if isinstance(phase, Inference) and phase.server is not None:
            commands.append(place.command(phase.server))
        paths = place.phase_code(phase.code, workdir, commands)
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise refuse(f"{phase.table}.code", f"files or directories that exist (no such path: {missing[0]})")
        if not paths and info.data.get("image") is None:
            raise refuse(f"{phase.table}.code", "the phase's files (hashed into its version) or `image` with a digest; "
                                                "none found in its command")
        return phase

    @field_validator("judge")
    @classmethod
    def _judge_files_that_exist(cls, judge: Judge | None, info: ValidationInfo) -> Judge | None:
        place = info.context
        if not isinstance(place, SpecPlace) or judge is None or "workdir" not in info.data:
            return judge
        workdir = place.workdir(info.data["workdir"])
        rubric = resolve(workdir, judge.rubric)
        if not rubric.is_file():
            raise refuse("judge.rubric", f"a file that exists (no such file: {rubric})")
        if judge.command is not None:
            paths = place.phase_code(judge.code, workdir, [place.command(judge.command)])
            missing = [p for p in paths if not p.exists()]
            if missing:
                raise refuse("judge.code", f"files or directories that exist (no such path: {missing[0]})")
            if not paths:
                raise refuse("judge.code", "the local judge's files (hashed into the evaluation's identity); "
                                           "none found in its command")
        return judge

    @field_validator("task_set")
    @classmethod
    def _a_path_that_exists(cls, task_set: str | None, info: ValidationInfo) -> str | None:
        place = info.context
        if isinstance(place, SpecPlace) and task_set is not None and "workdir" in info.data:
            path = place.task_set(task_set, place.workdir(info.data["workdir"]))
            if not path.exists():
                raise refuse("task_set", f"a file or directory that exists (no such path: {path})")
        return task_set

    @field_validator("metrics")
    @classmethod
    def _pass_at_k_within_samples(cls, metrics: list[str], info: ValidationInfo) -> list[str]:
        decoding = info.data.get("decoding")
        samples = decoding.samples if decoding is not None else None
        for metric in metrics:
            try:
                k = metric_k(metric)
            except ValueError as exc:
                raise refuse("metrics", str(exc)) from None
            if samples is not None and k > samples:
                raise refuse("metrics", f"pass@K with K ≤ decoding.samples ({samples}); {metric} needs {k} samples per task")
        return metrics

    @field_validator("every_n_commits", mode="wrap")
    @classmethod
    def _with_its_trigger(cls, every_n: Any, handler: Any, info: ValidationInfo) -> int | None:
        trigger = info.data.get("trigger")  # None: not given (or refused, and said there)
        if trigger in ("every_commit", "on_demand") and every_n is not None:
            raise refuse("every_n_commits", f"no value with trigger = {trigger!r} (use trigger = \"every_n_commits\")")
        if trigger == "every_n_commits" and every_n is None:
            raise refuse("every_n_commits", cls.model_fields["every_n_commits"].description)
        return handler(every_n)

    @field_validator("escalation", mode="wrap")
    @classmethod
    def _within_seeds_and_metrics(cls, value: Any, handler: Any, info: ValidationInfo) -> Escalation | None:
        seeds, metrics = info.data.get("seeds"), info.data.get("metrics")
        # first_seeds is said in words that count the seeds, so it is checked here, before the table's own checks.
        if seeds is not None and isinstance(value, dict) and set(value) <= set(Escalation.model_fields):
            first = value.get("first_seeds", 1)
            if not isinstance(first, int) or isinstance(first, bool) or not 1 <= first < len(seeds):
                raise refuse("escalation.first_seeds",
                             f"a whole number from 1 to {len(seeds) - 1} (fewer than the {len(seeds)} seeds)")
        escalation = handler(value)
        metric = None if escalation is None else escalation.condition[0]
        if metric is not None and metrics is not None and metric not in metrics:
            raise refuse("escalation.escalate_if", f"a metric listed in metrics ({', '.join(metrics)}), got {metric}")
        return escalation


TABLES: dict[str, type[SpecTable]] = {"decoding": Decoding, "escalation": Escalation, "output": Output,
                                       "inference": Inference, "scoring": Scoring, "judge": Judge}


def read_spec_file(doc: dict[str, Any], path: Path, place: SpecPlace) -> EvalSpecFile:
    """`doc` (read from `path`) checked whole; InputError names the file, the key and what was expected."""
    try:
        return EvalSpecFile.model_validate(doc, context=place)
    except ValidationError as exc:
        error = min(enumerate(exc.errors()), key=lambda item: _reading_order(*item, doc))[1]
        key, expected = _said(error)
        raise InputError(f"{path}: {key}: expected {expected}") from None


def _reading_order(index: int, error: Any, doc: dict[str, Any]) -> tuple:
    """Where an error stands in reading order: unknown keys first (alphabetically), then the keys in the order
    of the model's fields; in a table, its unknown keys first, then its keys as the file writes them."""
    loc = [str(part) for part in error["loc"]]
    fields = list(EvalSpecFile.model_fields)
    if not loc:  # said of the whole file (a relation between tables)
        return (0, "")
    if loc[0] not in fields:
        return (0, loc[0])
    position, table = fields.index(loc[0]), TABLES.get(loc[0])
    if table is None or len(loc) == 1:
        return (1, position, 1, index)
    if loc[1] not in table.model_fields:
        return (1, position, 0, loc[1])
    written = list(doc[loc[0]])
    return (1, position, 1, written.index(loc[1]) if loc[1] in written else len(written), index)


def _said(error: Any) -> tuple[str, str]:
    """The key an error is said of, and what was expected there."""
    if error["type"] == "trackway":  # a relation, said by the validator that found it
        return error["ctx"]["key"], error["ctx"]["message"]
    loc = [str(part) for part in error["loc"]]
    table, key = (EvalSpecFile, loc[0]) if len(loc) == 1 or loc[0] not in TABLES else (TABLES[loc[0]], loc[1])
    if error["type"] == "extra_forbidden":
        known = list(fields_of(table))
        name, expected = table.unknown
        return name.format(name=key), expected.format(known=", ".join(known), sorted=", ".join(sorted(known)))
    if table is not EvalSpecFile and key not in table.model_fields:  # a free-form table's value: said of the table
        table, key = EvalSpecFile, loc[0]
    described = fields_of(table)[key].description or "a valid value"
    return (key if table is EvalSpecFile else f"{loc[0]}.{key}"), described
