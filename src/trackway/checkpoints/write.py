"""Writing a checkpoint: writing → committed (payload, MANIFEST.json and the COMMITTED marker, each fsynced in turn).

`PendingCheckpoint.commit()` makes "committed" true last: payload written (hashed as it is
written) and fsynced → MANIFEST.json written, fsynced → temp directories fsynced → rename to
step-N → fsync root → COMMITTED.tmp written, fsynced → renamed to COMMITTED → fsync step-N.
Deletion removes COMMITTED first (recover.py). A crash anywhere leaves nothing that looks
committed and is not.

Two writers, one step: a rename onto a non-empty directory fails atomically. If the holder is
committed and verifies, the later commit discards its own files and returns it (committing a step
is idempotent); an uncommitted holder (its writer died between rename and marker) is moved aside as
debris, a corrupt one set aside, and the rename retried. Writers hold an flock on the root from the
rename to the marker, so nobody moves a live writer's directory; without a working flock the writer
notices afterwards and raises rather than claim a commit.

A full disk anywhere in a save (payload, manifest, marker) raises `CheckpointDiskFull`: an
OSError that keeps the errno (ENOSPC) and names the root and the bytes free. The temporary
directory is removed, and a step directory renamed into place before the marker failed is moved
back so that it is removed too: a failed save leaves no bytes behind on a disk that has none.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import threading
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from trackway.checkpoints.durable import fsync, hash_file, inode_of, publish, root_lock, walk, write_durably
from trackway.checkpoints.hashing import HashingWriter
from trackway.checkpoints.layout import (
    DIR_FLAGS,
    MANIFEST,
    MARKER,
    RESERVED,
    SHA256_RE,
    TOKEN_RE,
    CheckpointError,
    CheckpointInfo,
    CheckpointState,
    clean_relpath,
    crash_point,
    new_token,
    one_line,
    step_dir_name,
)
from trackway.checkpoints.recover import move_aside, set_aside_path
from trackway.checkpoints.verify import check_files, inspect_dir

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class CheckpointDiskFull(CheckpointError, OSError):
    """A save that ran out of disk: an OSError keeping the errno, naming the checkpoint root and the bytes free.

    Both a CheckpointError (what the SDK's callers catch) and an OSError with errno ENOSPC (what
    classifies an ending as disk full, however deep in an exception chain it sits).
    """

    @classmethod
    def saving(cls, exc: OSError, root: Path, step: int) -> CheckpointDiskFull:
        """The error for `exc` (ENOSPC or EDQUOT) met while saving `step` under `root`."""
        what = "disk full" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        free = _free_bytes(root)
        room = f"{free} bytes free" if free is not None else "free space unknown"
        cause = f" ({exc.strerror})" if exc.strerror else ""
        message = f"{what} while saving checkpoint {step_dir_name(step)} under {root}: {room}{cause}"
        return cls(exc.errno, message, str(root))


class disk_full_named:  # noqa: N801 - used as a context manager, like contextlib's
    """Re-raises a full disk met inside the block as CheckpointDiskFull (from the original); other errors pass.

    A class, not a generator: it wraps every write of a checkpoint's payload.
    """

    __slots__ = ("root", "step")

    def __init__(self, root: Path, step: int) -> None:
        self.root, self.step = root, step

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, CheckpointDiskFull) and exc.errno in _DISK_FULL_ERRNOS:
            raise CheckpointDiskFull.saving(exc, self.root, self.step) from exc


def _free_bytes(path: Path) -> int | None:
    """Bytes free on the file system holding `path` (or its nearest existing ancestor)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def begin(
    root: Path, step: int, *, run_id: str | None = None, attempt_id: str | None = None, parent: str | None = None,
    token: str | None = None,
) -> PendingCheckpoint:
    """Start writing `step` in `.tmp-step-N-<token>`, shared by every process given the token (see new_token)."""
    name = step_dir_name(step)
    if token is not None and not TOKEN_RE.fullmatch(token):
        raise CheckpointError(f"checkpoint token must match {TOKEN_RE.pattern}, got {token!r}")
    path = root / f".tmp-{name}-{token or new_token()}"
    with disk_full_named(root, step):
        root.mkdir(parents=True, exist_ok=True)
        path.mkdir(exist_ok=token is not None)
    return PendingCheckpoint(root, step, path, {"run_id": run_id, "attempt_id": attempt_id, "parent": parent})


