"""Alembic migrations applied on first use, safely when several processes open a fresh ledger at once."""

from __future__ import annotations

from functools import lru_cache

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from trackway.ledger.store import Ledger

SCRIPT_LOCATION = "trackway.ledger:migrations"
# Any constant works; it only has to be the same for every trackway process.
_PG_MIGRATION_LOCK = 0x7472_6B77


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    return config


@lru_cache(maxsize=1)
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def upgrade_to_head(ledger: Ledger) -> None:
    """Bring the schema to the newest revision; cheap when it already is."""
    with ledger.read() as conn:
        if current_revision(conn) == head_revision():
            return
    with ledger.write() as conn:
        if ledger.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        # Another process may have migrated while we waited for the write lock.
        if current_revision(conn) == head_revision():
            return
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
