"""`trackway schema` gives editors the rules trackway itself reads trackway.toml by."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from trackway.errors import InputError
from trackway.evals.spec import load_spec
from trackway.settings import DEFAULT_TRACKWAY_TOML, load_settings

CLUSTER = """\
[resources.ailab]
executor = "slurm"
gpu = "B200"
gpu_memory_gb = 180
gpus_per_node = 8
partition = "lab"

[[resources.ailab.qos]]
name = "gpu-test"
max_hours = 1

[selection]
full = ["ailab"]

[retry]
gpu_hours_budget = 100

[retry.reasons.preempted]
budget = 20

[preflight]
keys = { batch_size = "train.batch_size", model_config = "model.config" }
"""


@pytest.fixture
def schema(cli_process, tmp_path):
    result = cli_process("schema")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


def test_what_trackway_reads_the_schema_accepts(schema, tmp_path):
    for text in (DEFAULT_TRACKWAY_TOML, CLUSTER):
        (tmp_path / "trackway.toml").write_text(text)
        load_settings(home=tmp_path / "home", cwd=tmp_path)
        assert list(schema.iter_errors(tomllib.loads(text))) == []


@pytest.mark.parametrize("edit", [
    ("gpus_per_node = 8", "gpus_per_node = \"8\""),      # a string for a number
    ("gpus_per_node = 8", "gpus_per_node = 8\ngpus = 8"),  # a key no resource has
    ("max_hours = 1", "max_hours = 0"),                   # out of range
    ('executor = "slurm"', 'executor = "nomad"'),         # not an executor
    ("budget = 20", "budget = -1"),                       # [retry] as the retry policy reads it
    ("[retry.reasons.preempted]", "[retry.reasons.preemted]"),
    ("[selection]", "[selections]"),                      # a table trackway.toml has not
])
def test_what_trackway_refuses_the_schema_refuses(schema, tmp_path, edit):
    old, new = edit
    text = CLUSTER.replace(old, new, 1)
    assert text != CLUSTER
    assert list(schema.iter_errors(tomllib.loads(text))) != []
    (tmp_path / "trackway.toml").write_text(text)
    with pytest.raises(InputError):
        settings = load_settings(home=tmp_path / "home", cwd=tmp_path)
        # [retry] is read by the retry policy when a run is submitted; that is where it refuses.
        from trackway.supervisor.policy import load_policy

        load_policy(None, settings.retry)


def test_the_schema_is_written_where_asked(cli_process, tmp_path):
    target = tmp_path / "trackway.schema.json"

    result = cli_process("schema", "--output", str(target))

    assert result.code == 0, result.err
    assert json.loads(target.read_text())["properties"]["resources"]["additionalProperties"]["$ref"].endswith("ResourceTable")
    refused = cli_process("schema", "--output", str(tmp_path / "no" / "such" / "dir" / "x.json"))
    assert refused.code == 2 and refused.err.count("\n") == 1 and "--output" in refused.err


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ARITH = EXAMPLES / "evals" / "arith.toml"


@pytest.fixture
def eval_spec_schema(cli_process):
    result = cli_process("schema", "--for", "eval-spec")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


@pytest.fixture
def arith_spec(tmp_path) -> Path:
    """examples/evals/arith.toml where its paths lead: the evaluator and train_tiny.py beside it, the task set generated."""
    spec = tmp_path / "examples" / "evals" / "arith.toml"
    spec.parent.mkdir(parents=True)
    spec.write_text(ARITH.read_text())
    for name in ("eval_arith.py", "train_tiny.py"):
        (tmp_path / "examples" / name).write_text((EXAMPLES / name).read_text())
    (tmp_path / ".trackway" / "demo").mkdir(parents=True)
    (tmp_path / ".trackway" / "demo" / "arith_tasks.jsonl").write_text('{"task_id": "t0", "prompt": "1+1=", "answer": "2"}\n')
    return spec


def test_the_example_eval_specs_are_what_the_schema_accepts(eval_spec_schema, arith_spec):
    specs = sorted(EXAMPLES.rglob("*.toml"))
    assert ARITH in specs
    for path in specs:
        doc = tomllib.loads(path.read_text())
        if "command" in doc:  # an eval spec (not a trackway.toml or a training config)
            assert list(eval_spec_schema.iter_errors(doc)) == [], path
    assert load_spec(arith_spec).name == "arith"


@pytest.mark.parametrize("edit", [
    ("seeds = [0, 1, 2]", "seeds = []"),                              # fewer than one seed
    ("seeds = [0, 1, 2]", "seeds = [0, 0]"),                          # a seed twice
    ('trigger = "every_commit"', 'trigger = "sometimes"'),             # not a trigger
    ('trigger = "every_commit"', 'trigger = "every_commit"\ncolour = 1'),  # a key no spec has
    ('metrics = ["pass@1", "pass@2"]', 'metrics = ["accuracy"]'),      # not pass@K
    ("samples = 4", "samples = 0"),                                    # [decoding] samples below 1
    ("samples = 4", 'samples = "4"'),                                  # a string for a number
    ("temperature = 0.3", "temperature = [0.3]"),                      # [decoding] holds scalars
    ("first_seeds = 1", "first_seeds = 1\nfirst_seed = 1"),            # a key [escalation] has not
    ('escalate_if = "pass@1 >= 0.1"', 'escalate_if = "pass@1 is high"'),
    ("[escalation]", '[output]\nscore = "acc"\n\n[escalation]'),       # a field the output lines have not
    ('name = "arith"', 'name = "arith"\ngpus = -1'),                 # fewer than no GPUs
])
def test_what_load_spec_refuses_the_schema_refuses(eval_spec_schema, arith_spec, edit):
    old, new = edit
    text = arith_spec.read_text().replace(old, new, 1)
    assert text != arith_spec.read_text()
    assert list(eval_spec_schema.iter_errors(tomllib.loads(text))) != []
    arith_spec.write_text(text)
    with pytest.raises(InputError):
        load_spec(arith_spec)


def test_trackway_toml_is_still_the_default_and_an_unknown_file_is_refused(cli_process):
    default, explicit = cli_process("schema"), cli_process("schema", "--for", "trackway.toml")
    assert default.code == explicit.code == 0 and default.out == explicit.out
    assert "ResourceTable" in default.out and "Escalation" not in default.out
    refused = cli_process("schema", "--for", "evals")
    assert refused.code == 2 and refused.err.count("\n") == 1
    assert "--for 'evals': expected one of trackway.toml, eval-spec" in refused.err
