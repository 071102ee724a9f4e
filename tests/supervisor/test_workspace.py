"""An attempt's own workspace: the recorded commit and diff rebuilt, what git ignores linked, built once per version."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from trackway.receipts.code import capture_code
from trackway.supervisor.workspace import prepare_workspace


def git(work: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(work), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "repo"
    (work / "src").mkdir(parents=True)
    git(work, "init", "-q")
    (work / "src" / "train.py").write_text("VERSION = 1\n")
    (work / "README.md").write_text("committed\n")
    (work / ".gitignore").write_text("/data/\n/.trackway/\n*.log\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "first")
    (work / "data").mkdir()
    (work / "data" / "train.csv").write_text("a,b\n")
    (work / "run.log").write_text("ignored file\n")
    return work


def test_the_submitted_diff_is_rebuilt_and_later_edits_stay_out(work: Path, tmp_path: Path) -> None:
    (work / "src" / "train.py").write_text("VERSION = 2  # uncommitted at submit\n")
    (work / "src" / "helper.py").write_text("HELP = True\n")  # untracked at submit: part of the diff
    code = capture_code(work / "src", home=work / ".trackway")
    (work / "src" / "train.py").write_text("VERSION = 3  # half-made edit after the submit\n")
    (work / "src" / "helper.py").unlink()
    space = prepare_workspace(tmp_path / "runs", "r1", work / "src", code.commit, code.dirty_diff,
                              home=work / ".trackway")
    assert space is not None and space.cwd == space.tree / "src"
    assert (space.cwd / "train.py").read_text() == "VERSION = 2  # uncommitted at submit\n"
    assert (space.cwd / "helper.py").read_text() == "HELP = True\n"
    assert (space.tree / "README.md").read_text() == "committed\n"
    # What git ignores is reached through links, at the same relative paths; trackway's home is not linked.
    assert (space.tree / "data").is_symlink() and (space.tree / "data" / "train.csv").read_text() == "a,b\n"
    assert (space.tree / "run.log").is_symlink()
    assert not os.path.lexists(space.tree / ".trackway")
    assert space.as_record()["linked_ignored"] == 2
    # The work tree itself is untouched.
    assert (work / "src" / "train.py").read_text().startswith("VERSION = 3")


def test_the_same_version_is_built_once_and_new_ignored_paths_are_linked_at_the_next_launch(work, tmp_path) -> None:
    code = capture_code(work, home=work / ".trackway")
    first = prepare_workspace(tmp_path / "runs", "r1", work, code.commit, code.dirty_diff)
    (first.tree / "written-by-attempt-1.txt").write_text("kept for the next attempt\n")
    (work / "outputs.log").write_text("new ignored file\n")
    again = prepare_workspace(tmp_path / "runs", "r1", work, code.commit, code.dirty_diff)
    assert again.tree == first.tree
    assert (again.tree / "written-by-attempt-1.txt").exists()
    assert (again.tree / "outputs.log").is_symlink()
    assert json.loads((again.tree.parent / "workspace.json").read_text())["commit"] == code.commit


def test_a_large_file_changed_since_the_submit_is_linked_as_it_is_now_and_said(work, tmp_path) -> None:
    big = work / "weights.bin"
    big.write_bytes(os.urandom(2 << 20))  # untracked, 2 MiB: the receipt lists it by hash
    code = capture_code(work, home=work / ".trackway")
    big.write_bytes(os.urandom(2 << 20))
    space = prepare_workspace(tmp_path / "runs", "r1", work, code.commit, code.dirty_diff)
    assert space.changed_since == ["weights.bin"]
    assert (space.tree / "weights.bin").is_symlink()


def test_nothing_to_rebuild_from_is_none(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert prepare_workspace(tmp_path / "runs", "r1", plain, "a" * 40, None) is None
    assert prepare_workspace(tmp_path / "runs", "r1", plain, None, None) is None


def test_a_working_directory_inside_trackways_home_is_linked_alone(work: Path, tmp_path: Path) -> None:
    # `make demo` runs its Slurm step from .trackway/demo/slurm: ignored, inside the home that is not linked.
    where = work / ".trackway" / "demo" / "slurm"
    where.mkdir(parents=True)
    (where / "trackway.toml").write_text("[resources.cluster]\n")
    code = capture_code(where, home=work / ".trackway")
    space = prepare_workspace(work / ".trackway" / "runs", "r1", where, code.commit, code.dirty_diff,
                              home=work / ".trackway")
    assert space is not None and space.cwd == space.tree / ".trackway" / "demo" / "slurm"
    # The retry starts where the run ran (it was: "No such file or directory" for the rebuilt cwd), and the
    # home itself is still not linked into its own workspace.
    assert space.cwd.is_symlink() and (space.cwd / "trackway.toml").read_text() == "[resources.cluster]\n"
    assert not (space.tree / ".trackway").is_symlink()
