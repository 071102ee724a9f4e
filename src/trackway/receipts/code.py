"""The code reference: git repo, commit, branch and the uncommitted diff, read without touching the user's index."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from trackway.errors import InputError, TrackwayError
from trackway.receipts.canonical import sha256_hex

# Pinned so that the user's git config (external diff tools, textconv, prefixes, colour,
# rename detection, diff algorithm) cannot change the bytes, and so the hash, of a diff.
_DIFF_ARGS = (
    "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
    "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/",
)


@dataclass(frozen=True)
class CodeRef:
    """Where the code came from; every field is None outside a git work tree."""

    root: Path | None
    repo: str | None
    commit: str | None
    branch: str | None
    dirty_diff: bytes | None
    dirty_sha256: str | None


NO_CODE = CodeRef(root=None, repo=None, commit=None, branch=None, dirty_diff=None, dirty_sha256=None)


def capture_code(cwd: Path) -> CodeRef:
    """Read the git state of the work tree containing `cwd`.

    `repo` is remote.origin.url (without any credentials in it), else the work tree's path.
    `commit` is None before the first commit; `branch` is None on a detached HEAD. The dirty
    diff is every change against HEAD, untracked files included and ignored files not, built
    in a temporary index so the user's staging area is never read-modified-written. (Untracked
    files do get written to the object store as loose blobs, which `git gc` later prunes.)
    """
    top = _git(Path(cwd), "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return NO_CODE
    root = Path(top.stdout.decode().strip())
    commit = _out(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    diff = _dirty_diff(root, has_head=commit is not None)
    return CodeRef(
        root=root,
        repo=_without_credentials(_out(root, "config", "--get", "remote.origin.url")) or str(root),
        commit=commit,
        branch=_out(root, "symbolic-ref", "--quiet", "--short", "HEAD"),
        dirty_diff=diff or None,
        dirty_sha256=sha256_hex(diff) if diff else None,
    )


def clone_branch(url: str, branch: str, dest: Path) -> CodeRef:
    """Clone only `branch` of `url` into `dest` (absent or empty) and return its code reference."""
    result = subprocess.run(
        ["git", "clone", "--quiet", f"--branch={branch}", "--single-branch", "--", url, str(dest)],
        capture_output=True,
        check=False,
        env=_git_env(GIT_TERMINAL_PROMPT="0"),  # fail rather than wait for a password nobody will type
    )
    if result.returncode != 0:
        flag = f"--repo {_without_credentials(url)} --branch {branch}"
        raise InputError(f"{flag}: git clone failed: {_first_error(result.stderr)}")
    return capture_code(Path(dest))


def _dirty_diff(root: Path, has_head: bool) -> bytes:
    real_index = _out(root, "rev-parse", "--path-format=absolute", "--git-path", "index")
    with tempfile.TemporaryDirectory(prefix="trackway-index-") as tmp:
        index = Path(tmp) / "index"
        env = {"GIT_INDEX_FILE": str(index)}
        if real_index and Path(real_index).is_file():
            # A copy keeps git's stat cache (so `add` rehashes only what changed) and sparse-checkout bits.
            # copy2 keeps the index's mtime too: git rehashes a file edited in the same second as the
            # index was written ("racy git") only by comparing with it; a fresh mtime hid such an edit.
            shutil.copy2(real_index, index)
        if has_head and _git(root, "read-tree", "-m", "HEAD", env=env).returncode != 0:
            _git(root, "read-tree", "HEAD", env=env)  # -m refuses an index with merge conflicts
        _checked(root, _git(root, "add", "--all", "--", ".", env=env))
        # With no HEAD yet, `diff --cached` compares against the empty tree.
        return _checked(root, _git(root, *_DIFF_ARGS, *(["HEAD"] if has_head else []), env=env)).stdout


def _checked(root: Path, result: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[bytes]:
    # Reporting a clean tree when git could not tell would be a false receipt; fail loudly instead.
    if result.returncode != 0:
        command = "git " + " ".join(result.args[3:5])
        raise TrackwayError(f"{command} failed in {root}, so the dirty diff is unknown: {_first_error(result.stderr)}")
    return result


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    command = ["git", "-C", str(cwd), *args]
    return subprocess.run(command, capture_output=True, check=False, env=_git_env(**(env or {})))


def _out(cwd: Path, *args: str) -> str | None:
    result = _git(cwd, *args)
    text = result.stdout.decode("utf-8", "replace").strip()
    return text if result.returncode == 0 and text else None


def _git_env(**extra: str) -> dict[str, str]:
    # GIT_OPTIONAL_LOCKS=0 stops read-only commands from refreshing (so locking) the user's index.
    return {**os.environ, "GIT_OPTIONAL_LOCKS": "0", **extra}


def _without_credentials(url: str | None) -> str | None:
    """Drop user:token@ from http(s) URLs: a receipt is read by many people and lasts forever."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _first_error(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("fatal:", "error:")):
            return line
    return lines[0] if lines else "no message from git"
