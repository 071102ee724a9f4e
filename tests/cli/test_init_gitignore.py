"""Inside a git repository, trackway's home (ledger, checkpoints) stays out of git and out of receipts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from trackway.ledger.blobs import get_blob
from trackway.ledger.open import open_ledger

TRAIN = """\
import trackway
run = trackway.init(config={"lr": 0.1})
for step in (1, 2):
    run.log({"loss": 1.0 / step}, step=step)
    with run.checkpoints.writing(step) as d:
        (d / "weights.bin").write_bytes(bytes(range(256)) * 4096 * step)
run.finish()
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository as the working directory, trackway's home at its default ./.trackway."""
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "Test Author")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "test@example.com")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("TRACKWAY_HOME", raising=False)
    monkeypatch.delenv("TRACKWAY_DB", raising=False)
    monkeypatch.setenv("TRACKWAY_BACKGROUND_SUPERVISOR", "0")
    path = tmp_path / "proj"
    path.mkdir()
    subprocess.run(["git", "init", "--quiet", "--initial-branch=main", str(path)], check=True)
    (path / "train.py").write_text(TRAIN)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "--quiet", "-m", "first"], check=True)
    monkeypatch.chdir(path)
    return path


def trackway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trackway", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ), cwd=os.getcwd())


def recorded_diffs(repo: Path) -> list[bytes | None]:
    ledger = open_ledger(f"sqlite:///{repo / '.trackway' / 'ledger.db'}")
    try:
        with ledger.engine.connect() as conn:
            shas = [row[0] for row in conn.execute(text("select code_dirty_sha256 from runs order by created_at"))]
            return [None if sha is None else get_blob(conn, sha) for sha in shas]
    finally:
        ledger.dispose()


def test_three_submits_with_the_home_in_the_work_tree_all_work_and_record_no_trackway_file(repo: Path) -> None:
    (repo / "train.py").write_text(TRAIN + "# an uncommitted edit\n")
    for _ in range(3):
        done = trackway("submit", "--", sys.executable, "train.py")
        assert done.returncode == 0, done.stderr
        assert "ended: completed" in done.stderr
    diffs = recorded_diffs(repo)
    assert len(diffs) == 3
    for diff in diffs:
        assert diff is not None and b"an uncommitted edit" in diff
        assert b".trackway" not in diff and b"ledger.db" not in diff
    assert len(set(diffs)) == 1  # the user's code did not change between the submits


def test_init_adds_the_home_to_gitignore_once(repo: Path) -> None:
    first = trackway("init")
    assert first.returncode == 0, first.stderr
    assert "added /.trackway/ to" in first.stdout
    assert (repo / ".gitignore").read_text().count("/.trackway/") == 1
    second = trackway("init")
    assert second.returncode == 0, second.stderr
    assert "already in git's ignore rules" in second.stdout
    assert (repo / ".gitignore").read_text().count("/.trackway/") == 1
    status = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert ".trackway" not in status
    # The trackway.toml init wrote is trackway's: a submit records no diff for it (nor the .gitignore line? no:
    # .gitignore is the user's file and its new line is a real change to their tree).
    done = trackway("submit", "--", sys.executable, "train.py")
    assert done.returncode == 0, done.stderr
    (diff,) = recorded_diffs(repo)
    assert diff is not None and b"trackway.toml" not in diff and b".gitignore" in diff


def test_init_outside_a_git_repository_says_nothing_about_git(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TRACKWAY_HOME", raising=False)
    monkeypatch.delenv("TRACKWAY_DB", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    done = trackway("init")
    assert done.returncode == 0, done.stderr
    assert "ignore" not in done.stdout and not (tmp_path / ".gitignore").exists()
