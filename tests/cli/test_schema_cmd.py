"""`trackway schema` gives editors the rules trackway itself reads trackway.toml by."""

from __future__ import annotations

import json
import tomllib

import jsonschema
import pytest

from trackway.errors import InputError
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
    ('executor = "slurm"', 'executor = "kubernetes"'),    # not an executor
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
