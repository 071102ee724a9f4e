"""Recovering from what storage holds: listing, the resume target, setting aside, removing, and cleaning up debris.

The resume target is the highest step that is committed (or superseded) and verifies (verify.py);
anything committed-looking above it that fails is set aside on the way (`pick_latest`).

A set-aside directory is left exactly as it was found (it is evidence). Why it was set aside is
told to whoever set it aside (`pick_latest`, `set_aside`), which records it (the SDK's
`checkpoint_restored` event); `set_aside_list()` can only say what a cheap look shows.

Deletion removes COMMITTED first, so that a delete interrupted anywhere leaves a `deleted`
directory, which nothing reads and `clean_debris` finishes; `clean_debris` also removes what
writers abandoned (temp directories, debris, step directories without a verifying marker).
Every function takes the run's checkpoint root; store.py's CheckpointStore calls them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Collection
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from trackway.checkpoints.durable import fsync, inode_of, publish, root_lock, tree, walk
from trackway.checkpoints.layout import (
    DEBRIS_RE,
    MARKER,
    SET_ASIDE_RE,
    STAMP_FORMAT,
    STAMP_RE,
    SUPERSEDED_MARK,
    TMP_RE,
    CheckpointError,
    CheckpointInfo,
    CheckpointState,
    crash_point,
    new_token,
    one_line,
    parse_set_aside,
    parse_step,
    parse_time,
    step_dir_name,
)
from trackway.checkpoints.verify import check_files, inspect_dir, size_problems, verify

_LEFTOVER = (CheckpointState.WRITING, CheckpointState.DELETED)


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


def list_checkpoints(root: Path, verify_files: bool = False) -> list[CheckpointInfo]:
    """Every step-N directory, by step number; with verify_files, one whose files fail shows as corrupt."""
    infos = []
    for info in filter(None, map(inspect_dir, _step_dirs(root))):
        problems = verify(info) if verify_files and info.state.readable else None
        if problems:  # only shown as corrupt: latest_committed is what sets one aside
            info = replace(info, state=CheckpointState.CORRUPT, problems=tuple(problems))
        infos.append(info)
    return sorted(infos, key=lambda i: (i.step, i.name))


def get(root: Path, step: int) -> CheckpointInfo | None:
    return inspect_dir(root / step_dir_name(step)) or next(
        (i for i in map(inspect_dir, _step_dirs(root)) if i is not None and i.step == step), None
    )


def pick_latest(
    root: Path, verify_files: bool = True, deferred: Callable[[CheckpointInfo], Collection[str]] | None = None
) -> tuple[CheckpointInfo | None, list[SetAside]]:
    """(the resume target, what was set aside on the way to it, newest first).

    Anything committed-looking above the target that fails verification (bad marker; missing,
    truncated or altered file) is set aside as `step-N.corrupt-<UTC time>`, never deleted. A file
    unreadable for another reason (EIO, permissions) raises instead: that is no proof of corruption.
    `deferred(info)` names files whose hash the caller checks while it reads them (size only here):
    the caller sets the checkpoint aside as corrupt when one fails.
    """
    skipped: list[SetAside] = []
    for listed in reversed(list_checkpoints(root)):
        inode = inode_of(listed.path)  # taken before judging, so that what is set aside is what was judged
        info = inspect_dir(listed.path)
        if info is None or not (info.state.readable or info.state is CheckpointState.CORRUPT):
            continue
        later = deferred(info) if deferred is not None and info.state.readable else ()
        problems, unreadable = check_files(info.path, info.step, later) if verify_files else (info.problems, ())
        if unreadable:
            raise CheckpointError(f"cannot verify {info.path}: {'; '.join(unreadable)}")
        if not problems and not (info.manifest or {}).get("files"):
            # Committed before empty commits were refused: it verifies, and holds nothing to resume.
            problems = ["the manifest lists no file: a checkpoint with nothing in it cannot be resumed from"]
        if not problems:
            return info, skipped
        skipped.append(set_aside_path(root, info.path, inode, one_line(problems)))
    return None, skipped


def set_aside(root: Path, info: CheckpointInfo, reason: str, kind: str = "refused") -> SetAside:
    """Move a checkpoint that must never be read again out of the resume path, as `step-N.<kind>-<UTC time>`.

    For what verification cannot see: content that the loader refused. Nothing is deleted. If
    `info.path` meanwhile holds another checkpoint (a new commit of the step), it is left alone.
    """
    if kind not in ("corrupt", "refused"):
        raise CheckpointError(f"set_aside kind must be 'corrupt' or 'refused', got {kind!r}")
    inode = inode_of(info.path)
    current = inspect_dir(info.path)
    if current is None or current.manifest != info.manifest:
        return SetAside(info.name, one_line([reason]), None, kind=kind)
    return set_aside_path(root, info.path, inode, one_line([reason]), kind)


def set_aside_list(root: Path) -> list[CheckpointInfo]:
    """Every set-aside directory, by step then name, with what a look without hashing shows is wrong.

    That is the marker or a file's size when those are wrong; otherwise only "set aside as
    corrupt" (or refused): the full reason is in what set it aside recorded.
    """
    infos = []
    for path in _entries(root):
        parsed = parse_set_aside(path.name)
        if parsed is None or not path.is_dir():
            continue
        kind = SET_ASIDE_RE.fullmatch(path.name).group(3)
        seen = inspect_dir(path, parsed[1])
        if seen is None:
            continue  # removed by hand since the listing
        problems = seen.problems if seen.problems else size_problems(path, seen)
        infos.append(replace(seen, state=CheckpointState.SET_ASIDE, committed_at=None,
                             problems=(one_line(problems) if problems else f"set aside as {kind}",)))
    return sorted(infos, key=lambda i: (i.step, i.name))


def supersede(info: CheckpointInfo) -> CheckpointInfo:
    """Mark a committed checkpoint superseded (it stays readable until deleted)."""
    current = inspect_dir(info.path)
    if current is None or not current.state.readable:
        raise CheckpointError(f"cannot supersede {info.name}: it is {current.state.value if current else 'gone'}")
    if current.state is CheckpointState.COMMITTED:
        publish(info.path, SUPERSEDED_MARK, {"superseded_at": datetime.now(timezone.utc).isoformat()})
    return inspect_dir(info.path) or current


def delete(root: Path, info: CheckpointInfo) -> None:
    """Remove a committed or superseded checkpoint: COMMITTED first, then the files, then the directory.

    SUPERSEDED is written first (when missing) and removed last: a delete interrupted anywhere leaves
    a `deleted` directory, which nothing reads and `clean_debris` finishes.
    """
    path, current = info.path, inspect_dir(info.path)
    if current is None:
        return
    if not (current.state.readable or current.state is CheckpointState.DELETED):
        raise CheckpointError(f"cannot delete {info.name}: it is {current.state.value}, not committed")
    if current.state is CheckpointState.COMMITTED:
        supersede(current)
    with suppress(FileNotFoundError):
        os.unlink(path / MARKER)
    fsync(path, directory=True)
    crash_point("delete_after_marker")
    _, dirs = walk(path)
    for directory in reversed(dirs):  # deepest first; the mark in the step directory stays to the end
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                os.rmdir(entry.path)
            elif not (directory == path and entry.name == SUPERSEDED_MARK):
                os.unlink(entry.path)
                crash_point("delete_mid_files")
    os.unlink(path / SUPERSEDED_MARK)
    os.rmdir(path)
    fsync(root, directory=True)


def debris(root: Path) -> list[Path]:
    """Leftovers nothing will read: temp and moved-aside directories, step dirs without a verifying marker."""
    return sorted(
        p for p in _entries(root) if TMP_RE.fullmatch(p.name) or DEBRIS_RE.fullmatch(p.name)
        or parse_step(p.name) is not None and getattr(inspect_dir(p), "state", None) in _LEFTOVER
    )


def clean_debris(root: Path, min_age_s: float = 3600.0) -> list[Path]:
    """Remove debris at least `min_age_s` old and return it; committed and corrupt ones are never touched.

    Age: an entry is as young as the youngest thing known about it — the UTC time in its name
    (tokens from `new_token()`, debris names), its manifest's created_at, and the mtimes of it and
    everything in it. A time in the future keeps it (it looks young); an mtime in the past never
    makes it older than the time we recorded (only a token without one is dated by mtimes alone).
    A `deleted` directory (an interrupted delete) is finished at any age, since no writer makes
    one; min_age_s=0 removes all debris, for when no writer can be running.
    """
    now, removed = time.time(), []
    for path in debris(root):
        info = inspect_dir(path) if parse_step(path.name) is not None else None
        finishing = info is not None and info.state is CheckpointState.DELETED
        if not finishing and min_age_s > 0 and _age(path, info.manifest if info else None, now) < min_age_s:
            continue
        doomed = path
        if info is not None:
            with root_lock(root):  # writers hold it from rename to marker, so this one's writer is gone
                again = inspect_dir(path)
                if again is None or again.state not in _LEFTOVER:
                    continue
                doomed = move_aside(root, path)
        crash_point("clean_mid")
        if doomed.is_dir():
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            doomed.unlink(missing_ok=True)
        removed.append(path)
    if removed:
        fsync(root, directory=True)
    return removed


def move_aside(root: Path, path: Path) -> Path:
    """Rename an uncommitted step directory to `.debris-step-N-<token>`, out of a writer's way."""
    target = root / f".debris-{step_dir_name(parse_step(path.name))}-{new_token()}"
    with suppress(FileNotFoundError):
        os.rename(path, target)
        fsync(root, directory=True)
    return target


