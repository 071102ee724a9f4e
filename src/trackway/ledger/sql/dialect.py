"""Parsing one query with sqlglot: classified by `rules` as a read or refused, and spelled for the ledger's database.

`checked_sql(query, dialect)` parses one query as PostgreSQL, refuses anything but a read
(layer 1 of the three in `readonly`) and the server's own secrets, and returns the text to run:
transpiled for SQLite (with the rewrites sqlglot leaves invalid there), as given on PostgreSQL.
On SQLite, `ts ± interval '7 days'` (and `interval '1 day' + ts`) becomes `DATETIME(ts, '-7 days')`;
casts to timestamptz become `DATETIME(ts)`; `date_trunc` and `extract`/`date_part` call the
functions in `functions`. Timestamps are stored there as naive UTC text, so `now()` (UTC) compares
correctly. sqlglot costs about half of a short `trackway sql` to import, so this module, the only
one that imports it, is imported only for a query not already checked (see `remembered`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError

from trackway.errors import InputError, ReadOnlyViolation
from trackway.ledger.sql.functions import DATE_PARTS, TRUNCATIONS
from trackway.ledger.sql.rules import (
    TOKENS_TABLE, as_given, first_line, is_server_secret_relation, is_unsafe_function, not_allowed,
    pragma_is_read_only, reads_server_secrets, server_secret, tokens_not_readable,
)  # fmt: skip

__all__ = ["checked_sql"]


def checked_sql(query: str, dialect: str) -> str:
    """The statement to run for `query` on `dialect` ("sqlite" or "postgresql"); refused ones raise."""
    statement = _classify(query)
    if dialect == "sqlite":
        return _to_sqlite(statement)
    if isinstance(statement.tree, exp.Pragma):
        raise InputError("trackway sql: PRAGMA works on a SQLite ledger only; on PostgreSQL query information_schema")
    return as_given(query)


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
            raise not_allowed(f"EXPLAIN {keyword}" if explain else keyword) from None
        raise
    if not statements:
        raise InputError("trackway sql: nothing to EXPLAIN" if explain else "trackway sql: the query is empty")
    if len(statements) > 1:
        raise not_allowed("more than one statement")
    tree = statements[0]
    if isinstance(tree, exp.Pragma) and not explain:
        _check_pragma(tree)
        return _Statement(tree)
    if not isinstance(tree, (exp.Query, exp.Values)):
        # sqlglot reads statements it does not know (NOTIFY, DISCARD) as bare expressions.
        kind = _kind(tree) if isinstance(tree, _STATEMENTS) else _leading_keyword(text) or type(tree).__name__
        raise not_allowed(f"EXPLAIN {kind}" if explain else kind)
    for node in tree.walk():
        if isinstance(node, _STATEMENTS):
            raise not_allowed(f"{_kind(node)} inside a query" if isinstance(node, exp.DML) else _kind(node))
        if isinstance(node, exp.Func) and _reads_server_secrets(node):
            raise server_secret(f"{_function_name(node)}({', '.join(a.sql('postgres') for a in _arguments(node))})")
        if isinstance(node, exp.Func) and is_unsafe_function(name := _function_name(node)):
            raise not_allowed(f"{name}()")
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            if is_server_secret_relation(node.this.name.lower()):
                raise server_secret(node.this.name.lower())
            if node.this.name.lower() == TOKENS_TABLE:
                raise tokens_not_readable()
    return _Statement(tree, explain=bool(explain))


def _arguments(node: exp.Func) -> list[exp.Expression]:
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    return [a for a in (node.this, *node.expressions) if isinstance(a, exp.Expression)]


def _reads_server_secrets(node: exp.Func) -> bool:
    name = _function_name(node)
    setting = next(iter(_arguments(node)), None) if name == "current_setting" else None
    literal = setting.name if isinstance(setting, exp.Literal) and setting.is_string else None
    return reads_server_secrets(name, literal)


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
                raise InputError(f"trackway sql: cannot parse the query: {first_line(postgres_error)}") from None
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
        raise not_allowed(f"PRAGMA {target.this.name} = …")
    else:
        raise not_allowed("this PRAGMA")
    if not pragma_is_read_only(name, has_argument):
        raise not_allowed(f"PRAGMA {name.lower()}{'(…)' if has_argument else ''}")


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
        raise InputError(f"trackway sql: cannot translate the query for SQLite: {first_line(exc)}") from None
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
    field = _date_field(unit.name, TRUNCATIONS, "date_trunc")
    return exp.Anonymous(this="DATE_TRUNC", expressions=[exp.Literal.string(field), node.this])


def _date_part_call(node: exp.Extract) -> exp.Expression:
    if not isinstance(node.this, (exp.Var, exp.Literal)):
        return node
    field = _date_field(node.this.name, DATE_PARTS, "extract")
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
