"""An attempt's own copy of the code it was given: the run's recorded commit and diff, rebuilt under the run.

A retry the policy decides runs the code that was submitted, not whatever the work tree holds an
hour later (a half-finished edit, another branch). Its workspace is `runs/RUN/code/KEY/tree`,
KEY naming the commit and diff (receipts/code_rebuild.py), built once per run and code version
and shared by every attempt that runs that version, so files a script writes beside itself are
found again by its next attempt, as in a work tree.

What git ignores is not code: data, virtual environments, outputs and caches stay in the work
tree, and each ignored path there is a symbolic link in the workspace, so a script's relative
paths (`data/train.jsonl`, `outputs/`) reach the same files as before. Links are added at every
launch for ignored paths that appeared since. Submodules are linked too (the receipt does not
hold their content); large or binary changes the receipt lists by hash and the work tree no
longer holds as recorded are linked as they are now. `Workspace.as_record()` says all of it,
and `explain` shows it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trackway.errors import ExecutorError
from trackway.receipts.code_rebuild import code_key, git_top, has_commit, rebuild_tree

RECORD = "workspace.json"
TREE = "tree"


@dataclass(frozen=True)
class Workspace:
    """Where an attempt runs the rebuilt code, and what in it is not the recorded code."""

    key: str
    tree: Path  # the rebuilt top of the repository
    cwd: Path  # where the command runs: the work tree's working directory, inside `tree`
    commit: str
    changed_since: list[str] = field(default_factory=list)  # omitted large/binary changes taken as they are now
    submodules: list[str] = field(default_factory=list)  # linked as they are now
    linked: int = 0  # ignored paths of the work tree reached through links

    def as_record(self) -> dict:
        return {"key": self.key, "workspace": str(self.tree), "cwd": str(self.cwd), "commit": self.commit,
                "changed_since": self.changed_since, "submodules": self.submodules, "linked_ignored": self.linked}


def prepare_workspace(runs_dir: Path, run_id: str, workdir: Path, commit: str | None,
                      dirty_diff: bytes | None, home: Path | None = None) -> Workspace | None:
    """The workspace for `commit` + `dirty_diff` of the work tree holding `workdir`, built if needed.

    None when there is nothing to rebuild from: no recorded commit, the work tree is no git
    repository, or the commit is gone from it. Raises ExecutorError when the rebuild fails
    (the recorded diff does not apply): running the work tree instead would be a false receipt.
    """
    workdir = Path(workdir).resolve()
    if not commit or not workdir.is_dir():
        return None
    root = git_top(workdir)
    if root is None or not has_commit(root, commit):
        return None
    key = code_key(commit, dirty_diff)
    place = runs_dir / run_id / "code" / key
    if not (place / RECORD).is_file():
        _build(place, root, commit, dirty_diff)
    record = json.loads((place / RECORD).read_text())
    tree = place / TREE
    linked = _link_ignored(root, tree, home)
    relative = workdir.relative_to(root)
    cwd = tree / relative
    if not os.path.lexists(cwd):
        # The working directory is one git ignores inside a path that is not linked (trackway's own home,
        # as `make demo` runs from .trackway/demo/slurm): it alone is linked, or made where it holds the workspace.
        if tree.resolve().is_relative_to(workdir):
            cwd.mkdir(parents=True, exist_ok=True)
        else:
            _link(workdir, cwd)
            linked += 1
    return Workspace(key=key, tree=tree, cwd=cwd, commit=commit,
                     changed_since=record.get("changed_since", []), submodules=record.get("submodules", []),
                     linked=linked)


def _build(place: Path, root: Path, commit: str, dirty_diff: bytes | None) -> None:
    """Rebuild into a temporary directory beside `place`, then rename: a crash leaves no half-built workspace."""
    place.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=f".{place.name}-", dir=place.parent))
    try:
        tree = staging / TREE
        missing = rebuild_tree(root, commit, dirty_diff, tree)
        for rel in missing:
            _link(root / rel, tree / rel)
        submodules = _submodules(root, commit)
        for rel in submodules:
            target = tree / rel
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()  # git archive leaves a submodule as an empty directory
            _link(root / rel, target)
        (staging / RECORD).write_text(json.dumps({"commit": commit, "changed_since": missing,
                                                  "submodules": submodules}))
        try:
            staging.rename(place)
        except OSError:
            if not (place / RECORD).is_file():  # not another launcher's finished build: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _submodules(root: Path, commit: str) -> list[str]:
    listed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "-z", "--full-tree", commit],
                            capture_output=True, check=False)
    paths = []
    for entry in listed.stdout.split(b"\0"):
        meta, _, path = entry.partition(b"\t")
        if meta.startswith(b"160000 "):
            paths.append(path.decode("utf-8", "surrogateescape"))
    return paths


def _link_ignored(root: Path, tree: Path, home: Path | None) -> int:
    """Link each path git ignores in the work tree into the workspace, where nothing is yet; the count linked."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
        capture_output=True, check=False,
    )
    if listed.returncode != 0:
        raise ExecutorError(f"git ls-files in {root} failed: {listed.stderr.decode(errors='replace').strip()[:200]}")
    skipped = {p.resolve() for p in (home, tree) if p is not None}
    count = 0
    for raw in listed.stdout.split(b"\0"):
        rel = raw.decode("utf-8", "surrogateescape").rstrip("/")
        if not rel:
            continue
        source = root / rel
        # trackway's home holds the workspace itself: a link to it would loop.
        if any(source.resolve() == p or p.is_relative_to(source.resolve()) for p in skipped):
            continue
        count += 1
        _link(source, tree / rel)
    return count


def _link(source: Path, target: Path) -> None:
    """A symbolic link at `target` to `source`, unless something is there already."""
    if os.path.lexists(target):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(source, target)
    except FileExistsError:
        pass  # another launcher linked it a moment ago
