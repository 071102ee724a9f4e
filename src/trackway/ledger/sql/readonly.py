"""Running one checked query read-only: `run_readonly_query`, on SQLite and on PostgreSQL as the reader role.

Three layers keep the ledger unchanged and the server's secrets unread; the database's own is the
one that holds whatever the query text hides:

1. `dialect` classifies the query by the names in `rules`: exactly one SELECT / WITH … SELECT /
   VALUES / EXPLAIN of one of those, or a read-only PRAGMA on SQLite. Writes anywhere in the tree
   (a DELETE in a CTE, SELECT … INTO, FOR UPDATE), PostgreSQL functions with side effects and the
   server's configuration and credential catalogs are refused by name, with a message that says why.
2. The database enforces it. On PostgreSQL the transaction is `READ ONLY` and runs as a role
   that may only read the ledger (`SET LOCAL ROLE`, see "The reader role" below): pg_authid,
   pg_read_file, pg_hba_file_rules and superuser-only settings are refused by the server, and
   pg_stat_activity hides other sessions' SQL, however the query reaches them (table_to_xml,
   a quoted or schema-qualified name). The query is sent over the extended protocol, which runs
   one statement at most. On SQLite, `PRAGMA query_only` plus an authorizer that allows only reads.
   Every transaction is rolled back.
3. On SQLite, what runs is sqlglot's regeneration of the parsed tree, never the raw text.

Every query runs under a time limit (`statement_timeout` on PostgreSQL, a progress handler on
SQLite, whose regular expressions are RE2's, linear in their input, so no single step can run
away) and returns at most `max_rows` rows, fetched in one bounded batch: a careless join can hold
neither the ledger's connections nor the memory of whoever asked.

The reader role (PostgreSQL). Migration 0016 creates it: `trackway_reader` when the ledger's owner
is a superuser (only superusers and the role's members can become it, so one serves every ledger
of a cluster), else `trackway_reader_<database>`, granted to the owner. It is NOLOGIN, with USAGE
on the ledger's schema and SELECT on its tables and views. A session whose user is a superuser can
leave any role again, with `SET ROLE` or `set_config('role', …)`: one statement per transaction
makes a bare SET useless, and the migration revokes from PUBLIC, in the ledger's database, the two
ways one statement could do it (set_config, and DO blocks through plpgsql). Where the owner may not
create roles, a database administrator creates it (docs/guide/sql.md, "trackway sql on PostgreSQL"); until
then a query is refused with a LedgerError naming the role to create, and never runs as the owner.
"""

from __future__ import annotations

import hashlib
import math
import re
import sqlite3
import time
import weakref
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from trackway.errors import InputError, LedgerError, LedgerUnavailable, ReadOnlyViolation
from trackway.ledger.reader import open_reader, postgres_conninfo, sqlite_file
from trackway.ledger.sql.functions import sqlite_functions
from trackway.ledger.sql.remembered import checked
from trackway.ledger.sql.rules import (
    ALLOWED, TOKENS_TABLE, first_line, is_unsafe_function, not_allowed, pragma_is_read_only, tokens_not_readable,
)  # fmt: skip

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from trackway.ledger.store import Ledger

__all__ = ["QueryResult", "run_readonly_query"]


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    executed_sql: str  # what actually ran (transpiled on SQLite)
    truncated: bool = False  # the query returned more than the rows kept


DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 24 * 3600.0
DEFAULT_MAX_ROWS = 10_000  # the API's default; the CLI's is CLI_MAX_ROWS
CLI_MAX_ROWS = 100_000  # a terminal or a CSV file: more than anyone reads, less than a laptop's memory
MAX_MAX_ROWS = 10_000_000


