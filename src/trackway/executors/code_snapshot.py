"""The code an attempt runs on another machine: the attempt's recorded commit plus its recorded diff, as one tar.

A retry must run the code the run was submitted with, not whatever the work tree holds an hour
later, so the snapshot is rebuilt from the receipt (receipts/code_rebuild.py): `git archive` of
the recorded commit, then the recorded dirty diff applied with `git apply` (large and binary
changes, which the receipt lists by path, size and sha256 instead of holding, are copied from the
work tree when they still match, and otherwise named as missing). Its key hashes the commit and
the diff, so a host that already holds the snapshot is not sent it again.

A work tree without git (or whose commit is gone) is sent as it is now, without `.git`,
trackway's home, virtual environments and caches, up to MAX_PLAIN_BYTES; such a snapshot is
keyed by its content and `explain` says it was not the recorded commit.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trackway.errors import InputError
from trackway.receipts.code_rebuild import code_key, file_sha256, git_top, has_commit, rebuild_tree

MAX_PLAIN_BYTES = 512 << 20
SKIPPED_DIRS = {".git", ".trackway", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache"}


@dataclass(frozen=True)
class CodeSnapshot:
    """A gzip tar of the code, the key naming it, and where in it the command's working directory is."""

    key: str
    tar_gz: bytes
    cwd: str  # relative to the snapshot's top ("." for the top)
    source: str  # one line for the receipt: "commit abc123 + recorded diff" or "work tree as it was at launch"
    missing: list[str] = field(default_factory=list)


def build_snapshot(workdir: Path, commit: str | None, dirty_diff: bytes | None) -> CodeSnapshot:
    """The snapshot of a run whose command runs in `workdir`, from its recorded commit and diff."""
    workdir = Path(workdir).resolve()
    if not workdir.is_dir():
        raise InputError(f"workdir {workdir}: not a directory, so there is no code to send to the host")
    root = git_top(workdir) if commit else None
    if root is not None and has_commit(root, commit):
        return _from_commit(root, workdir, commit, dirty_diff)
    return _from_work_tree(workdir)


def _from_commit(root: Path, workdir: Path, commit: str, dirty_diff: bytes | None) -> CodeSnapshot:
    with tempfile.TemporaryDirectory(prefix="trackway-code-") as tmp:
        tree = Path(tmp) / "tree"
        missing = rebuild_tree(root, commit, dirty_diff, tree)
        cwd = workdir.relative_to(root).as_posix() if workdir != root else "."
        source = f"commit {commit[:12]}" + (" + the recorded diff" if dirty_diff else "")
        return CodeSnapshot(key=code_key(commit, dirty_diff), tar_gz=_tar(tree), cwd=cwd, source=source,
                            missing=missing)


def _from_work_tree(workdir: Path) -> CodeSnapshot:
    total = 0
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for top, dirs, files in os.walk(workdir):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for name in sorted(files):
                path = Path(top) / name
                if not path.is_file() or path.is_symlink():
                    continue
                total += path.stat().st_size
                if total > MAX_PLAIN_BYTES:
                    raise InputError(
                        f"workdir {workdir}: more than {MAX_PLAIN_BYTES >> 20} MiB outside git; commit the code "
                        "(trackway sends the recorded commit) or move data and checkpoints out of the work tree")
                rel = path.relative_to(workdir).as_posix()
                digest.update(rel.encode() + b"\0" + file_sha256(path).encode())
                tar.add(path, arcname=rel, recursive=False)
    return CodeSnapshot(key="tree-" + digest.hexdigest()[:19], tar_gz=buffer.getvalue(), cwd=".",
                        source="the work tree as it was at launch (no recorded git commit to rebuild it from)")


def _tar(tree: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for entry in sorted(tree.iterdir()):
            tar.add(entry, arcname=entry.name)
    return buffer.getvalue()


def describe(snapshot: CodeSnapshot) -> dict:
    return {"key": snapshot.key, "source": snapshot.source, "cwd": snapshot.cwd, "missing": snapshot.missing,
            "bytes": len(snapshot.tar_gz)}

