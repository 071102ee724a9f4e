"""Where checkpoints lie on a filesystem: the names under a run's root, the states, and the protocol's errors.

The lowest module of the checkpoint protocol (layout ← durable ← verify ← recover ← write ← store):
what every other part names. Storage is the truth; the ledger only mirrors it. Under a run's
checkpoint root:

    .tmp-step-00001234-<token>/        being written (PendingCheckpoint); never read
    step-00001234/                     payload files, MANIFEST.json, COMMITTED [, SUPERSEDED]
    step-00001234.corrupt-<UTC time>/  committed-looking, failed verification: set aside, never deleted
    step-00001234.refused-<UTC time>/  verified, but its loader refused the content (a pickle that runs code)
    .debris-step-00001234-<token>/     an uncommitted step directory moved out of a new writer's way

    writing ──commit──► committed ──supersede──► superseded ──delete──► deleted ──► (gone)
       └─ abandoned: debris     └── fails verification ──┴──► corrupt ──► set aside
                                └── refused by the loader ──────────────────► set aside

How a checkpoint gets there is in write.py (writing → committed), how it is judged in verify.py,
how it is found, set aside, removed and cleaned up in recover.py; store.py's CheckpointStore is
the one object callers hold.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

from trackway.errors import TrackwayError

MANIFEST = "MANIFEST.json"
MARKER = "COMMITTED"
SUPERSEDED_MARK = "SUPERSEDED"
RESERVED = frozenset({MANIFEST, MARKER, SUPERSEDED_MARK, MARKER + ".tmp", SUPERSEDED_MARK + ".tmp"})

_STEP_RE = re.compile(r"step-(\d+)", re.ASCII)
TMP_RE = re.compile(r"\.tmp-step-(\d+)-(.+)", re.ASCII)
DEBRIS_RE = re.compile(r"\.debris-step-(\d+)-(.+)", re.ASCII)
SET_ASIDE_RE = re.compile(r"(step-(\d+))\.(corrupt|refused)-(\d{8}T\d{6}\.\d{6}Z)", re.ASCII)
TOKEN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
STAMP_RE = re.compile(r"\d{8}T\d{6}\.\d{6}Z", re.ASCII)  # what new_token() starts with
STAMP_FORMAT = "%Y%m%dT%H%M%S.%fZ"
SHA256_RE = re.compile(r"[0-9a-f]{64}", re.ASCII)
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)

# Fault injection for the kill tests: TRACKWAY_CHECKPOINT_CRASH_AT=<point>[@n] SIGKILLs the process the
# n-th time it passes that point; unset, a point costs one comparison.
CRASH_POINTS = (
    "mid_write", "after_payload_fsync", "after_manifest", "before_rename", "after_rename",
    "after_COMMITTED_tmp_write", "before_COMMITTED_rename", "after_COMMITTED_rename", "after_commit",
    "after_SUPERSEDED_rename", "delete_after_marker", "delete_mid_files", "clean_mid", "before_set_aside",
)
_crash_at = os.environ.get("TRACKWAY_CHECKPOINT_CRASH_AT") or None
_crash_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    if _crash_at is not None and _crash_at.partition("@")[0] == name:
        _crash_hits[name] = _crash_hits.get(name, 0) + 1
        if _crash_hits[name] >= int(_crash_at.partition("@")[2] or 1):
            os.kill(os.getpid(), signal.SIGKILL)


class CheckpointError(TrackwayError):
    """A checkpoint could not be written, committed, verified or removed; the message says which and why."""


class CheckpointRefused(CheckpointError):
    """A committed checkpoint whose content the safe loader refused (it would run code): set it aside, never load it."""


class CheckpointCorrupt(CheckpointError):
    """A file read for loading does not match its manifest entry (`problems` says how): set it aside, load nothing."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


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
    match = SET_ASIDE_RE.fullmatch(name)
    return (match.group(1), int(match.group(2))) if match else None


def new_token() -> str:
    """A temp-directory token that records when it was made (the debris cleaner dates it by this)."""
    return f"{datetime.now(timezone.utc).strftime(STAMP_FORMAT)}-{secrets.token_hex(4)}"


def clean_relpath(relpath: str) -> str:
    if not isinstance(relpath, str) or not relpath or "\x00" in relpath:
        raise CheckpointError(f"checkpoint file name must be a non-empty relative path, got {relpath!r}")
    pure = PurePosixPath(relpath)
    if pure.is_absolute() or any(part in ("..", ".") for part in relpath.split("/")):
        raise CheckpointError(f"checkpoint file name must stay inside the checkpoint, got {relpath!r}")
    if pure.as_posix() in RESERVED:
        raise CheckpointError(f"{relpath} is the protocol's own file; pick another name")
    return pure.as_posix()


def one_line(problems: list[str] | tuple[str, ...], most: int = 3) -> str:
    """Evidence as one line: the first few problems, then how many more."""
    lines = [" ".join(str(p).split()) for p in problems] or ["failed verification"]
    more = f"; and {len(lines) - most} more" if len(lines) > most else ""
    return "; ".join(lines[:most]) + more


def parse_time(value: Any) -> datetime | None:
    try:  # ISO 8601, also the basic form in tokens (20260509T073525.123456Z)
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
