"""`trackway experiment` end to end: real runs of a script whose loss is exact arithmetic, gated, judged, chained.

toy_train.py logs loss = 2·exp(-lr·step) + 0.1 over `train.steps` steps (40): with lr 0.1 the baseline ends at
2·e^-4 + 0.1 = 0.136631; with lr 0.2 the loss is at or below that from step 20 on, half the baseline's steps.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

TOY = str(Path(__file__).resolve().parents[1] / "experiments" / "scripts" / "toy_train.py")
BASELINE_FINAL = 2 * math.exp(-4) + 0.1


@pytest.fixture
def sq(cli_sqlite):
    """The CLI on SQLite only: these tests run real attempts; the PostgreSQL path is covered by the first test."""
    return cli_sqlite


def _baseline(cli, name: str = "base") -> str:
    config = Path("cfg.json")
    config.write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    result = cli("submit", "--name", name, "--config", str(config), "--", sys.executable, TOY)
    assert result.code == 0, result.err
    return result.out.split()[0]


def _new(cli, *args: str) -> str:
    result = cli("experiment", "new", *args)
    assert result.code == 0, result.err
    return result.out.strip()


def test_a_test_run_gates_the_full_run_and_the_verdict_has_its_numbers(cli):
    baseline = _baseline(cli)
    experiment = _new(
        cli, "--title", "double lr", "--hypothesis", "doubling lr reaches the baseline's final loss in half the steps",
        "--baseline", "base", "--set", "train.lr=0.2",
        "--expect", "steps_to(loss, baseline.final.loss) <= 0.5 * baseline.steps",
        "--expect", "final.loss <= baseline.final.loss",
    )
    started = cli("experiment", "start", experiment)
    assert started.code == 0, started.err
    assert "test run → local" in started.err and "full run → local" in started.err  # shown before submitting
    assert "test run passed every check" in started.err and f"{experiment} supported" in started.err
    # Long enough for the loss trend: 12 points at the baseline's interval of 1 step, over a tenth of 40.
    assert ("test run: 12 steps (TRACKWAY_MAX_STEPS: the larger of a tenth of the planned 40 (4, at most 200) and "
            "12 loss points at the baseline's logging interval of 1 step (12))") in started.err

    shown = cli("experiment", "show", experiment, "--json").json()
    assert (shown["status"], shown["verdict"]) == ("concluded", "supported")
    assert shown["changes"] == [{"key": "train.lr", "before": 0.1, "after": 0.2}]
    assert shown["test_run"]["kind"] == "test" and shown["test_plan"]["max_steps"] == 12
    # No GPU here: the runs' hours are CPU-hours, said as such in the JSON and on the page.
    assert shown["test_run"]["compute"] == shown["full_run"]["compute"] == "CPU"
    page = cli("experiment", "show", experiment).out
    assert "CPU-h" in page and "GPU-h" not in page
    assert [a["last_step"] for a in shown["test_run"]["attempts"]] == [12]
    checks = {c["check"]: c["passed"] for c in shown["test_checks"]}
    # Twelve steps in microseconds cannot be timed, no GPUs, no git here: those checks are skipped, and say so.
    assert checks == {"ended": True, "first_step": True, "no_red_flag": True, "loss": True, "throughput": None,
                      "gpu_use": None, "checkpoint": True, "restore": True, "same_code": None}
    assert "too short to time: 11 steps logged in" in next(c["detail"] for c in shown["test_checks"]
                                                         if c["check"] == "throughput")
    first, second = shown["verdict_detail"]["criteria"]
    assert (first["left"], first["right"]) == (20.0, 20.0)
    assert first["values"]["baseline.final.loss"] == pytest.approx(BASELINE_FINAL)
    assert second["left"] == pytest.approx(2 * math.exp(-8) + 0.1)

    report = cli("experiment", "report", experiment)
    assert report.code == 0
    for text in ("## Changes against the baseline", "`train.lr: 0.1 → 0.2`", "| `steps_to(loss, baseline.final.loss) "
                 "<= 0.5 * baseline.steps` | 20 vs 20 | yes |", "`baseline.final.loss` = 0.136631",
                 "| restore | pass |", "**SUPPORTED**", "push further", f"**full run `{shown['full_run']['run_id']}`**"):
        assert text in report.out, text
    (listed,) = cli("experiments", "--json").json()
    assert listed["baseline_run_id"] == baseline and listed["verdict"] == "supported"


def test_iterations_chain_from_a_supported_one_and_revert_a_rejected_one(sq):
    _baseline(sq)
    faster = _new(sq, "--title", "lr up", "--hypothesis", "h1", "--baseline", "base", "--set", "train.lr=0.2",
                  "--expect", "final.loss <= baseline.final.loss")
    assert sq("experiment", "start", faster).code == 0
    full = sq("experiment", "show", faster, "--json").json()["full_run"]["run_id"]

    slower = sq("experiment", "new", "--from", faster, "--title", "lr down", "--hypothesis", "h2",
                "--set", "train.lr=0.05", "--expect", "final.loss <= baseline.final.loss")
    assert slower.code == 0 and f"{faster} was supported: its full run {full} is the new baseline" in slower.err
    assert "train.lr: 0.2 → 0.05" in slower.err  # against the new baseline's config
    slower_id = slower.out.strip()
    assert sq("experiment", "start", slower_id).code == 0  # concluded (rejected) is still a conclusion
    assert sq("experiment", "show", slower_id, "--json").json()["verdict"] == "rejected"

    reverted = sq("experiment", "new", "--from", slower_id, "--title", "t3", "--hypothesis", "h3",
                  "--set", "train.steps=50")
    assert f"{slower_id} is rejected: its change is reverted and its baseline {full} stays the baseline" in reverted.err

    chain = sq("experiments", "--chain", slower_id, "--json").json()
    assert [(c["iteration"], c["experiment_id"], c["verdict"], c["next"]) for c in chain] == [
        (1, None, None, ""), (2, faster, "supported", "build on it"), (3, slower_id, "rejected", "revert"),
        (4, reverted.out.strip(), None, ""),
    ]
    assert chain[0]["key_metric"] == pytest.approx(BASELINE_FINAL)
    table = sq("experiments", "--chain", faster)
    assert "revert" in table.out and "build on it" in table.out


@pytest.mark.parametrize(("mode", "failed"), [
    ("nan", ["ended", "loss", "checkpoint", "restore"]),  # NaN at step 3, before its first save
    ("no_checkpoint", ["checkpoint", "restore"]),
])
def test_a_test_run_that_diverges_or_never_checkpoints_stops_before_the_full_run(sq, mode, failed):
    _baseline(sq)
    experiment = _new(sq, "--title", mode, "--hypothesis", "h", "--baseline", "base", "--set", f"train.mode={mode}",
                      "--expect", "final.loss <= baseline.final.loss")
    started = sq("experiment", "start", experiment)
    assert started.code == 1
    shown = sq("experiment", "show", experiment, "--json").json()
    assert shown["status"] == "stopped" and shown["full_run"] is None and shown["verdict"] is None
    assert [c["check"] for c in shown["test_checks"] if c["passed"] is False] == failed
    assert shown["stop_reason"] == f"the test run failed {', '.join(failed)}"
    # There will be no verdict: the page says so, and why, never "not yet".
    page = " ".join(sq("experiment", "show", experiment).out.split())
    assert f"verdict none: stopped: the test run failed {failed[0]}" in page and "not yet" not in page, page
    report = sq("experiment", "report", experiment).out
    assert "not yet" not in report
    for check in failed:
        assert f"| {check} | **FAIL** |" in report
    if mode == "nan":
        assert "nan_loss" in report
    # The test run explains itself as part of the experiment, and why the experiment stopped.
    explained = " ".join(sq("explain", shown["test_run"]["run_id"]).out.split())
    assert f"the test run of {experiment} ({mode}): stopped (the test run failed" in explained
    # With the gate's numbers, that the full run never started, and what to do next (not "Next: nothing").
    for check in shown["test_checks"]:
        assert f"gate: {check['check']} {'passed' if check['passed'] else 'FAILED'}: {check['detail']}" in explained
    assert "the full run was never started" in explained
    assert "stopped at this test run's gate, and its full run was never started" in explained
    assert f"`trackway experiment new --from {experiment} ...`" in explained
    assert len(sq("runs", "--json").json()) == 2  # the baseline and the test run: no full run was submitted


def test_bad_input_is_refused_with_exit_2_and_nothing_recorded(sq):
    _baseline(sq)
    two = sq("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base",
             "--set", "train.lr=0.2", "--set", "train.steps=80")
    assert two.code == 2 and "changes 2 things against the baseline" in two.err
    assert "train.lr: 0.1 → 0.2" in two.err and "--allow-multiple-changes" in two.err
    bad = sq("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base",
             "--expect", "final.loss <= baseline.final.loss *")
    assert bad.code == 2 and "at column 36" in bad.err and "Traceback" not in bad.err
    missing = sq("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "nope")
    assert missing.code == 2
    nothing = sq("experiment", "new", "--title", "t", "--hypothesis", "h")
    assert nothing.code == 2 and "--baseline" in nothing.err
    same = sq("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base", "--set", "train.lr=0.1")
    assert same.code == 2 and same.err.count("\n") == 1 and "no change against the baseline: same config" in same.err
    assert "same command" in same.err and "no git commit here to compare the code by" in same.err
    assert sq("experiments", "--json").json() == []

    meant = _new(sq, "--title", "t", "--hypothesis", "h", "--baseline", "base", "--set", "train.lr=0.2",
                 "--set", "train.steps=80", "--allow-multiple-changes")
    shown = sq("experiment", "show", meant, "--json").json()
    assert shown["allow_multiple_changes"] is True and len(shown["changes"]) == 2
    assert sq("experiment", "start", meant, "--max-steps", "0").code == 2
    assert sq("experiment", "stop", meant, "--reason", "changed my mind").code == 0
    assert sq("experiment", "show", meant, "--json").json()["stop_reason"] == "changed my mind"
    refused = sq("experiment", "start", meant)  # only a planned experiment starts, or a stopped one --again
    assert refused.code == 2 and f"`trackway experiment start {shown['experiment_id']} --again`" in refused.err
    assert sq("experiment", "stop", meant, "--reason", "again").code == 2


def test_skip_test_is_recorded_and_a_budget_refuses_an_expensive_full_run(sq, monkeypatch):
    # A quiet machine: on a loaded one (this suite on two cores) a wall-clock shortfall is "not judged".
    monkeypatch.setattr("trackway.experiments.gate.load_per_core", lambda: 0.2)
    _baseline(sq)
    skipped = _new(sq, "--title", "t", "--hypothesis", "h", "--baseline", "base", "--set", "train.lr=0.2",
                   "--expect", "final.loss <= baseline.final.loss")
    detached = sq("experiment", "start", skipped, "--skip-test", "--detach")
    assert detached.code == 0 and "full run" in detached.err
    # Whoever supervises the ledger (here `supervise --once`; usually the background one) concludes it.
    for _ in range(400):
        assert sq("supervise", "--once").code == 0
        if sq("experiment", "show", skipped, "--json").json()["status"] == "concluded":
            break
        time.sleep(0.05)
    shown = sq("experiment", "show", skipped, "--json").json()
    assert shown["skip_test"] is True and shown["test_run"] is None and shown["verdict"] == "supported"
    assert "Skipped (`--skip-test`, recorded)." in sq("experiment", "report", skipped).out

    costly = _new(sq, "--title", "t", "--hypothesis", "h", "--baseline", "base", "--set", "train.lr=0.3")
    assert sq("experiment", "start", costly, "--budget-gpu-hours", "0.0000001").code == 1
    shown = sq("experiment", "show", costly, "--json").json()
    assert shown["status"] == "stopped" and "over the budget of 1e-07" in shown["stop_reason"]
    assert shown["estimate"]["planned_steps"] == 40 and shown["estimate"]["gpu_hours"] > 1e-7
    first_test = shown["test_run"]["run_id"]
    # Stopped at the gate, it starts again with a new test run; the first one and its checks stay on record.
    assert sq("experiment", "start", costly, "--again").code == 0
    shown = sq("experiment", "show", costly, "--json").json()
    assert shown["status"] == "concluded" and shown["test_run"]["run_id"] != first_test
    (earlier,) = shown["earlier_test_runs"]
    assert earlier["run_id"] == first_test and "over the budget of 1e-07" in earlier["stop_reason"]
    assert {c["check"] for c in earlier["checks"]} >= {"loss", "throughput", "restore"}
    said = " ".join(sq("experiment", "show", costly).out.split())
    assert f"test run 1 {first_test} stopped: the full run would take about" in said
    assert f"test run 2 {shown['test_run']['run_id']} completed" in said
    assert f"Test run 1: `{first_test}`" in sq("experiment", "report", costly).out
    assert sq("experiment", "start", costly, "--again").code == 2  # concluded: nothing to start again

    # A test run slower than asked: 0.4 s a step is 2.5 steps/s, under the 100 asked for.
    slow = _new(sq, "--title", "t", "--hypothesis", "h", "--baseline", "base", "--set", "train.delay=0.4")
    assert sq("experiment", "start", slow, "--min-throughput", "100", "--max-steps", "5").code == 1
    shown = sq("experiment", "show", slow, "--json").json()
    (throughput,) = [c for c in shown["test_checks"] if c["check"] == "throughput"]
    assert throughput["passed"] is False and "minimum 100" in throughput["detail"]
    assert shown["stop_reason"] == "the test run failed throughput"


def test_the_full_run_is_evaluated_like_the_baseline_and_judged_after_its_evaluations(sq, tmp_path):
    evaluator = Path(__file__).resolve().parents[1] / "evals" / "scripts" / "evaluator.py"
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "evaluator.py").write_text(evaluator.read_text())
    (evals / "tasks.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(10)))
    spec = evals / "toy.toml"
    spec.write_text(f'name = "toy"\ncommand = {json.dumps([sys.executable, "evaluator.py"])}\ntask_set = "tasks.jsonl"\n'
                    'seeds = [0]\nmetrics = ["pass@1"]\n\n[decoding]\nsamples = 2\n')
    Path("cfg.json").write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    base = sq("submit", "--name", "base", "--config", "cfg.json", "--eval", str(spec), "--", sys.executable, TOY)
    assert base.code == 0, base.err
    experiment = _new(sq, "--title", "t", "--hypothesis", "h", "--baseline", "base", "--set", "train.lr=0.2",
                      "--expect", "eval.pass@1 >= baseline.eval.pass@1")
    # The baseline's evaluation may still be going: the experiment's supervisor drives it too.
    assert sq("experiment", "start", experiment).code == 0
    shown = sq("experiment", "show", experiment, "--json").json()
    (outcome,) = shown["verdict_detail"]["criteria"]
    # Both final checkpoints are at step 40: the stand-in evaluator scores them the same.
    assert outcome["holds"] is True and outcome["values"]["eval.pass@1"] == outcome["values"]["baseline.eval.pass@1"]
    assert {(e["checkpoint_step"], e["spec_name"], e["state"]) for e in shown["evaluations"]} == {(40, "toy", "completed")}
    assert shown["test_run"]["run_id"] not in {r["run_id"] for r in sq("runs", "--kind", "eval", "--json").json()}
    report = sq("experiment", "report", experiment).out
    assert "| run | step | spec | pass@1 | pass@2 | seeds | state |" in report
    assert "| baseline | 40 | toy | 0.75 ± 0 | 0.9 ± 0 | 1 | completed |" in report
    assert "| this | 40 | toy | 0.75 ± 0 | 0.9 ± 0 | 1 | completed |" in report


def test_with_the_baseline_config_and_command_only_new_code_is_a_change(sq):
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], capture_output=True, text=True, check=True)

    git("init", "--quiet", "--initial-branch=main")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    Path("train.py").write_text(Path(TOY).read_text())
    Path("cfg.json").write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    git("add", "train.py", "cfg.json")
    git("commit", "--quiet", "-m", "toy")
    assert sq("submit", "--name", "base", "--config", "cfg.json", "--", sys.executable, "train.py").code == 0
    same = sq("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base")
    assert same.code == 2 and "same code (commit " in same.err and ", clean)" in same.err
    assert sq("experiments", "--json").json() == []

    Path("train.py").write_text(Path(TOY).read_text() + "# a faster loop\n")
    git("commit", "--quiet", "-am", "faster")
    changed = sq("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base")
    assert changed.code == 0, changed.err
    (change,) = sq("experiment", "show", changed.out.strip(), "--json").json()["changes"]
    assert change["key"] == "code" and change["before"].startswith("commit ") and change["after"] != change["before"]


def test_the_test_run_may_go_elsewhere_than_the_full_run_and_its_speed_is_then_not_compared(sq):
    Path("trackway.toml").write_text('[resources.quick]\nexecutor = "local"\n\n[resources.big]\nexecutor = "local"\n')
    config = Path("cfg.json")
    config.write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    assert sq("submit", "--name", "base", "--resource", "big", "--config", str(config), "--",
              sys.executable, TOY).code == 0
    experiment = _new(sq, "--title", "lr", "--hypothesis", "a higher lr is no worse", "--baseline", "base",
                      "--set", "train.lr=0.2", "--full-resource", "big", "--expect", "final.loss <= baseline.final.loss")
    refused = sq("experiment", "start", experiment, "--test-resource", "nope")
    assert refused.code == 2 and "--test-resource" in refused.err and "--resource" not in refused.err.replace(
        "--test-resource", "")
    started = sq("experiment", "start", experiment, "--test-resource", "quick")
    assert started.code == 0, started.err
    assert "test run → quick" in started.err and "full run → big" in started.err
    shown = sq("experiment", "show", experiment, "--json").json()
    assert shown["test_plan"]["test_resource"] == "quick"
    assert (shown["test_run"]["resource"], shown["full_run"]["resource"]) == ("quick", "big")
    throughput = next(c for c in shown["test_checks"] if c["check"] == "throughput")
    assert throughput["passed"] is None and "on quick with 0 GPU(s) is not comparable with the baseline on big" \
        in throughput["detail"]
