"""What the supervisor noticed about an attempt, kept as attempt events of its own rank, once per kind."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, func, select

from trackway.ledger.schema import attempt_events

SUPERVISOR_RANK = -1  # attempt_events rows the supervisor wrote, not a training process


def add_supervisor_event(conn: Connection, attempt_id: str, kind: str, payload: dict[str, Any]) -> bool:
    """Record what the supervisor noticed about an attempt, once per kind; False if already recorded."""
    mine = (attempt_events.c.attempt_id == attempt_id) & (attempt_events.c.rank == SUPERVISOR_RANK)
    if conn.execute(select(attempt_events.c.seq).where(mine, attempt_events.c.kind == kind)).first() is not None:
        return False
    seq = conn.execute(select(func.coalesce(func.max(attempt_events.c.seq), -1)).where(mine)).scalar_one() + 1
    now = datetime.now(timezone.utc)
    conn.execute(
        attempt_events.insert().values(
            attempt_id=attempt_id, rank=SUPERVISOR_RANK, seq=seq, kind=kind, at=now,
            payload=json.dumps({"kind": kind, "t": now.timestamp(), **payload}),
        )
    )
    return True
