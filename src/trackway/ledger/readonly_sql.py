"""`trackway sql`: one read-only query over the ledger, in PostgreSQL's dialect on every backend.

Three layers keep the ledger unchanged and the server's secrets unread; the database's own is the
one that holds whatever the query text hides:

1. sqlglot classifies the query: exactly one SELECT / WITH … SELECT / VALUES / EXPLAIN of
   one of those, or a read-only PRAGMA on SQLite. Writes anywhere in the tree (a DELETE in a
   CTE, SELECT … INTO, FOR UPDATE), PostgreSQL functions with side effects and the server's
   configuration and credential catalogs are refused by name, with a message that says why.
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
create roles, a database administrator creates it (README, "trackway sql on PostgreSQL"); until
then a query is refused with a LedgerError naming the role to create, and never runs as the owner.

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
import stat
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

from trackway.errors import InputError, LedgerError, LedgerUnavailable, ReadOnlyViolation
from trackway.ledger.reader import open_reader, sqlite_file

if TYPE_CHECKING:
    from collections.abc import Callable

    from trackway.ledger.store import Ledger

__all__ = ["QueryResult", "run_readonly_query"]

ALLOWED = "only SELECT, WITH … SELECT, VALUES, EXPLAIN and read-only PRAGMA"


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
    parsed again (see `_checked`). At most `max_rows` rows come back; `truncated` says there were
    more. Raises ReadOnlyViolation for writes and for the server's configuration and credentials,
    InputError for queries that do not parse, that the database rejects or that run longer than
    `timeout_s`, LedgerError for a PostgreSQL ledger without its reader role, each in one line.
    `on_start` is called as the statement starts, when its `timeout_s` starts counting (the CLI arms
    its watchdog there).
    """
    timeout_s, max_rows = check_timeout(timeout_s), check_max_rows(max_rows)
    if isinstance(ledger, str) and sqlite_file(ledger) is not None:
        sql = _checked(query, "sqlite", remember_in)
        with open_reader(ledger) as reader:  # migrated if need be; one read transaction
            return _execute_sqlite(reader.conn, sql, timeout_s, ledger, max_rows, on_start)
    if isinstance(ledger, str):
        from trackway.ledger.store import open_ledger

        opened = open_ledger(ledger)
        try:
            return run_readonly_query(opened, query, timeout_s, remember_in, max_rows, on_start)
        finally:
            opened.dispose()
    return _execute(ledger, _checked(query, ledger.dialect, remember_in), timeout_s, max_rows, on_start)


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


def as_given(query: str) -> str:
    """What runs on PostgreSQL for a query that passed the check: its own text, less trailing semicolons."""
    return re.sub(r"[\s;]+$", "", query)


