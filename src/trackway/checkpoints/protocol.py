"""The checkpoint protocol on a filesystem: how a checkpoint is written, committed, found, verified and removed.

Storage is the truth; the ledger only mirrors it. Under a run's checkpoint root:

    .tmp-step-00001234-<token>/        being written (PendingCheckpoint); never read
    step-00001234/                     payload files, MANIFEST.json, COMMITTED [, SUPERSEDED]
    step-00001234.corrupt-<UTC time>/  committed-looking, failed verification: set aside, never deleted
    step-00001234.refused-<UTC time>/  verified, but its loader refused the content (a pickle that runs code)
    .debris-step-00001234-<token>/     an uncommitted step directory moved out of a new writer's way

    writing ──commit──► committed ──supersede──► superseded ──delete──► deleted ──► (gone)
       └─ abandoned: debris     └── fails verification ──┴──► corrupt ──► set aside
                                └── refused by the loader ──────────────────► set aside

A set-aside directory is left exactly as it was found (it is evidence). Why it was set aside is
told to whoever set it aside (`pick_latest`, `set_aside`), which records it (the SDK's
`checkpoint_restored` event); `set_aside_list()` can only say what a cheap look shows.

Committed iff COMMITTED parses, its manifest_sha256 is sha256(MANIFEST.json) and the manifest's
step is the directory's. `commit()` makes that true last: payload written (hashed as it is written)
and fsynced → MANIFEST.json written, fsynced → temp directories fsynced → rename to step-N → fsync
root → COMMITTED.tmp written, fsynced → renamed to COMMITTED → fsync step-N. Deletion removes
COMMITTED first. A crash anywhere leaves nothing that looks committed and is not.

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
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from trackway.checkpoints.hashing import HashingWriter
from trackway.errors import TrackwayError

MANIFEST = "MANIFEST.json"
MARKER = "COMMITTED"
SUPERSEDED_MARK = "SUPERSEDED"
_RESERVED = frozenset({MANIFEST, MARKER, SUPERSEDED_MARK, MARKER + ".tmp", SUPERSEDED_MARK + ".tmp"})

_STEP_RE = re.compile(r"step-(\d+)", re.ASCII)
_TMP_RE = re.compile(r"\.tmp-step-(\d+)-(.+)", re.ASCII)
_DEBRIS_RE = re.compile(r"\.debris-step-(\d+)-(.+)", re.ASCII)
_SET_ASIDE_RE = re.compile(r"(step-(\d+))\.(corrupt|refused)-(\d{8}T\d{6}\.\d{6}Z)", re.ASCII)
_TOKEN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
_STAMP_RE = re.compile(r"\d{8}T\d{6}\.\d{6}Z", re.ASCII)  # what new_token() starts with
_STAMP_FORMAT = "%Y%m%dT%H%M%S.%fZ"
_SHA256_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

_READ_CHUNK = 4 << 20

# Fault injection for the kill tests: TRACKWAY_CHECKPOINT_CRASH_AT=<point>[@n] SIGKILLs the process the
# n-th time it passes that point; unset, a point costs one comparison.
CRASH_POINTS = (
    "mid_write", "after_payload_fsync", "after_manifest", "before_rename", "after_rename",
    "after_COMMITTED_tmp_write", "before_COMMITTED_rename", "after_COMMITTED_rename", "after_commit",
    "after_SUPERSEDED_rename", "delete_after_marker", "delete_mid_files", "clean_mid", "before_set_aside",
)
_crash_at = os.environ.get("TRACKWAY_CHECKPOINT_CRASH_AT") or None
_crash_hits: dict[str, int] = {}


def _crash_point(name: str) -> None:
    if _crash_at is not None and _crash_at.partition("@")[0] == name:
        _crash_hits[name] = _crash_hits.get(name, 0) + 1
        if _crash_hits[name] >= int(_crash_at.partition("@")[2] or 1):
            os.kill(os.getpid(), signal.SIGKILL)


class CheckpointError(TrackwayError):
    """A checkpoint could not be written, committed, verified or removed; the message says which and why."""


class CheckpointRefused(CheckpointError):
    """A committed checkpoint whose content the safe loader refused (it would run code): set it aside, never load it."""


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


class CheckpointState(str, Enum):
    """Where a step directory stands; only committed and superseded ones may be read."""

    WRITING = "writing"
    COMMITTED = "committed"
    SUPERSEDED = "superseded"
    DELETED = "deleted"
    CORRUPT = "corrupt"
    SET_ASIDE = "set_aside"  # step-N.corrupt-<time> or step-N.refused-<time>: kept, never read

    @property
    def readable(self) -> bool:
        return self in (CheckpointState.COMMITTED, CheckpointState.SUPERSEDED)


@dataclass(frozen=True)
class CheckpointInfo:
    """One step directory as storage held it when read (`CheckpointStore.get` reads it again)."""

    step: int
    path: Path
    state: CheckpointState
    manifest: dict | None
    committed_at: datetime | None
    size_bytes: int
    problems: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class SetAside:
    """One checkpoint moved out of the resume path on the way to a restore: which, why, and its new name."""

    name: str
    reason: str
    set_aside_as: str | None  # None when another process had already moved it
    path: str | None = None
    kind: str = "corrupt"  # or "refused"

    def as_event(self) -> dict[str, str | None]:
        """The entry of a `checkpoint_restored` event's fallback_from."""
        return {"name": self.name, "reason": self.reason, "set_aside_as": self.set_aside_as, "path": self.path}


