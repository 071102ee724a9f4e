"""`trackway experiment batch`: hypotheses against one baseline, recorded together, started as room allows, one table."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

TOY = str(Path(__file__).resolve().parent / "scripts" / "toy_train.py")


@pytest.fixture
def baseline(cli_sqlite):
    Path("cfg.json").write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    done = cli_sqlite("submit", "--name", "base", "--config", "cfg.json", "--", sys.executable, TOY)
    assert done.code == 0, done.err
    return cli_sqlite


def test_a_batch_runs_every_hypothesis_two_at_a_time_and_tables_the_verdicts(baseline):
    cli = baseline
    Path("ideas.toml").write_text('''
expect = "final.loss <= baseline.final.loss"
max_running = 2

[[hypothesis]]
title = "double lr"
hypothesis = "a doubled learning rate ends lower"
set = "train.lr=0.2"

[[hypothesis]]
title = "half lr"
hypothesis = "a halved learning rate ends lower"
set = ["train.lr=0.05"]

[[hypothesis]]
title = "triple lr"
hypothesis = "a tripled learning rate ends lower"
set = "train.lr=0.3"
''')
    done = cli("experiment", "batch", "--baseline", "base", "--from-file", "ideas.toml", "--name", "wave")
    assert done.code == 0, done.err  # every member concluded (a rejected hypothesis is a conclusion)
    batch_id = done.out.split()[0]
    shown = cli("experiments", "--batch", "wave", "--json").json()
    assert shown["batch_id"] == batch_id and shown["status"] == "done" and shown["max_running"] == 2
    verdicts = {e["title"]: e["verdict"] for e in shown["experiments"]}
    assert verdicts == {"double lr": "supported", "half lr": "rejected", "triple lr": "supported"}
    half = next(e for e in shown["experiments"] if e["title"] == "half lr")
    (criterion,) = half["criteria"]
    assert criterion["holds"] is False
    assert criterion["left"] == pytest.approx(2 * math.exp(-2) + 0.1)  # lr 0.05 over 40 steps
    assert criterion["right"] == pytest.approx(2 * math.exp(-4) + 0.1)
    # Never more than two in flight: the third started only after one of the first two had concluded.
    started = sorted((e["experiment_id"], cli("experiment", "show", e["experiment_id"], "--json").json())
                     for e in shown["experiments"])
    third = max(started, key=lambda pair: pair[1]["started_at"])[1]
    earliest_end = min(pair[1]["concluded_at"] for pair in started if pair[1] is not third)
    assert third["started_at"] >= earliest_end
    table = cli("experiments", "--batch", batch_id).out
    assert "train.lr=0.05" in table and "rejected" in table and "✗" in table
    # Each member's runs are credited to the batch command.
    runs = {r["run_id"]: r for r in cli("runs", "--json").json()}
    assert runs[half["test_run_id"]]["submitted_by"].startswith("trackway experiment batch (")


def test_a_budget_of_nothing_is_refused_before_anything_is_recorded(baseline):
    cli = baseline
    refused = cli("experiment", "batch", "--baseline", "base", "--hypothesis", "train.lr=0.2: faster",
                  "--budget-gpu-hours", "0")
    assert refused.code == 2 and "--budget-gpu-hours" in refused.err
    assert cli("experiments", "--json").json() == []


def test_a_bad_hypothesis_records_none_of_the_batch(baseline):
    cli = baseline
    refused = cli("experiment", "batch", "--baseline", "base", "--hypothesis", "train.lr=0.2: faster",
                  "--hypothesis", "train.lr=0.1: the same as the baseline")
    assert refused.code == 2 and "hypothesis 2 (train.lr=0.1): no change against the baseline" in refused.err
    assert cli("experiments", "--json").json() == []
    malformed = cli("experiment", "batch", "--baseline", "base", "--hypothesis", "faster please")
    assert malformed.code == 2 and "--hypothesis 'faster please': expected KEY=VALUE: statement" in malformed.err
    Path("bad.toml").write_text('[[hypothesis]]\ntitle = "x"\nhypothesis = "y"\nsett = "a=1"\n')
    unknown = cli("experiment", "batch", "--baseline", "base", "--from-file", "bad.toml")
    assert unknown.code == 2 and "bad.toml: [[hypothesis]] 1: sett: unknown key" in unknown.err
