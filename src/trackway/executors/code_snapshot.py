"""The code an attempt runs on another machine: the run's recorded commit plus its recorded diff, as one tar.

A retry must run the code the run was submitted with, not whatever the work tree holds an hour
later, so the snapshot is rebuilt from the receipt: `git archive` of the recorded commit, then
the recorded dirty diff applied with `git apply` (large and binary changes, which the receipt
lists by path, size and sha256 instead of holding, are copied from the work tree when they still
match, and otherwise named as missing). Its key hashes the commit and the diff, so a host that
already holds the snapshot is not sent it again.

A work tree without git (or whose commit is gone) is sent as it is now, without `.git`,
trackway's home, virtual environments and caches, up to MAX_PLAIN_BYTES; such a snapshot is
keyed by its content and `explain` says it was not the recorded commit.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trackway.errors import ExecutorError, InputError
from trackway.receipts.code import omitted_files

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
    root = _git_top(workdir) if commit else None
    if root is not None and _has_commit(root, commit):
        return _from_commit(root, workdir, commit, dirty_diff)
    return _from_work_tree(workdir)


def _from_commit(root: Path, workdir: Path, commit: str, dirty_diff: bytes | None) -> CodeSnapshot:
    key = hashlib.sha256(commit.encode() + b"\0" + (dirty_diff or b"")).hexdigest()[:24]
    with tempfile.TemporaryDirectory(prefix="trackway-code-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise ExecutorError(f"git archive {commit[:12]} failed: {archive.stderr.decode(errors='replace').strip()[:200]}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="tar")
        missing: list[str] = []
        if dirty_diff:
            patch = Path(tmp) / "dirty.patch"
            patch.write_bytes(dirty_diff)
            # Outside a repository `git apply` is a plain patch tool; --unidiff-zero is not needed: the diff is git's own.
            applied = subprocess.run(["git", "apply", "--binary", "--whitespace=nowarn", str(patch)], cwd=tree,
                                     capture_output=True, check=False,
                                     env={**os.environ, "GIT_DIR": str(Path(tmp) / "no-git")})
            if applied.returncode != 0:
                raise ExecutorError("the run's recorded diff does not apply to commit "
                                    f"{commit[:12]}: {applied.stderr.decode(errors='replace').strip()[:200]}")
            missing = _copy_omitted(root, tree, dirty_diff)
        cwd = workdir.relative_to(root).as_posix() if workdir != root else "."
        source = f"commit {commit[:12]}" + (" + the recorded diff" if dirty_diff else "")
        return CodeSnapshot(key=key, tar_gz=_tar(tree), cwd=cwd, source=source, missing=missing)


def _copy_omitted(root: Path, tree: Path, dirty_diff: bytes) -> list[str]:
    """Large or binary changes the receipt lists by hash: copied from the work tree if they still match."""
    missing = []
    for entry in omitted_files(dirty_diff):
        rel = str(entry.get("path"))
        target = tree / rel
        if entry.get("sha256") is None:  # deleted in the recorded work tree
            target.unlink(missing_ok=True)
            continue
        source = root / rel
        try:
            if source.stat().st_size == entry.get("size") and _sha256(source) == entry.get("sha256"):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                continue
        except OSError:
            pass
        missing.append(rel)
    return missing


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
                digest.update(rel.encode() + b"\0" + _sha256(path).encode())
                tar.add(path, arcname=rel, recursive=False)
    return CodeSnapshot(key="tree-" + digest.hexdigest()[:19], tar_gz=buffer.getvalue(), cwd=".",
                        source="the work tree as it was at launch (no recorded git commit to rebuild it from)")


def _tar(tree: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for entry in sorted(tree.iterdir()):
            tar.add(entry, arcname=entry.name)
    return buffer.getvalue()


def _git_top(path: Path) -> Path | None:
    found = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                           check=False)
    return Path(found.stdout.strip()).resolve() if found.returncode == 0 and found.stdout.strip() else None


def _has_commit(root: Path, commit: str) -> bool:
    return subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True, check=False).returncode == 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe(snapshot: CodeSnapshot) -> dict:
    return {"key": snapshot.key, "source": snapshot.source, "cwd": snapshot.cwd, "missing": snapshot.missing,
            "bytes": len(snapshot.tar_gz)}

