"""`trackway sql`: one read-only query over the ledger, in PostgreSQL's dialect on every backend.

Three layers keep the ledger unchanged, each enough on its own for ordinary mistakes:

1. sqlglot classifies the query: exactly one SELECT / WITH … SELECT / VALUES / EXPLAIN of
   one of those, or a read-only PRAGMA on SQLite. Writes anywhere in the tree (a DELETE in a
   CTE, SELECT … INTO, FOR UPDATE) and PostgreSQL functions with side effects are refused.
2. The database makes the transaction read-only: `SET TRANSACTION READ ONLY` on PostgreSQL
   (sent over the extended protocol, which runs one statement at most); `PRAGMA query_only`
   plus an authorizer that allows only reads on SQLite. Every transaction is rolled back.
3. On SQLite, what runs is sqlglot's regeneration of the parsed tree, never the raw text.

Reading is not always harmless either: the server's configuration and credential catalogs
(pg_settings, pg_hba_file_rules, pg_authid, pg_read_file, …) are refused by name, since
anyone allowed to query the ledger is not thereby allowed to read the server's password files
or connection strings. Every query runs under a time limit (`statement_timeout` on PostgreSQL,
a progress handler on SQLite) so that one careless join cannot hold the ledger's connections.

On SQLite the query is transpiled from PostgreSQL with sqlglot, after rewriting what sqlglot
leaves invalid there: `ts ± interval '7 days'` (and `interval '1 day' + ts`) becomes
`DATETIME(ts, '-7 days')`; casts to timestamptz become `DATETIME(ts)`; `date_trunc`,
`extract`/`date_part` and the regex match `~` run as Python functions registered on the
connection. Timestamps are stored there as naive UTC text, so `now()` (UTC) compares correctly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from trackway.errors import InputError, LedgerUnavailable, ReadOnlyViolation
from trackway.ledger.reader import open_reader, sqlite_file

if TYPE_CHECKING:
    from trackway.ledger.store import Ledger

__all__ = ["QueryResult", "run_readonly_query"]

ALLOWED = "only SELECT, WITH … SELECT, VALUES, EXPLAIN and read-only PRAGMA"


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    executed_sql: str  # what actually ran (transpiled on SQLite)


DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 24 * 3600.0


def run_readonly_query(
    ledger: Ledger | str, query: str, timeout_s: float = DEFAULT_TIMEOUT_S, remember_in: Path | None = None
) -> QueryResult:
    """Run one read-only query; refuse anything that could change the ledger or read the server's secrets.

    `ledger` is an open Ledger or a ledger URL; a SQLite file named by URL is queried over plain
    `sqlite3`, without SQLAlchemy. With `remember_in` (a directory), a query checked once is not
    parsed again (see `_remembered`). Raises ReadOnlyViolation for writes and for the server's
    configuration and credentials, InputError for queries that do not parse, that the database
    rejects or that run longer than `timeout_s`, each with a one-line message.
    """
    timeout_s = check_timeout(timeout_s)
    if isinstance(ledger, str) and sqlite_file(ledger) is not None:
        sql = _checked(query, "sqlite", remember_in)
        with open_reader(ledger) as reader:  # migrated if need be; one read transaction
            return _execute_sqlite(reader.conn, sql, timeout_s, ledger)
    if isinstance(ledger, str):
        from trackway.ledger.store import open_ledger

        opened = open_ledger(ledger)
        try:
            return run_readonly_query(opened, query, timeout_s, remember_in)
        finally:
            opened.dispose()
    return _execute(ledger, _checked(query, ledger.dialect, remember_in), timeout_s)


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


# PostgreSQL functions that write, signal other sessions, touch server files or run SQL given as
# text (which would escape this check). A read-only transaction stops most of them; not all.
_UNSAFE_FUNCTIONS = frozenset(
    """nextval setval set_config pg_terminate_backend pg_cancel_backend pg_reload_conf
    pg_rotate_logfile pg_promote pg_switch_wal pg_backup_start pg_backup_stop pg_start_backup
    pg_stop_backup pg_wal_replay_pause pg_wal_replay_resume pg_log_backend_memory_contexts
    pg_notify pg_import_system_collations pg_read_file pg_read_binary_file pg_stat_file lo_import
    lo_export lo_create lo_creat lo_unlink lo_open lo_write lowrite lo_put lo_truncate
    lo_truncate64 lo_from_bytea query_to_xml query_to_xmlschema query_to_xml_and_xmlschema
    cursor_to_xml cursor_to_xmlschema ts_stat load_extension""".split()
)
_UNSAFE_FUNCTION_PREFIXES = (
    "pg_advisory", "pg_try_advisory", "dblink", "pg_stat_reset", "pg_file_", "pg_ls_", "pg_create_",
    "pg_drop_replication", "pg_copy_", "pg_logical_", "pg_replication_origin",
)  # fmt: skip

_PRAGMAS_WITH_ARGUMENT = frozenset(
    """table_info table_xinfo table_list index_info index_xinfo index_list foreign_key_list
    foreign_key_check integrity_check quick_check""".split()
)
_READ_ONLY_PRAGMAS = _PRAGMAS_WITH_ARGUMENT | frozenset(
    """application_id auto_vacuum busy_timeout cache_size collation_list compile_options
    data_version database_list encoding foreign_keys freelist_count function_list journal_mode
    module_list page_count page_size pragma_list query_only schema_version synchronous temp_store
    user_version""".split()
)

def _pragma_is_read_only(name: str, has_argument: bool) -> bool:
    name = name.lower()
    return name in (_PRAGMAS_WITH_ARGUMENT if has_argument else _READ_ONLY_PRAGMAS)


def _is_unsafe_function(name: str) -> bool:
    return name in _UNSAFE_FUNCTIONS or name.startswith(_UNSAFE_FUNCTION_PREFIXES)


def _not_allowed(what: str) -> ReadOnlyViolation:
    return ReadOnlyViolation(f"trackway sql is read-only: {what} is not allowed ({ALLOWED})")


def _first_line(exc: BaseException) -> str:
    message = str(exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


# --- checked queries, remembered ---------------------------------------------------------------
#
# A query that passed the check is remembered by its text, with what to run for it, so that a query
# run again (a script's, a watch loop's) starts without importing sqlglot. The key holds the rules
# that checked it (this module's and sql_dialect's files, sqlglot's installed version): a change to
# any of them checks every query afresh. What is remembered can only be what the check produced;
# the database still enforces read-only (layer 2) whatever the text says.

_REMEMBERED_MAX = 500


def _checked(query: str, dialect: str, remember_in: Path | None) -> str:
    entry = _remembered_path(query, dialect, remember_in)
    if entry is not None:
        try:
            return entry.read_text(encoding="utf-8")
        except OSError:
            pass
    from trackway.ledger.sql_dialect import checked_sql

    sql = checked_sql(query, dialect)
    if entry is not None:
        _remember(entry, sql)
    return sql


def _remembered_path(query: str, dialect: str, remember_in: Path | None) -> Path | None:
    if remember_in is None:
        return None
    rules = [Path(__file__), Path(__file__).with_name("sql_dialect.py")]
    spec = importlib.util.find_spec("sqlglot")  # finds the package without importing it
    if spec is not None and spec.origin:
        rules.append(Path(spec.origin))
    try:
        stamps = [f"{path}:{path.stat().st_mtime_ns}:{path.stat().st_size}" for path in rules]
    except OSError:
        return None
    key = hashlib.sha256("\0".join([dialect, query, *stamps]).encode()).hexdigest()
    return remember_in / f"{key}.sql"


def _remember(entry: Path, sql: str) -> None:
    """Write atomically (a reader never sees half a query); a full or read-only disk only costs the speed-up."""
    try:
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(sql, encoding="utf-8")
        os.replace(temporary, entry)
        remembered = sorted(entry.parent.glob("*.sql"), key=lambda path: path.stat().st_mtime)
        for stale in remembered[: max(0, len(remembered) - _REMEMBERED_MAX)]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass


# --- PostgreSQL functions registered on the SQLite connection ---------------------------------

_EPOCH = datetime(1970, 1, 1)


def _naive_utc(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"expected a timestamp, got {value!r}")
    moment = datetime.fromisoformat(value.strip())
    return moment.astimezone(timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


_TRUNCATIONS = {
    "second": lambda t: t.replace(microsecond=0),
    "minute": lambda t: t.replace(second=0, microsecond=0),
    "hour": lambda t: t.replace(minute=0, second=0, microsecond=0),
    "day": lambda t: t.replace(hour=0, minute=0, second=0, microsecond=0),
    "week": lambda t: (t - timedelta(days=t.weekday())).replace(hour=0, minute=0, second=0, microsecond=0),
    "month": lambda t: t.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
    "quarter": lambda t: t.replace(month=(t.month - 1) // 3 * 3 + 1, day=1, hour=0, minute=0, second=0, microsecond=0),
    "year": lambda t: t.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0),
}
_DATE_PARTS = {
    "epoch": lambda t: (t - _EPOCH).total_seconds(),
    "year": lambda t: t.year,
    "quarter": lambda t: (t.month - 1) // 3 + 1,
    "month": lambda t: t.month,
    "week": lambda t: t.isocalendar().week,
    "day": lambda t: t.day,
    "dow": lambda t: t.isoweekday() % 7,
    "isodow": lambda t: t.isoweekday(),
    "doy": lambda t: t.timetuple().tm_yday,
    "hour": lambda t: t.hour,
    "minute": lambda t: t.minute,
    "second": lambda t: t.second + t.microsecond / 1_000_000,
}


def _date_trunc(field: str, value: object) -> str | None:
    if value is None:
        return None
    return _TRUNCATIONS[field.lower()](_naive_utc(value)).strftime("%Y-%m-%d %H:%M:%S")


def _date_part(field: str, value: object) -> float | int | None:
    return None if value is None else _DATE_PARTS[field.lower()](_naive_utc(value))


def _regexp(pattern: str, value: object) -> bool | None:
    return None if pattern is None or value is None else re.search(pattern, str(value)) is not None


_SQLITE_FUNCTIONS = (("date_trunc", 2, _date_trunc), ("date_part", 2, _date_part), ("regexp", 2, _regexp))


# --- execution --------------------------------------------------------------------------------


def _execute(ledger: Ledger, sql: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> QueryResult:
    """Run `sql` in a transaction the database itself keeps read-only, then roll it back."""
    if ledger.dialect == "sqlite":
        with ledger.read() as conn:  # BEGIN (deferred): the query sees one snapshot
            try:
                raw = conn.connection.dbapi_connection
                raw.execute("PRAGMA query_only=ON")
                return _execute_sqlite(raw, sql, timeout_s, ledger.engine.url)
            finally:
                conn.rollback()
                raw.execute("PRAGMA query_only=OFF")
    return _execute_postgresql(ledger, sql, timeout_s)


def _too_slow(timeout_s: float) -> InputError:
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


def _authorize(refused: list[str], action: int, arg1: str | None, arg2: str | None, _db, _source) -> int:
    if action in _SQLITE_READS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and not _is_unsafe_function((arg2 or "").lower()):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and _pragma_is_read_only(arg1 or "", arg2 is not None):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master":
        # Table-valued pragmas (pragma_table_info) probe the schema table this way; IGNORE writes nothing.
        return sqlite3.SQLITE_IGNORE
    if action == sqlite3.SQLITE_PRAGMA:
        refused.append(f"PRAGMA {arg1} with an argument" if arg2 is not None else f"PRAGMA {arg1}")
    elif action == sqlite3.SQLITE_FUNCTION:
        refused.append(f"{arg2}()")
    else:
        refused.append(_SQLITE_ACTIONS.get(action, f"SQLite action {action}"))
    return sqlite3.SQLITE_DENY


def _execute_sqlite(raw: sqlite3.Connection, sql: str, timeout_s: float, url) -> QueryResult:
    """Run `sql` on `raw`, in the caller's read-only transaction, under the authorizer and the time limit."""
    refused: list[str] = []
    deadline = time.monotonic() + timeout_s
    stopped: list[bool] = []

    def past_deadline() -> int:
        if time.monotonic() > deadline:
            stopped.append(True)
            return 1  # non-zero: SQLite interrupts the statement
        return 0

    for name, arity, function in _SQLITE_FUNCTIONS:
        raw.create_function(name, arity, function, deterministic=True)
    raw.set_authorizer(partial(_authorize, refused))
    raw.set_progress_handler(past_deadline, _SQLITE_PROGRESS_STEPS)
    try:
        cursor = raw.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchall()
            columns = [column[0] for column in cursor.description or ()]
        finally:
            cursor.close()
    except sqlite3.Error as exc:
        if refused:
            raise _not_allowed(refused[0]) from None
        if stopped:
            raise _too_slow(timeout_s) from None
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY":
            raise ReadOnlyViolation(f"trackway sql is read-only: {_first_line(exc)} ({ALLOWED})") from None
        failure = _ledger_failure(exc, url)
        if failure is not None:  # a locked or damaged ledger is not the query's fault (exit 3, not 2)
            raise failure from None
        raise InputError(f"trackway sql: {_first_line(exc)}") from None
    finally:
        raw.set_progress_handler(None, 0)
        raw.set_authorizer(None)
        for name, arity, _function in _SQLITE_FUNCTIONS:
            raw.create_function(name, arity, None)
    return QueryResult(columns=columns, rows=[tuple(row) for row in rows], executed_sql=sql)


