"""Reading what an evaluator wrote: one JSON line per sample, checked against the contract, counted per task.

The contract (`$TRACKWAY_EVAL_OUTPUT`): every line is a JSON object with `task_id` (a string or an
integer), `sample` (an integer ≥ 0, unique within its task), `correct` (true or false, or the
numbers 1 and 0) and `output` (what the model produced); any other field is kept with the raw
outputs. The spec's `[output]` table renames these fields to fit an existing harness (e.g.
lm-eval's `task_id = "doc_id"`, `correct = "acc"`, `output = "filtered_resps"`); `sample = false`
(or `output = false`) says the lines have no such field: then the lines of one task are its
samples, numbered in the order they appear. An output that breaks the contract is not a result:
the attempt that wrote it is an `evaluator_crash` (rule `evaluator:bad-output`), and the problem
names the first broken line and what was expected there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIELDS = ("task_id", "sample", "correct", "output")
PARAMS_FILE = "eval-params.json"  # evals/launch.py writes it in the eval run's directory, with "output_fields"
OUTPUT_FILE = "eval-output.jsonl"  # in the attempt's directory: a retry never reads a crashed attempt's lines
FAILURE_SAMPLE_SIZE = 5
MAX_SHOWN_CHARS = 500


@dataclass
class EvaluatorOutput:
    """Samples counted per task (n, c), a few failures to read, and the raw bytes to store."""

    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    raw: bytes = b""
    problem: str | None = None
    judge_answers: bytes | None = None  # a scorer's judge answers ($TRACKWAY_EVAL_JUDGE_ANSWERS), kept as written

    @property
    def ok(self) -> bool:
        return self.problem is None


def field_names(mapping: Mapping[str, Any] | None) -> dict[str, str | None]:
    """The contract's fields as the evaluator names them (None: the lines have no such field)."""
    names: dict[str, str | None] = {name: name for name in FIELDS}
    for name, value in (mapping or {}).items():
        names[name] = None if value is False else value
    return names


def read_output(path: Path, fields: Mapping[str, Any] | None = None) -> EvaluatorOutput:
    """Parse an evaluator's output file; `problem` says what broke the contract, if anything did.

    `fields` is the spec's `[output]` mapping; when None, it is read from the eval run's parameters
    file (`runs/RUN/eval-params.json`, beside `attempts/N/` where the output file lies).
    """
    if fields is None:
        fields = _fields_beside(path)
    names = field_names(fields)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return EvaluatorOutput(problem=f"the evaluator wrote no output file ($TRACKWAY_EVAL_OUTPUT = {path})")
    result = EvaluatorOutput(raw=raw)
    seen: set[tuple[str, int]] = set()
    next_sample: dict[str, int] = {}
    failures: list[tuple[str, dict[str, Any]]] = []
    counts: dict[str, list[int]] = {}
    expected = _expected(names)
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            result.problem = (f"output line {number}: not JSON: {line[:120].decode('utf-8', 'replace')!r} "
                              f"(expected {expected})")
            return result
        problem = _contract_problem(record, names, expected)
        if problem is not None:
            result.problem = f"output line {number}: {problem}"
            return result
        task_id = str(record[names["task_id"]])
        if names["sample"] is None:
            sample = next_sample.get(task_id, 0)
            next_sample[task_id] = sample + 1
        else:
            sample = record[names["sample"]]
        if (task_id, sample) in seen:
            result.problem = f"output line {number}: task {task_id!r} sample {sample} appears twice"
            return result
        seen.add((task_id, sample))
        correct = bool(record[names["correct"]])
        n_c = counts.setdefault(task_id, [0, 0])
        n_c[0] += 1
        n_c[1] += int(correct)
        if not correct:
            key = hashlib.sha256(f"{task_id}\0{sample}".encode()).hexdigest()
            failures.append((key, _shown(_normalized(record, names, task_id, sample, correct))))
    if not seen:
        result.problem = f"the output file holds no samples (expected {expected})"
        return result
    result.counts = {task: (n, c) for task, (n, c) in counts.items()}
    result.samples = len(seen)
    # A stable spread of failures (ordered by a hash, not by position), so that the sample is the
    # same every time the same outputs are read and is not just the first few tasks.
    result.failures = [record for _, record in sorted(failures, key=lambda f: f[0])[:FAILURE_SAMPLE_SIZE]]
    return result


def _fields_beside(path: Path) -> Mapping[str, Any] | None:
    params = path.parent.parent.parent / PARAMS_FILE
    try:
        return json.loads(params.read_text()).get("output_fields")
    except (OSError, ValueError, AttributeError):
        return None


def _expected(names: Mapping[str, str | None]) -> str:
    parts = []
    for name in FIELDS:
        field_name = names[name]
        if field_name is None:
            continue
        shown = field_name if field_name == name else f"{field_name} (as {name})"
        parts.append(shown)
    return "one JSON object per line with " + ", ".join(parts)


def _contract_problem(record: Any, names: Mapping[str, str | None], expected: str) -> str | None:
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object (expected {expected})"
    for name in FIELDS:
        key = names[name]
        if key is not None and key not in record:
            return f"missing {key!r} (expected {expected})"
    task_key, sample_key, correct_key = names["task_id"], names["sample"], names["correct"]
    task_id = record[task_key]
    if isinstance(task_id, bool) or not isinstance(task_id, (str, int)):
        return f"{task_key} {task_id!r}: expected a string or an integer"
    if sample_key is not None:
        sample = record[sample_key]
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
            return f"{sample_key} {sample!r}: expected an integer ≥ 0"
    correct = record[correct_key]
    if not isinstance(correct, bool) and not (isinstance(correct, (int, float)) and correct in (0, 1)):
        return f"{correct_key} {correct!r}: expected true or false (or 1 or 0)"
    return None


def _normalized(record: dict[str, Any], names: Mapping[str, str | None], task_id: str, sample: int,
                correct: bool) -> dict[str, Any]:
    """A line under the contract's names (task_id, sample, correct, output first), its other fields after."""
    output_key = names["output"]
    mapped = {key for key in names.values() if key is not None}
    return {
        "task_id": record[names["task_id"]] if names["task_id"] else task_id,
        "sample": sample,
        "correct": correct,
        "output": record[output_key] if output_key is not None else None,
        **{key: value for key, value in record.items() if key not in mapped and key not in FIELDS},
    }


def _shown(record: dict[str, Any]) -> dict[str, Any]:
    """A failure as kept for reading: long strings cut, so a runaway generation cannot bloat the ledger."""
    return {
        key: (value[:MAX_SHOWN_CHARS] + "…" if isinstance(value, str) and len(value) > MAX_SHOWN_CHARS else value)
        for key, value in record.items()
    }
