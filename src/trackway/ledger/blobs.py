"""Content-addressed blobs: immutable snapshots stored once, keyed by the sha256 of their content."""

from __future__ import annotations

import hashlib
import zlib
from datetime import datetime, timezone

from sqlalchemy import Connection

from trackway.ledger.reader import Reader
from trackway.ledger.schema import blobs

def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def put_blob(conn: Connection, content: bytes, kind: str) -> str:
    """Store `content` unless the same bytes are already stored; return its sha256."""
    digest = sha256_hex(content)
    # Imported here: the PostgreSQL dialect module pulls in asyncio, which every CLI start would pay for.
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    statement = insert(blobs).values(
        sha256=digest,
        kind=kind,
        size=len(content),
        compression="zlib",
        content=zlib.compress(content, 6),
        created_at=datetime.now(timezone.utc),
    )
    conn.execute(statement.on_conflict_do_nothing(index_elements=["sha256"]))
    return digest


def get_blob(conn: Connection, digest: str) -> bytes:
    return Reader.over(conn).blob(digest)

