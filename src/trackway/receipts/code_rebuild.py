"""The code a receipt names, rebuilt as a directory: the recorded commit (`git archive`), then the recorded diff.

The diff is applied with `git apply`. Large and binary changes, which a receipt lists by path,
size and sha256 instead of holding (receipts/code.py), are copied from the work tree where they
still match; those that no longer do are returned, so whoever rebuilt the tree can say so.
Both the SSH executor's snapshot and a local attempt's own workspace are built here.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from trackway.errors import ExecutorError
from trackway.receipts.code import omitted_files


def code_key(commit: str, dirty_diff: bytes | None) -> str:
    """A short name for one version of the code: the same commit and diff always give the same key."""
    return hashlib.sha256(commit.encode() + b"\0" + (dirty_diff or b"")).hexdigest()[:24]


def rebuild_tree(root: Path, commit: str, dirty_diff: bytes | None, dest: Path) -> list[str]:
    """Write `commit` of the repository at `root`, with `dirty_diff` applied, into `dest` (empty or absent).

    Returns the paths of large or binary changes the diff lists by hash that the work tree no
    longer holds as recorded: they are left as the commit has them (absent if it has none).
    """
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise ExecutorError(f"git archive {commit[:12]} failed: {archive.stderr.decode(errors='replace').strip()[:200]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="tar")
    if not dirty_diff:
        return []
    if not _patch_body(dirty_diff):
        # Only large or binary changes, listed by hash: there is no patch for `git apply` (it would refuse).
        return _copy_omitted(root, dest, dirty_diff)
    with tempfile.TemporaryDirectory(prefix="trackway-patch-") as tmp:
        patch = Path(tmp) / "dirty.patch"
        patch.write_bytes(dirty_diff)
        # Outside a repository `git apply` is a plain patch tool: GIT_DIR points nowhere on purpose.
        applied = subprocess.run(["git", "apply", "--binary", "--whitespace=nowarn", str(patch)], cwd=dest,
                                 capture_output=True, check=False,
                                 env={**os.environ, "GIT_DIR": str(Path(tmp) / "no-git")})
    if applied.returncode != 0:
        raise ExecutorError("the recorded diff does not apply to commit "
                            f"{commit[:12]}: {applied.stderr.decode(errors='replace').strip()[:200]}")
    return _copy_omitted(root, dest, dirty_diff)


def _patch_body(dirty_diff: bytes) -> bytes:
    """The diff without the header receipts/code.py puts ahead of it (`# ...` lines listing omitted files)."""
    lines = dirty_diff.split(b"\n")
    start = next((i for i, line in enumerate(lines) if not line.startswith(b"# ")), len(lines))
    return b"\n".join(lines[start:]).strip()


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
            if source.stat().st_size == entry.get("size") and file_sha256(source) == entry.get("sha256"):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                continue
        except OSError:
            pass
        missing.append(rel)
    return missing


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_top(path: Path) -> Path | None:
    """The top of the git work tree holding `path`, or None outside one."""
    found = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                           check=False)
    return Path(found.stdout.strip()).resolve() if found.returncode == 0 and found.stdout.strip() else None


def has_commit(root: Path, commit: str) -> bool:
    return subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True, check=False).returncode == 0
