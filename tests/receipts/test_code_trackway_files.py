"""Code capture leaves out trackway's own files and records large or binary changes by name only."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from trackway.receipts.code import LARGE_FILE_BYTES, capture_code, omitted_files
from trackway.settings import DEFAULT_TRACKWAY_TOML


@pytest.fixture(autouse=True)
def git_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "Test Author")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "test@example.com")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("TRACKWAY_HOME", raising=False)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch=main")
    (path / "train.py").write_text("print('step')\n")
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "first")
    return path


def test_the_default_home_and_a_generated_toml_are_not_in_the_diff(repo: Path) -> None:
    (repo / ".trackway" / "runs").mkdir(parents=True)
    (repo / ".trackway" / "ledger.db").write_bytes(b"SQLite format 3\0" + b"x" * 5000)
    (repo / ".trackway" / "runs" / "notes.txt").write_text("checkpoint\n")
    (repo / "trackway.toml").write_text(DEFAULT_TRACKWAY_TOML)
    assert capture_code(repo).dirty_diff is None  # nothing of the user's changed
    (repo / "train.py").write_text("print('edited')\n")
    diff = capture_code(repo).dirty_diff
    assert b"train.py" in diff and b".trackway" not in diff and b"trackway.toml" not in diff


def test_an_edited_trackway_toml_is_the_users_and_stays_in_the_diff(repo: Path) -> None:
    (repo / "trackway.toml").write_text(DEFAULT_TRACKWAY_TOML + "\n[evals]\nmax_running = 4\n")
    assert b"trackway.toml" in capture_code(repo).dirty_diff


def test_a_home_given_explicitly_or_by_environment_is_left_out(repo: Path, monkeypatch) -> None:
    (repo / "state").mkdir()
    (repo / "state" / "ledger.db").write_bytes(b"ledger")
    assert b"state/ledger.db" in capture_code(repo).dirty_diff
    assert capture_code(repo, home=repo / "state").dirty_diff is None
    monkeypatch.setenv("TRACKWAY_HOME", str(repo / "state"))
    assert capture_code(repo).dirty_diff is None


def test_large_files_are_listed_by_name_size_and_sha256(repo: Path) -> None:
    big = b"a line of text\n" * (LARGE_FILE_BYTES // 15 + 10)
    (repo / "big.txt").write_bytes(big)
    (repo / "train.py").write_text("print('edited')\n")
    ref = capture_code(repo)
    assert len(ref.dirty_diff) < 10_000
    assert omitted_files(ref.dirty_diff) == [
        {"path": "big.txt", "status": "added", "size": len(big), "sha256": hashlib.sha256(big).hexdigest()}]
    assert b"print('edited')" in ref.dirty_diff
    # The recorded diff still applies: git skips the header lines.
    patch = repo.parent / "p.diff"
    patch.write_bytes(ref.dirty_diff)
    git(repo, "checkout", "--quiet", "--", "train.py")
    git(repo, "apply", str(patch))
    assert (repo / "train.py").read_text() == "print('edited')\n"
    # A different large file gives a different recorded dirty state.
    (repo / "big.txt").write_bytes(big + b"more\n")
    assert capture_code(repo).dirty_sha256 != ref.dirty_sha256
