"""Alembic environment: runs migrations on the connection trackway hands over (see ledger/migrate.py)."""

from alembic import context

from trackway.ledger.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
