"""A run and its first attempt with a spool directory: what tests of ingesting a spool start from."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from trackway.ledger.records import get_attempt, insert_attempt, insert_run


def attempt_with_spool(ledger, state_dir: Path, run_id: str = "rspool") -> dict:
    """A run and its first attempt whose spool is `state_dir/spool`."""
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id=run_id, project="p", kind="full", state="running", command="[]",
                              workdir=str(state_dir), resource="local", executor="local", gpus=0, created_at=now))
        attempt_id = insert_attempt(conn, dict(run_id=run_id, attempt_number=1, state="running", executor="local",
                                               state_dir=str(state_dir), log_path=str(state_dir / "output.log"),
                                               gpu_count=0))
    (state_dir / "spool").mkdir(parents=True, exist_ok=True)
    with ledger.read() as conn:
        return get_attempt(conn, attempt_id)