def run_readonly_query(
    ledger: Ledger | str, query: str, timeout_s: float = DEFAULT_TIMEOUT_S, remember_in: Path | None = None,
    max_rows: int = DEFAULT_MAX_ROWS, on_start: Callable[[], None] | None = None,
) -> QueryResult:
    """Run one read-only query; refuse anything that could change the ledger or read the server's secrets.

    `ledger` is an open Ledger or a ledger URL; a SQLite file named by URL is queried over plain
    `sqlite3`, without SQLAlchemy. With `remember_in` (a directory), a query checked once is not
    parsed again (see `remembered`). At most `max_rows` rows come back; `truncated` says there were
    more. Raises ReadOnlyViolation for writes and for the server's configuration and credentials,
    InputError for queries that do not parse, that the database rejects or that run longer than
    `timeout_s`, LedgerError for a PostgreSQL ledger without its reader role, each in one line.
    `on_start` is called as the statement starts, when its `timeout_s` starts counting (the CLI arms
    its watchdog there).
    """
    timeout_s, max_rows = check_timeout(timeout_s), check_max_rows(max_rows)
    if isinstance(ledger, str) and sqlite_file(ledger) is not None:
        sql = checked(query, "sqlite", remember_in)
        with open_reader(ledger) as reader:  # migrated if need be; one read transaction
            return _execute_sqlite(reader.conn, sql, timeout_s, ledger, max_rows, on_start)
    if isinstance(ledger, str) and postgres_conninfo(ledger) is not None:
        result = _over_libpq(ledger, query, timeout_s, remember_in, max_rows, on_start)
        if result is not None:
            return result
    if isinstance(ledger, str):
        from trackway.ledger.open import open_ledger

        opened = open_ledger(ledger)
        try:
            return run_readonly_query(opened, query, timeout_s, remember_in, max_rows, on_start)
        finally:
            opened.dispose()
    return _execute(ledger, checked(query, ledger.dialect, remember_in), timeout_s, max_rows, on_start)


def check_timeout(seconds: float) -> float:
    """The query time limit, or InputError naming --timeout: finite, above 0, at most a day."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise InputError(
            f"--timeout: expected a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f}, got {seconds!r}"
        )
    return value


def check_max_rows(rows: int) -> int:
    """The row cap, or InputError naming --max-rows: a whole number from 1 to MAX_MAX_ROWS."""
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_MAX_ROWS:
        raise InputError(f"--max-rows: expected a whole number of rows from 1 to {MAX_MAX_ROWS}, got {rows!r}")
    return rows


# --- execution --------------------------------------------------------------------------------


def _execute(
    ledger: Ledger, sql: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_rows: int = DEFAULT_MAX_ROWS,
    on_start: Callable[[], None] | None = None,
) -> QueryResult:
    """Run `sql` in a transaction the database itself keeps read-only, then roll it back."""
    if ledger.dialect == "sqlite":
        with ledger.read() as conn:  # BEGIN (deferred): the query sees one snapshot
            try:
                raw = conn.connection.dbapi_connection
                raw.execute("PRAGMA query_only=ON")
                return _execute_sqlite(raw, sql, timeout_s, ledger.engine.url, max_rows, on_start)
            finally:
                conn.rollback()
                raw.execute("PRAGMA query_only=OFF")
    return _execute_postgresql(ledger, sql, timeout_s, max_rows, on_start)


def _kept(rows: list, max_rows: int) -> tuple[list[tuple], bool]:
    """The first `max_rows` of `rows` (fetched as max_rows + 1), and whether there were more."""
    return [tuple(row) for row in rows[:max_rows]], len(rows) > max_rows


def too_slow(timeout_s: float) -> InputError:
    # Exit 2, like any query the database rejects: the ledger is fine, and the remedy is the
    # user's (a narrower query, or a longer --timeout).
    return InputError(
        f"trackway sql: the query ran longer than --timeout {timeout_s:g}s and was stopped; "
        "narrow it (a where clause, a limit) or give a longer --timeout"
    )


# How many SQLite virtual-machine steps between looks at the clock: often enough to stop within
# milliseconds of the limit, rarely enough to cost nothing measurable.
_SQLITE_PROGRESS_STEPS = 10_000


_SQLITE_ACTIONS = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in """CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER
    CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX
    DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT TRANSACTION
    UPDATE ATTACH DETACH ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE SAVEPOINT""".split()
}
_SQLITE_READS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})


def _authorize(refused: list[ReadOnlyViolation], action: int, arg1: str | None, arg2: str | None, _db, _source) -> int:
    if action == sqlite3.SQLITE_READ and (arg1 or "").lower() == TOKENS_TABLE:  # through a view too
        refused.append(tokens_not_readable())
        return sqlite3.SQLITE_DENY
    if action in _SQLITE_READS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and not is_unsafe_function((arg2 or "").lower()):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and pragma_is_read_only(arg1 or "", arg2 is not None):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master":
        # Table-valued pragmas (pragma_table_info) probe the schema table this way; IGNORE writes nothing.
        return sqlite3.SQLITE_IGNORE
    if action == sqlite3.SQLITE_PRAGMA:
        what = f"PRAGMA {arg1} with an argument" if arg2 is not None else f"PRAGMA {arg1}"
    elif action == sqlite3.SQLITE_FUNCTION:
        what = f"{arg2}()"
    else:
        what = _SQLITE_ACTIONS.get(action, f"SQLite action {action}")
    refused.append(not_allowed(what))
    return sqlite3.SQLITE_DENY


def _execute_sqlite(raw: sqlite3.Connection, sql: str, timeout_s: float, url, max_rows: int,
                    on_start: Callable[[], None] | None = None) -> QueryResult:
    """Run `sql` on `raw`, in the caller's read-only transaction, under the authorizer and the time limit."""
    refused: list[ReadOnlyViolation] = []
    failures: list[str] = []
    functions = sqlite_functions(failures)
    if on_start is not None:
        on_start()
    deadline = time.monotonic() + timeout_s
    stopped: list[bool] = []

    def past_deadline() -> int:
        if time.monotonic() > deadline:
            stopped.append(True)
            return 1  # non-zero: SQLite interrupts the statement
        return 0

    for name, arity, function in functions:
        raw.create_function(name, arity, function, deterministic=True)
    raw.set_authorizer(partial(_authorize, refused))
    raw.set_progress_handler(past_deadline, _SQLITE_PROGRESS_STEPS)
    try:
        cursor = raw.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchmany(max_rows + 1)  # what is not fetched is never computed
            columns = [column[0] for column in cursor.description or ()]
        finally:
            cursor.close()
    except sqlite3.Error as exc:
        if refused:
            raise refused[0] from None
        if failures:
            raise InputError(failures[0]) from None
        if stopped:
            raise too_slow(timeout_s) from None
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY":
            raise ReadOnlyViolation(f"trackway sql is read-only: {first_line(exc)} ({ALLOWED})") from None
        failure = _ledger_failure(exc, url)
        if failure is not None:  # a locked or damaged ledger is not the query's fault (exit 3, not 2)
            raise failure from None
        raise InputError(f"trackway sql: {first_line(exc)}") from None
    finally:
        raw.set_progress_handler(None, 0)
        raw.set_authorizer(None)
        for name, arity, _function in functions:
            raw.create_function(name, arity, None)
    kept, truncated = _kept(rows, max_rows)
    return QueryResult(columns=columns, rows=kept, executed_sql=sql, truncated=truncated)


