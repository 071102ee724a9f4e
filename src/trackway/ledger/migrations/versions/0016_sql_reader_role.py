"""`trackway sql` on PostgreSQL runs as a role that may only read the ledger (see ledger/sql/readonly.py):
SELECT on its tables and views but api_tokens, which holds the server's token names, roles and digests.

A superuser owner makes `trackway_reader` (one for every ledger of the cluster: only superusers and
its members may become it); an owner with CREATEROLE makes `trackway_reader_<database>` and is
granted it; an owner with neither is told so, and docs/guide/sql.md gives a database administrator the
GRANTs to run. Role creation is idempotent and survives another database's migration creating the
same role at the same moment. Nothing changes on SQLite.

A superuser session can leave any role it set; one statement per transaction leaves two ways to do
so in one statement, both revoked from PUBLIC here, in this database only: `set_config('role', …)`
and a DO block (plpgsql). The owner keeps both (a superuser needs no grant).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

import sys

from alembic import op
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_SET_CONFIG = "pg_catalog.set_config(text, text, boolean)"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    owner = _owner(bind)
    role = _reader_role(bind, owner)
    if role is None:
        return
    _grant_reads(bind, role)
    if owner["superuser"]:
        _run(bind, f"REVOKE EXECUTE ON FUNCTION {_SET_CONFIG} FROM PUBLIC")
        if _has_plpgsql(bind):
            _run(bind, "REVOKE USAGE ON LANGUAGE plpgsql FROM PUBLIC")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    owner = _owner(bind)
    schema = _quoted(bind, owner["schema"])
    for role in _existing(bind, _names(owner["database"])):
        quoted = _quoted(bind, role)
        _run(bind, f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} REVOKE SELECT ON TABLES FROM {quoted}")
        for relation in _ledger_relations(bind):
            _run(bind, f"REVOKE SELECT ON {schema}.{_quoted(bind, relation)} FROM {quoted}")
    if owner["superuser"]:
        _run(bind, f"GRANT EXECUTE ON FUNCTION {_SET_CONFIG} TO PUBLIC")
        if _has_plpgsql(bind):
            _run(bind, "GRANT USAGE ON LANGUAGE plpgsql TO PUBLIC")


def _owner(bind: Connection) -> dict:
    row = bind.execute(text(
        "SELECT current_user AS name, current_database() AS database, current_schema() AS schema, "
        "rolsuper AS superuser, rolcreaterole AS createrole FROM pg_roles WHERE rolname = current_user"
    )).mappings().one()  # fmt: skip
    return dict(row)


def _names(database: str) -> tuple[str, str]:
    from trackway.ledger.sql.readonly import reader_role_names

    return reader_role_names(database)


def _reader_role(bind: Connection, owner: dict) -> str | None:
    """The reader role, created and granted to the owner if need be; None (said on stderr) when it cannot be."""
    own, shared = _names(owner["database"])
    existing = _existing(bind, (own, shared))
    if own in existing:
        role = own
    elif owner["superuser"]:
        role = shared
    elif owner["createrole"]:
        role = own
    else:
        role = None
    if role is None:
        _say(f"cannot create role {own} (user {owner['name']} may not create roles); `trackway sql` refuses to run "
             "until a database administrator creates it: see docs/guide/sql.md, \"trackway sql on PostgreSQL\"")
        return None
    if role not in existing:
        _create_role(bind, role)
    if not owner["superuser"] and not _is_member(bind, role):
        if not _try(bind, f"GRANT {_quoted(bind, role)} TO CURRENT_USER"):
            _say(f"cannot grant role {role} to {owner['name']}; a database administrator runs "
                 f"GRANT {role} TO {owner['name']} (docs/guide/sql.md, \"trackway sql on PostgreSQL\")")
    return role


def _create_role(bind: Connection, role: str) -> None:
    # Roles are the cluster's: another database's migration may create the same one at this moment.
    if not _try(bind, f"CREATE ROLE {_quoted(bind, role)} NOLOGIN") and role not in _existing(bind, (role,)):
        raise RuntimeError(f"could not create role {role}")


def _grant_reads(bind: Connection, role: str) -> None:
    """USAGE on the ledger's schema; SELECT on its tables and views, now and as later migrations add them,
    except api_tokens."""
    quoted = _quoted(bind, role)
    schema = _quoted(bind, bind.execute(text("SELECT current_schema()")).scalar_one())
    _try(bind, f"GRANT USAGE ON SCHEMA {schema} TO {quoted}")  # PUBLIC usually has it already
    for relation in _ledger_relations(bind):
        _run(bind, f"GRANT SELECT ON {schema}.{_quoted(bind, relation)} TO {quoted}")
    _run(bind, f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT ON TABLES TO {quoted}")
    # Not the server's API tokens (names, roles, digests): any `read` token may query through the reader.
    if "api_tokens" in _ledger_relations(bind):
        _run(bind, f"REVOKE SELECT ON {schema}.api_tokens FROM {quoted}")


def _ledger_relations(bind: Connection) -> list[str]:
    """The tables and views the ledger's owner made in its schema (not whatever else shares the schema)."""
    return list(bind.execute(text(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
        "AND c.relkind IN ('r', 'v', 'm', 'p') AND pg_get_userbyid(c.relowner) = current_user ORDER BY c.relname"
    )).scalars())  # fmt: skip


def _existing(bind: Connection, names) -> list[str]:
    return list(bind.execute(text("SELECT rolname FROM pg_roles WHERE rolname = ANY(:names)"),
                             {"names": list(names)}).scalars())


def _is_member(bind: Connection, role: str) -> bool:
    return bind.execute(text("SELECT pg_has_role(current_user, :role, 'MEMBER')"), {"role": role}).scalar_one()


def _has_plpgsql(bind: Connection) -> bool:
    return bind.execute(text("SELECT EXISTS (SELECT 1 FROM pg_language WHERE lanname = 'plpgsql')")).scalar_one()


def _try(bind: Connection, statement: str) -> bool:
    """Run `statement` in a savepoint: False, with the transaction still usable, when the server refuses it."""
    savepoint = bind.begin_nested()
    try:
        _run(bind, statement)
    except DBAPIError:
        savepoint.rollback()
        return False
    savepoint.commit()
    return True


def _run(bind: Connection, statement: str) -> None:
    # Straight to the driver, unparsed: a quoted name may hold a colon or a percent sign.
    bind.exec_driver_sql(statement, execution_options={"no_parameters": True})


def _quoted(bind: Connection, name: str) -> str:
    return bind.dialect.identifier_preparer.quote_identifier(name)


def _say(line: str) -> None:
    print(f"trackway: ledger migration 0016: {line}", file=sys.stderr)
