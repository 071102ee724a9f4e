"""`AttemptContext`: where this process stands (run, attempt, spool, checkpoints, rank), read from `TRACKWAY_*`."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AttemptContext:
    """Where this process stands: which run and attempt, where to spool and checkpoint, which rank."""

    run_id: str
    attempt_id: str
    attempt_number: int
    spool_dir: Path
    checkpoint_dir: Path
    resume_from: str | None = None
    config_path: Path | None = None
    rank: int = 0
    world_size: int = 1
    checkpoint_url: str | None = None  # the remote store checkpoints are also uploaded to (an fsspec URL)
    max_steps: int | None = None  # a test run's last step (TRACKWAY_MAX_STEPS): see `Run.should_stop`
    restore_check: bool = False  # read the first checkpoint back and compare (TRACKWAY_RESTORE_CHECK)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AttemptContext | None:
        env = os.environ if env is None else env
        attempt_id = env.get("TRACKWAY_ATTEMPT_ID")
        if not attempt_id:
            return None
        config = env.get("TRACKWAY_CONFIG")
        return cls(
            run_id=env["TRACKWAY_RUN_ID"],
            attempt_id=attempt_id,
            attempt_number=int(env.get("TRACKWAY_ATTEMPT_NUMBER", "1")),
            spool_dir=Path(env["TRACKWAY_SPOOL_DIR"]),
            checkpoint_dir=Path(env["TRACKWAY_CHECKPOINT_DIR"]),
            resume_from=env.get("TRACKWAY_RESUME_FROM") or None,
            config_path=Path(config) if config else None,
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            checkpoint_url=env.get("TRACKWAY_CHECKPOINT_URL") or None,
            max_steps=_max_steps(env.get("TRACKWAY_MAX_STEPS")),
            restore_check=env.get("TRACKWAY_RESTORE_CHECK") == "1",
        )


def _max_steps(text: str | None) -> int | None:
    """TRACKWAY_MAX_STEPS as a positive step number; None when unset or not one (said on stderr)."""
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        print(f"trackway: TRACKWAY_MAX_STEPS={text!r} is not a positive whole number; ignored", file=sys.stderr)
        return None
    return value