def _ledger_failure(exc: sqlite3.Error, url):
    """A locked, full or damaged ledger as the LedgerError `store` maps it to; None for the query's own error."""
    from sqlalchemy.engine import make_url

    from trackway.ledger.store import as_ledger_error

    return as_ledger_error(exc, make_url(url) if isinstance(url, str) else url)


# --- PostgreSQL -------------------------------------------------------------------------------

SHARED_READER_ROLE = "trackway_reader"
# Roles whose members read the server's files, settings or other sessions' SQL, or signal other
# sessions: a reader in any of them would undo what running as the reader is for.
_SERVER_READING_ROLES = (
    "pg_read_server_files", "pg_write_server_files", "pg_execute_server_program", "pg_read_all_settings",
    "pg_read_all_stats", "pg_monitor", "pg_signal_backend",
)  # fmt: skip
_READER_ROLE_QUERY = """
SELECT r.rolname,
       r.rolsuper OR EXISTS (SELECT 1 FROM pg_roles p WHERE p.rolname = ANY(%(strong)s)
                             AND pg_has_role(r.oid, p.oid, 'USAGE')) AS too_strong,
       pg_has_role(session_user, r.oid, 'MEMBER') AS reachable,
       has_table_privilege(r.oid, 'training_attempts', 'SELECT') AS reads_ledger,
       has_table_privilege(r.oid, 'api_tokens', 'SELECT') AS reads_tokens
FROM pg_roles r WHERE r.rolname = ANY(%(names)s)
ORDER BY array_position(%(names)s, r.rolname::text)
"""
# What the reader role of each ledger (engine) is: looked up once per process, not once per query.
_reader_roles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reader_role_names(database: str) -> tuple[str, str]:
    """The reader role for `database`: its own (an owner that is not a superuser makes or is given this
    one), then the one a superuser owner makes for every ledger of the cluster."""
    own = f"{SHARED_READER_ROLE}_{database}"
    if len(own.encode()) > 63:  # PostgreSQL's limit on a name
        own = f"{SHARED_READER_ROLE}_{hashlib.sha256(database.encode()).hexdigest()[:16]}"
    return own, SHARED_READER_ROLE