def _ledger_failure(exc: sqlite3.Error, url):
    """A locked, full or damaged ledger as the LedgerError `store` maps it to; None for the query's own error."""
    from sqlalchemy.engine import make_url

    from trackway.ledger.store import as_ledger_error

    return as_ledger_error(exc, make_url(url) if isinstance(url, str) else url)


def _execute_postgresql(ledger: Ledger, sql: str, timeout_s: float) -> QueryResult:
    import psycopg

    with ledger.read() as conn:
        raw = conn.connection.dbapi_connection
        try:
            with raw.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")  # the first statement of the transaction
                # LOCAL: ends with the transaction, so the pooled connection goes back unchanged.
                # At least 1 ms: 0 would mean no limit at all.
                cursor.execute(f"SET LOCAL statement_timeout = {max(1, round(timeout_s * 1000))}")
                try:
                    if psycopg.Pipeline.is_supported():
                        # Pipeline mode uses the extended protocol: one statement, whatever the text hides.
                        with raw.pipeline():
                            cursor.execute(sql)
                    else:
                        cursor.execute(sql, prepare=True)  # also the extended protocol
                    rows = cursor.fetchall() if cursor.description else []
                    columns = [column.name for column in cursor.description or ()]
                except psycopg.Error as exc:
                    if exc.sqlstate == "57014":  # query_canceled: by statement_timeout, or by an administrator
                        if _first_line(exc).startswith("canceling statement due to statement timeout"):
                            raise _too_slow(timeout_s) from None
                        raise InputError(f"trackway sql: the server cancelled the query: {_first_line(exc)}") from None
                    if exc.sqlstate == "25006":  # read_only_sql_transaction
                        raise ReadOnlyViolation(f"trackway sql is read-only: {_first_line(exc)} ({ALLOWED})") from None
                    if exc.sqlstate is None or exc.sqlstate.startswith("08"):
                        raise LedgerUnavailable(f"trackway sql: lost the ledger connection: {_first_line(exc)}") from None
                    raise InputError(f"trackway sql: {_first_line(exc)}") from None
        finally:
            conn.rollback()
    return QueryResult(columns=columns, rows=[tuple(row) for row in rows], executed_sql=sql)
