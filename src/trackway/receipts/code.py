"""The code reference: git repo, commit, branch and the uncommitted diff, read without touching the user's index."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from trackway.errors import InputError, TrackwayError
from trackway.receipts.canonical import sha256_hex
from trackway.settings import CONFIG_FILE_NAME, DEFAULT_TRACKWAY_TOML

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

# A changed file at least this large, or binary by git's own detection, is recorded in the diff's
# header by path, size and sha256 instead of inside the diff (a checkpoint or dataset someone left
# in the work tree must not become a multi-gigabyte blob in every receipt).
LARGE_FILE_BYTES = 1024 * 1024
OMITTED_PREFIX = b"# trackway-omitted "
_HEADER = (
    b"# trackway: changes to large or binary files are listed here by path, size and sha256\n"
    b"# (size and sha256 are null for a deleted file); they are not part of the patch below.\n"
)


def default_home(cwd: Path | None = None) -> Path:
    """trackway's home as trackway/settings derives it without a --home: $TRACKWAY_HOME, else ./.trackway."""
    home = os.environ.get("TRACKWAY_HOME")
    return Path(home).expanduser().resolve() if home else (Path(cwd or Path.cwd()) / ".trackway").resolve()


def omitted_files(diff: bytes | None) -> list[dict[str, object]]:
    """The large or binary changes a recorded diff lists by name instead of holding (see LARGE_FILE_BYTES)."""
    if not diff:
        return []
    return [json.loads(line[len(OMITTED_PREFIX):]) for line in diff.split(b"\n") if line.startswith(OMITTED_PREFIX)]