def _reader_role(ledger: Ledger, cursor) -> str:
    """The role this ledger's queries run as, or LedgerError saying which to create: never the owner."""
    known = _reader_roles.get(ledger.engine)
    if known is not None:
        return known
    cursor.execute("SELECT current_database(), session_user")
    database, user = cursor.fetchone()
    names = list(reader_role_names(database))
    cursor.execute(_READER_ROLE_QUERY, {"names": names, "strong": list(_SERVER_READING_ROLES)})
    name = _chosen_role(cursor.fetchall(), names, user, database)
    _reader_roles[ledger.engine] = name
    return name


def _chosen_role(found: list, names: list[str], user: str, database: str) -> str:
    """The first reader role the session may become that reads the ledger, or LedgerError saying why none."""
    for name, too_strong, reachable, reads_ledger, reads_tokens in found:
        if too_strong or reads_tokens:
            why = ("it may read the server's API tokens (REVOKE SELECT ON api_tokens FROM it)" if not too_strong
                   else "it is a superuser or may read the server's files, settings or sessions")
            raise LedgerError(
                f"trackway sql: will not run as role {name}: {why}; make it a plain NOLOGIN role that reads "
                f"the ledger only (docs/guide/sql.md, \"trackway sql on PostgreSQL\")"
            )
        if reachable and reads_ledger:
            return name
    raise LedgerError(_no_reader(names[0], user, database, found))


def _no_reader(name: str, user: str, database: str, found: list) -> str:
    exists = any(row[0] == name for row in found)
    what = f"{user} cannot become it, or it cannot read the ledger" if exists else "it does not exist"
    return (
        f"trackway sql: queries on PostgreSQL run as a read-only role, and database {database} has none for {user} "
        f"(role {name}: {what}): a database administrator runs the GRANTs in docs/guide/sql.md, \"trackway sql on PostgreSQL\""
    )


# Statements a server-side cursor can hold (DECLARE … CURSOR FOR …): their rows are fetched in one
# bounded batch. Anything else (EXPLAIN) returns a plan, whose size is the query's.
_DECLARABLE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/|\()*(?:select|with|values|table)\b", re.I | re.S)


def _execute_postgresql(ledger: Ledger, sql: str, timeout_s: float, max_rows: int = DEFAULT_MAX_ROWS,
                        on_start: Callable[[], None] | None = None) -> QueryResult:
    import psycopg

    with ledger.read() as conn:
        raw = conn.connection.dbapi_connection
        try:
            with raw.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")  # the first statement of the transaction
                _enter_reader_role(ledger, cursor, timeout_s)
            if on_start is not None:
                on_start()
            try:
                columns, rows = _fetch_postgresql(raw, sql, max_rows)
            except psycopg.Error as exc:
                raise _postgresql_failure(exc, timeout_s) from None
        finally:
            conn.rollback()
    kept, truncated = _kept(rows, max_rows)
    return QueryResult(columns=columns, rows=kept, executed_sql=sql, truncated=truncated)


