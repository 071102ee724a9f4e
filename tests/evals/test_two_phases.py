"""Evaluations in two phases (issue 36): inference once on its resource, scoring apart with its own retries, judges pinned.

The inference phase starts a small HTTP server around the test model (a `neutral.py` checkpoint),
waits for its health URL, asks it for every sample and stops it; its outputs are committed like a
checkpoint. The scorer crashes once, and its retry reads the same outputs: inference ran once per
seed. A local judge, whose code is hashed, grades by a rubric file; changing the rubric is a new
evaluation, scored from the same outputs without generating again.
"""

from __future__ import annotations

import json
import shutil

import pytest
from api_server import Api, serving
from waiting import wait_for
import sys
from pathlib import Path

PY = sys.executable
NEUTRAL = str(Path(__file__).parent.parent / "cli" / "scripts" / "neutral.py")
SCRIPTS = Path(__file__).parent / "scripts"


def two_phase_spec(eval_dir: Path, name: str = "judged", scorer_args: tuple[str, ...] = (), seeds: str = "[0, 1]") -> Path:
    for script in ("model_server.py", "generate.py", "score.py", "judge.py"):
        shutil.copy(SCRIPTS / script, eval_dir / script)
    rubric = eval_dir / "rubric.md"
    if not rubric.exists():
        rubric.write_text("exact: the output must be the answer\n")
    path = eval_dir / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\ntask_set = "tasks.jsonl"\nseeds = {seeds}\nmetrics = ["pass@1"]\n'
        f'[decoding]\nsamples = 2\n'
        f'[inference]\ncommand = {json.dumps(["{python}", "generate.py", "--log", str(eval_dir / "generations.log")])}\n'
        f'code = ["generate.py", "model_server.py"]\n'
        f'server = ["{{python}}", "model_server.py", "--port", "{{port}}"]\n'
        f'health_url = "http://127.0.0.1:{{port}}/health"\nserver_start_timeout_s = 60\n'
        f'[scoring]\ncommand = {json.dumps(["{python}", "score.py", *scorer_args])}\n'
        f'[judge]\ncommand = ["{{python}}", "judge.py"]\nrubric = "rubric.md"\n[judge.decoding]\ntemperature = 0.0\n'
    )
    return path


def generations(eval_dir: Path) -> list[str]:
    log = eval_dir / "generations.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_scorer_that_crashes_once_is_retried_against_the_same_outputs_and_inference_runs_once_per_seed(
        cli, eval_dir, monkeypatch):
    from trackway.cli import render

    # The table is read back whole: as on a wide terminal, whatever width the test process was started with.
    monkeypatch.setattr(render.console, "_width", 250)
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    spec = two_phase_spec(eval_dir, scorer_args=("--crash-attempts", "1"))
    done = cli("eval", "train@20", "--spec", str(spec))
    assert done.code == 0, done.err
    shown = cli("eval", "show", done.out.split()[0], "--json").json()
    assert shown["state"] == "completed"
    assert 0 < shown["metrics"]["pass@1"]["mean"] < 1
    # Inference ran exactly once per seed, through the scorer's crash and retry.
    assert sorted(line.split(" attempt ")[0] for line in generations(eval_dir)) == ["seed 0", "seed 1"]
    for seed in shown["seeds"]:
        inference, scoring = seed["phases"]["inference"], seed["phases"]["scoring"]
        assert [a["termination_reason"] for a in inference["attempts"]] == ["completed"]
        assert [a["termination_reason"] for a in scoring["attempts"]] == ["evaluator_crash", "completed"]
        # The outputs were committed like a checkpoint: a manifest whose hash the seed keeps, the files it lists.
        outputs = Path(seed["inference_outputs"])
        manifest = json.loads((outputs / "MANIFEST.json").read_text())
        assert list(manifest["files"]) == ["outputs.jsonl"] and (outputs / "COMMITTED").exists()
        assert seed["judge_answers"] == 20 * 2  # one kept answer per sample
        # The server was started, answered its health URL, and was stopped.
        server = json.loads((Path(inference["attempts"][0]["state_dir"]) / "eval-server.json").read_text())
        assert server["ready"] is True and server["stopped"].startswith("stopped (SIGTERM")
    text = " ".join(cli("eval", "show", shown["eval_id"]).out.split())
    assert "inference: completed; scoring: evaluator_crash → completed" in text
    assert "inference " in text and "2 attempt(s)" in text and "scoring " in text and "4 attempt(s)" in text
    assert f"rubric {eval_dir / 'rubric.md'} (sha256:" in text and "judge local " in text
    # explain says which phase a run is, what it made or read, and the judge it asked.
    seed = shown["seeds"][0]
    scoring_story = " ".join(cli("explain", seed["phases"]["scoring"]["run_id"]).out.split())
    assert f"the scoring phase of seed {seed['seed']} of evaluation {shown['eval_id']}" in scoring_story
    assert f"scores the inference outputs committed at {seed['inference_outputs']}" in scoring_story
    assert "in 1 attempt(s)" in scoring_story and "a retry of this phase reads the same outputs" in scoring_story
    assert f"judge: a local judge, code {shown['judge']['code_sha256'][7:19]}" in scoring_story
    inference_story = " ".join(cli("explain", seed["phases"]["inference"]["run_id"]).out.split())
    assert f"its outputs: committed at {seed['inference_outputs']}" in inference_story
    # The waste report separates generation from scoring (and both from training).
    by_phase = {r["phase"]: r["attempts"] for r in cli("report", "waste", "--by", "phase", "--json").json()}
    assert by_phase == {"training": 1, "inference": 2, "scoring": 4}


