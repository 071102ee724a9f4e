"""Reading what an evaluator wrote: one JSON line per sample, checked against the contract, counted per task.

The contract (`$TRACKWAY_EVAL_OUTPUT`): every line is a JSON object with `task_id` (a string or an
integer), `sample` (an integer ≥ 0, unique within its task), `correct` (true or false) and
`output` (what the model produced); any other field is kept with the raw outputs. An output that
breaks the contract is not a result: the attempt that wrote it is an `evaluator_crash`, and the
first broken line is the evidence.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    @property
    def ok(self) -> bool:
        return self.problem is None


def read_output(path: Path) -> EvaluatorOutput:
    """Parse an evaluator's output file; `problem` says what broke the contract, if anything did."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return EvaluatorOutput(problem=f"the evaluator wrote no output file ($TRACKWAY_EVAL_OUTPUT = {path})")
    result = EvaluatorOutput(raw=raw)
    seen: set[tuple[str, int]] = set()
    failures: list[tuple[str, dict[str, Any]]] = []
    counts: dict[str, list[int]] = {}
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            result.problem = f"output line {number}: not JSON: {line[:120].decode('utf-8', 'replace')!r}"
            return result
        problem = _contract_problem(record)
        if problem is not None:
            result.problem = f"output line {number}: {problem}"
            return result
        task_id, sample = str(record["task_id"]), record["sample"]
        if (task_id, sample) in seen:
            result.problem = f"output line {number}: task {task_id!r} sample {sample} appears twice"
            return result
        seen.add((task_id, sample))
        n_c = counts.setdefault(task_id, [0, 0])
        n_c[0] += 1
        n_c[1] += int(record["correct"])
        if not record["correct"]:
            key = hashlib.sha256(f"{task_id}\0{sample}".encode()).hexdigest()
            failures.append((key, _shown(record)))
    if not seen:
        result.problem = "the output file holds no samples"
        return result
    result.counts = {task: (n, c) for task, (n, c) in counts.items()}
    result.samples = len(seen)
    # A stable spread of failures (ordered by a hash, not by position), so that the sample is the
    # same every time the same outputs are read and is not just the first few tasks.
    result.failures = [record for _, record in sorted(failures, key=lambda f: f[0])[:FAILURE_SAMPLE_SIZE]]
    return result


def _contract_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return "expected a JSON object per line"
    for key in ("task_id", "sample", "correct", "output"):
        if key not in record:
            return f"missing {key!r} (every line needs task_id, sample, correct, output)"
    if isinstance(record["task_id"], bool) or not isinstance(record["task_id"], (str, int)):
        return f"task_id {record['task_id']!r}: expected a string or an integer"
    if isinstance(record["sample"], bool) or not isinstance(record["sample"], int) or record["sample"] < 0:
        return f"sample {record['sample']!r}: expected an integer ≥ 0"
    if not isinstance(record["correct"], bool):
        return f"correct {record['correct']!r}: expected true or false"
    return None


def _shown(record: dict[str, Any]) -> dict[str, Any]:
    """A failure as kept for reading: long strings cut, so a runaway generation cannot bloat the ledger."""
    return {
        key: (value[:MAX_SHOWN_CHARS] + "…" if isinstance(value, str) and len(value) > MAX_SHOWN_CHARS else value)
        for key, value in record.items()
    }
