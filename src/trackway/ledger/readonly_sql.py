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

import logging
import math
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from functools import partial

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError

from trackway.errors import InputError, LedgerUnavailable, ReadOnlyViolation
from trackway.ledger.store import Ledger, as_ledger_error

__all__ = ["QueryResult", "run_readonly_query"]

ALLOWED = "only SELECT, WITH … SELECT, VALUES, EXPLAIN and read-only PRAGMA"


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    executed_sql: str  # what actually ran (transpiled on SQLite)


DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 24 * 3600.0


def run_readonly_query(ledger: Ledger, query: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> QueryResult:
    """Run one read-only query; refuse anything that could change the ledger or read the server's secrets.

    Raises ReadOnlyViolation for writes and for the server's configuration and credentials,
    InputError for queries that do not parse, that the database rejects or that run longer than
    `timeout_s`, each with a one-line message.
    """
    timeout_s = check_timeout(timeout_s)
    statement = _classify(query)
    if ledger.dialect == "sqlite":
        return _execute(ledger, _to_sqlite(statement), timeout_s)
    if isinstance(statement.tree, exp.Pragma):
        raise InputError("trackway sql: PRAGMA works on a SQLite ledger only; on PostgreSQL query information_schema")
    return _execute(ledger, re.sub(r"[\s;]+$", "", query), timeout_s)


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


# --- classification ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Statement:
    tree: exp.Expression
    explain: bool = False


_STATEMENTS = (
    exp.DML, exp.DDL, exp.Alter, exp.Drop, exp.TruncateTable, exp.Command, exp.Set, exp.Transaction,
    exp.Commit, exp.Rollback, exp.Attach, exp.Detach, exp.Pragma, exp.Grant, exp.Revoke, exp.Analyze,
    exp.Use, exp.Kill, exp.Comment, exp.Refresh, exp.Cache, exp.Uncache, exp.LoadData, exp.Describe,
    exp.Into, exp.Lock,
)  # fmt: skip
_KIND_NAMES = {"transaction": "BEGIN", "truncatetable": "TRUNCATE", "loaddata": "LOAD DATA"}

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

# What the server knows about itself and its users: configuration (which holds connection strings
# with passwords, e.g. primary_conninfo, and the paths of the password files), authentication
# rules, password hashes, foreign-server credentials, and the files on the server's disk. None of
# it is part of the ledger, and a read-only transaction does not stop reading it.
_SERVER_SECRET_RELATIONS = frozenset(
    """pg_file_settings pg_hba_file_rules pg_ident_file_mappings pg_settings pg_config pg_authid
    pg_shadow pg_user_mappings pg_user_mapping user_mapping_options pg_subscription
    pg_db_role_setting""".split()
)
_SERVER_SECRET_FUNCTIONS = frozenset(
    """current_setting pg_show_all_settings pg_show_all_file_settings pg_config pg_hba_file_rules
    pg_ident_file_mappings pg_read_file pg_read_binary_file pg_stat_file pg_ls_dir
    pg_current_logfile pg_options_to_table""".split()
)
_SERVER_SECRET_FUNCTION_PREFIXES = ("pg_read_", "pg_ls_", "pg_file_")
# Settings that `current_setting('…')` may read: what a query needs to make sense of its results
# (time zone, formats, the transaction it runs in). None of these can hold a credential.
_READABLE_SETTINGS = frozenset(
    """transaction_read_only transaction_isolation default_transaction_read_only statement_timeout
    server_version server_version_num timezone datestyle intervalstyle search_path client_encoding
    server_encoding application_name""".split()
)

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

_QUERY_KEYWORDS = frozenset({"SELECT", "WITH", "VALUES", "TABLE", "PRAGMA", "EXPLAIN"})
_SKIP = r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
_EXPLAIN = re.compile(
    _SKIP + r"explain\b(?:\s+query\s+plan\b)?"
    r"(?:\s*\((?!\s*(?:select|with|values|table)\b)[^()]*\))?(?:\s+(?:analy[sz]e|verbose)\b)*",
    re.IGNORECASE | re.DOTALL,
)


def _classify(query: str) -> _Statement:
    explain = _EXPLAIN.match(query)
    text = query[explain.end() :] if explain else query
    try:
        statements = _parse(text)
    except InputError:
        keyword = _leading_keyword(text)
        if keyword and keyword not in _QUERY_KEYWORDS:  # e.g. START TRANSACTION READ WRITE
            raise _not_allowed(f"EXPLAIN {keyword}" if explain else keyword) from None
        raise
    if not statements:
        raise InputError("trackway sql: nothing to EXPLAIN" if explain else "trackway sql: the query is empty")
    if len(statements) > 1:
        raise _not_allowed("more than one statement")
    tree = statements[0]
    if isinstance(tree, exp.Pragma) and not explain:
        _check_pragma(tree)
        return _Statement(tree)
    if not isinstance(tree, (exp.Query, exp.Values)):
        # sqlglot reads statements it does not know (NOTIFY, DISCARD) as bare expressions.
        kind = _kind(tree) if isinstance(tree, _STATEMENTS) else _leading_keyword(text) or type(tree).__name__
        raise _not_allowed(f"EXPLAIN {kind}" if explain else kind)
    for node in tree.walk():
        if isinstance(node, _STATEMENTS):
            raise _not_allowed(f"{_kind(node)} inside a query" if isinstance(node, exp.DML) else _kind(node))
        if isinstance(node, exp.Func) and _reads_server_secrets(node):
            raise _server_secret(f"{_function_name(node)}({', '.join(a.sql('postgres') for a in _arguments(node))})")
        if isinstance(node, exp.Func) and _is_unsafe_function(name := _function_name(node)):
            raise _not_allowed(f"{name}()")
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            if node.this.name.lower() in _SERVER_SECRET_RELATIONS:
                raise _server_secret(node.this.name.lower())
    return _Statement(tree, explain=bool(explain))


def _arguments(node: exp.Func) -> list[exp.Expression]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    return [a for a in (node.this, *node.expressions) if isinstance(a, exp.Expression)]


def _reads_server_secrets(node: exp.Func) -> bool:
    name = _function_name(node)
    if name == "current_setting":
        setting = next(iter(_arguments(node)), None)
        return not (
            isinstance(setting, exp.Literal) and setting.is_string and setting.name.lower() in _READABLE_SETTINGS
        )
    return name in _SERVER_SECRET_FUNCTIONS or name.startswith(_SERVER_SECRET_FUNCTION_PREFIXES)


def _server_secret(what: str) -> ReadOnlyViolation:
    return ReadOnlyViolation(
        f"trackway sql: {what} is not allowed: it shows the database server's configuration, files or "
        "credentials, which are not part of the ledger (query the ledger's tables and views)"
    )


def _leading_keyword(sql: str) -> str:
    word = re.match(_SKIP + r"([a-z_]+)", sql, re.IGNORECASE | re.DOTALL)
    return word.group(1).upper() if word else ""


def _parse(sql: str) -> list[exp.Expression]:
    with _quiet_sqlglot():
        try:
            statements = sqlglot.parse(sql, read="postgres")
        except (SqlglotError, RecursionError) as postgres_error:
            try:
                statements = sqlglot.parse(sql, read="sqlite")
            except (SqlglotError, RecursionError):
                raise InputError(f"trackway sql: cannot parse the query: {_first_line(postgres_error)}") from None
    return [s for s in statements if s is not None and not isinstance(s, exp.Semicolon)]


@contextmanager
def _quiet_sqlglot() -> Iterator[None]:
    """sqlglot logs a warning when it falls back to an opaque Command; we refuse those anyway."""
    logger = logging.getLogger("sqlglot")
    drop = lambda _record: False  # noqa: E731
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _check_pragma(tree: exp.Pragma) -> None:
    target = tree.this
    if isinstance(target, exp.Dot):  # PRAGMA main.table_info(runs)
        target = target.expression
    if isinstance(target, exp.Column):
        name, has_argument = target.name, False
    elif isinstance(target, exp.Anonymous):
        name, has_argument = target.name, bool(target.expressions)
    elif isinstance(target, exp.EQ):
        raise _not_allowed(f"PRAGMA {target.this.name} = …")
    else:
        raise _not_allowed("this PRAGMA")
    if not _pragma_is_read_only(name, has_argument):
        raise _not_allowed(f"PRAGMA {name.lower()}{'(…)' if has_argument else ''}")


def _pragma_is_read_only(name: str, has_argument: bool) -> bool:
    name = name.lower()
    return name in (_PRAGMAS_WITH_ARGUMENT if has_argument else _READ_ONLY_PRAGMAS)


def _kind(node: exp.Expression) -> str:
    if isinstance(node, exp.Into):
        return "SELECT … INTO"
    if isinstance(node, exp.Lock):
        return "SELECT … FOR " + ("UPDATE" if node.args.get("update") else "SHARE")
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    if isinstance(node, exp.Pragma):
        return "PRAGMA"
    kind = node.args.get("kind") if isinstance(node, (exp.Create, exp.Drop, exp.Alter)) else None
    name = _KIND_NAMES.get(node.key, node.key.upper())
    return f"{name} {kind.upper()}" if isinstance(kind, str) else name


def _function_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def _is_unsafe_function(name: str) -> bool:
    return name in _UNSAFE_FUNCTIONS or name.startswith(_UNSAFE_FUNCTION_PREFIXES)


def _not_allowed(what: str) -> ReadOnlyViolation:
    return ReadOnlyViolation(f"trackway sql is read-only: {what} is not allowed ({ALLOWED})")


def _first_line(exc: BaseException) -> str:
    message = str(exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


# --- PostgreSQL -> SQLite -----------------------------------------------------------------------

_SQLITE_UNITS: dict[str, tuple[str, Decimal]] = {}
for _unit, _aliases in {
    ("seconds", Decimal("0.000001")): "microsecond microseconds us usec usecs",
    ("seconds", Decimal("0.001")): "millisecond milliseconds ms msec msecs",
    ("seconds", Decimal(1)): "second seconds sec secs s",
    ("minutes", Decimal(1)): "minute minutes min mins m",
    ("hours", Decimal(1)): "hour hours hr hrs h",
    ("days", Decimal(1)): "day days d",
    ("days", Decimal(7)): "week weeks w",
    ("months", Decimal(1)): "month months mon mons",
    ("years", Decimal(1)): "year years yr yrs y",
}.items():
    _SQLITE_UNITS.update(dict.fromkeys(_aliases.split(), _unit))
_INTERVAL = re.compile(r"(?:\s*[+-]?\d+(?:\.\d+)?\s*[a-z]+)+\s*", re.IGNORECASE)
_INTERVAL_PART = re.compile(r"([+-]?\d+(?:\.\d+)?)\s*([a-z]+)", re.IGNORECASE)


def _to_sqlite(statement: _Statement) -> str:
    tree = statement.tree.copy()
    if isinstance(tree, exp.Pragma):
        return tree.sql(dialect="sqlite")
    for node_types, rewrite in _REWRITES:
        # Deepest first, so that an outer node sees its children already rewritten.
        for node in reversed(list(tree.find_all(*node_types))):
            replacement = rewrite(node)
            if replacement is not node:
                node.replace(replacement)
    leftover = tree.find(exp.Interval)
    if leftover is not None:
        raise InputError(
            f"trackway sql: cannot translate {leftover.sql(dialect='postgres')} for SQLite; "
            "add it to or subtract it from a timestamp, e.g. now() - interval '7 days'"
        )
    try:
        sql = tree.sql(dialect="sqlite", unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as exc:
        raise InputError(f"trackway sql: cannot translate the query for SQLite: {_first_line(exc)}") from None
    return f"EXPLAIN QUERY PLAN {sql}" if statement.explain else sql


def _datetime_arithmetic(node: exp.Add | exp.Sub) -> exp.Expression:
    """`ts - interval '7 days'` -> `DATETIME(ts, '-7 days')`; also `interval '1 day' + ts`."""
    sign = 1 if isinstance(node, exp.Add) else -1
    base, modifiers = node.this, _interval_modifiers(node.expression, sign)
    if modifiers is None and sign == 1:
        base, modifiers = node.expression, _interval_modifiers(node.this, sign)
    if modifiers is None:
        return node
    return exp.Anonymous(this="DATETIME", expressions=[base, *modifiers])


def _interval_modifiers(node: exp.Expression, sign: int) -> list[exp.Literal] | None:
    if isinstance(node, exp.Paren):
        return _interval_modifiers(node.this, sign)
    if isinstance(node, exp.Interval) and isinstance(node.this, exp.Literal):
        unit = node.args.get("unit")
        if unit is not None and not isinstance(unit, exp.Var):
            return None  # INTERVAL '1-2' YEAR TO MONTH and friends: left for the error below
        text = node.this.name + (f" {unit.name}" if unit is not None else "")
    elif isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.INTERVAL) and node.this.is_string:
        text = node.this.name  # '7 days'::interval
    else:
        return None
    if not _INTERVAL.fullmatch(text):
        raise InputError(f"trackway sql: interval {text!r}: expected e.g. '7 days' or '1 day 2 hours' on SQLite")
    modifiers = []
    for number, unit_name in _INTERVAL_PART.findall(text):
        if unit_name.lower() not in _SQLITE_UNITS:
            raise InputError(
                f"trackway sql: interval unit {unit_name.lower()!r}: expected seconds, minutes, hours, days, weeks, "
                "months or years"
            )
        sqlite_unit, factor = _SQLITE_UNITS[unit_name.lower()]
        amount = Decimal(number) * factor * sign
        modifiers.append(exp.Literal.string(f"{'-' if amount < 0 else '+'}{abs(amount).normalize():f} {sqlite_unit}"))
    return modifiers


def _timestamptz_cast(node: exp.Cast) -> exp.Expression:
    """SQLite gives CAST(... AS TIMESTAMPTZ) numeric affinity ('2026-01-01' -> 2026)."""
    if node.to.is_type(exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ):
        return exp.Anonymous(this="DATETIME", expressions=[node.this])
    return node


def _date_trunc_call(node: exp.TimestampTrunc) -> exp.Expression:
    unit = node.args.get("unit")
    if not isinstance(unit, (exp.Var, exp.Literal)):
        return node
    field = _date_field(unit.name, _TRUNCATIONS, "date_trunc")
    return exp.Anonymous(this="DATE_TRUNC", expressions=[exp.Literal.string(field), node.this])


def _date_part_call(node: exp.Extract) -> exp.Expression:
    if not isinstance(node.this, (exp.Var, exp.Literal)):
        return node
    field = _date_field(node.this.name, _DATE_PARTS, "extract")
    return exp.Anonymous(this="DATE_PART", expressions=[exp.Literal.string(field), node.expression])


def _date_field(name: str, fields: dict, function: str) -> str:
    field = name.lower()
    if field not in fields and field.endswith("s") and field[:-1] in fields:
        field = field[:-1]
    if field not in fields:
        raise InputError(f"trackway sql: {function}({name!r}, …) on SQLite: expected one of {', '.join(fields)}")
    return field


_REWRITES = (
    ((exp.Add, exp.Sub), _datetime_arithmetic),  # one pass, so chains of intervals nest
    ((exp.Cast,), _timestamptz_cast),
    ((exp.TimestampTrunc,), _date_trunc_call),
    ((exp.Extract,), _date_part_call),
)


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
        return _execute_sqlite(ledger, sql, timeout_s)
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


def _execute_sqlite(ledger: Ledger, sql: str, timeout_s: float) -> QueryResult:
    refused: list[str] = []
    deadline = time.monotonic() + timeout_s
    stopped: list[bool] = []

    def past_deadline() -> int:
        if time.monotonic() > deadline:
            stopped.append(True)
            return 1  # non-zero: SQLite interrupts the statement
        return 0

    with ledger.read() as conn:  # BEGIN (deferred): the query sees one snapshot
        raw = conn.connection.dbapi_connection
        raw.execute("PRAGMA query_only=ON")
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
            failure = as_ledger_error(exc, ledger.engine.url)
            if failure is not None:  # a locked or damaged ledger is not the query's fault (exit 3, not 2)
                raise failure from None
            raise InputError(f"trackway sql: {_first_line(exc)}") from None
        finally:
            raw.set_progress_handler(None, 0)
            raw.set_authorizer(None)
            for name, arity, _function in _SQLITE_FUNCTIONS:
                raw.create_function(name, arity, None)
            conn.rollback()
            raw.execute("PRAGMA query_only=OFF")
    return QueryResult(columns=columns, rows=[tuple(row) for row in rows], executed_sql=sql)


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