def set_aside_path(
    root: Path, path: Path, inode: tuple[int, int] | None, reason: str, kind: str = "corrupt", locked: bool = False
) -> SetAside:
    """Rename `path` (if it is still what was judged) to `<name>.<kind>-<UTC time>`; say what was done and why."""
    now = datetime.now(timezone.utc)
    with nullcontext() if locked else root_lock(root):
        if inode is None or inode_of(path) != inode:
            return SetAside(path.name, reason, None, kind=kind)  # already moved, or replaced since judged
        crash_point("before_set_aside")
        target = path.with_name(f"{path.name}.{kind}-{now.strftime(STAMP_FORMAT)}")
        os.rename(path, target)
        fsync(root, directory=True)
    return SetAside(path.name, reason, target.name, str(target), kind)


def _entries(root: Path) -> list[Path]:
    return [Path(e.path) for e in os.scandir(root)] if root.is_dir() else []


def _step_dirs(root: Path) -> list[Path]:
    return [p for p in _entries(root) if parse_step(p.name) is not None]


def _age(path: Path, manifest: dict | None, now: float) -> float:
    """Seconds since the youngest evidence about `path` (the rule is in `clean_debris`)."""
    evidence = []
    named = TMP_RE.fullmatch(path.name) or DEBRIS_RE.fullmatch(path.name)
    stamped = STAMP_RE.search(named.group(2)) if named else None
    for recorded in (stamped and stamped.group(0), (manifest or {}).get("created_at")):
        if (moment := parse_time(recorded)) is not None:
            evidence.append(moment.timestamp())
    return now - max([*evidence, tree(path)[1]])