def test_changing_the_rubric_is_a_new_evaluation_scored_from_the_same_outputs(cli, eval_dir):
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    spec = two_phase_spec(eval_dir, seeds="[0]")
    first = cli("eval", "train@20", "--spec", str(spec))
    assert first.code == 0, first.err
    again = cli("eval", "train@20", "--spec", str(spec))
    assert again.out.split()[0] == first.out.split()[0] and "repeat" in again.err
    (eval_dir / "rubric.md").write_text("lenient: an attempt counts\n")
    second = cli("eval", "train@20", "--spec", str(spec))
    assert second.code == 0, second.err
    old, new = (cli("eval", "show", r.out.split()[0], "--json").json() for r in (first, second))
    assert new["eval_id"] != old["eval_id"]
    assert new["judge"]["rubric_sha256"] != old["judge"]["rubric_sha256"]
    assert new["metrics"]["pass@1"]["mean"] == 1.0 > old["metrics"]["pass@1"]["mean"]
    # No generation for the new rubric: its seed was scored from the outputs the first one committed.
    assert len(generations(eval_dir)) == 1
    assert new["seeds"][0]["inference_outputs"] == old["seeds"][0]["inference_outputs"]


def test_rescore_scores_stored_outputs_with_a_new_scorer_version_and_refuses_another_generation(
        cli_sqlite, eval_dir, home, sqlite_url):
    cli = cli_sqlite
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    spec = two_phase_spec(eval_dir, seeds="[0, 1]")
    first = cli("eval", "train@20", "--spec", str(spec))
    assert first.code == 0, first.err
    old_id = first.out.split()[0]
    score = eval_dir / "score.py"
    score.write_text(score.read_text() + "\n# scorer v2\n")  # a new scorer version
    rescored = cli("eval", "rescore", old_id, "--spec", str(spec))
    assert rescored.code == 0, rescored.err
    new = cli("eval", "show", rescored.out.split()[0], "--json").json()
    assert new["eval_id"] != old_id and new["state"] == "completed" and new["trigger"] == "rescore"
    assert len(generations(eval_dir)) == 2  # the two seeds' first and only generation
    assert all("inference" in s["phases"] and s["phases"]["inference"]["attempts"][0]["termination_reason"] == "completed"
               for s in new["seeds"])
    assert new["phase_totals"]["scoring"]["attempts"] == 2
    # The API answers the same, phases apart: the rescore's inference is the first evaluation's, its scoring its own.
    with serving(home, sqlite_url) as (base, _):
        status, body, _ = Api(base).get(f"/api/evaluations/{new['eval_id']}")
        assert status == 200 and body["phase_totals"]["scoring"]["attempts"] == 2
        old_seeds = {s["seed"]: s for s in cli("eval", "show", old_id, "--json").json()["seeds"]}
        for seed in body["seeds"]:
            phases = seed["phases"]
            assert phases["inference"]["run_id"] == old_seeds[seed["seed"]]["phases"]["inference"]["run_id"]
            assert phases["scoring"]["run_id"] != old_seeds[seed["seed"]]["phases"]["scoring"]["run_id"]
            assert phases["scoring"]["gpus"] == 0
        assert Api(base).get("/api/evaluations/evnothere")[0] == 404
    again = cli("eval", "rescore", old_id, "--spec", str(spec))
    assert again.code == 0 and again.out.split()[0] == new["eval_id"] and "repeat" in again.err
    generate = eval_dir / "generate.py"
    generate.write_text(generate.read_text() + "\n# generator v2\n")
    refused = cli("eval", "rescore", old_id, "--spec", str(spec))
    assert refused.code == 2 and "is not the one that generated evaluation" in refused.err


