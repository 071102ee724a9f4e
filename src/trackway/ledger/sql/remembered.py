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

import hashlib
import importlib.util
import os
import stat
from pathlib import Path

from trackway.ledger.sql.rules import as_given

__all__ = ["checked", "entry_path"]

_REMEMBERED_MAX = 500
_REMEMBERED_MAX_BYTES = 1 << 20
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
        _remember(entry, sql if dialect == "sqlite" else "")
    return sql


def entry_path(query: str, dialect: str, remember_in: Path | None) -> Path | None:
    """Where `query`'s entry is (or would be) kept; None without a directory or when a rule file is unreadable."""
    if remember_in is None:
        return None
    rules = [Path(__file__).with_name(name) for name in _RULES]
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


