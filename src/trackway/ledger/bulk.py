"""Many rows read by id and many rows updated, through the database driver: what a burst of ends costs the ledger.

A supervisor recording thousands of ends in a tick reads their runs and attempts by id and
writes an UPDATE per end. Through SQLAlchemy's statements, binding an IN list of hundreds of
names, or the parameters of every row of an executemany, costs more than the database spends
on them. Here the SQL is built from the schema's own table and column names (nothing else
reaches the text), values go to the driver as positional parameters, and each column's
values are converted by its type exactly as SQLAlchemy converts them (its public
`bind_processor`), so what is stored and what is read is what `select`/`update` would store
and read. A driver of another parameter style goes through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Boolean, Connection, Table, and_, bindparam, select, update

from trackway.ledger.reader import as_utc
from trackway.ledger.schema import UTCDateTime

# Ids bound in one IN list: far below SQLite's 32,766 variables and PostgreSQL's 65,535 parameters.
IN_CHUNK = 900


def chunks(values: Sequence[Any], size: int = IN_CHUNK):
    for start in range(0, len(values), size):
        yield values[start:start + size]


# A placeholder for one positional parameter, by the driver's paramstyle.
_POSITIONAL = {"qmark": "?", "format": "%s", "pyformat": "%s"}


def _own_names(table: Table, names: Iterable[str]) -> None:
    if unknown := set(names) - set(table.c.keys()):  # only the table's own names reach the SQL
        raise ValueError(f"not columns of {table.name}: {', '.join(sorted(unknown))}")


def rows_where_in(conn: Connection, table: Table, column: str, values: Iterable[Any],
                  order_by: Sequence[str] = (), columns: Sequence[str] | None = None,
                  for_update: bool = False) -> list[dict[str, Any]]:
    """The rows of `table` whose `column` is one of `values`, as `select(table)` gives them (UTC times), as dicts.

    A chunk of values at a time. `order_by`: column names, within each chunk. `columns`: only
    these, for a caller that reads a few of a wide table's. `for_update`: the rows locked until
    the transaction ends (PostgreSQL; a SQLite writer holds the whole database already).
    """
    _own_names(table, [column, *order_by, *(columns or ())])
    chosen = [table.c[name] for name in columns] if columns is not None else list(table.c)
    mark = _POSITIONAL.get(conn.dialect.paramstyle)
    if mark is None:  # a driver of another style: SQLAlchemy's way
        query = select(*chosen).where(table.c[column].in_(bindparam("values", expanding=True)))
        query = query.order_by(*(table.c[name] for name in order_by))
        query = query.with_for_update() if for_update else query
        return [dict(row) for part in chunks(list(values)) for row in conn.execute(query, {"values": part}).mappings()]
    names = [c.name for c in chosen]
    stamps = [c.name for c in chosen if isinstance(c.type, UTCDateTime)]
    flags = [c.name for c in chosen if isinstance(c.type, Boolean)]
    found: list[dict[str, Any]] = []
    for part in chunks(list(values)):
        sql = (f"SELECT {', '.join(names)} FROM {table.name} WHERE {column} IN "
               f"({', '.join([mark] * len(part))})" + (f" ORDER BY {', '.join(order_by)}" if order_by else "")
               + (" FOR UPDATE" if for_update and conn.dialect.name != "sqlite" else ""))
        result = conn.exec_driver_sql(sql, tuple(part))
        try:
            rows = result.cursor.fetchall()  # the driver's tuples: a Row per row would cost more than reading it
        finally:
            result.close()
        for row in rows:
            # Most of a row's times and flags are unset: convert only those that are not.
            record = dict(zip(names, row))
            for name in stamps:
                if record[name] is not None:
                    record[name] = as_utc(record[name])
            for name in flags:
                if record[name] is not None:
                    record[name] = bool(record[name])
            found.append(record)
    return found


def update_many(conn: Connection, table: Table, key: str, rows: Sequence[Mapping[str, Any]],
                unless: tuple[str, Any] | None = None) -> None:
    """`UPDATE table SET ... WHERE key = :key [AND column != value]` once per row, in one executemany.

    Each row names the same columns: `key`'s value says which row of the table, the others are
    the values set. `unless` (column, value): leave a row that already holds that value as it
    is (an attempt already ended).
    """
    if not rows:
        return
    columns = [name for name in rows[0] if name != key]
    _own_names(table, [key, *columns, *([unless[0]] if unless else [])])
    mark = _POSITIONAL.get(conn.dialect.paramstyle)
    if mark is None:
        # Bound under names of their own: SQLAlchemy keeps a column's own name for its SET clause.
        where = [table.c[key] == bindparam(f"b_{key}")]
        if unless is not None:
            where.append(table.c[unless[0]] != unless[1])
        statement = update(table).where(and_(*where)).values({name: bindparam(f"b_{name}") for name in columns})
        conn.execute(statement, [{f"b_{name}": row[name] for name in [*columns, key]} for row in rows])
        return
    ordered = [*columns, key]
    convert = [(name, _bind_processor(conn, table, name)) for name in ordered]
    sql = (f"UPDATE {table.name} SET {', '.join(f'{name} = {mark}' for name in columns)} WHERE {key} = {mark}"
           + (f" AND {unless[0]} != {mark}" if unless else ""))
    tail = [_bound(unless[1], _bind_processor(conn, table, unless[0]))] if unless else []
    conn.exec_driver_sql(sql, [tuple([_bound(row[name], to) for name, to in convert] + tail) for row in rows])


def _bound(value: Any, to: Callable[[Any], Any] | None) -> Any:
    return value if to is None or value is None else to(value)


_processors: dict[tuple[str, str, str], Callable[[Any], Any] | None] = {}


def _bind_processor(conn: Connection, table: Table, name: str) -> Callable[[Any], Any] | None:
    """How SQLAlchemy turns a value of this column into what the driver is given; None where it passes it as it is."""
    cache_key = (conn.dialect.name, table.name, name)
    if cache_key not in _processors:
        dialect = conn.dialect
        general = table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
        if dialect.name == "sqlite" and isinstance(table.c[name].type, UTCDateTime) and general is not None:
            general = _sqlite_utc_text(general)
        _processors[cache_key] = general
    return _processors[cache_key]


def _sqlite_utc_text(general: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A UTC time as SQLAlchemy writes it into SQLite (naive UTC, `YYYY-MM-DD HH:MM:SS.ffffff`), from datetime's own
    C formatter: SQLAlchemy's two steps (UTCDateTime's, then its format string) were about 9% of writing a burst's
    receipts (2% of the instructions of the tick that records them). Anything but a plain datetime goes SQLAlchemy's
    way."""
    def convert(value: Any) -> Any:
        if type(value) is not datetime:
            return general(value)
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value.isoformat(" ", "microseconds")
    return convert
