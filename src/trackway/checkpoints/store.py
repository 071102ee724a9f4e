"""CheckpointStore: the checkpoints under one run's root directory, the one object the protocol's callers hold.

The top of the checkpoint protocol (layout ← durable ← verify ← recover ← write ← store). Each
method is one job of a module below it: `begin` writes (write.py), `verify` verifies (verify.py),
the rest find, set aside, remove and clean up (recover.py). The layout under the root and the
states a step directory goes through are in layout.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path

from trackway.checkpoints import recover, write
from trackway.checkpoints.layout import CheckpointInfo
from trackway.checkpoints.recover import SetAside
from trackway.checkpoints.verify import verify
from trackway.checkpoints.write import PendingCheckpoint


class CheckpointStore:
    """The checkpoints under one root directory (one run): begin, list, verify, supersede, delete, clean."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def begin(
        self, step: int, *, run_id: str | None = None, attempt_id: str | None = None, parent: str | None = None,
        token: str | None = None,
    ) -> PendingCheckpoint:
        """Start writing `step` in `.tmp-step-N-<token>`, shared by every process given the token (see new_token)."""
        return write.begin(self.root, step, run_id=run_id, attempt_id=attempt_id, parent=parent, token=token)

    def list(self, verify_files: bool = False) -> list[CheckpointInfo]:
        """Every step-N directory, by step number; with verify_files, one whose files fail shows as corrupt."""
        return recover.list_checkpoints(self.root, verify_files)

    def get(self, step: int) -> CheckpointInfo | None:
        return recover.get(self.root, step)

    def latest_committed(self, verify_files: bool = True) -> CheckpointInfo | None:
        """The resume target: the highest step that is committed (or superseded) and verifies (see pick_latest)."""
        return self.pick_latest(verify_files)[0]

    def pick_latest(
        self, verify_files: bool = True, deferred: Callable[[CheckpointInfo], Collection[str]] | None = None
    ) -> tuple[CheckpointInfo | None, list[SetAside]]:
        """(the resume target, what was set aside on the way to it, newest first); see recover.pick_latest."""
        return recover.pick_latest(self.root, verify_files, deferred)

    def set_aside(self, info: CheckpointInfo, reason: str, kind: str = "refused") -> SetAside:
        """Move a checkpoint that must never be read again out of the resume path; see recover.set_aside."""
        return recover.set_aside(self.root, info, reason, kind)

    def set_aside_list(self) -> list[CheckpointInfo]:
        """Every set-aside directory, by step then name, with what a look without hashing shows is wrong."""
        return recover.set_aside_list(self.root)

    def verify(self, info: CheckpointInfo) -> list[str]:
        """What is wrong with a checkpoint as it is on disk now (marker, manifest, every file); [] when good."""
        return verify(info)

    def supersede(self, info: CheckpointInfo) -> CheckpointInfo:
        """Mark a committed checkpoint superseded (it stays readable until deleted)."""
        return recover.supersede(info)

    def delete(self, info: CheckpointInfo) -> None:
        """Remove a committed or superseded checkpoint: COMMITTED first, then the files, then the directory."""
        recover.delete(self.root, info)

    def debris(self) -> list[Path]:
        """Leftovers nothing will read: temp and moved-aside directories, step dirs without a verifying marker."""
        return recover.debris(self.root)

    def clean_debris(self, min_age_s: float = 3600.0) -> list[Path]:
        """Remove debris at least `min_age_s` old and return it; see recover.clean_debris for how age is told."""
        return recover.clean_debris(self.root, min_age_s)
