"""One attempt's writers, one at a time: the attempt's row locked until the writing transaction ends.

On PostgreSQL two processes (a supervisor, a command's reconciling tick, a second supervisor) may
write about the same attempt at once; what each writes next depends on what is there (a spool
cursor, the next event number), so the second must read after the first commits, not before. On
SQLite a write transaction holds the whole database already and the lock is a no-op.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from trackway.ledger.schema import attempts


def lock_attempt(conn: Connection, attempt_id: str) -> None:
    """Make a concurrent writer of this attempt wait for this transaction to end (PostgreSQL's row lock)."""
    conn.execute(select(attempts.c.attempt_id).where(attempts.c.attempt_id == attempt_id).with_for_update())
