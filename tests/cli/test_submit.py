"""`trackway submit` end to end: real processes, the receipt in the ledger, and the run's outcome as exit code."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from waiting import wait_for

PY = sys.executable


def _attempt(cli, run: str) -> dict:
    result = cli("attempts", run, "--json")
    assert result.code == 0, result.err
    (attempt,) = result.json()
    return attempt


def test_a_completed_run_exits_0_and_leaves_a_full_receipt(cli, tmp_path):
    config = tmp_path / "cfg.toml"
    config.write_text("[train]\nlr = 0.001\nsteps = 10\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("1+1=2\n")
    script = "import os; print('run', os.environ['TRACKWAY_RUN_ID'], 'attempt', os.environ['TRACKWAY_ATTEMPT_ID'])"
    result = cli(
        "submit", "--name", "first", "--project", "arcagi", "--model-family", "reasoning", "--kind", "test",
        "--config", str(config), "--set", "train.lr=3e-4", "--data", str(data), "--", PY, "-c", script,
    )
    assert result.code == 0, result.err
    run_id = result.out.split()[0]
    assert "ended: completed" in result.err

    (run,) = cli("runs", "--json").json()
    assert run["run_id"] == run_id and run["name"] == "first" and run["state"] == "completed"
    assert run["project"] == "arcagi" and run["model_family"] == "reasoning" and run["kind"] == "test"

    attempt = _attempt(cli, "first")
    assert attempt["attempt_id"] == f"{run_id}/1" and attempt["termination_reason"] == "completed"
    assert attempt["exit_code"] == 0 and attempt["signal"] is None
    assert attempt["executor"] == "local" and attempt["executor_job_id"] and attempt["host"]
    assert attempt["gpu_count"] == 0 and attempt["gpu_seconds"] > 0 and attempt["cost_usd"] == 0
    for key in ("config_sha256", "data_manifest_sha256", "environment_sha256"):
        assert len(attempt[key]) == 64, key
    assert attempt["started_at"] <= attempt["ended_at"]

    shown = cli("show", "first", "--json").json()
    assert shown["config"] == {"train": {"lr": 3e-4, "steps": 10}}
    assert [f["path"] for f in shown["data_manifest"]["files"]] == ["data/train.txt"]

    log = cli("logs", f"{run_id}/1")
    assert f"out run {run_id} attempt {run_id}/1" in log.out


def test_a_failing_run_exits_1_and_says_why(cli):
    result = cli("submit", "--", PY, "-c", "1/0")
    assert result.code == 1
    attempt = _attempt(cli, result.out.split()[0])
    assert attempt["termination_reason"] == "code_error" and attempt["exit_code"] == 1
    evidence = attempt["termination_evidence"]
    assert evidence["rule"] == "log:traceback"
    assert any("ZeroDivisionError" in line for line in evidence["lines"])


def test_detached_run_is_recorded_by_the_next_command_that_looks(cli):
    result = cli("submit", "--detach", "--", PY, "-c", "import time; time.sleep(0.5)")
    assert result.code == 0
    run_id = result.out.split()[0]
    deadline = time.time() + 30
    while time.time() < deadline:
        (run,) = cli("runs", "--json").json()
        if run["state"] == "completed":
            break
        time.sleep(0.2)
    assert run["state"] == "completed"
    assert _attempt(cli, run_id)["termination_reason"] == "completed"


def test_time_limit_ends_the_attempt_as_timeout(cli, home):
    Path("trackway.toml").write_text("[resources.local]\ngrace_seconds = 1\n")
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    started = time.time()
    result = cli("submit", "--time-limit", str(1.5 / 3600), "--", PY, "-c", script)
    assert result.code == 1
    assert time.time() - started < 30
    attempt = _attempt(cli, result.out.split()[0])
    assert attempt["termination_reason"] == "timeout" and attempt["signal"] == 9


def test_cancel_ends_the_run_as_user_cancelled(cli):
    result = cli("submit", "--detach", "--name", "long", "--", PY, "-c", "import time; time.sleep(120)")
    assert result.code == 0
    cancelled = cli("cancel", "long")
    assert cancelled.code == 0 and "cancel requested" in cancelled.out
    deadline = time.time() + 30
    while time.time() < deadline:
        (run,) = cli("runs", "--json").json()
        if run["state"] != "running":
            break
        time.sleep(0.2)
    assert run["state"] == "cancelled" and run["termination_reason"] == "user_cancelled"
    again = cli("cancel", "long")
    assert again.code == 2 and "already cancelled" in again.err


def test_same_config_is_stored_once_and_changed_data_changes_the_manifest(cli, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("lr: 0.1\nbatch: 8\n")
    data = tmp_path / "d.txt"
    data.write_text("one")
    first = cli("submit", "--config", str(config), "--data", str(data), "--", PY, "-c", "pass")
    second = cli("submit", "--config", str(config), "--data", str(data), "--", PY, "-c", "pass")
    data.write_text("two")
    third = cli("submit", "--config", str(config), "--data", str(data), "--", PY, "-c", "pass")
    assert first.code == second.code == third.code == 0
    attempts = {a["run_id"]: a for a in cli("attempts", "--json").json()}
    a, b, c = (attempts[r.out.split()[0]] for r in (first, second, third))
    assert a["config_sha256"] == b["config_sha256"] == c["config_sha256"]
    assert a["data_manifest_sha256"] == b["data_manifest_sha256"] != c["data_manifest_sha256"]
    stored = cli("sql", "select count(*) as n from blobs where kind = 'config'", "--json").json()
    assert stored == [{"n": 1}]


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    import os

    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **env}).stdout


def test_dirty_work_tree_records_a_diff_hash_that_differs_from_the_clean_one(cli):
    repo = Path.cwd()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("print('v1')\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "v1")
    clean = cli("submit", "--", PY, "train.py")
    (repo / "train.py").write_text("print('v2')\n")
    dirty = cli("submit", "--", PY, "train.py")
    assert clean.code == dirty.code == 0
    runs = {r["run_id"]: r for r in cli("runs", "--json").json()}
    clean_run, dirty_run = runs[clean.out.split()[0]], runs[dirty.out.split()[0]]
    assert clean_run["code_commit"] == dirty_run["code_commit"] == _git(repo, "rev-parse", "HEAD").strip()
    assert clean_run["code_branch"] == "main"
    assert clean_run["code_dirty_sha256"] is None and len(dirty_run["code_dirty_sha256"]) == 64
    diff = cli("sql", f"select size from blobs where sha256 = '{dirty_run['code_dirty_sha256']}'", "--json").json()
    assert diff and diff[0]["size"] > 0


def test_repo_and_branch_clone_into_the_workspace_and_run_there(cli, tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    (origin / "train.py").write_text("print('on main')\n")
    _git(origin, "add", ".")
    _git(origin, "commit", "-q", "-m", "main")
    _git(origin, "checkout", "-q", "-b", "exp")
    (origin / "train.py").write_text("print('on exp')\n")
    _git(origin, "commit", "-q", "-am", "exp")
    exp_commit = _git(origin, "rev-parse", "HEAD").strip()
    result = cli("submit", "--repo", str(origin), "--branch", "exp", "--", PY, "train.py")
    assert result.code == 0, result.err
    run_id = result.out.split()[0]
    (run,) = cli("runs", "--json").json()
    assert run["code_commit"] == exp_commit and run["code_branch"] == "exp"
    assert run["workdir"].endswith(f"{run_id}/workspace")
    assert "out on exp" in cli("logs", run_id).out


SLOW_TO_STOP = ("import signal, sys, time\n"
                "def stop(*_):\n"
                "    time.sleep(3)  # a final save on the notice\n"
                "    sys.exit(143)\n"
                "signal.signal(signal.SIGTERM, stop)\n"
                "print('ready', flush=True)\n"
                "time.sleep(120)\n")


def test_resume_right_after_cancel_waits_for_the_cancel_to_finish(cli_sqlite, tmp_path):
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    assert cli_sqlite("submit", "--detach", "--name", "slow", "--", PY, str(script)).code == 0
    (attempt,) = cli_sqlite("attempts", "slow", "--json").json()
    log = Path(attempt["log_path"])
    wait_for(lambda: log.exists() and "ready" in log.read_text(), "the script to start", timeout=30, interval=0.1)
    assert cli_sqlite("cancel", "slow").code == 0
    resumed = cli_sqlite("resume", "slow", "--detach")
    # Not "is running": the cancel was finishing, resume waited for it, then went on.
    assert resumed.code == 0, resumed.err
    assert "slow/1 ended (cancelled); resuming" in resumed.err.replace(attempt["run_id"], "slow")
    first, second = cli_sqlite("attempts", "slow", "--json").json()
    assert first["termination_reason"] == "user_cancelled" and second["attempt_number"] == 2
    assert cli_sqlite("cancel", "slow").code == 0
