"""What the supervisor noticed about an attempt, kept as attempt events of its own rank, once per kind.

Each write locks the attempt first (ledger/attempt_lock.py): two processes noting the same attempt
at once (a supervisor and a command's reconciling tick) would otherwise both find the kind missing
and take the same next number, and one of them would fail on the event's key.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, func, select

from trackway.ledger.attempt_lock import lock_attempt
from trackway.ledger.event_kinds import QUEUED_EVENT, SUPERVISOR_RANK

__all__ = ["QUEUED_EVENT", "SUPERVISOR_RANK", "add_supervisor_event", "set_supervisor_event", "supervisor_event"]
from trackway.ledger.reader import Reader
from trackway.ledger.schema import attempt_events


def add_supervisor_event(conn: Connection, attempt_id: str, kind: str, payload: dict[str, Any]) -> bool:
    """Record what the supervisor noticed about an attempt, once per kind; False if already recorded."""
    lock_attempt(conn, attempt_id)
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


def set_supervisor_event(conn: Connection, attempt_id: str, kind: str, payload: dict[str, Any]) -> bool:
    """Record what the supervisor notices now about an attempt, replacing what it noticed before under `kind`
    (a queue's reason that changes: Priority, then Resources); False if it said the same already."""
    lock_attempt(conn, attempt_id)
    mine = (attempt_events.c.attempt_id == attempt_id) & (attempt_events.c.rank == SUPERVISOR_RANK)
    row = conn.execute(select(attempt_events.c.seq, attempt_events.c.payload)
                       .where(mine, attempt_events.c.kind == kind)).first()
    if row is None:
        return add_supervisor_event(conn, attempt_id, kind, payload)
    said = json.loads(row.payload)
    if all(said.get(key) == value for key, value in payload.items()):
        return False
    now = datetime.now(timezone.utc)
    conn.execute(attempt_events.update().where(mine, attempt_events.c.seq == row.seq).values(
        at=now, payload=json.dumps({"kind": kind, "t": now.timestamp(), **payload})))
    return True


def supervisor_event(conn: Connection, attempt_id: str, kind: str) -> dict[str, Any] | None:
    """What the supervisor recorded about an attempt under `kind`, or None."""
    return Reader.over(conn).supervisor_event(attempt_id, kind)
