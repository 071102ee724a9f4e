"""The pending-registration file: a standalone script's whole receipt, written before the ledger is reached.

    $TRACKWAY_HOME/pending/<run_id>.json   {"run": {...}, "attempt": {...}, "blobs": {kind: base64 | null}}

The SDK writes it at `init()` (this module imports no SQLAlchemy, so that `init()` stays quick);
`trackway.ledger.registration` registers it in the ledger and removes it.
"""

from __future__ import annotations

import base64
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

PENDING_DIR = "pending"


def pending_path(home: Path, run_id: str) -> Path:
    return home / PENDING_DIR / f"{run_id}.json"


def write_pending(home: Path, run: dict[str, Any], attempt: dict[str, Any], blobs: dict[str, bytes | None]) -> Path:
    """Write a run's registration durably (tmp file, fsync, rename)."""
    path = pending_path(home, run["run_id"])
    # The receipt holds the config, the command line and the git diff, any of which may carry a
    # credential: only the owner may read it, from the first byte written.
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    payload = {
        "run": run,
        "attempt": attempt,
        "blobs": {kind: base64.b64encode(data).decode() if data is not None else None for kind, data in blobs.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a leftover keeps its old mode through O_CREAT; O_EXCL makes a new file
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
        json.dump(payload, f, default=_iso)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_pending(path: Path) -> dict[str, Any]:
    """A pending file's run, attempt (their times as datetimes) and blobs (as bytes); FileNotFoundError when gone."""
    payload = json.loads(path.read_text())
    return {
        "run": {**payload["run"], "created_at": datetime.fromisoformat(payload["run"]["created_at"])},
        "attempt": {**payload["attempt"], "started_at": datetime.fromisoformat(payload["attempt"]["started_at"])},
        "blobs": {kind: base64.b64decode(text) if text else None for kind, text in payload["blobs"].items()},
    }


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__} in a pending registration")
