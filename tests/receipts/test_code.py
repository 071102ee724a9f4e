"""Code references from real git repos: commit, branch, dirty diff, an untouched index, and branch clones."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from trackway.errors import InputError
from trackway.receipts.code import capture_code, clone_branch, omitted_files


@pytest.fixture(autouse=True)
def git_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits need an author; the developer's own git config must not leak into the tests."""
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "Test Author")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "test@example.com")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "--quiet", "--initial-branch=main")
    (path / "train.py").write_text("print('step')\n")
    (path / ".gitignore").write_text("outputs/\n")
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "first")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


def test_outside_git_everything_is_none(tmp_path: Path) -> None:
    ref = capture_code(tmp_path)
    assert (ref.root, ref.repo, ref.commit, ref.branch, ref.dirty_diff, ref.dirty_sha256) == (None,) * 6


def test_clean_repo_has_commit_branch_and_no_dirty_hash(repo: Path) -> None:
    (repo / "src").mkdir()
    ref = capture_code(repo / "src")
    assert ref.root == repo.resolve()
    assert ref.commit == git(repo, "rev-parse", "HEAD")
    assert ref.branch == "main"
    assert ref.repo == str(repo.resolve())
    assert ref.dirty_diff is None and ref.dirty_sha256 is None


def test_ignored_files_do_not_make_the_tree_dirty(repo: Path) -> None:
    (repo / "outputs").mkdir()
    (repo / "outputs" / "ckpt.pt").write_bytes(b"\x00" * 10)
    assert capture_code(repo).dirty_sha256 is None


def test_repo_is_the_origin_url_without_credentials(repo: Path) -> None:
    git(repo, "remote", "add", "origin", "https://user:s3cret@example.com/team/model.git")
    assert capture_code(repo).repo == "https://example.com/team/model.git"
    git(repo, "remote", "set-url", "origin", "git@example.com:team/model.git")
    assert capture_code(repo).repo == "git@example.com:team/model.git"


def test_modified_and_untracked_files_give_different_dirty_hashes(repo: Path) -> None:
    (repo / "train.py").write_text("print('step 2')\n")
    modified = capture_code(repo)
    assert modified.dirty_diff is not None and b"step 2" in modified.dirty_diff
    assert modified.dirty_sha256 == hashlib.sha256(modified.dirty_diff).hexdigest()

    (repo / "notes.md").write_text("new idea\n")
    with_untracked = capture_code(repo)
    assert b"notes.md" in with_untracked.dirty_diff
    assert with_untracked.dirty_sha256 != modified.dirty_sha256
    assert capture_code(repo).dirty_sha256 == with_untracked.dirty_sha256  # deterministic


def test_a_new_untracked_file_alone_is_dirty(repo: Path) -> None:
    (repo / "notes.md").write_text("new idea\n")
    assert capture_code(repo).dirty_sha256 is not None


def test_deleted_file_and_binary_change_are_in_the_diff(repo: Path) -> None:
    (repo / "train.py").unlink()
    (repo / "weights.bin").write_bytes(bytes(range(256)))
    diff = capture_code(repo).dirty_diff
    assert b"deleted file mode" in diff
    # A binary file is recorded by name, size and sha256, not stored inside the diff.
    assert b"GIT binary patch" not in diff
    assert omitted_files(diff) == [{"path": "weights.bin", "status": "added", "size": 256,
                                    "sha256": hashlib.sha256(bytes(range(256))).hexdigest()}]


def test_the_users_index_is_never_touched(repo: Path) -> None:
    (repo / "staged.py").write_text("x = 1\n")
    git(repo, "add", "staged.py")
    (repo / "train.py").write_text("print('unstaged')\n")
    (repo / "untracked.py").write_text("y = 2\n")
    index = repo / ".git" / "index"
    staged_before, index_before = git(repo, "diff", "--cached", "--name-only"), index.read_bytes()

    ref = capture_code(repo)

    assert index.read_bytes() == index_before
    assert git(repo, "diff", "--cached", "--name-only") == staged_before == "staged.py"
    for name in (b"staged.py", b"train.py", b"untracked.py"):
        assert name in ref.dirty_diff


def test_staging_does_not_change_the_dirty_hash(repo: Path) -> None:
    (repo / "train.py").write_text("print('changed')\n")
    before = capture_code(repo).dirty_sha256
    git(repo, "add", "train.py")
    assert capture_code(repo).dirty_sha256 == before


def test_repo_without_commits_has_no_commit_but_a_diff(tmp_path: Path) -> None:
    path = tmp_path / "fresh"
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch=main")
    (path / "a.py").write_text("a = 1\n")
    ref = capture_code(path)
    assert ref.commit is None
    assert ref.branch == "main"
    assert ref.dirty_diff is not None and b"a.py" in ref.dirty_diff


def test_detached_head_has_no_branch(repo: Path) -> None:
    git(repo, "checkout", "--quiet", "--detach")
    ref = capture_code(repo)
    assert ref.branch is None and ref.commit == git(repo, "rev-parse", "HEAD")


@pytest.fixture
def bare_with_branches(tmp_path: Path, repo: Path) -> tuple[Path, dict[str, str]]:
    git(repo, "checkout", "--quiet", "-b", "experiment")
    (repo / "train.py").write_text("print('experiment')\n")
    git(repo, "commit", "--quiet", "-am", "experiment")
    commits = {"main": git(repo, "rev-parse", "main"), "experiment": git(repo, "rev-parse", "experiment")}
    bare = tmp_path / "origin.git"
    git(tmp_path, "clone", "--quiet", "--bare", str(repo), str(bare))
    return bare, commits


@pytest.mark.parametrize("branch", ["main", "experiment"])
def test_clone_branch_checks_out_that_branch(tmp_path: Path, bare_with_branches, branch: str) -> None:
    bare, commits = bare_with_branches
    dest = tmp_path / f"work-{branch}"
    ref = clone_branch(str(bare), branch, dest)
    assert ref.commit == commits[branch]
    assert ref.branch == branch
    assert ref.repo == str(bare)
    assert ref.root == dest.resolve()
    assert ref.dirty_sha256 is None
    assert git(dest, "branch", "--list", "--format=%(refname:short)") == branch  # single branch only


def test_clone_of_a_missing_branch_is_an_input_error(tmp_path: Path, bare_with_branches) -> None:
    bare, _ = bare_with_branches
    with pytest.raises(InputError) as caught:
        clone_branch(str(bare), "no-such-branch", tmp_path / "dest")
    message = str(caught.value)
    assert message.startswith(f"--repo {bare} --branch no-such-branch: git clone failed: ")
    assert "no-such-branch" in message.split("git clone failed: ")[1]
    assert "\n" not in message


def test_clone_into_a_non_empty_directory_is_an_input_error(tmp_path: Path, bare_with_branches) -> None:
    bare, _ = bare_with_branches
    dest = tmp_path / "occupied"
    dest.mkdir()
    (dest / "file").write_text("x")
    with pytest.raises(InputError, match="git clone failed: .*already exists"):
        clone_branch(str(bare), "main", dest)


def test_the_users_diff_settings_do_not_change_the_dirty_hash(repo: Path) -> None:
    (repo / "train.py").write_text("print('changed')\n")
    before = capture_code(repo).dirty_sha256
    for key, value in (("diff.noprefix", "true"), ("color.ui", "always"), ("diff.algorithm", "histogram")):
        git(repo, "config", key, value)
    assert capture_code(repo).dirty_sha256 == before