# PostgreSQL functions that write, signal other sessions, touch server files or large objects, or run
# SQL or read tables named in text (which would escape this check). The reader role stops the ones
# that reach what is not the ledger's; these names give a clearer message first.
_UNSAFE_FUNCTIONS = frozenset(
    """nextval setval set_config pg_terminate_backend pg_cancel_backend pg_reload_conf
    pg_rotate_logfile pg_promote pg_switch_wal pg_backup_start pg_backup_stop pg_start_backup
    pg_stop_backup pg_wal_replay_pause pg_wal_replay_resume pg_log_backend_memory_contexts
    pg_notify pg_import_system_collations pg_read_file pg_read_binary_file pg_stat_file lo_import
    lo_export lo_create lo_creat lo_unlink lo_open lo_write lowrite lo_put lo_truncate
    lo_truncate64 lo_from_bytea loread query_to_xml query_to_xmlschema query_to_xml_and_xmlschema
    cursor_to_xml cursor_to_xmlschema ts_stat load_extension""".split()
)
_UNSAFE_FUNCTION_PREFIXES = (
    "pg_advisory", "pg_try_advisory", "dblink", "pg_stat_reset", "pg_file_", "pg_ls_", "pg_create_",
    "pg_drop_replication", "pg_copy_", "pg_logical_", "pg_replication_origin", "lo_", "table_to_xml",
    "schema_to_xml", "database_to_xml", "query_to_xml", "cursor_to_xml",
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


# The server's API tokens (names, roles, digests): not for every `read` token to see through /api/sql.
TOKENS_TABLE = "api_tokens"


def tokens_not_readable() -> ReadOnlyViolation:
    return ReadOnlyViolation(
        f"trackway sql: {TOKENS_TABLE} is not readable through trackway sql: use `trackway token list`"
    )


def _first_line(exc: BaseException) -> str:
    message = str(exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


# --- checked queries, remembered ---------------------------------------------------------------
#
# A query that passed the check is remembered, so that a query run again (a script's, a watch
# loop's) starts without importing sqlglot. The entry's name is a hash of the dialect, the query and
# the rules that checked it (this module's and sql_dialect's files, sqlglot's installed version): a
# change to any of them checks every query afresh. On PostgreSQL the entry is an empty marker: what
# runs is the query as given. On SQLite it holds the transpiled text, which only this user can have
# written: an entry is used only from a directory of this user's that no one else can write, and
# only if this user owns it and no one else can write it; anything else is checked again. Whatever
# an entry says, the database's own layer (the reader role; query_only and the authorizer) applies.

_REMEMBERED_MAX = 500
_REMEMBERED_MAX_BYTES = 1 << 20


def _checked(query: str, dialect: str, remember_in: Path | None) -> str:
    entry = _remembered_path(query, dialect, remember_in)
    remembered = _read_remembered(entry) if entry is not None else None
    if remembered is not None:
        return remembered if dialect == "sqlite" else as_given(query)
    from trackway.ledger.sql_dialect import checked_sql

    sql = checked_sql(query, dialect)
    if entry is not None:
        _remember(entry, sql if dialect == "sqlite" else "")
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


def _read_remembered(entry: Path) -> str | None:
    """The entry's text if this user wrote it where only this user can write; None (check again) otherwise."""
    from trackway.private_dir import check_private

    try:
        check_private(entry.parent)
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())  # of what was opened, not of whatever the name points at by now
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        data = file.read(_REMEMBERED_MAX_BYTES + 1)
    try:
        return data.decode("utf-8") if len(data) <= _REMEMBERED_MAX_BYTES else None
    except UnicodeDecodeError:
        return None


def _remember(entry: Path, sql: str) -> None:
    """Write atomically (a reader never sees half a query), 0600 in a 0700 directory; a full, read-only or
    shared disk only costs the speed-up."""
    from trackway.private_dir import make_private_dir

    try:
        entry.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private_dir(entry.parent)
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(sql.encode("utf-8"))
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


def _regexp(failures: list[str], pattern: object, value: object) -> bool | None:
    """`value ~ pattern` with RE2, linear in the text: one call cannot run away as Python's `re` can
    (`'aaaa…!' ~ '(a+)+$'`), and one call is one step of SQLite's, which no time limit interrupts."""
    if pattern is None or value is None:
        return None
    try:
        compiled = _re2_pattern(str(pattern))
    except ValueError as exc:
        failures.append(str(exc))  # SQLite reports only "user-defined function raised exception"
        raise
    return compiled.search(str(value)) is not None


@lru_cache(maxsize=64)
def _re2_pattern(pattern: str):
    import re2

    options = re2.Options()
    options.log_errors = False  # RE2 would print its own complaint on stderr too
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        raise ValueError(
            f"trackway sql: regular expression {shown!r}: {reason}; on a SQLite ledger `~` takes RE2's syntax, "
            "which has no backreferences or lookaround"
        ) from None


def _sqlite_functions(failures: list[str]) -> tuple:
    return (("date_trunc", 2, _date_trunc), ("date_part", 2, _date_part), ("regexp", 2, partial(_regexp, failures)))


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
    if action == sqlite3.SQLITE_FUNCTION and not _is_unsafe_function((arg2 or "").lower()):
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and _pragma_is_read_only(arg1 or "", arg2 is not None):
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
    refused.append(_not_allowed(what))
    return sqlite3.SQLITE_DENY


def _execute_sqlite(raw: sqlite3.Connection, sql: str, timeout_s: float, url, max_rows: int,
                    on_start: Callable[[], None] | None = None) -> QueryResult:
    """Run `sql` on `raw`, in the caller's read-only transaction, under the authorizer and the time limit."""
    refused: list[ReadOnlyViolation] = []
    failures: list[str] = []
    functions = _sqlite_functions(failures)
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
            raise ReadOnlyViolation(f"trackway sql is read-only: {_first_line(exc)} ({ALLOWED})") from None
        failure = _ledger_failure(exc, url)
        if failure is not None:  # a locked or damaged ledger is not the query's fault (exit 3, not 2)
            raise failure from None
        raise InputError(f"trackway sql: {_first_line(exc)}") from None
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
    found = cursor.fetchall()
    for name, too_strong, reachable, reads_ledger, reads_tokens in found:
        if too_strong or reads_tokens:
            why = ("it may read the server's API tokens (REVOKE SELECT ON api_tokens FROM it)" if not too_strong
                   else "it is a superuser or may read the server's files, settings or sessions")
            raise LedgerError(
                f"trackway sql: will not run as role {name}: {why}; make it a plain NOLOGIN role that reads "
                f"the ledger only (README.md, \"trackway sql on PostgreSQL\")"
            )
        if reachable and reads_ledger:
            _reader_roles[ledger.engine] = name
            return name
    raise LedgerError(_no_reader(names[0], user, database, found))


def _no_reader(name: str, user: str, database: str, found: list) -> str:
    exists = any(row[0] == name for row in found)
    what = f"{user} cannot become it, or it cannot read the ledger" if exists else "it does not exist"
    return (
        f"trackway sql: queries on PostgreSQL run as a read-only role, and database {database} has none for {user} "
        f"(role {name}: {what}): a database administrator runs the GRANTs in README.md, \"trackway sql on PostgreSQL\""
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
        raise LedgerError(f"trackway sql: cannot run as role {role}: {_first_line(exc)}") from None


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
        if _first_line(exc).startswith("canceling statement due to statement timeout"):
            return too_slow(timeout_s)
        return InputError(f"trackway sql: the server cancelled the query: {_first_line(exc)}")
    if exc.sqlstate == "25006":  # read_only_sql_transaction
        return ReadOnlyViolation(f"trackway sql is read-only: {_first_line(exc)} ({ALLOWED})")
    if exc.sqlstate == "42501":  # insufficient_privilege: the reader role may not
        return ReadOnlyViolation(
            f"trackway sql: {_first_line(exc)}: queries run as a role that may read the ledger's tables and "
            "views only, not the database server's configuration, files or credentials"
        )
    if exc.sqlstate is None or exc.sqlstate.startswith("08"):
        return LedgerUnavailable(f"trackway sql: lost the ledger connection: {_first_line(exc)}")
    return InputError(f"trackway sql: {_first_line(exc)}")
