"""Real harnesses fit the evaluator contract: mapped field names, bundled tasks, the training config, precise errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PY = sys.executable
NEUTRAL = str(Path(__file__).parent.parent / "cli" / "scripts" / "neutral.py")
LM_EVAL = Path(__file__).parent / "scripts" / "lm_eval_style.py"
MAPPED = '[output]\ntask_id = "doc_id"\ncorrect = "acc"\nsample = false\noutput = "filtered_resps"\n'


def write_spec(directory: Path, name: str, args: list[str] | None = None, output: str = MAPPED) -> str:
    directory.mkdir(exist_ok=True)
    (directory / "lm_eval_style.py").write_text(LM_EVAL.read_text())
    command = [PY, "lm_eval_style.py", *(args or [])]
    path = directory / f"{name}.toml"
    path.write_text(f'name = "{name}"\ncommand = {json.dumps(command)}\nseeds = [0]\nmetrics = ["pass@1"]\n{output}')
    return str(path)


def trained(cli, tmp_path: Path) -> None:
    config = tmp_path / "model.toml"
    config.write_text("[model]\nwidth = 64\n")
    done = cli("submit", "--name", "train", "--config", str(config), "--", PY, NEUTRAL, "30")
    assert done.code == 0, done.err


def test_an_lm_eval_style_evaluator_works_through_a_field_mapping_and_bundled_tasks(cli, tmp_path):
    trained(cli, tmp_path)
    spec = write_spec(tmp_path / "evals", "lmeval")
    result = cli("eval", "train@20", "--spec", spec)
    assert result.code == 0, result.err
    eval_id = result.out.split()[0]
    detail = cli("eval", "show", eval_id, "--json").json()
    assert detail["state"] == "completed"
    assert detail["metrics"]["pass@1"]["mean"] == 0.4  # docs 0..3 of 10 are right at step 20
    assert detail["task_set"] is None and detail["task_set_sha256"] == detail["evaluator_version"]
    assert detail["output_fields"] == {"task_id": "doc_id", "correct": "acc", "sample": False,
                                       "output": "filtered_resps"}
    shown = " ".join(cli("eval", "show", eval_id).out.split())
    assert "bundled with the evaluator" in shown and "task_id = doc_id" in shown
    (seed,) = detail["seeds"]
    log = cli("logs", seed["eval_run_id"]).out
    assert "lm-eval-style: width 64 step 20" in log  # the training config reached the evaluator


def test_without_the_mapping_the_first_line_is_named_with_what_was_expected(cli, tmp_path):
    trained(cli, tmp_path)
    spec = write_spec(tmp_path / "evals", "plain", output="")
    result = cli("eval", "train@20", "--spec", spec)
    assert result.code == 1
    (seed,) = cli("eval", "show", result.out.split()[0], "--json").json()["seeds"]
    evidence = cli("attempts", seed["eval_run_id"], "--json").json()[0]["termination_evidence"]
    assert "output line 1: missing 'task_id'" in evidence["lines"][0]
    assert "task_id, sample, correct, output" in evidence["lines"][0]


def test_a_malformed_line_fails_the_seed_naming_the_line(cli, tmp_path):
    trained(cli, tmp_path)
    spec = write_spec(tmp_path / "evals", "broken", ["--bad-line", "3"])
    result = cli("eval", "train@20", "--spec", spec)
    assert result.code == 1
    detail = cli("eval", "show", result.out.split()[0], "--json").json()
    (seed,) = detail["seeds"]
    assert detail["state"] == "failed" and detail["metrics"] == {}
    attempt = cli("attempts", seed["eval_run_id"], "--json").json()[0]
    assert attempt["termination_reason"] == "evaluator_crash"
    assert "output line 3: acc 'yes': expected true or false (or 1 or 0)" in attempt["termination_evidence"]["lines"][0]