def _over_libpq(url: str, query: str, timeout_s: float, remember_in: Path | None, max_rows: int,
                on_start: Callable[[], None] | None) -> QueryResult | None:
    """`_execute_postgresql` through libpq alone (ledger/libpq.py): no SQLAlchemy, no psycopg to import.

    None, and the query is left to the psycopg path, without libpq, when the server cannot be reached
    or the ledger is not current, and for a result with a column psycopg loads to what libpq.py does
    not (an array, an interval): the types are asked of the server before the query runs.
    """
    from trackway.ledger import libpq
    from trackway.ledger.reader import postgres_current

    try:
        conn = libpq.connect(postgres_conninfo(url))
    except libpq.Error:
        return None
    if conn is None:
        return None
    try:
        if not postgres_current(conn):
            return None
        sql = checked(query, "postgresql", remember_in)
        conn.script("BEGIN READ ONLY")
        role = _libpq_reader_role(conn)
        try:
            conn.script(f"SET LOCAL ROLE {_identifier(role)}; SET LOCAL statement_timeout = "
                        f"{max(1, round(timeout_s * 1000))}; SET LOCAL cursor_tuple_fraction = 1")
        except libpq.Error as exc:  # dropped or revoked since it was looked up
            raise LedgerError(f"trackway sql: cannot run as role {role}: {first_line(exc)}") from None
        try:
            if not all(libpq.loads_as_psycopg(oid) for oid in conn.result_types(sql)):
                return None
            if on_start is not None:
                on_start()
            if _DECLARABLE.match(sql):  # DECLARE: the server keeps what is not fetched
                conn.execute(f'DECLARE "trackway_sql" CURSOR FOR {sql}')
                columns, rows = conn.execute(f'FETCH FORWARD {max_rows + 1} FROM "trackway_sql"')
            else:
                columns, rows = conn.execute(sql)
        except libpq.Error as exc:
            raise _postgresql_failure(exc, timeout_s) from None
    finally:
        conn.close()  # the transaction is rolled back
    kept, truncated = _kept(rows, max_rows)
    return QueryResult(columns=columns, rows=kept, executed_sql=sql, truncated=truncated)


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _libpq_reader_role(conn) -> str:
    """`_reader_role` over a libpq connection (one process, one query: nothing to remember between)."""
    database, user = conn.execute("SELECT current_database(), session_user")[1][0]
    names = list(reader_role_names(database))
    _, found = conn.execute(_READER_ROLE_QUERY.replace("%(strong)s", ":strong").replace("%(names)s", ":names"),
                            {"names": names, "strong": list(_SERVER_READING_ROLES)})
    return _chosen_role(found, names, user, database)


def _enter_reader_role(ledger: Ledger, cursor, timeout_s: float) -> None:
    """Become the reader, with the time limit, until the transaction ends (LOCAL: the pooled connection
    goes back as it came). cursor_tuple_fraction 1: a cursor's query is planned for all its rows, as
    the same query sent plainly would be, not for the first tenth."""
    import psycopg
    from psycopg import sql as pg_sql

    role = _reader_role(ledger, cursor)
    statements = pg_sql.SQL(
        "SET LOCAL ROLE {}; SET LOCAL statement_timeout = {}; SET LOCAL cursor_tuple_fraction = 1"
    ).format(pg_sql.Identifier(role), pg_sql.Literal(max(1, round(timeout_s * 1000))))  # 0 would mean no limit
    try:
        cursor.execute(statements)
    except psycopg.Error as exc:  # dropped or revoked since it was looked up
        _reader_roles.pop(ledger.engine, None)
        raise LedgerError(f"trackway sql: cannot run as role {role}: {first_line(exc)}") from None


def _fetch_postgresql(raw, sql: str, max_rows: int) -> tuple[list[str], list]:
    """Columns and at most max_rows + 1 rows, over the extended protocol: one statement, whatever the text hides."""
    import psycopg

    if _DECLARABLE.match(sql):
        with raw.cursor(name="trackway_sql") as cursor:  # DECLARE: the server keeps what is not fetched
            cursor.execute(sql)
            columns = [column.name for column in cursor.description or ()]
            return columns, cursor.fetchmany(max_rows + 1)
    with raw.cursor() as cursor:
        if psycopg.Pipeline.is_supported():
            with raw.pipeline():  # pipeline mode sends even a query without parameters over the extended protocol
                cursor.execute(sql)
        else:
            cursor.execute(sql, prepare=True)  # also the extended protocol
        columns = [column.name for column in cursor.description or ()]
        return columns, cursor.fetchmany(max_rows + 1) if cursor.description else []


def _postgresql_failure(exc, timeout_s: float) -> Exception:
    if exc.sqlstate == "57014":  # query_canceled: by statement_timeout, or by an administrator
        if first_line(exc).startswith("canceling statement due to statement timeout"):
            return too_slow(timeout_s)
        return InputError(f"trackway sql: the server cancelled the query: {first_line(exc)}")
    if exc.sqlstate == "25006":  # read_only_sql_transaction
        return ReadOnlyViolation(f"trackway sql is read-only: {first_line(exc)} ({ALLOWED})")
    if exc.sqlstate == "42501":  # insufficient_privilege: the reader role may not
        return ReadOnlyViolation(
            f"trackway sql: {first_line(exc)}: queries run as a role that may read the ledger's tables and "
            "views only, not the database server's configuration, files or credentials"
        )
    if exc.sqlstate is None or exc.sqlstate.startswith("08"):
        return LedgerUnavailable(f"trackway sql: lost the ledger connection: {first_line(exc)}")
    return InputError(f"trackway sql: {first_line(exc)}")