def test_a_judge_that_cannot_be_reached_is_infra_transient_for_the_scoring_phase_only(cli_sqlite, eval_dir):
    # The default backoff of an infra_transient resume is 30 s: what is tested is which phase is retried, not the wait.
    Path("trackway.toml").write_text("[retry.reasons.infra_transient]\nbackoff_seconds = 1\n")
    assert cli_sqlite("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    spec = two_phase_spec(eval_dir, scorer_args=("--unreachable-attempts", "1"), seeds="[0]")
    done = cli_sqlite("eval", "train@20", "--spec", str(spec))
    assert done.code == 0, done.err
    (seed,) = cli_sqlite("eval", "show", done.out.split()[0], "--json").json()["seeds"]
    first, second = seed["phases"]["scoring"]["attempts"]
    assert (first["termination_reason"], first["rule"]) == ("infra_transient", "scoring:judge-unreachable")
    assert second["termination_reason"] == "completed"
    assert [a["termination_reason"] for a in seed["phases"]["inference"]["attempts"]] == ["completed"]
    assert len(generations(eval_dir)) == 1


@pytest.mark.parametrize("edit,said", [
    (lambda text: text.split("[inference]")[0] + "[scoring]" + text.split("[scoring]")[1],
     "scoring: expected an [inference] table too: the scoring phase reads the outputs the inference phase commits "
     "($TRACKWAY_EVAL_INFERENCE_OUTPUTS)"),
    (lambda text: text.replace("[scoring]\n", "[scorin]\n"),
     "scorin: expected one of "),
    (lambda text: text.replace("server_start_timeout_s = 60", "gpu = 1"),
     "inference.gpu: expected one of command, code, resource, gpus, time_limit_hours, server, health_url, "
     "server_start_timeout_s"),
    (lambda text: 'gpus = 1\n' + text, "gpus: expected no top-level gpus in a spec with [inference] and [scoring] "
                                      "(each phase says its own gpus)"),
    (lambda text: text.replace('rubric = "rubric.md"', 'rubric = "missing.md"'), "judge.rubric: expected a file that "
                                                                                "exists (no such file: "),
])
def test_a_two_phase_spec_that_cannot_work_is_refused_in_one_line_naming_the_file_and_the_field(
        cli_sqlite, eval_dir, edit, said):
    assert cli_sqlite("submit", "--name", "train", "--", PY, NEUTRAL, "20").code == 0
    spec = two_phase_spec(eval_dir)
    spec.write_text(edit(spec.read_text()))
    refused = cli_sqlite("eval", "train@10", "--spec", str(spec))
    assert refused.code == 2
    assert refused.err.strip().startswith(f"error: {spec}: {said}") or f"{spec}: {said}" in refused.err
    assert len(refused.err.strip().splitlines()) == 1 and "Traceback" not in refused.err
    assert cli_sqlite("evals", "train", "--json").json()["evaluations"] == []


def test_a_rubric_changed_after_the_request_never_scores_under_the_pinned_judge(cli_sqlite, eval_dir):
    cli = cli_sqlite
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    spec = two_phase_spec(eval_dir, seeds="[0]")
    asked = cli("eval", "train@20", "--spec", str(spec), "--detach")
    assert asked.code == 0, asked.err
    old_id = asked.out.split()[0]
    (eval_dir / "rubric.md").write_text("lenient: an attempt counts\n")  # before anything launched

    def ended() -> bool:
        assert cli("supervise", "--once").code == 0
        rows = cli("evals", "train", "--json").json()["evaluations"]
        return len(rows) == 2 and all(r["state"] != "running" for r in rows)

    wait_for(ended, timeout=90, what="both evaluations to end")
    old = cli("eval", "show", old_id, "--json").json()
    (new_row,) = [r for r in cli("evals", "train", "--json").json()["evaluations"] if r["eval_id"] != old_id]
    new = cli("eval", "show", new_row["eval_id"], "--json").json()
    assert old["state"] == "failed" and old["metrics"] == {}
    assert new["state"] == "completed" and new["metrics"]["pass@1"]["mean"] == 1.0
    assert new["judge"]["rubric_sha256"] != old["judge"]["rubric_sha256"]
    assert len(generations(eval_dir)) == 1


def test_a_phase_on_a_resource_over_ssh_is_refused_before_anything_is_recorded(cli_sqlite, eval_dir, tmp_path):
    key = tmp_path / "id_box"
    key.write_text("not a key\n")
    Path("trackway.toml").write_text(f'[resources.box]\nexecutor = "ssh"\nhosts = ["eval@box.internal"]\n'
                                     f'key_file = "{key}"\nworkdir = "/srv/evals"\n')
    assert cli_sqlite("submit", "--name", "train", "--resource", "local", "--", PY, NEUTRAL, "20").code == 0
    spec = two_phase_spec(eval_dir)
    spec.write_text(spec.read_text().replace("[scoring]\n", '[scoring]\nresource = "box"\n'))
    refused = cli_sqlite("eval", "train@10", "--spec", str(spec))
    assert refused.code == 2, refused.err
    assert f"{spec}: scoring.resource: expected a resource on this machine's file system" in refused.err
    assert cli_sqlite("evals", "train", "--json").json()["evaluations"] == []


def test_a_two_phase_spec_attached_at_submit_evaluates_each_committed_checkpoint_once(cli_sqlite, eval_dir):
    spec = two_phase_spec(eval_dir, seeds="[0]")
    assert cli_sqlite("submit", "--name", "train", "--eval", str(spec), "--", PY, NEUTRAL, "30").code == 0

    def ended() -> list[dict]:
        assert cli_sqlite("supervise", "--once").code == 0
        rows = cli_sqlite("evals", "train", "--json").json()["evaluations"]
        return rows if rows and all(r["state"] != "running" for r in rows) else []

    rows = wait_for(ended, timeout=90, what="the triggered evaluations to end")
    assert [r["step"] for r in rows] == [10, 20] and all(r["state"] == "completed" for r in rows)
    assert rows[0]["metrics"]["pass@1"]["mean"] < rows[1]["metrics"]["pass@1"]["mean"]
    assert len(generations(eval_dir)) == 2  # one generation per checkpoint and seed


def test_a_scorer_that_failed_for_good_and_was_fixed_scores_the_outputs_already_generated(cli_sqlite, eval_dir):
    cli = cli_sqlite
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "30").code == 0
    spec = two_phase_spec(eval_dir, scorer_args=("--crash-attempts", "99"), seeds="[0]")
    failed = cli("eval", "train@20", "--spec", str(spec))
    assert failed.code == 1
    old = cli("eval", "show", failed.out.split()[0], "--json").json()
    (seed,) = old["seeds"]
    assert old["state"] == "failed" and seed["termination_reason"] == "evaluator_crash"
    assert [a["termination_reason"] for a in seed["phases"]["scoring"]["attempts"]] == ["evaluator_crash"] * 2
    score = eval_dir / "score.py"
    score.write_text(score.read_text().replace("if attempt <= args.crash_attempts:", "if False:"))  # the fix
    fixed = cli("eval", "train@20", "--spec", str(spec))
    assert fixed.code == 0, fixed.err
    new = cli("eval", "show", fixed.out.split()[0], "--json").json()
    assert new["eval_id"] != old["eval_id"] and new["state"] == "completed"
    assert new["seeds"][0]["inference_outputs"] == seed["inference_outputs"]
    assert len(generations(eval_dir)) == 1  # the GPU-hour spent once
