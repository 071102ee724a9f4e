"""Runs a script recorded on its own (`trackway.init()` alone), waiting in `$TRACKWAY_HOME/pending/` until the ledger takes them.

The script writes its whole receipt to a pending file when it starts, so that a ledger that is
down for the script's whole life loses nothing: the next process that reaches the ledger (the
script's own ingester, or any `trackway` command) registers it, then removes the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from trackway.ledger.blobs import put_blob
from trackway.ledger.records import insert_attempt, insert_run
from trackway.ledger.schema import runs
from trackway.ledger.store import Ledger
from trackway.pending import PENDING_DIR, read_pending
from trackway.receipts.submitted_config import recorded


def register_pending(ledger: Ledger, path: Path) -> bool:
    """Register the run in `path` (once: a run already in the ledger is left as it is); remove the file."""
    try:
        pending = read_pending(path)
    except FileNotFoundError:
        return False
    run, attempt, blobs = pending["run"], pending["attempt"], pending["blobs"]
    with ledger.write() as conn:
        if conn.execute(select(runs.c.run_id).where(runs.c.run_id == run["run_id"])).first() is None:
            shas = {kind: put_blob(conn, _recorded(kind, data), kind) if data is not None else None
                    for kind, data in blobs.items()}
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


def _recorded(kind: str, data: bytes) -> bytes:
    """A blob as the ledger may hold it: the config the script gave `init()` with its secret values masked (its
    values as given stay in the run's own config.json)."""
    return recorded(json.loads(data)) if kind == "config" else data


def register_all_pending(ledger: Ledger, home: Path) -> int:
    """Register every run waiting under `home`; return how many were registered."""
    directory = home / PENDING_DIR
    if not directory.is_dir():
        return 0
    return sum(register_pending(ledger, path) for path in sorted(directory.glob("*.json")))
