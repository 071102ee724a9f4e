"""Eval specs: checked field by field, and versions computed from content (one byte changes them)."""

from __future__ import annotations

import json
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


ALL_KEYS = ("code, command, decoding, escalation, every_n_commits, gpus, image, inference, judge, metrics, name, output, "
            "resource, scoring, seeds, task_set, time_limit_hours, trigger, workdir")
FIELD_NAME = "the name of the evaluator's field (a non-empty string)"


@pytest.mark.parametrize(
    "body,said",
    [
        ('colour = "blue"\n', f"colour: expected one of {ALL_KEYS}"),
        ('[decoding]\nsamples = 0\n', "decoding.samples: expected a whole number ≥ 1 (samples per task)"),
        ('[decoding]\nsamples = [4]\n',
         "decoding: expected a table of scalar decoding parameters, e.g. samples = 4, temperature = 0.8"),
        ('metrics = ["pass@8"]\n[decoding]\nsamples = 4\n',
         "metrics: expected pass@K with K ≤ decoding.samples (4); pass@8 needs 8 samples per task"),
        ('metrics = ["accuracy"]\n', "metrics: expected 'accuracy': expected pass@K with K a whole number ≥ 1"),
        ('seeds = [0, 1]\n[escalation]\nfirst_seeds = 2\nescalate_if = "pass@1 >= 0.05"\n',
         "escalation.first_seeds: expected a whole number from 1 to 1 (fewer than the 2 seeds)"),
        ('seeds = [0, 1]\n[escalation]\nescalate_if = "pass@1 >= 0.05"\nfirst = 1\n',
         "escalation: expected a table with first_seeds and escalate_if"),
        ('seeds = [0, 1]\n[escalation]\nescalate_if = "pass@2 >= 0.1"\n',
         "escalation.escalate_if: expected a metric listed in metrics (pass@1), got pass@2"),
        ('[output]\ntask_id = "doc_id"\nscore = "acc"\n', "output.score: expected one of task_id, sample, correct, output"),
        ('[output]\nsample = true\n', f"output.sample: expected {FIELD_NAME} or false (the lines have no such field)"),
        ('[output]\ntask_id = "correct"\n',
         "output: expected a different field for each of task_id, sample, correct, output (got ['correct'])"),
        ('trigger = "on_demand"\nevery_n_commits = 2\n',
         "every_n_commits: expected no value with trigger = 'on_demand' (use trigger = \"every_n_commits\")"),
        ('trigger = "every_n_commits"\n',
         "every_n_commits: expected a whole number ≥ 1 (evaluate every N-th committed checkpoint)"),
        ('workdir = "nowhere"\n', "workdir: expected a directory (no such directory: {eval_dir}/nowhere)"),
        ('code = ["missing.py"]\n', "code: expected files or directories that exist (no such path: {eval_dir}/missing.py)"),
        ('gpus = true\n', "gpus: expected a whole number from 0 to 100000"),
        ('time_limit_hours = inf\n', "time_limit_hours: expected a number of hours above 0 and at most 87600 (10 years)"),
        ('resource = "a b"\n', "resource: expected the name of a resource declared in trackway.toml"),
        # More than one thing wrong: the first in reading order is said. Unknown keys come first, then the
        # keys in the order they are read (the workdir before the gpus), a table's keys as the file writes them.
        ('zeta = 1\nseeds = []\n', f"zeta: expected one of {ALL_KEYS}"),
        ('gpus = -1\nworkdir = "nowhere"\n', "workdir: expected a directory (no such directory: {eval_dir}/nowhere)"),
        ('[output]\noutput = 3\ntask_id = 4\n', f"output.output: expected {FIELD_NAME} or false (the lines have no such field)"),
        ('seeds = [0]\nmetrics = ["pass@3"]\n[decoding]\nsamples = 2\n[escalation]\nescalate_if = "pass@1 > 0"\n',
         "metrics: expected pass@K with K ≤ decoding.samples (2); pass@3 needs 3 samples per task"),
    ],
)
def test_each_refusal_says_the_file_the_key_and_what_was_expected(write_spec, eval_dir, body, said):
    path = write_spec(body=body)
    with pytest.raises(InputError) as caught:
        load_spec(path)
    assert str(caught.value) == f"{path}: {said.format(eval_dir=eval_dir)}"


@pytest.mark.parametrize("body,said", [
    # A quote left open once ended as an internal error; inf once passed, and failed when the spec was stored.
    ('command = "python \'evaluator.py"\n', "command: expected the evaluator's command as a list of strings"),
    ('command = "python evaluator.py"\n[decoding]\ntemperature = inf\n',
     "decoding: expected a table of scalar decoding parameters"),
])
def test_what_could_not_be_run_or_stored_is_refused_as_bad_input(eval_dir, body, said):
    path = eval_dir / "toy.toml"
    path.write_text(f'name = "toy"\ntask_set = "tasks.jsonl"\n{body}')
    with pytest.raises(InputError) as caught:
        load_spec(path)
    assert str(caught.value).startswith(f"{path}: {said}")


def test_an_image_without_code_files_is_read_back_from_its_record(eval_dir):
    digest = "ghcr.io/lab/eval@sha256:" + "ab" * 32
    (eval_dir / "img.toml").write_text(f'name = "img"\ncommand = ["run-eval"]\nimage = "{digest}"\n')
    spec = load_spec(eval_dir / "img.toml")
    assert spec.code == [] and spec.task_set is None
    assert spec_from_record(json.loads(json.dumps(spec.record()))) == spec


def test_a_stored_record_reads_back_as_the_spec(write_spec):
    body = ('seeds = [0, 1, 2]\nmetrics = ["pass@1", "pass@2"]\nevery_n_commits = 2\ntime_limit_hours = 1\ngpus = 1\n'
            'resource = "box"\n[decoding]\nsamples = 2\ntemperature = 0.5\n[escalation]\nescalate_if = "pass@2 >= 1e-3"\n'
            '[output]\ntask_id = "doc_id"\nsample = false\n')
    spec = load_spec(write_spec(body=body))
    assert spec.trigger == "every_n_commits" and spec.every_n_commits == 2 and spec.time_limit_hours == 1.0
    assert spec.escalation is not None and spec.escalation.condition == "pass@2 >= 0.001"
    assert spec.output_fields == {"task_id": "doc_id", "sample": False}
    assert spec_from_record(json.loads(json.dumps(spec.record()))) == spec


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
