"""A run's own watcher thresholds: read as trackway.toml would, refused in its words, laid over the file's."""

import json

import pytest

from trackway.errors import InputError
from trackway.settings.run_watchers import described, for_run, parse_watch, recorded


def test_values_are_read_as_the_file_would_read_them():
    own = parse_watch(["loss_rising.window=200 steps", "gpu_underused.threshold=50", 'plateau.window="3h"',
                       "loss_rising.min_z=4.5"])
    assert own == {"loss_rising": {"window": "200 steps", "min_z": 4.5}, "gpu_underused": {"threshold": 50.0},
                   "plateau": {"window": "3h"}}


@pytest.mark.parametrize(("given", "said"), [
    ("loss_rising.window=3 parsecs",
     "--watch loss_rising.window: expected a number of steps or a duration, such as \"500 steps\", \"90s\", \"10m\" "
     "or \"3h\", got '3 parsecs'"),
    ("gpu_underused.threshold=-5",
     "--watch gpu_underused.threshold: expected a percentage above 0 and at most 100, such as 70, got -5"),
    ("gpu_underused.duration=200 steps", "--watch gpu_underused.duration: expected a duration such as"),
    ("vibes.level=3", "--watch vibes: unknown watcher; expected one of loss_rising, plateau, throughput_falling, "
                      "gpu_underused"),
    ("plateau.windw=3h", "--watch plateau.windw: unknown key; expected one of window, min_improvement"),
    ("loss_rising=1", "--watch 'loss_rising=1': expected KIND.KEY=VALUE"),
    ("loss_rising.min_z=", "--watch 'loss_rising.min_z=': expected KIND.KEY=VALUE"),
])
def test_a_bad_threshold_is_refused_in_one_line_naming_it(given, said):
    with pytest.raises(InputError) as refused:
        parse_watch([given])
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_the_run_keeps_only_what_it_set_and_the_file_gives_the_rest():
    project = {"loss_rising": {"window": "500 steps", "min_rise": 0.1, "min_z": 8.0},
               "gpu_underused": {"threshold": 70.0, "duration": "10m"}}
    stored = recorded(parse_watch(["loss_rising.window=50 steps"]))
    assert json.loads(stored) == {"loss_rising": {"window": "50 steps"}}
    judged = for_run(project, stored)
    assert judged["loss_rising"] == {"window": "50 steps", "min_rise": 0.1, "min_z": 8.0}
    assert judged["gpu_underused"] == project["gpu_underused"]
    # An edit of trackway.toml still reaches what the run did not set.
    edited = {**project, "loss_rising": {**project["loss_rising"], "min_rise": 0.3}}
    assert for_run(edited, stored)["loss_rising"]["min_rise"] == 0.3
    assert described(stored) == ["loss_rising.window=50 steps"]
    assert recorded({}) is None and for_run(project, None) == project and described(None) == []


def test_a_stored_value_that_no_longer_reads_leaves_the_files_thresholds():
    project = {"plateau": {"window": "2000 steps", "min_improvement": 0.01}}
    assert for_run(project, "{not json") == project
    assert for_run(project, "[1, 2]") == project
