"""Alembic migrations applied on first use, safely when several processes open a fresh ledger at once.

Every trackway command opens the ledger, so the up-to-date check must be cheap: it reads
`alembic_version` with one query and compares it with `HEAD_REVISION`, importing Alembic
only when there is something to migrate. `tests/ledger/test_schema.py` keeps the constant
(in `revision.py`, which `reader.py` reads a current ledger with, without SQLAlchemy) equal to the newest migration.
"""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

from trackway.ledger.revision import HEAD_REVISION
from trackway.ledger.store import Ledger

__all__ = ["upgrade_to_head"]

SCRIPT_LOCATION = "trackway.ledger:migrations"
# Any constant works; it only has to be the same for every trackway process.
_PG_MIGRATION_LOCK = 0x7472_6B77


def alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    return config


def head_revision() -> str:
    """The newest revision as Alembic computes it from the migration files."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade_to_head(ledger: Ledger) -> None:
    """Bring the schema to the newest revision; one small query when it already is."""
    with ledger.read() as conn:
        if current_revision(conn) == HEAD_REVISION:
            return
    from alembic import command

    with ledger.write() as conn:
        if ledger.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        # Another process may have migrated while we waited for the write lock.
        if current_revision(conn) == HEAD_REVISION:
            return
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
