"""Where a ledger's background-supervisor lock lies, and whether a live supervisor holds it.

Every listing asks `held()` before it reconciles, so this module imports little: a SQLite ledger's
lock lies beside its file, found without hashlib, SQLAlchemy or the redaction patterns, and a free
lock is told without reading who last held it (supervisor/background.py does that, and starts one).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from trackway.errors import InputError
from trackway.ledger.reader import plain_postgres, sqlite_file
from trackway.settings import Settings


def held(settings: Settings) -> bool:
    """Whether a background supervisor holds this ledger's lock now (it holds it exclusively for its whole life)."""
    lock = lock_path(settings)
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def lock_path(settings: Settings, key: str | None = None) -> Path:
    """A SQLite ledger's lock lies beside its file; a server's under trackway's home, named by `key`."""
    database = sqlite_database(settings.db_url)
    if database is None:
        return settings.home / "supervisor" / f"{key or ledger_key(settings.db_url)}.lock"
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise InputError(f"ledger {settings.db_url}: an in-memory SQLite ledger has no background supervisor")
    return Path(database).expanduser().resolve().with_name(Path(database).name + ".supervisor.lock")


def ledger_key(db_url: str) -> str:
    """A short name for the ledger a URL names, however it is spelled: a server ledger's lock and log are named by it."""
    import hashlib

    return hashlib.sha256(_identity(db_url).encode()).hexdigest()[:16]


def sqlite_database(db_url: str) -> str | None:
    """The database a SQLite URL names (as given), or None for a server's URL.

    A plain `sqlite:///PATH` is read without SQLAlchemy, whose import would cost every listing
    more than the look-up itself; any other spelling goes through its URL parser.
    """
    path = sqlite_file(db_url)
    if path is not None:
        return db_url[len("sqlite:///"):]
    if plain_postgres(db_url) is not None:
        return None
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    return (url.database or "") if url.get_backend_name() == "sqlite" else None


def _identity(db_url: str) -> str:
    """The ledger a URL names, spelled one way: a SQLite file by its absolute path; a server without password."""
    database = sqlite_database(db_url)
    if database is not None:
        return "sqlite:" + str(Path(database).expanduser().resolve())
    plain = plain_postgres(db_url)
    if plain is not None:  # what make_url renders for it, without importing SQLAlchemy (a test holds the two equal)
        # `URL.set(password=None)` below leaves the password in: a name kept as it always was.
        password = f":{plain['password']}" if plain["password"] is not None else ""
        port = f":{plain['port']}" if plain["port"] else ""
        return f"postgresql://{plain['user']}{password}@{plain['host']}{port}/{plain['database']}"
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    return url.set(drivername=url.get_backend_name(), password=None).render_as_string(hide_password=False)