def step_dir_name(step: int) -> str:
    """`step-00001234`: at least 8 digits, more when the step needs them."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"checkpoint step must be a non-negative integer, got {step!r}")
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    """The step of a `step-N` directory name; None for anything else (temp, debris, set-aside names)."""
    match = _STEP_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_set_aside(name: str) -> tuple[str, int] | None:
    """(`step-N`, N) of a set-aside directory name (`step-N.corrupt-<time>`, `step-N.refused-<time>`); else None."""
    match = _SET_ASIDE_RE.fullmatch(name)
    return (match.group(1), int(match.group(2))) if match else None


def new_token() -> str:
    """A temp-directory token that records when it was made (the debris cleaner dates it by this)."""
    return f"{datetime.now(timezone.utc).strftime(_STAMP_FORMAT)}-{secrets.token_hex(4)}"


class PendingCheckpoint:
    """A checkpoint being written into a private temporary directory; nothing reads it until `commit()`.

    Processes (ranks) given one token by `begin()` share the directory: each writes its own files and
    sends its `digests` to one of them, which `add_digest`s them and commits; the others neither
    commit nor abort (so they do not use `with`).
    """

    def __init__(self, store: CheckpointStore, step: int, path: Path, identity: dict[str, str | None]) -> None:
        self.step = step
        self.path = path
        self.info: CheckpointInfo | None = None
        self._store = store
        self._identity = identity
        self._digests: dict[str, tuple[int, str]] = {}
        self._open: list[str] = []  # files whose writer is not closed yet
        self._lock = threading.Lock()
        self._state = "open"

    @property
    def digests(self) -> dict[str, dict[str, Any]]:
        """{relpath: {"size", "sha256"}} of the files recorded so far."""
        with self._lock:
            return {rel: {"size": size, "sha256": sha} for rel, (size, sha) in self._digests.items()}

    def open(self, relpath: str) -> BinaryIO:
        """A new binary file in the checkpoint, hashed as it is written and fsynced when closed.

        It is a `HashingWriter`: besides `write()`, `write_held(data, owner)` takes bytes that stay
        unchanged until the file is closed and hashes them without a copy.
        """
        self._check_open("open a file in")
        rel = _clean_relpath(relpath)
        (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
        writer = HashingWriter(
            self.path / rel,
            name=rel,
            guard=self._disk_full_named,
            on_close=lambda digest: self._closed(rel, digest),
            crash_point=_crash_point,
        )
        with self._lock:
            self._digests.pop(rel, None)
            self._open.append(rel)
        return writer  # type: ignore[return-value]

    def add_digest(self, relpath: str, size: int, sha256: str) -> None:
        """Record a file that another process wrote into this directory, with the digest it computed."""
        self._check_open("add a digest to")
        rel = _clean_relpath(relpath)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CheckpointError(f"add_digest({rel!r}): size must be a non-negative integer, got {size!r}")
        if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
            raise CheckpointError(f"add_digest({rel!r}): sha256 must be 64 lowercase hex digits, got {sha256!r}")
        with self._lock:
            self._digests[rel] = (size, sha256)

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
        found, dirs = _walk(self.path)
        files: dict[str, dict[str, Any]] = {}
        for rel in found:
            if rel in _RESERVED:
                raise CheckpointError(f"{self.path / rel}: {rel} is the protocol's own file; do not write it")
            if rel in recorded:
                size, sha = recorded[rel]
                actual = os.stat(self.path / rel).st_size
                if actual != size:
                    raise CheckpointError(f"{self.path / rel} is {actual} bytes, {size} were recorded; changed later?")
                _fsync(self.path / rel)  # nothing left to flush when it came through open()
            else:
                size, sha = _hash_file(self.path / rel, fsync=True)
            files[rel] = {"size": size, "sha256": sha}
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
        _write_durably(self.path / MANIFEST, manifest_bytes)
        _crash_point("after_manifest")
        for directory in reversed(dirs):  # deepest first, the temp directory itself last
            _fsync(directory, directory=True)
        _crash_point("before_rename")
        self.info = self._store._install(self, manifest_bytes)
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
        if wanted != {rel: (f["size"], f["sha256"]) for rel, f in files.items()}:
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
        return disk_full_named(self._store.root, self.step)

    def _check_open(self, action: str) -> None:
        if self._state != "open":
            raise CheckpointError(f"cannot {action} checkpoint step {self.step}: it was already {self._state}")

    def _closed(self, rel: str, digest: tuple[int, str] | None) -> None:
        with self._lock:
            self._open.remove(rel)
            if digest is not None:
                self._digests[rel] = digest


_LEFTOVER = (CheckpointState.WRITING, CheckpointState.DELETED)


class CheckpointStore:
    """The checkpoints under one root directory (one run): begin, list, verify, supersede, delete, clean."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def begin(
        self, step: int, *, run_id: str | None = None, attempt_id: str | None = None, parent: str | None = None,
        token: str | None = None,
    ) -> PendingCheckpoint:
        """Start writing `step` in `.tmp-step-N-<token>`, shared by every process given the token (see new_token)."""
        name = step_dir_name(step)
        if token is not None and not _TOKEN_RE.fullmatch(token):
            raise CheckpointError(f"checkpoint token must match {_TOKEN_RE.pattern}, got {token!r}")
        path = self.root / f".tmp-{name}-{token or new_token()}"
        with disk_full_named(self.root, step):
            self.root.mkdir(parents=True, exist_ok=True)
            path.mkdir(exist_ok=token is not None)
        return PendingCheckpoint(self, step, path, {"run_id": run_id, "attempt_id": attempt_id, "parent": parent})

    def list(self, verify_files: bool = False) -> list[CheckpointInfo]:
        """Every step-N directory, by step number; with verify_files, one whose files fail shows as corrupt."""
        infos = []
        for info in filter(None, map(self._inspect, self._step_dirs())):
            problems = self.verify(info) if verify_files and info.state.readable else None
            if problems:  # only shown as corrupt: latest_committed is what sets one aside
                info = replace(info, state=CheckpointState.CORRUPT, problems=tuple(problems))
            infos.append(info)
        return sorted(infos, key=lambda i: (i.step, i.name))

    def get(self, step: int) -> CheckpointInfo | None:
        return self._inspect(self.root / step_dir_name(step)) or next(
            (i for i in map(self._inspect, self._step_dirs()) if i is not None and i.step == step), None
        )

    def latest_committed(self, verify_files: bool = True) -> CheckpointInfo | None:
        """The resume target: the highest step that is committed (or superseded) and verifies (see pick_latest)."""
        return self.pick_latest(verify_files)[0]

    def pick_latest(self, verify_files: bool = True) -> tuple[CheckpointInfo | None, list[SetAside]]:
        """(the resume target, what was set aside on the way to it, newest first).

        Anything committed-looking above the target that fails verification (bad marker; missing,
        truncated or altered file) is set aside as `step-N.corrupt-<UTC time>`, never deleted. A file
        unreadable for another reason (EIO, permissions) raises instead: that is no proof of corruption.
        """
        skipped: list[SetAside] = []
        for listed in reversed(self.list()):
            inode = _inode(listed.path)  # taken before judging, so that what is set aside is what was judged
            info = self._inspect(listed.path)
            if info is None or not (info.state.readable or info.state is CheckpointState.CORRUPT):
                continue
            problems, unreadable = self._check_files(info.path, info.step) if verify_files else (info.problems, ())
            if unreadable:
                raise CheckpointError(f"cannot verify {info.path}: {'; '.join(unreadable)}")
            if not problems and not (info.manifest or {}).get("files"):
                # Committed before empty commits were refused: it verifies, and holds nothing to resume.
                problems = ["the manifest lists no file: a checkpoint with nothing in it cannot be resumed from"]
            if not problems:
                return info, skipped
            skipped.append(self._set_aside(info.path, inode, _one_line(problems)))
        return None, skipped

    def set_aside(self, info: CheckpointInfo, reason: str, kind: str = "refused") -> SetAside:
        """Move a checkpoint that must never be read again out of the resume path, as `step-N.<kind>-<UTC time>`.

        For what verification cannot see: content that the loader refused. Nothing is deleted. If
        `info.path` meanwhile holds another checkpoint (a new commit of the step), it is left alone.
        """
        if kind not in ("corrupt", "refused"):
            raise CheckpointError(f"set_aside kind must be 'corrupt' or 'refused', got {kind!r}")
        inode = _inode(info.path)
        current = self._inspect(info.path)
        if current is None or current.manifest != info.manifest:
            return SetAside(info.name, _one_line([reason]), None, kind=kind)
        return self._set_aside(info.path, inode, _one_line([reason]), kind)

    def set_aside_list(self) -> list[CheckpointInfo]:
        """Every set-aside directory, by step then name, with what a look without hashing shows is wrong.

        That is the marker or a file's size when those are wrong; otherwise only "set aside as
        corrupt" (or refused): the full reason is in what set it aside recorded.
        """
        infos = []
        for path in self._entries():
            parsed = parse_set_aside(path.name)
            if parsed is None or not path.is_dir():
                continue
            kind = _SET_ASIDE_RE.fullmatch(path.name).group(3)
            seen = self._inspect(path, parsed[1])
            if seen is None:
                continue  # removed by hand since the listing
            problems = seen.problems if seen.problems else self._size_problems(path, seen)
            infos.append(replace(seen, state=CheckpointState.SET_ASIDE, committed_at=None,
                                 problems=(_one_line(problems) if problems else f"set aside as {kind}",)))
        return sorted(infos, key=lambda i: (i.step, i.name))

    def verify(self, info: CheckpointInfo) -> list[str]:
        """What is wrong with a checkpoint as it is on disk now (marker, manifest, every file); [] when good."""
        return sum(self._check_files(info.path, info.step), [])

    def supersede(self, info: CheckpointInfo) -> CheckpointInfo:
        """Mark a committed checkpoint superseded (it stays readable until deleted)."""
        current = self._inspect(info.path)
        if current is None or not current.state.readable:
            raise CheckpointError(f"cannot supersede {info.name}: it is {current.state.value if current else 'gone'}")
        if current.state is CheckpointState.COMMITTED:
            _publish(info.path, SUPERSEDED_MARK, {"superseded_at": datetime.now(timezone.utc).isoformat()})
        return self._inspect(info.path) or current

    def delete(self, info: CheckpointInfo) -> None:
        """Remove a committed or superseded checkpoint: COMMITTED first, then the files, then the directory.

        SUPERSEDED is written first (when missing) and removed last: a delete interrupted anywhere leaves
        a `deleted` directory, which nothing reads and `clean_debris` finishes.
        """
        path, current = info.path, self._inspect(info.path)
        if current is None:
            return
        if not (current.state.readable or current.state is CheckpointState.DELETED):
            raise CheckpointError(f"cannot delete {info.name}: it is {current.state.value}, not committed")
        if current.state is CheckpointState.COMMITTED:
            self.supersede(current)
        with suppress(FileNotFoundError):
            os.unlink(path / MARKER)
        _fsync(path, directory=True)
        _crash_point("delete_after_marker")
        _, dirs = _walk(path)
        for directory in reversed(dirs):  # deepest first; the mark in the step directory stays to the end
            for entry in os.scandir(directory):
                if entry.is_dir(follow_symlinks=False):
                    os.rmdir(entry.path)
                elif not (directory == path and entry.name == SUPERSEDED_MARK):
                    os.unlink(entry.path)
                    _crash_point("delete_mid_files")
        os.unlink(path / SUPERSEDED_MARK)
        os.rmdir(path)
        _fsync(self.root, directory=True)

    def debris(self) -> list[Path]:
        """Leftovers nothing will read: temp and moved-aside directories, step dirs without a verifying marker."""
        return sorted(
            p for p in self._entries() if _TMP_RE.fullmatch(p.name) or _DEBRIS_RE.fullmatch(p.name)
            or parse_step(p.name) is not None and getattr(self._inspect(p), "state", None) in _LEFTOVER
        )

    def clean_debris(self, min_age_s: float = 3600.0) -> list[Path]:
        """Remove debris at least `min_age_s` old and return it; committed and corrupt ones are never touched.

        Age: an entry is as young as the youngest thing known about it — the UTC time in its name
        (tokens from `new_token()`, debris names), its manifest's created_at, and the mtimes of it and
        everything in it. A time in the future keeps it (it looks young); an mtime in the past never
        makes it older than the time we recorded (only a token without one is dated by mtimes alone).
        A `deleted` directory (an interrupted delete) is finished at any age, since no writer makes
        one; min_age_s=0 removes all debris, for when no writer can be running.
        """
        now, removed = time.time(), []
        for path in self.debris():
            info = self._inspect(path) if parse_step(path.name) is not None else None
            finishing = info is not None and info.state is CheckpointState.DELETED
            if not finishing and min_age_s > 0 and _age(path, info.manifest if info else None, now) < min_age_s:
                continue
            doomed = path
            if info is not None:
                with self._locked():  # writers hold it from rename to marker, so this one's writer is gone
                    again = self._inspect(path)
                    if again is None or again.state not in _LEFTOVER:
                        continue
                    doomed = self._move_aside(path)
            _crash_point("clean_mid")
            if doomed.is_dir():
                shutil.rmtree(doomed, ignore_errors=True)
            else:
                doomed.unlink(missing_ok=True)
            removed.append(path)
        if removed:
            _fsync(self.root, directory=True)
        return removed

    def _entries(self) -> list[Path]:
        return [Path(e.path) for e in os.scandir(self.root)] if self.root.is_dir() else []

    def _step_dirs(self) -> list[Path]:
        return [p for p in self._entries() if parse_step(p.name) is not None]

    def _inspect(self, path: Path, step: int | None = None) -> CheckpointInfo | None:
        step = parse_step(path.name) if step is None else step
        if not os.path.lexists(path):
            return None
        (marker_bytes, marker), (manifest_bytes, manifest) = _read(path / MARKER), _read(path / MANIFEST)
        superseded = os.path.lexists(path / SUPERSEDED_MARK)
        if marker_bytes is None:
            state = CheckpointState.DELETED if superseded else CheckpointState.WRITING
            return CheckpointInfo(step, path, state, manifest, None, _tree(path)[0])
        problems = _marker_problems(step, marker, manifest_bytes, manifest)
        if problems:
            return CheckpointInfo(step, path, CheckpointState.CORRUPT, manifest, None, _tree(path)[0], problems)
        state = CheckpointState.SUPERSEDED if superseded else CheckpointState.COMMITTED
        size = sum(f["size"] for f in manifest["files"].values() if isinstance(f, dict) and type(f.get("size")) is int)
        return CheckpointInfo(step, path, state, manifest, _parse_time(marker.get("committed_at")), size)

    @staticmethod
    def _size_problems(path: Path, info: CheckpointInfo) -> list[str]:
        """Files the manifest lists that are missing or of another size (stat only, nothing read)."""
        problems = []
        files = (info.manifest or {}).get("files")
        for rel, entry in sorted(files.items()) if isinstance(files, dict) else ():
            try:
                actual = os.stat(path / _clean_relpath(rel)).st_size
            except (CheckpointError, OSError):
                problems.append(f"{rel}: missing")
                continue
            expected = entry.get("size") if isinstance(entry, dict) else "?"
            if actual != expected:
                problems.append(f"{rel}: {actual} bytes, manifest says {expected}")
        return problems

    def _check_files(self, path: Path, step: int) -> tuple[list[str], list[str]]:
        """(evidence of corruption, files that could not be read for other reasons)."""
        info = self._inspect(path, step)
        if info is None or not info.state.readable:
            return list(info.problems if info else ()) or [f"{path} is not committed"], []
        problems, unreadable, checks = [], [], []
        for rel, entry in sorted(info.manifest["files"].items()):
            try:
                target, size = path / _clean_relpath(rel), entry["size"]
                st = os.stat(target)
            except (CheckpointError, KeyError, TypeError) as exc:
                problems.append(f"{rel}: bad manifest entry ({exc})")
                continue
            except FileNotFoundError:
                problems.append(f"{rel}: missing")
                continue
            except OSError as exc:
                unreadable.append(f"{rel}: {exc.strerror or exc}")
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                problems.append(f"{rel}: {st.st_size} bytes, manifest says {size}")
            else:
                checks.append((rel, target, entry.get("sha256")))
        if problems:
            return problems, unreadable  # a wrong size is proof enough; nothing needs reading
        for rel, target, expected in checks:
            try:
                actual = _hash_file(target)[1]
            except OSError as exc:
                unreadable.append(f"{rel}: {exc.strerror or exc}")
                continue
            if actual != expected:
                problems.append(f"{rel}: sha256 {actual[:12]}… but manifest says {str(expected)[:12]}…")
        return problems, unreadable

    def _install(self, pending: PendingCheckpoint, manifest_bytes: bytes) -> CheckpointInfo:
        """Rename the pending directory to step-N and write its marker, holding the root lock."""
        final = self.root / step_dir_name(pending.step)
        # The marker goes through a descriptor of our own directory: it can only ever land beside
        # the manifest it names, wherever that directory has been moved to.
        dir_fd = os.open(pending.path, _DIR_FLAGS)
        try:
            with self._locked():
                for _ in range(100):
                    try:
                        os.rename(pending.path, final)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                            raise
                    existing = self._make_room(final)
                    if existing is not None:
                        shutil.rmtree(pending.path, ignore_errors=True)
                        return existing
                else:
                    raise CheckpointError(f"could not rename {pending.path} to {final}: something keeps taking it")
                try:
                    _crash_point("after_rename")
                    _fsync(self.root, directory=True)
                    _publish(dir_fd, MARKER, {"manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
                                              "committed_at": datetime.now(timezone.utc).isoformat()})
                except BaseException:
                    self._unrename(dir_fd, final, pending.path)
                    raise
                mine = os.fstat(dir_fd)
                if _inode(final) != (mine.st_dev, mine.st_ino):
                    raise CheckpointError(f"{final} was moved by another writer before its marker: no working flock?")
        finally:
            os.close(dir_fd)
        _crash_point("after_commit")
        info = self._inspect(final)
        if info is None or not info.state.readable:
            raise CheckpointError(f"{final} does not verify right after commit: {info.problems if info else 'gone'}")
        return info

    def _make_room(self, final: Path) -> CheckpointInfo | None:
        """Something holds step-N: return it when committed and good, else move it out of the way."""
        inode = _inode(final)
        existing = self._inspect(final)
        if existing is None:
            return None
        problems: list[str] = []
        if existing.state.readable:
            problems, unreadable = self._check_files(final, existing.step)
            if unreadable:
                raise CheckpointError(f"step {existing.step} exists and cannot be verified: {'; '.join(unreadable)}")
            if not problems:
                return existing
        if existing.state.readable or existing.state is CheckpointState.CORRUPT:
            self._set_aside(final, inode, _one_line(problems or existing.problems), locked=True)
        else:
            self._move_aside(final)
        return None

    def _move_aside(self, path: Path) -> Path:
        target = self.root / f".debris-{step_dir_name(parse_step(path.name))}-{new_token()}"
        with suppress(FileNotFoundError):
            os.rename(path, target)
            _fsync(self.root, directory=True)
        return target

    def _set_aside(
        self, path: Path, inode: tuple[int, int] | None, reason: str, kind: str = "corrupt", locked: bool = False
    ) -> SetAside:
        """Rename `path` (if it is still what was judged) to `<name>.<kind>-<UTC time>`; say what was done and why."""
        now = datetime.now(timezone.utc)
        with nullcontext() if locked else self._locked():
            if inode is None or _inode(path) != inode:
                return SetAside(path.name, reason, None, kind=kind)  # already moved, or replaced since judged
            _crash_point("before_set_aside")
            target = path.with_name(f"{path.name}.{kind}-{now.strftime(_STAMP_FORMAT)}")
            os.rename(path, target)
            _fsync(self.root, directory=True)
        return SetAside(path.name, reason, target.name, str(target), kind)

    def _unrename(self, dir_fd: int, final: Path, pending: Path) -> None:
        """Move a step directory whose marker could not be written back to its temp name, for abort() to remove."""
        mine = os.fstat(dir_fd)
        with suppress(OSError):
            if os.path.lexists(final / MARKER) or _inode(final) != (mine.st_dev, mine.st_ino):
                return  # it committed after all, or it is not ours any more
            os.rename(final, pending)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive flock on the root directory; nothing where the filesystem has no flock (ENOLCK...)."""
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            with suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _one_line(problems: list[str] | tuple[str, ...], most: int = 3) -> str:
    """Evidence as one line: the first few problems, then how many more."""
    lines = [" ".join(str(p).split()) for p in problems] or ["failed verification"]
    more = f"; and {len(lines) - most} more" if len(lines) > most else ""
    return "; ".join(lines[:most]) + more


def _parse_time(value: Any) -> datetime | None:
    try:  # ISO 8601, also the basic form in tokens (20260509T073525.123456Z)
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _age(path: Path, manifest: dict | None, now: float) -> float:
    """Seconds since the youngest evidence about `path` (the rule is in `clean_debris`)."""
    evidence = []
    named = _TMP_RE.fullmatch(path.name) or _DEBRIS_RE.fullmatch(path.name)
    stamped = _STAMP_RE.search(named.group(2)) if named else None
    for recorded in (stamped and stamped.group(0), (manifest or {}).get("created_at")):
        if (moment := _parse_time(recorded)) is not None:
            evidence.append(moment.timestamp())
    return now - max([*evidence, _tree(path)[1]])


def _clean_relpath(relpath: str) -> str:
    if not isinstance(relpath, str) or not relpath or "\x00" in relpath:
        raise CheckpointError(f"checkpoint file name must be a non-empty relative path, got {relpath!r}")
    pure = PurePosixPath(relpath)
    if pure.is_absolute() or any(part in ("..", ".") for part in relpath.split("/")):
        raise CheckpointError(f"checkpoint file name must stay inside the checkpoint, got {relpath!r}")
    if pure.as_posix() in _RESERVED:
        raise CheckpointError(f"{relpath} is the protocol's own file; pick another name")
    return pure.as_posix()


def _walk(root: Path) -> tuple[list[str], list[Path]]:
    """(relative paths of the regular files, directories from root down); links and devices are refused."""
    files, dirs, stack = [], [], [root]
    while stack:
        dirs.append(stack.pop())
        for entry in os.scandir(dirs[-1]):
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                files.append(Path(entry.path).relative_to(root).as_posix())
            else:
                raise CheckpointError(f"{entry.path} is not a regular file or directory; checkpoints hold files only")
    return sorted(files), sorted(dirs, key=lambda d: len(d.parts))


def _hash_file(path: Path, fsync: bool = False) -> tuple[int, str]:
    sha, size, buffer = hashlib.sha256(), 0, bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            sha.update(view[:n])
            size += n
        if fsync:
            os.fsync(f.fileno())
    return size, sha.hexdigest()


def _write_durably(path: Path | str, data: bytes, dir_fd: int | None = None, crash_point: str = "") -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        _crash_point(crash_point)
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(directory: int | Path, name: str, body: dict) -> None:
    """Write `name` in a directory (a path or a descriptor) whole or not at all, and make it durable."""
    dir_fd = directory if isinstance(directory, int) else os.open(directory, _DIR_FLAGS)
    try:
        _write_durably(f"{name}.tmp", json.dumps(body).encode() + b"\n", dir_fd, f"after_{name}_tmp_write")
        _crash_point(f"before_{name}_rename")
        os.rename(f"{name}.tmp", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        _crash_point(f"after_{name}_rename")
        os.fsync(dir_fd)
    finally:
        if not isinstance(directory, int):
            os.close(dir_fd)


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, _DIR_FLAGS if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if not directory or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # some filesystems cannot
            raise
    finally:
        os.close(fd)


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        return os.lstat(path).st_dev, os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def _read(path: Path) -> tuple[bytes | None, dict | None]:
    """(the file's bytes, None when absent; its content when that is a JSON object)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except IsADirectoryError:
        return b"", None
    with suppress(ValueError, UnicodeDecodeError):
        value = json.loads(data)
        return data, value if isinstance(value, dict) else None
    return data, None


def _marker_problems(step: int | None, marker: dict | None, manifest_bytes: bytes | None, manifest: dict | None
                     ) -> tuple[str, ...]:
    expected = (marker or {}).get("manifest_sha256")
    actual = hashlib.sha256(manifest_bytes).hexdigest() if manifest_bytes is not None else None
    if marker is None:
        return (f"{MARKER} is not a JSON object (torn or garbage marker)",)
    if not isinstance(expected, str) or not _SHA256_RE.fullmatch(expected):
        return (f"{MARKER} has no valid manifest_sha256",)
    if actual != expected:
        return (f"{MARKER} names manifest {expected[:12]}… but {MANIFEST} is {(actual or 'missing')[:12]}…",)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return (f"{MANIFEST} is not a JSON object with a files table",)
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        return (f"{MANIFEST} says step {manifest.get('step')!r}, the directory says {step}",)
    return ()


def _tree(path: Path) -> tuple[int, float]:
    """(bytes in the files under path, the newest mtime of path and anything under it)."""
    size, newest = 0, float("-inf")
    with suppress(FileNotFoundError):
        newest = os.lstat(path).st_mtime
    for dirpath, dirnames, filenames in os.walk(path):
        for name in ["", *dirnames, *filenames]:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            size += st.st_size if stat.S_ISREG(st.st_mode) else 0
            newest = max(newest, st.st_mtime)
    return size, newest


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
