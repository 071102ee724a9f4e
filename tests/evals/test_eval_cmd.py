"""`trackway eval`, `eval show`, `eval compare`, `evals`: repeats, escalation, pins, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PY = sys.executable
NEUTRAL = str(Path(__file__).parent.parent / "cli" / "scripts" / "neutral.py")
THREE_SEEDS = 'seeds = [0, 1, 2]\nmetrics = ["pass@1", "pass@2"]\n[decoding]\nsamples = 4\ntemperature = 0.8\n'
ESCALATING = 'seeds = [0, 1, 2]\nmetrics = ["pass@1"]\n[decoding]\nsamples = 4\n[escalation]\nfirst_seeds = 1\nescalate_if = "pass@1 >= 0.4"\n'


def trained(cli, name: str = "train", steps: int = 40) -> str:
    assert cli("submit", "--name", name, "--", PY, NEUTRAL, str(steps)).code == 0
    return name


def eval_runs(cli) -> list[dict]:
    return cli("runs", "--kind", "eval", "--json").json()


def test_the_same_checkpoint_and_versions_again_is_a_repeat_and_a_changed_evaluator_is_not(cli, write_spec, eval_dir):
    trained(cli)
    spec = str(write_spec(body=THREE_SEEDS))
    first = cli("eval", "train@20", "--spec", spec, "--seeds", "2")
    assert first.code == 0, first.err
    eval_id = first.out.split()[0]
    assert "pass@1" in first.out and len(eval_runs(cli)) == 2
    again = cli("eval", "train@step-00000020", "--spec", spec, "--seeds", "2")
    assert again.code == 0 and again.out.split()[0] == eval_id and "is a repeat" in again.err
    assert len(eval_runs(cli)) == 2  # nothing ran
    code = eval_dir / "evaluator.py"
    code.write_text(code.read_text().replace('VERSION_TAG = "v1"', 'VERSION_TAG = "v2"'))
    changed = cli("eval", "train@20", "--spec", spec, "--seeds", "2")
    assert changed.code == 0 and changed.out.split()[0] != eval_id
    rows = cli("evals", "train", "--json").json()["evaluations"]
    assert len(rows) == 2 and rows[0]["evaluator_version"] != rows[1]["evaluator_version"]
    # More seeds for the same identity extend it instead of repeating it.
    more = cli("eval", "train@20", "--spec", spec, "--seeds", "3")
    assert more.code == 0 and more.out.split()[0] == changed.out.split()[0]
    detail = cli("eval", "show", more.out.split()[0], "--json").json()
    page = cli("eval", "show", more.out.split()[0]).out
    # Headers say what their column holds (each seed's attempt endings), and no Python dict or repr leaks out.
    assert "endings" in page and "sampled failures:" in page and "{'" not in page and "': " not in page, page
    assert 'output "' in page
    assert [s["seed"] for s in detail["seeds"]] == [0, 1, 2] and detail["metrics"]["pass@1"]["seeds"] == 3


def test_escalation_runs_the_remaining_seeds_only_when_the_first_clears(cli, write_spec):
    trained(cli)
    spec = str(write_spec("esc", body=ESCALATING))
    low = cli("eval", "train@10", "--spec", spec)  # the stand-in's skill at step 10 is 0.2
    assert low.code == 0, low.err
    low_detail = cli("eval", "show", low.out.split()[0], "--json").json()
    assert [s["seed"] for s in low_detail["seeds"]] == [0]
    assert low_detail["escalation"]["decided"] == "held" and low_detail["escalation"]["value"] < 0.4
    assert low_detail["state"] == "completed"
    high = cli("eval", "train@30", "--spec", spec)  # skill 0.6
    high_detail = cli("eval", "show", high.out.split()[0], "--json").json()
    assert [s["seed"] for s in high_detail["seeds"]] == [0, 1, 2]
    assert high_detail["escalation"]["decided"] == "escalated" and high_detail["escalation"]["value"] >= 0.4
    assert high_detail["metrics"]["pass@1"]["seeds"] == 3
    assert "cleared pass@1 >= 0.4; ran seeds [1, 2]" in " ".join(cli("eval", "show", high.out.split()[0]).out.split())
    # Asking again after escalation decided is a repeat, whichever way it went.
    assert "is a repeat" in cli("eval", "train@10", "--spec", spec).err


def test_evaluations_pin_checkpoints_against_retention(cli, write_spec):
    trained(cli, steps=60)  # checkpoints at 10..50
    spec = str(write_spec())
    detached = cli("eval", "train@10", "--spec", spec, "--detach")
    assert detached.code == 0
    plan = cli("gc", "train", "--dry-run")
    assert "keep step 10: pinned by evaluation" in plan.out and "(in flight)" in plan.out
    # Done: the best checkpoint by pass@1 stays pinned; others follow retention.
    assert cli("eval", "train@20", "--spec", spec).code == 0
    cli("supervise", "--once")
    for _ in range(100):
        if all(r["state"] != "running" for r in cli("evals", "train", "--json").json()["evaluations"]):
            break
        cli("supervise", "--once")
    # keep_evaluated = "all": every evaluated checkpoint stays, whatever its result.
    Path("trackway.toml").write_text('[checkpoints]\nkeep_evaluated = "all"\n')
    plan = cli("gc", "train", "--dry-run")
    assert "keep step 10: pinned by evaluation" in plan.out and "(completed)" in plan.out
    Path("trackway.toml").unlink()
    plan = cli("gc", "train")
    assert "keep step 20: best pass@1 by evaluation spec toy" in plan.out
    states = {c["step"]: c["state"] for c in cli("checkpoints", "train", "--json").json()}
    assert states[20] == "committed" and 10 not in states  # the worse evaluated one followed retention
    Path("trackway.toml").write_text('[checkpoints]\nkeep_evaluated = "some"\n')
    bad = cli("gc", "train")
    assert bad.code == 2 and "[checkpoints] keep_evaluated: expected \"best\" or \"all\", got 'some'" in bad.err


def test_compare_lists_the_tasks_that_flipped(cli, write_spec):
    trained(cli)
    spec = str(write_spec())
    assert cli("eval", "train@10", "--spec", spec).code == 0
    assert cli("eval", "train@30", "--spec", spec).code == 0
    result = cli("eval", "compare", "train@10", "train@30", "--json").json()
    assert result["tasks_compared"] == 20 and result["same_evaluator"]
    assert len(result["gained"]) > len(result["lost"])
    for flip in result["gained"]:
        assert flip["before"] < 0.5 <= flip["after"]
    text = " ".join(cli("eval", "compare", "train@10", "train@30").out.split())  # lines wrap at the terminal's width
    assert "gained" in text and f"{len(result['gained'])} gained" in text


def test_best_checkpoint_by_pass_at_1_is_one_sql_query(cli, write_spec):
    trained(cli)
    spec = str(write_spec())
    for step in (10, 20, 30):
        assert cli("eval", f"train@{step}", "--spec", spec).code == 0
    query = ("select checkpoint, step, mean, evaluator_version from checkpoint_evals "
             "where run_name = 'train' and metric = 'pass@1' order by mean desc limit 1")
    (best,) = cli("sql", query, "--json").json()
    assert best["step"] == 30 and best["evaluator_version"].startswith("sha256:")


def test_bad_input_is_one_line_exit_2_and_records_nothing(cli, write_spec, tmp_path):
    trained(cli)
    spec = str(write_spec())
    cases = [
        (["eval", "train@999", "--spec", spec], "train@999: does not exist"),
        (["eval", "nope@10", "--spec", spec], "run 'nope'"),
        (["eval", "train@ten", "--spec", spec], "expected RUN@STEP"),
        (["eval", "train@10", "--spec", str(tmp_path / "missing.toml")], "no such file"),
        (["eval", "train@10", "--spec", spec, "--seeds", "0"], "--seeds 0"),
        (["submit", "--eval", str(tmp_path / "missing.toml"), "--", PY, "-c", "pass"], "no such file"),
        (["runs", "--kind", "weird"], "--kind 'weird'"),
        (["eval", "show", "ev0000"], "no evaluation has that id"),
    ]
    for args, expected in cases:
        result = cli(*args)
        assert result.code == 2 and expected in result.err and len(result.err.strip().splitlines()) == 1, (args, result.err)
    assert eval_runs(cli) == [] and len(cli("runs", "--json").json()) == 1


def test_an_evaluator_that_breaks_the_output_contract_fails_that_seed_once(cli, write_spec):
    trained(cli)
    spec = str(write_spec("broken", ["--bad-output"], body='seeds = [0]\n[decoding]\nsamples = 1\n'))
    result = cli("eval", "train@10", "--spec", spec)
    assert result.code == 1
    detail = cli("eval", "show", result.out.split()[0], "--json").json()
    (seed,) = detail["seeds"]
    # A format error is deterministic: the seed is not retried into the same bad line.
    assert [a["rule"] for a in seed["attempts"]] == ["evaluator:bad-output"]
    (attempt,) = cli("attempts", seed["eval_run_id"], "--json").json()
    assert "missing 'correct'" in attempt["termination_evidence"]["lines"][0]
    decision = json.loads(attempt["retry_decision"])
    assert decision["action"] == "stop" and decision["rule"] == "evaluator_crash: evaluator:bad-output"
    assert detail["state"] == "failed" and detail["metrics"] == {}


def test_explain_connects_a_run_to_its_evaluations_and_a_seed_to_its_checkpoint(cli, write_spec):
    trained(cli)
    result = cli("eval", "train@30", "--spec", str(write_spec()))
    eval_id = result.out.split()[0]
    text = cli("explain", "train", "--markdown").out
    version = cli("eval", "show", eval_id, "--json").json()["evaluator_version"].rpartition(":")[2][:12]
    assert "## Evaluations" in text and f"step-00000030 by toy (evaluator {version}): completed, pass@1" in text
    assert eval_id in text
    seed_run = eval_runs(cli)[0]["run_id"]
    seed_text = cli("explain", seed_run, "--markdown").out
    assert f"of evaluation {eval_id} (toy, completed): checkpoint step-00000030" in seed_text


def test_asking_again_after_a_failed_evaluation_gives_its_failed_seeds_one_more_attempt(cli, write_spec):
    trained(cli)
    spec = str(write_spec("flaky", ["--crash-attempts", "2"], body='seeds = [0]\n[decoding]\nsamples = 2\n'))
    first = cli("eval", "train@10", "--spec", spec)
    assert first.code == 1  # the same crash twice: no third attempt, whatever the budget
    eval_id = first.out.split()[0]
    again = cli("eval", "train@10", "--spec", spec)
    assert again.code == 0 and again.out.split()[0] == eval_id and "is a repeat" not in again.err
    (seed,) = cli("eval", "show", eval_id, "--json").json()["seeds"]
    assert [a["termination_reason"] for a in seed["attempts"]] == ["evaluator_crash"] * 2 + ["completed"]
    assert seed["state"] == "completed"