def capture_code(cwd: Path, home: Path | None = None) -> CodeRef:
    """Read the git state of the work tree containing `cwd`.

    `repo` is remote.origin.url (without any credentials in it), else the work tree's path.
    `commit` is None before the first commit; `branch` is None on a detached HEAD. The dirty
    diff is every change against HEAD, untracked files included and ignored files not, built
    in a temporary index so the user's staging area is never read-modified-written. (Untracked
    files do get written to the object store as loose blobs, which `git gc` later prunes.)

    trackway's own files are never part of the diff: its home (`home`, default $TRACKWAY_HOME or
    `.trackway` beside `cwd`, holding the SQLite ledger and checkpoints, which change while git
    would read them) when it lies inside the work tree, and a trackway.toml byte-identical to the
    one `trackway init` writes. Changed files of LARGE_FILE_BYTES or more, or binary ones, are
    listed by path, size and sha256 in a `# trackway-omitted {json}` header line each, ahead of
    the patch (`git apply` skips such lines); `dirty_sha256` hashes exactly these recorded bytes.
    """
    # One call for the work tree, the index and HEAD (commit and branch); it fails before the first commit.
    found = _git(Path(cwd), "rev-parse", "--show-toplevel", "--path-format=absolute", "--git-path", "index",
                 "HEAD", "--symbolic-full-name", "HEAD")
    lines = found.stdout.decode("utf-8", "surrogateescape").splitlines()
    if not lines:
        return NO_CODE
    root = Path(lines[0])
    if found.returncode != 0 or len(lines) != 4:
        commit = _out(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        branch = _out(root, "symbolic-ref", "--quiet", "--short", "HEAD")
        index = _out(root, "rev-parse", "--path-format=absolute", "--git-path", "index")
    else:
        commit, index = lines[2], lines[1]
        branch = lines[3].removeprefix("refs/heads/") if lines[3] != "HEAD" else None
    excluded = _trackway_paths(root, Path(cwd), home)
    # Then, at once: whether anything changed (a clean tree needs no diff at all), and the remote.
    status, remote = _git_at_once(
        root,
        ["status", "--porcelain", "-z", "--untracked-files=all", "--ignore-submodules=none", "--",
         *_pathspec(excluded)],
        ["config", "--get", "remote.origin.url"],
    )
    if status.returncode == 0 and not status.stdout:
        diff = b""
    else:
        diff = _dirty_diff(root, has_head=commit is not None, excluded=excluded, real_index=index)
    url = remote.stdout.decode("utf-8", "replace").strip() if remote.returncode == 0 else ""
    return CodeRef(
        root=root,
        repo=_without_credentials(url or None) or str(root),
        commit=commit,
        branch=branch,
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


def clone_commit(url: str, commit: str, dest: Path) -> CodeRef:
    """Clone `url` into `dest` (absent or empty) with exactly `commit` checked out (a detached HEAD)."""
    cloned = subprocess.run(["git", "clone", "--quiet", "--no-checkout", "--", url, str(dest)], capture_output=True,
                            check=False, env=_git_env(GIT_TERMINAL_PROMPT="0"))
    checked = _git(dest, "checkout", "--quiet", "--detach", commit) if cloned.returncode == 0 else cloned
    if checked.returncode != 0:
        raise InputError(f"commit {commit[:12]} of {_without_credentials(url)}: git could not check it out: "
                         f"{_first_error(checked.stderr)}")
    return capture_code(Path(dest))


def resolve_commit(root: Path, ref: str) -> str | None:
    """The full hash of the commit `ref` (a branch, a tag, a hash or a prefix of one) names in `root`'s repository."""
    if not ref or ref.startswith("-"):
        return None
    return _out(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


def changed_files(root: Path, before: str, after: str) -> list[dict]:
    """Each file that differs between two commits, with its added and deleted lines (None for a binary file)."""
    result = _git(root, "diff", "--numstat", "-z", "--no-renames", before, after)
    files = []
    for entry in result.stdout.decode("utf-8", "surrogateescape").split("\0"):
        parts = entry.split("\t", 2)
        if len(parts) == 3:
            added, deleted, path = parts
            files.append({"path": path, "added": int(added) if added.isdigit() else None,
                          "deleted": int(deleted) if deleted.isdigit() else None})
    return files


def _trackway_paths(root: Path, cwd: Path, home: Path | None) -> list[str]:
    """Paths (relative to the work tree's top) of trackway's own files that the diff leaves out."""
    root = root.resolve()
    paths: list[str] = []
    for candidate in {Path(home).expanduser().resolve() if home else default_home(cwd), (cwd / ".trackway").resolve()}:
        if candidate == root:
            continue  # a home at the top of the work tree would hide everything: keep the user's files
        try:
            paths.append(candidate.relative_to(root).as_posix())
        except ValueError:
            continue
    for toml in {(cwd / CONFIG_FILE_NAME).resolve(), root / CONFIG_FILE_NAME}:
        try:
            generated = toml.is_file() and toml.read_text() == DEFAULT_TRACKWAY_TOML
            relative = toml.relative_to(root).as_posix()
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if generated:
            paths.append(relative)
    return sorted(set(paths))


def _pathspec(excluded: list[str]) -> list[str]:
    return [".", *(f":(top,literal,exclude){p}" for p in excluded)]


def _dirty_diff(root: Path, has_head: bool, excluded: list[str] | None = None, real_index: str | None = None) -> bytes:
    # `git add` refuses a pathspec naming an ignored path, and needs no exclusion for one.
    excluded = [p for p in (excluded or []) if _git(root, "check-ignore", "--quiet", "--", p).returncode != 0]
    spec = _pathspec(excluded)
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
        # The exclusions keep git from reading trackway's files at all (the ledger changes under it).
        _checked(root, _git(root, "add", "--all", "--", *spec, env=env))
        # With no HEAD yet, `diff --cached` compares against the empty tree.
        base = ["HEAD"] if has_head else []
        omitted = _large_or_binary(root, base, spec, env)
        if omitted:
            spec += [f":(top,literal,exclude){entry['path']}" for entry in omitted]
        diff = _checked(root, _git(root, *_DIFF_ARGS, *base, "--", *spec, env=env)).stdout
    if not omitted:
        return diff
    lines = [OMITTED_PREFIX + json.dumps(entry, sort_keys=True, ensure_ascii=False).encode() + b"\n" for entry in omitted]
    return _HEADER + b"".join(lines) + diff


def _large_or_binary(root: Path, base: list[str], spec: list[str], env: dict[str, str]) -> list[dict[str, object]]:
    """Changed paths that are binary (to git) or LARGE_FILE_BYTES or more on either side, with the new side's size and sha256."""
    common = ["--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "-z"]
    raw = _checked(root, _git(root, "diff", "--cached", "--raw", "--abbrev=40", *common, *base, "--", *spec, env=env))
    numstat = _checked(root, _git(root, "diff", "--cached", "--numstat", *common, *base, "--", *spec, env=env))
    binary: set[str] = set()
    fields = numstat.stdout.split(b"\0")
    for item in fields:
        if item.startswith(b"-\t-\t"):
            binary.add(item[4:].decode("utf-8", "surrogateescape"))
    changes: list[tuple[str, str, str, str]] = []  # path, status, old id, new id
    parts = raw.stdout.split(b"\0")
    for i in range(0, len(parts) - 1, 2):
        meta = parts[i].decode().lstrip(":").split()
        if len(meta) < 5:
            continue
        changes.append((parts[i + 1].decode("utf-8", "surrogateescape"), meta[4], meta[2], meta[3]))
    zero = "0" * 40
    ids = sorted({oid for _, _, old, new in changes for oid in (old, new) if oid != zero and len(oid) >= 40})
    sizes: dict[str, int] = {}
    if ids:
        check = subprocess.run(
            ["git", "-C", str(root), "cat-file", "--batch-check=%(objectname) %(objectsize)"],
            input="\n".join(ids).encode() + b"\n", capture_output=True, check=False, env=_git_env(**env),
        )
        for line in check.stdout.decode().splitlines():
            oid, _, size = line.partition(" ")
            if size.isdigit():
                sizes[oid] = int(size)
    omitted: list[dict[str, object]] = []
    for path, status, old, new in changes:
        largest = max(sizes.get(old, 0), sizes.get(new, 0))
        if path not in binary and largest < LARGE_FILE_BYTES:
            continue
        deleted = status.startswith("D") or new == zero
        entry: dict[str, object] = {"path": path, "status": "deleted" if deleted else "added" if status.startswith("A") else "modified",
                                    "size": None, "sha256": None}
        if not deleted:
            entry["size"], entry["sha256"] = sizes.get(new), _blob_sha256(root, new, env)
        omitted.append(entry)
    return omitted


def _blob_sha256(root: Path, oid: str, env: dict[str, str]) -> str | None:
    """sha256 of a blob's content as git stored it (the bytes the receipt means), streamed."""
    process = subprocess.Popen(["git", "-C", str(root), "cat-file", "blob", oid], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env=_git_env(**env))
    digest = hashlib.sha256()
    assert process.stdout is not None
    for chunk in iter(lambda: process.stdout.read(1 << 20), b""):
        digest.update(chunk)
    process.stdout.close()
    return digest.hexdigest() if process.wait() == 0 else None


def _checked(root: Path, result: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[bytes]:
    # Reporting a clean tree when git could not tell would be a false receipt; fail loudly instead.
    if result.returncode != 0:
        command = "git " + " ".join(result.args[3:5])
        raise TrackwayError(f"{command} failed in {root}, so the dirty diff is unknown: {_first_error(result.stderr)}")
    return result


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    command = ["git", "-C", str(cwd), *args]
    return subprocess.run(command, capture_output=True, check=False, env=_git_env(**(env or {})))


def _git_at_once(cwd: Path, *commands: list[str]) -> list[subprocess.CompletedProcess[bytes]]:
    """Run independent git commands side by side: on a busy machine each start costs as much as the work."""
    env = _git_env()
    started = [
        (command, subprocess.Popen(["git", "-C", str(cwd), *command], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env))
        for command in commands
    ]
    done = []
    for command, process in started:
        out, err = process.communicate()
        done.append(subprocess.CompletedProcess(["git", "-C", str(cwd), *command], process.returncode, out, err))
    return done


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
