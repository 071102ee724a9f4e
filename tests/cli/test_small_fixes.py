"""The small ones: `eval show RUN@STEP`, `metrics --limit` from the latest point, readable evaluation run names
kept out of `report waste --by run`, and hints that repeat --db/--home so that following them works."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

PY = sys.executable
NEUTRAL = str(Path(__file__).parent / "scripts" / "neutral.py")
EVALUATOR = Path(__file__).resolve().parents[1] / "evals" / "scripts" / "evaluator.py"


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """An eval spec `toy` (two seeds) around a copy of the stand-in evaluator, which a test may edit."""
    evaluator = tmp_path / "evaluator.py"
    evaluator.write_text(EVALUATOR.read_text())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                             for i in range(5)))
    path = tmp_path / "toy.toml"
    path.write_text(f'name = "toy"\ncommand = {json.dumps([PY, str(evaluator)])}\ntask_set = "{tasks}"\n'
                    'seeds = [0, 1]\nmetrics = ["pass@1"]\n[decoding]\nsamples = 2\n')
    return path


def test_eval_show_accepts_a_checkpoint_and_a_seed_run_name(cli, spec):
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    first = cli("eval", "train@10", "--spec", str(spec))
    second = cli("eval", "train@20", "--spec", str(spec))
    assert first.code == 0 and second.code == 0, (first.err, second.err)
    first_id, second_id = first.out.split()[0], second.out.split()[0]
    assert cli("eval", "show", "train@10", "--json").json()["eval_id"] == first_id
    assert cli("eval", "show", "train@step-00000020", "--json").json()["eval_id"] == second_id
    assert cli("eval", "show", "train", "--json").json()["eval_id"] == second_id  # the newest checkpoint's
    shown = cli("eval", "show", "train@10")
    assert shown.code == 0 and f"evaluation {first_id}" in shown.out
    assert cli("eval", "show", "train@10/toy/seed-1", "--json").json()["eval_id"] == first_id
    missing = cli("eval", "show", "train@30")
    assert missing.code != 0 and "train@30" in missing.err and "no evaluation" in missing.err


def test_evaluation_runs_are_named_after_their_checkpoint_spec_and_seed(cli, spec):
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    unnamed = cli("submit", "--", PY, NEUTRAL, "30")
    unnamed_id = unnamed.out.split()[0]
    assert cli("eval", "train@20", "--spec", str(spec)).code == 0
    assert cli("eval", f"{unnamed_id}@10", "--spec", str(spec), "--seeds", "1").code == 0
    # The same checkpoint, spec and seeds again with a changed evaluator: a new evaluation, names kept unique.
    evaluator = spec.parent / "evaluator.py"
    evaluator.write_text(evaluator.read_text().replace('VERSION_TAG = "v1"', 'VERSION_TAG = "v2"'))
    assert cli("eval", "train@20", "--spec", str(spec)).code == 0
    names = sorted(run["name"] for run in cli("runs", "--kind", "eval", "--json").json())
    assert names == sorted([
        "train@20/toy/seed-0", "train@20/toy/seed-1", "train@20/toy/seed-0~2", "train@20/toy/seed-1~2",
        f"{unnamed_id}@10/toy/seed-0",
    ])
    # A seed's name addresses its run like any name, '/' and all.
    shown = cli("show", "train@20/toy/seed-1", "--json").json()
    assert shown["name"] == "train@20/toy/seed-1" and shown["kind"] == "eval"
    assert "evaluator v1: step 20 seed 1" in cli("logs", "train@20/toy/seed-1").out
    assert "evaluator v1: step 20 seed 1" in cli("logs", "train@20/toy/seed-1/1").out
    listed = cli("runs").out  # training runs only, by default
    assert "train" in listed and "seed-" not in listed


def test_report_waste_by_run_leaves_evaluation_runs_out_unless_asked(cli, spec):
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    assert cli("eval", "train@20", "--spec", str(spec)).code == 0
    by_run = cli("report", "waste", "--by", "run", "--json").json()
    assert [r["name"] for r in by_run] == ["train"]
    everything = cli("report", "waste", "--by", "run", "--kind", "all", "--json").json()
    assert sorted(r["name"] for r in everything) == ["train", "train@20/toy/seed-0", "train@20/toy/seed-1"]
    table = cli("report", "waste", "--by", "run", "--kind", "all").out
    seed_ids = [run["run_id"] for run in cli("runs", "--kind", "eval", "--json").json()]
    assert "train@20/toy/seed-0" in table and not any(run_id in table for run_id in seed_ids)  # names, not bare ids
    # Grouped by reason, every run counts, as before.
    assert sum(r["attempts"] for r in cli("report", "waste", "--json").json()) == 3
    refused = cli("report", "waste", "--kind", "evals")
    assert refused.code == 2 and "--kind 'evals'" in refused.err


def test_metrics_limit_gives_the_latest_points_and_first_the_earliest(cli):
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    latest = cli("metrics", "train", "--key", "loss", "--limit", "3", "--json").json()
    assert [p["step"] for p in latest] == [27, 28, 29]
    earliest = cli("metrics", "train", "--key", "loss", "--limit", "3", "--first", "--json").json()
    assert [p["step"] for p in earliest] == [0, 1, 2]
    table = cli("metrics", "train", "--key", "loss", "--limit", "2").out
    assert re.search(r"^\s*29\s", table, re.M) and not re.search(r"^\s*0\s", table, re.M)
    refused = cli("metrics", "train", "--first")
    assert refused.code == 2 and "--first" in refused.err and "--limit" in refused.err


def test_hints_repeat_the_db_and_home_they_were_given(cli, tmp_path, monkeypatch, spec):
    db, home = os.environ["TRACKWAY_DB"], os.environ["TRACKWAY_HOME"]
    assert cli("submit", "--name", "spot", "--", PY, NEUTRAL, "30", "--preempt-at", "12").code == 0
    # From here on only the options say where the ledger is, as on a machine where nothing is exported.
    monkeypatch.delenv("TRACKWAY_DB")
    monkeypatch.delenv("TRACKWAY_HOME")
    shown = cli("--db", db, "--home", home, "show", "spot")
    assert shown.code == 0, shown.err
    (hint,) = re.findall(r"`(trackway [^`]*)`", shown.out)
    assert hint == f"trackway --db {shlex.quote(db)} --home {shlex.quote(home)} show spot/N"
    followed = cli(*shlex.split(hint.replace("/N", "/1"))[1:], "--json")
    assert followed.code == 0 and followed.json()["attempts"][0]["termination_reason"] == "preempted"

    detached = cli("--db", db, "--home", home, "eval", "spot@20", "--spec", str(spec), "--detach")
    assert detached.code == 0, detached.err
    (hint,) = re.findall(r"`(trackway [^`]*)`", detached.err)
    assert hint == f"trackway --db {shlex.quote(db)} --home {shlex.quote(home)} supervise"
    empty = cli("--db", db, "--home", home, "evals", "spot", "--spec", "other")
    assert f"`trackway --db {shlex.quote(db)} --home {shlex.quote(home)} eval spot@STEP --spec FILE`" in empty.out


def test_a_password_in_a_repeated_db_url_is_masked():
    from trackway.cli.context import repeat_global_options

    said = repeat_global_options("see `trackway runs`", None, "postgresql+psycopg://ana:s3cret@db/ledger")
    assert said == "see `trackway --db 'postgresql+psycopg://ana:***@db/ledger' runs`"
    assert repeat_global_options("see `trackway runs`", None, None) == "see `trackway runs`"
