"""An evaluation's result is filed under the version that produced it (issue 30, item 2).

The evaluator's version and the task set's are computed again when each seed attempt launches.
Before: an evaluator crashed on a checkpoint, the file was fixed, and the policy's retry (or the
`trackway resume <seed>` that explain advised) ran the fixed code and recorded the completed
result under the crashed version's sha; adding an `[output]` mapping after a bad-output failure
and asking again re-ran the old failed seed with the old mapping.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PY = sys.executable
NEUTRAL = str(Path(__file__).parent.parent / "cli" / "scripts" / "neutral.py")
ONE_SEED = 'seeds = [0]\nmetrics = ["pass@1"]\n[decoding]\nsamples = 2\n'
CRASH = "if attempt <= args.crash_attempts and i == 2:"


def trained(cli) -> None:
    assert cli("submit", "--name", "train", "--", PY, NEUTRAL, "20").code == 0


def fix(evaluator: Path) -> None:
    """What the person does: the crash is taken out of the evaluator's code."""
    text = evaluator.read_text()
    assert CRASH in text
    evaluator.write_text(text.replace(CRASH, "if False:").replace('VERSION_TAG = "v1"', 'VERSION_TAG = "v2"'))


def test_resuming_a_seed_after_its_evaluator_changed_is_refused_and_a_new_evaluation_is_asked_for(
        cli, write_spec, eval_dir):
    trained(cli)
    spec = str(write_spec("fragile", ["--crash-attempts", "99"], body=ONE_SEED))
    first = cli("eval", "train@10", "--spec", spec)
    assert first.code == 1
    old = cli("eval", "show", first.out.split()[0], "--json").json()
    (seed,) = old["seeds"]
    # explain points at a new evaluation, not at resuming the seed, and states only what is so of it.
    advice = cli("explain", seed["eval_run_id"], "--json").json()["next"]
    assert "`trackway eval train@10 --spec " in advice and f"trackway resume {seed['eval_run_id']}" not in advice
    text = " ".join(cli("explain", seed["eval_run_id"]).out.split())
    assert f"code: the evaluator, version {old['evaluator_version']}" in text and "not a git repository" not in text
    assert "asked for by name" not in text and "the resource its training run was placed on" in text
    assert "started by the supervisor (an evaluation a person asked for (`trackway eval`))" in text
    training = " ".join(cli("explain", "train").out.split())
    assert f"step-00000010 by fragile (evaluator {old['evaluator_version'][7:19]}): failed (evaluator_crash)" in training
    fix(eval_dir / "evaluator.py")
    resumed = cli("resume", seed["eval_run_id"])
    assert resumed.code == 2
    assert "its evaluator sha256:" in resumed.err and "`trackway eval RUN@STEP --spec FILE`" in resumed.err
    again = cli("eval", "train@10", "--spec", spec)
    assert again.code == 0, again.err
    new = cli("eval", "show", again.out.split()[0], "--json").json()
    assert new["eval_id"] != old["eval_id"] and new["state"] == "completed"
    assert new["evaluator_version"] != old["evaluator_version"]
    # The old evaluation keeps what its own version did: the crashes, and no result.
    kept = cli("eval", "show", old["eval_id"], "--json").json()
    assert kept["state"] == "failed" and kept["metrics"] == {}
    assert [a["termination_reason"] for a in kept["seeds"][0]["attempts"]] == ["evaluator_crash"] * 2


def test_a_policy_retry_after_the_evaluator_changed_continues_as_the_new_versions_evaluation(
        cli, write_spec, eval_dir):
    trained(cli)
    Path("trackway.toml").write_text("[retry.reasons.evaluator_crash]\nbackoff_seconds = 1\n")
    spec = str(write_spec("fragile", ["--crash-attempts", "99"], body=ONE_SEED))
    asked = cli("eval", "train@10", "--spec", spec, "--detach")
    assert asked.code == 0, asked.err
    old_id = asked.out.split()[0]

    def seed_attempts(eval_id: str) -> list[dict]:
        seeds = cli("eval", "show", eval_id, "--json").json()["seeds"]
        return seeds[0]["attempts"] if seeds else []

    for _ in range(300):
        cli("supervise", "--once")
        attempts = seed_attempts(old_id)
        if attempts and attempts[0]["termination_reason"]:
            break
    assert attempts[0]["retry_decision"]["action"] == "resume"  # queued, held back 1 s
    fix(eval_dir / "evaluator.py")  # the file is fixed before the retry launches
    for _ in range(300):
        cli("supervise", "--once")
        rows = cli("evals", "train", "--json").json()["evaluations"]
        if len(rows) == 2 and all(r["state"] != "running" for r in rows):
            break
    old = cli("eval", "show", old_id, "--json").json()
    (new_row,) = [r for r in rows if r["eval_id"] != old_id]
    new = cli("eval", "show", new_row["eval_id"], "--json").json()
    # Nothing the fixed evaluator produced is filed under the version that crashed.
    assert (old["state"], old["metrics"]) == ("failed", {})
    assert [a["termination_reason"] for a in old["seeds"][0]["attempts"]] == ["evaluator_crash"]
    assert new["state"] == "completed" and new["evaluator_version"] != old["evaluator_version"]
    assert new["step"] == old["step"] == 10 and new["checkpoint_manifest_sha256"] == old["checkpoint_manifest_sha256"]
    (attempt,) = new["seeds"][0]["attempts"]
    assert attempt["termination_reason"] == "completed"
    moved = cli("explain", old["seeds"][0]["eval_run_id"], "--json").json()
    assert any(f"continues as evaluation {new['eval_id']}" in line for line in moved["watchers"]), moved["watchers"]


def test_the_output_mapping_is_part_of_an_evaluations_identity(cli, tmp_path):
    lm_eval = Path(__file__).parent / "scripts" / "lm_eval_style.py"
    config = tmp_path / "model.toml"
    config.write_text("[model]\nwidth = 64\n")
    assert cli("submit", "--name", "train", "--config", str(config), "--", PY, NEUTRAL, "30").code == 0
    directory = tmp_path / "evals"
    directory.mkdir()
    (directory / "lm_eval_style.py").write_text(lm_eval.read_text())
    spec = directory / "lm.toml"
    head = f'name = "lm"\ncommand = {json.dumps([PY, "lm_eval_style.py"])}\nseeds = [0]\nmetrics = ["pass@1"]\n'
    spec.write_text(head)
    first = cli("eval", "train@20", "--spec", str(spec))
    assert first.code == 1  # the lines use lm-eval's field names: a bad output
    spec.write_text(head + '[output]\ntask_id = "doc_id"\ncorrect = "acc"\nsample = false\noutput = "filtered_resps"\n')
    again = cli("eval", "train@20", "--spec", str(spec))
    assert again.code == 0, again.err
    assert again.out.split()[0] != first.out.split()[0]  # a new evaluation, not the old failed seed re-run
    shown = cli("eval", "show", again.out.split()[0], "--json").json()
    assert shown["state"] == "completed" and shown["metrics"]["pass@1"]["mean"] == 0.4
    assert cli("eval", "show", first.out.split()[0], "--json").json()["state"] == "failed"
