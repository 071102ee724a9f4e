"""The evaluator contract as trackway reads it: counts per task, kept failures, and the first broken line."""

from __future__ import annotations

import json

from trackway.evals.outputs import FAILURE_SAMPLE_SIZE, read_output


def write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_counts_per_task_and_keeps_extra_fields_in_failures(tmp_path):
    path = write(tmp_path / "out.jsonl", [
        {"task_id": "a", "sample": 0, "correct": True, "output": "19"},
        {"task_id": "a", "sample": 1, "correct": False, "output": "18", "prompt": "12+7="},
        {"task_id": 7, "sample": 0, "correct": False, "output": "x" * 2000},
    ])
    out = read_output(path)
    assert out.ok and out.counts == {"a": (2, 1), "7": (1, 0)} and out.samples == 3
    assert out.raw == path.read_bytes()
    by_task = {f["task_id"]: f for f in out.failures}
    assert by_task["a"]["prompt"] == "12+7="
    assert len(by_task[7]["output"]) == 501  # a runaway generation is cut for reading; raw keeps it whole


def test_failure_sample_is_bounded_and_stable(tmp_path):
    records = [{"task_id": f"t{i}", "sample": 0, "correct": False, "output": ""} for i in range(50)]
    first = read_output(write(tmp_path / "a.jsonl", records)).failures
    again = read_output(write(tmp_path / "b.jsonl", list(reversed(records)))).failures
    assert len(first) == FAILURE_SAMPLE_SIZE and first == again


def test_broken_contract_names_the_line(tmp_path):
    cases = {
        "not json": ("garbage", "line 2: not JSON"),
        "missing": ({"task_id": "b", "sample": 0, "output": ""}, "line 2: missing 'correct'"),
        "bad correct": ({"task_id": "b", "sample": 0, "correct": "yes", "output": ""}, "correct 'yes'"),
        "bad sample": ({"task_id": "b", "sample": -1, "correct": True, "output": ""}, "sample -1"),
        "duplicate": ({"task_id": "a", "sample": 0, "correct": True, "output": ""}, "task 'a' sample 0 appears twice"),
    }
    good = {"task_id": "a", "sample": 0, "correct": True, "output": ""}
    for name, (record, expected) in cases.items():
        out = read_output(write(tmp_path / f"{name}.jsonl", [good, record]))
        assert not out.ok and expected in out.problem, (name, out.problem)


def test_missing_and_empty_outputs_are_problems(tmp_path):
    assert "no output file" in read_output(tmp_path / "nope.jsonl").problem
    assert "no samples" in read_output(write(tmp_path / "empty.jsonl", [])).problem
