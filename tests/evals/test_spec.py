"""Eval specs: checked field by field, and versions computed from content (one byte changes them)."""

from __future__ import annotations

import sys

import pytest

from trackway.errors import InputError
from trackway.evals.spec import load_spec, spec_from_record


def test_a_spec_loads_with_paths_resolved_against_its_directory(write_spec, eval_dir):
    spec = load_spec(write_spec("toy", body='seeds = [3, 4]\ntrigger = "on_demand"\n[decoding]\nsamples = 2\n'))
    assert spec.workdir == eval_dir and spec.task_set == eval_dir / "tasks.jsonl"
    assert spec.code == [eval_dir / "evaluator.py"]  # found in the command
    assert spec.seeds == [3, 4] and spec.trigger == "on_demand" and spec.metrics == ["pass@1"]
    assert spec_from_record(spec.record()) == spec


def test_one_byte_of_the_evaluator_or_the_task_set_changes_its_version(write_spec, eval_dir):
    spec = load_spec(write_spec())
    evaluator, tasks = spec.evaluator_version(), spec.task_set_version()
    assert evaluator.startswith("sha256:") and len(evaluator) == 71
    code = eval_dir / "evaluator.py"
    code.write_text(code.read_text().replace('VERSION_TAG = "v1"', 'VERSION_TAG = "v2"'))
    assert spec.evaluator_version() != evaluator and spec.task_set_version() == tasks
    data = eval_dir / "tasks.jsonl"
    data.write_bytes(data.read_bytes().replace(b'"t0"', b'"t9"', 1))
    assert spec.task_set_version() != tasks


def test_caches_written_by_running_the_evaluator_do_not_change_its_version(write_spec, eval_dir):
    (eval_dir / "lib").mkdir()
    (eval_dir / "lib" / "util.py").write_text("X = 1\n")
    spec = load_spec(write_spec(body='code = ["evaluator.py", "lib"]\n'))
    before = spec.evaluator_version()
    (eval_dir / "lib" / "__pycache__").mkdir()
    (eval_dir / "lib" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0" * 10)
    assert spec.evaluator_version() == before
    (eval_dir / "lib" / "util.py").write_text("X = 2\n")
    assert spec.evaluator_version() != before


def test_an_image_digest_is_the_evaluator_version(write_spec):
    digest = "ghcr.io/lab/eval@sha256:" + "ab" * 32
    assert load_spec(write_spec(body=f'image = "{digest}"\n')).evaluator_version() == digest


@pytest.mark.parametrize(
    "body,field",
    [
        ('seeds = []\n', "seeds"),
        ('seeds = [1, 1]\n', "seeds"),
        ('metrics = ["accuracy"]\n', "metrics"),
        ('metrics = ["pass@8"]\n[decoding]\nsamples = 4\n', "metrics"),
        ('trigger = "sometimes"\n', "trigger"),
        ('every_n_commits = 0\n', "every_n_commits"),
        ('trigger = "every_commit"\nevery_n_commits = 2\n', "every_n_commits"),
        ('seeds = [0, 1]\n[escalation]\nfirst_seeds = 2\nescalate_if = "pass@1 >= 0.05"\n', "escalation.first_seeds"),
        ('seeds = [0, 1]\n[escalation]\nescalate_if = "pass@1 is good"\n', "escalation.escalate_if"),
        ('seeds = [0, 1]\n[escalation]\nescalate_if = "pass@2 >= 0.1"\n', "escalation.escalate_if"),
        ('image = "latest"\n', "image"),
        ('code = ["missing.py"]\n', "code"),
        ('[decoding]\nsamples = 0\n', "decoding.samples"),
        ('colour = "blue"\n', "colour"),
        ('time_limit_hours = -1\n', "time_limit_hours"),
    ],
)
def test_bad_fields_are_named_in_one_line(write_spec, body, field):
    with pytest.raises(InputError) as caught:
        load_spec(write_spec(body=body))
    message = str(caught.value)
    assert f": {field}: expected" in message and "\n" not in message


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_spec(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("name = \n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_spec(tmp_path / "bad.toml")


def test_python_placeholder_is_the_running_interpreter(eval_dir):
    (eval_dir / "p.toml").write_text('name = "p"\ncommand = ["{python}", "evaluator.py"]\ntask_set = "tasks.jsonl"\n')
    assert load_spec(eval_dir / "p.toml").command == [sys.executable, "evaluator.py"]


def test_triggers_pick_which_commits_are_evaluated(write_spec):
    every = load_spec(write_spec("a", body='trigger = "every_commit"\n'))
    third = load_spec(write_spec("b", body="every_n_commits = 3\n"))
    manual = load_spec(write_spec("c", body='trigger = "on_demand"\n'))
    assert [every.due_for_commit(i) for i in range(1, 5)] == [True] * 4
    assert [third.due_for_commit(i) for i in range(1, 7)] == [False, False, True, False, False, True]
    assert not any(manual.due_for_commit(i) for i in range(1, 5))
