"""Code-change experiments: `experiment new --branch B` / `--commit C`, the one change being the other code.

The baseline runs the toy script as committed on main; branch `faster` doubles its learning rate in the code
(config unchanged). The experiment's runs clone exactly that branch's commit, while the work tree stays on main.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOY = (Path(__file__).resolve().parent / "scripts" / "toy_train.py").read_text()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(cli_sqlite, monkeypatch, tmp_path) -> tuple:
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "Test Author")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "test@example.com")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    work = Path.cwd()
    subprocess.run(["git", "init", "--quiet", "--initial-branch=main", str(work)], check=True)
    (work / ".gitignore").write_text("cfg.json\n")
    (work / "train.py").write_text(TOY)
    git(work, "add", "-A")
    git(work, "commit", "--quiet", "-m", "the toy")
    git(work, "checkout", "--quiet", "-b", "faster")
    (work / "train.py").write_text(TOY.replace('lr, mode = train.get("steps", 40), train.get("lr", 0.1)',
                                               'lr, mode = train.get("steps", 40), 2 * train.get("lr", 0.1)'))
    git(work, "commit", "--quiet", "-am", "double the learning rate in the code")
    faster = git(work, "rev-parse", "HEAD")
    git(work, "checkout", "--quiet", "main")
    Path("cfg.json").write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    done = cli_sqlite("submit", "--name", "base", "--config", "cfg.json", "--", sys.executable, "train.py")
    assert done.code == 0, done.err
    return cli_sqlite, work, faster


def test_a_branchs_code_is_the_one_change_and_both_runs_run_exactly_its_commit(repo):
    cli, work, faster = repo
    made = cli("experiment", "new", "--title", "lr in code", "--hypothesis", "the doubled rate ends lower",
               "--baseline", "base", "--branch", "faster", "--expect", "final.loss <= baseline.final.loss")
    assert made.code == 0, made.err
    experiment = made.out.strip()
    assert f'code: "commit {git(work, "rev-parse", "main")[:12]}" → "commit {faster[:12]} (branch faster; 1 file(s), ' \
           '+1 -1 lines)"' in " ".join(made.err.split())
    started = cli("experiment", "start", experiment)
    assert started.code == 0, started.err
    shown = cli("experiment", "show", experiment, "--json").json()
    assert (shown["status"], shown["verdict"]) == ("concluded", "supported")
    (change,) = shown["changes"]
    assert change["commit"] == faster and change["files"] == [{"path": "train.py", "added": 1, "deleted": 1}]
    runs = {r["run_id"]: r for r in cli("runs", "--json").json()}
    assert runs[shown["test_run"]["run_id"]]["code_commit"] == faster == runs[shown["full_run"]["run_id"]]["code_commit"]
    same = next(c for c in shown["test_checks"] if c["check"] == "same_code")
    assert same["passed"] is True and "cloned for each run" in same["detail"]
    # The work tree was never touched: still main, its train.py the baseline's.
    assert git(work, "rev-parse", "--abbrev-ref", "HEAD") == "main" and (work / "train.py").read_text() == TOY


def test_a_ref_that_is_not_there_or_changes_nothing_is_refused(repo):
    cli, work, _ = repo
    missing = cli("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base", "--branch", "nope")
    assert missing.code == 2 and f"--branch 'nope': expected a branch of the repository at {work}" in missing.err
    same = cli("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base", "--commit", "main")
    assert same.code == 2 and "the code the baseline ran: no change" in same.err
    both = cli("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "base", "--branch", "faster",
               "--commit", "main")
    assert both.code == 2 and "--branch/--commit: expected one of them" in both.err
    assert cli("experiments", "--json").json() == []


def test_a_baseline_naming_its_script_by_absolute_path_is_refused(repo):
    cli, work, _ = repo
    assert cli("submit", "--name", "abs", "--config", "cfg.json", "--", sys.executable, str(work / "train.py")).code == 0
    refused = cli("experiment", "new", "--title", "t", "--hypothesis", "h", "--baseline", "abs", "--branch", "faster")
    assert refused.code == 2 and f"names {work / 'train.py'}, inside the work tree, by its absolute path" in refused.err
