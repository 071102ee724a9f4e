"""The migrations and schema.py describe the same tables: a drift here means a migration is missing."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from trackway.ledger.migrate import head_revision
from trackway.ledger.revision import HEAD_REVISION
from trackway.ledger.schema import metadata


def test_migrated_schema_matches_schema_py(ledger):
    with ledger.read() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    assert diff == [], (
        "schema.py and the migrations disagree; write a migration under "
        f"src/trackway/ledger/migrations/versions for: {diff}"
    )


def test_head_constant_names_the_newest_migration():
    assert HEAD_REVISION == head_revision(), "set HEAD_REVISION in ledger/revision.py to the new migration's id"
