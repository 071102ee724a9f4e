"""Reconciling the ledger's checkpoint rows from storage, which is the truth.

Storage decides every state: what storage holds is written as it is; a row whose directory
is gone becomes `deleted`. The attempt that wrote a checkpoint comes from its manifest.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import select, update

from trackway.checkpoints.protocol import CheckpointInfo, CheckpointState, CheckpointStore
from trackway.ledger import Ledger
from trackway.ledger.ingest import mirror_checkpoint
from trackway.ledger.schema import checkpoints


def checkpoint_root(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / run_id / "checkpoints"


def reconcile_run_checkpoints(ledger: Ledger, run_id: str, store: CheckpointStore) -> list[CheckpointInfo]:
    """Mirror `store` into the ledger for `run_id`; return what storage holds, oldest first."""
    held = store.list() if store.root.is_dir() else []
    with ledger.write() as conn:
        for info in held:
            manifest = info.manifest or {}
            mirror_checkpoint(
                conn,
                run_id,
                manifest.get("attempt_id"),
                {
                    "step": info.step,
                    "name": info.name,
                    "state": info.state.value,
                    "path": str(info.path),
                    "size_bytes": info.size_bytes,
                    "parent": manifest.get("parent"),
                    "metrics": manifest.get("metrics"),
                    "committed_at": info.committed_at,
                },
            )
        steps = {info.step for info in held}
        gone = [
            step
            for step in conn.execute(select(checkpoints.c.step).where(checkpoints.c.run_id == run_id)).scalars()
            if step not in steps
        ]
        if gone:
            conn.execute(
                update(checkpoints)
                .where(checkpoints.c.run_id == run_id, checkpoints.c.step.in_(gone))
                .values(state=CheckpointState.DELETED.value, updated_at=datetime.now(timezone.utc))
            )
    return held
