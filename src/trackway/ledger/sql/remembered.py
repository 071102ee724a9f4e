"""Queries already checked, remembered on disk, so that a query run again starts without importing sqlglot.

A query that passed the check is remembered, so that a query run again (a script's, a watch
loop's) skips `dialect`. The entry's name is a hash of the dialect, the query and the rules that
checked it (the files of this package that decide what runs, sqlglot's installed version): a
change to any of them checks every query afresh. On PostgreSQL the entry is an empty marker: what
runs is the query as given. On SQLite it holds the transpiled text, which only this user can have
written: an entry is used only from a directory of this user's that no one else can write, and
only if this user owns it and no one else can write it; anything else is checked again. Whatever
an entry says, the database's own layer (the reader role; query_only and the authorizer) applies.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trackway.ledger.sql.rules import as_given
from trackway.remembered import entry_path as remembered_entry
from trackway.remembered import read_entry, write_entry

__all__ = ["checked", "entry_path"]

# The modules whose change can change what a query is checked or transpiled into.
_RULES = ("remembered.py", "rules.py", "functions.py", "dialect.py")


def checked(query: str, dialect: str, remember_in: Path | None) -> str:
    """What to run for `query` on `dialect`: remembered in `remember_in` if checked before, else checked now."""
    entry = entry_path(query, dialect, remember_in)
    remembered = _read_remembered(entry) if entry is not None else None
    if remembered is not None:
        return remembered if dialect == "sqlite" else as_given(query)
    from trackway.ledger.sql.dialect import checked_sql

    sql = checked_sql(query, dialect)
    if entry is not None:
        write_entry(entry, (sql if dialect == "sqlite" else "").encode("utf-8"))
    return sql


def entry_path(query: str, dialect: str, remember_in: Path | None) -> Path | None:
    """Where `query`'s entry is (or would be) kept; None without a directory or when a rule file is unreadable."""
    if remember_in is None:
        return None
    rules = [Path(__file__).with_name(name) for name in _RULES]
    spec = importlib.util.find_spec("sqlglot")  # finds the package without importing it
    if spec is not None and spec.origin:
        rules.append(Path(spec.origin))
    return remembered_entry(remember_in, [dialect, query], rules, ".sql")


def _read_remembered(entry: Path) -> str | None:
    data = read_entry(entry)
    try:
        return data.decode("utf-8") if data is not None else None
    except UnicodeDecodeError:
        return None
