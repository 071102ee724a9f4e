"""Runs a script recorded on its own (`trackway.init()` alone), waiting in `$TRACKWAY_HOME/pending/` until the ledger takes them.

The script writes its whole receipt to a pending file when it starts, so that a ledger that is
down for the script's whole life loses nothing: the next process that reaches the ledger (the
script's own ingester, or any `trackway` command) registers it, then removes the file.
"""

from __future__ import annotations

import base64
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from trackway.ledger.blobs import put_blob
from trackway.ledger.records import insert_attempt, insert_run
from trackway.ledger.schema import runs
from trackway.ledger.store import Ledger

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


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__} in a pending registration")


def register_pending(ledger: Ledger, path: Path) -> bool:
    """Register the run in `path` (once: a run already in the ledger is left as it is); remove the file."""
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    blobs = {kind: base64.b64decode(text) if text else None for kind, text in payload["blobs"].items()}
    run = {**payload["run"], "created_at": datetime.fromisoformat(payload["run"]["created_at"])}
    attempt = {**payload["attempt"], "started_at": datetime.fromisoformat(payload["attempt"]["started_at"])}
    with ledger.write() as conn:
        if conn.execute(select(runs.c.run_id).where(runs.c.run_id == run["run_id"])).first() is None:
            shas = {kind: put_blob(conn, data, kind) if data is not None else None for kind, data in blobs.items()}
            insert_run(
                conn,
                {**run, "config_sha256": shas.get("config"), "code_dirty_sha256": shas.get("git_diff")},
            )
            insert_attempt(
                conn,
                {
                    **attempt,
                    "config_sha256": shas.get("config"),
                    "environment_sha256": shas.get("environment"),
                    "code_dirty_sha256": shas.get("git_diff"),
                },
            )
    path.unlink(missing_ok=True)
    return True


def register_all_pending(ledger: Ledger, home: Path) -> int:
    """Register every run waiting under `home`; return how many were registered."""
    directory = home / PENDING_DIR
    if not directory.is_dir():
        return 0
    return sum(register_pending(ledger, path) for path in sorted(directory.glob("*.json")))