class PendingCheckpoint:
    """A checkpoint being written into a private temporary directory; nothing reads it until `commit()`.

    Processes (ranks) given one token by `begin()` share the directory: each writes its own files and
    sends its `digests` to one of them, which `add_digest`s them and commits; the others neither
    commit nor abort (so they do not use `with`).
    """

    def __init__(self, root: Path, step: int, path: Path, identity: dict[str, str | None]) -> None:
        self.step = step
        self.path = path
        self.info: CheckpointInfo | None = None
        self._root = root
        self._identity = identity
        self._digests: dict[str, tuple[int, str, str | None]] = {}  # (size, sha256, blake3 where known)
        self._open: list[str] = []  # files whose writer is not closed yet
        self._lock = threading.Lock()
        self._state = "open"

    @property
    def digests(self) -> dict[str, dict[str, Any]]:
        """{relpath: {"size", "sha256", "blake3"}} of the files recorded so far (blake3 where known)."""
        with self._lock:
            return {rel: _entry(*digest) for rel, digest in self._digests.items()}

    def open(self, relpath: str, *, blake3: bool = False) -> BinaryIO:
        """A new binary file in the checkpoint, hashed as it is written and fsynced when closed.

        It is a `HashingWriter`: besides `write()`, `write_held(data, owner)` takes bytes that stay
        unchanged until the file is closed and hashes them without a copy. `blake3`: record that
        digest too, for a file that readers will hash whole (digests.py), at ~40% more hashing here.
        """
        self._check_open("open a file in")
        rel = clean_relpath(relpath)
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        writer = HashingWriter(
            self.path / rel,
            name=rel,
            guard=self._disk_full_named,
            on_close=lambda digest: self._closed(rel, digest),
            crash_point=crash_point,
            blake3=blake3,
        )
        with self._lock:
            self._digests.pop(rel, None)
            self._open.append(rel)
        return writer  # type: ignore[return-value]

    def add_digest(self, relpath: str, size: int, sha256: str, blake3: str | None = None) -> None:
        """Record a file that another process wrote into this directory, with the digests it computed."""
        self._check_open("add a digest to")
        rel = clean_relpath(relpath)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CheckpointError(f"add_digest({rel!r}): size must be a non-negative integer, got {size!r}")
        if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
            raise CheckpointError(f"add_digest({rel!r}): sha256 must be 64 lowercase hex digits, got {sha256!r}")
        if blake3 is not None and (not isinstance(blake3, str) or not SHA256_RE.fullmatch(blake3)):
            raise CheckpointError(f"add_digest({rel!r}): blake3 must be 64 lowercase hex digits or None, got {blake3!r}")
        with self._lock:
            self._digests[rel] = (size, sha256, blake3)

    def commit(
        self, metrics: dict | None = None, extra: dict | None = None, *, manifest: bytes | None = None
    ) -> CheckpointInfo:
        """Commit in the order the module docstring gives; return the committed checkpoint.

        Files dropped into the directory without `open()`/`add_digest()` are hashed and fsynced here.
        If this step is already committed and verifies, this one is discarded and that one returned.
        `manifest`: for a copy of a checkpoint committed elsewhere (a download), its MANIFEST.json
        bytes, kept as they are (so the copy has the original's manifest sha256); they must be this
        step's and list exactly the files here, with their sizes and digests.
        """
        if self._state == "committed" and self.info is not None:
            return self.info
        self._check_open("commit")
        if manifest is not None and (metrics or extra):
            raise CheckpointError("commit(manifest=...) takes the manifest as it is: metrics and extra are in it")
        with self._disk_full_named():
            return self._commit(metrics, extra, manifest)

    def _commit(self, metrics: dict | None, extra: dict | None, given: bytes | None = None) -> CheckpointInfo:
        with self._lock:
            if self._open:
                raise CheckpointError(f"cannot commit step {self.step}: {', '.join(sorted(self._open))} still open")
            recorded = dict(self._digests)
        found, dirs = walk(self.path)
        files: dict[str, dict[str, Any]] = {}
        for rel in found:
            if rel in RESERVED:
                raise CheckpointError(f"{self.path / rel}: {rel} is the protocol's own file; do not write it")
            if rel in recorded:
                size, sha, b3 = recorded[rel]
                actual = os.stat(self.path / rel).st_size
                if actual != size:
                    raise CheckpointError(f"{self.path / rel} is {actual} bytes, {size} were recorded; changed later?")
                fsync(self.path / rel)  # nothing left to flush when it came through open()
            else:
                size, sha = hash_file(self.path / rel, fsync=True)
                b3 = None  # dropped in without open(): hashed here for its sha256 alone
            files[rel] = _entry(size, sha, b3)
        missing = sorted(set(recorded) - set(found))
        if missing:
            raise CheckpointError(f"cannot commit step {self.step}: recorded but missing: {', '.join(missing)}")
        if not files:
            # A marker over nothing would be the resume target, and a resume from it restores nothing.
            raise CheckpointError(f"cannot commit step {self.step}: no file was written into {self.path}; a checkpoint "
                                  "with nothing in it cannot be resumed from")
        if given is not None:
            manifest_bytes = self._copied_manifest(given, files)
        else:
            manifest = {
                "format": 1, "step": self.step, **self._identity,
                "created_at": datetime.now(timezone.utc).isoformat(), "files": files,
                "metrics": _jsonable(metrics or {}, "metrics"), "extra": _jsonable(extra or {}, "extra"),
            }
            manifest_bytes = (json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
        write_durably(self.path / MANIFEST, manifest_bytes)
        crash_point("after_manifest")
        for directory in reversed(dirs):  # deepest first, the temp directory itself last
            fsync(directory, directory=True)
        crash_point("before_rename")
        self.info = _install(self._root, self, manifest_bytes)
        self._state = "committed"
        return self.info

    def _copied_manifest(self, given: bytes, files: dict[str, dict[str, Any]]) -> bytes:
        """`given` when it is this step's manifest and lists exactly `files` (sizes, digests); else CheckpointError."""
        try:
            manifest = json.loads(given)
        except (ValueError, UnicodeDecodeError):
            manifest = None
        listed = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(listed, dict) or manifest.get("step") != self.step or isinstance(manifest["step"], bool):
            raise CheckpointError(f"cannot commit step {self.step} with a manifest that is not this step's")
        wanted = {rel: (e.get("size"), e.get("sha256")) if isinstance(e, dict) else e for rel, e in listed.items()}
        # A blake3 the manifest lists must be the file's too, where this copy knows the file's.
        blake3_differs = any(f.get("blake3") and listed[rel].get("blake3") not in (None, f["blake3"])
                             for rel, f in files.items() if isinstance(listed.get(rel), dict))
        if blake3_differs or wanted != {rel: (f["size"], f["sha256"]) for rel, f in files.items()}:
            raise CheckpointError(f"cannot commit step {self.step}: its files differ from those the manifest lists")
        return given

    def abort(self) -> None:
        """Discard the temporary directory and everything in it; safe to call twice."""
        if self._state != "committed":
            self._state = "aborted"
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> PendingCheckpoint:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.commit()

    def _disk_full_named(self) -> disk_full_named:
        return disk_full_named(self._root, self.step)

    def _check_open(self, action: str) -> None:
        if self._state != "open":
            raise CheckpointError(f"cannot {action} checkpoint step {self.step}: it was already {self._state}")

    def _closed(self, rel: str, digest: tuple[int, str, str] | None) -> None:
        with self._lock:
            self._open.remove(rel)
            if digest is not None:
                self._digests[rel] = digest


def _entry(size: int, sha256: str, blake3: str | None) -> dict[str, Any]:
    """A file's manifest entry: blake3 only where it was computed (digests.py says which one a reader checks)."""
    return {"size": size, "sha256": sha256} if blake3 is None else {"size": size, "sha256": sha256, "blake3": blake3}


def _install(root: Path, pending: PendingCheckpoint, manifest_bytes: bytes) -> CheckpointInfo:
    """Rename the pending directory to step-N and write its marker, holding the root lock."""
    final = root / step_dir_name(pending.step)
    # The marker goes through a descriptor of our own directory: it can only ever land beside
    # the manifest it names, wherever that directory has been moved to.
    dir_fd = os.open(pending.path, DIR_FLAGS)
    try:
        with root_lock(root):
            for _ in range(100):
                try:
                    os.rename(pending.path, final)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                        raise
                existing = _make_room(root, final)
                if existing is not None:
                    shutil.rmtree(pending.path, ignore_errors=True)
                    return existing
            else:
                raise CheckpointError(f"could not rename {pending.path} to {final}: something keeps taking it")
            try:
                crash_point("after_rename")
                fsync(root, directory=True)
                publish(dir_fd, MARKER, {"manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
                                         "committed_at": datetime.now(timezone.utc).isoformat()})
            except BaseException:
                _unrename(dir_fd, final, pending.path)
                raise
            mine = os.fstat(dir_fd)
            if inode_of(final) != (mine.st_dev, mine.st_ino):
                raise CheckpointError(f"{final} was moved by another writer before its marker: no working flock?")
    finally:
        os.close(dir_fd)
    crash_point("after_commit")
    info = inspect_dir(final)
    if info is None or not info.state.readable:
        raise CheckpointError(f"{final} does not verify right after commit: {info.problems if info else 'gone'}")
    return info


def _make_room(root: Path, final: Path) -> CheckpointInfo | None:
    """Something holds step-N: return it when committed and good, else move it out of the way."""
    inode = inode_of(final)
    existing = inspect_dir(final)
    if existing is None:
        return None
    problems: list[str] = []
    if existing.state.readable:
        problems, unreadable = check_files(final, existing.step)
        if unreadable:
            raise CheckpointError(f"step {existing.step} exists and cannot be verified: {'; '.join(unreadable)}")
        if not problems:
            return existing
    if existing.state.readable or existing.state is CheckpointState.CORRUPT:
        set_aside_path(root, final, inode, one_line(problems or existing.problems), locked=True)
    else:
        move_aside(root, final)
    return None


def _unrename(dir_fd: int, final: Path, pending: Path) -> None:
    """Move a step directory whose marker could not be written back to its temp name, for abort() to remove."""
    mine = os.fstat(dir_fd)
    with suppress(OSError):
        if os.path.lexists(final / MARKER) or inode_of(final) != (mine.st_dev, mine.st_ino):
            return  # it committed after all, or it is not ours any more
        os.rename(final, pending)


def _jsonable(value: Any, where: str) -> Any:
    """`value` as plain JSON: numpy/torch scalars become numbers, non-finite floats strings ("nan")."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    try:
        return _jsonable(value.item(), where)  # numpy and torch scalars
    except (AttributeError, TypeError, ValueError, RuntimeError):
        raise CheckpointError(f"{where} is a {type(value).__name__}; a manifest holds JSON values only") from None
