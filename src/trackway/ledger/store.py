"""Opening the ledger: engine from a URL, SQLite in WAL mode with one writer, migrations on first use.

SQLite allows many readers and one writer. Every write transaction here starts with
`BEGIN IMMEDIATE`, which takes the write lock up front (so two writers queue on the busy
timeout instead of failing half-way with "database is locked"), and writes from threads of
one process are serialized by a lock before they reach SQLite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.pool import NullPool

from trackway.errors import InputError, LedgerUnavailable

SQLITE_BUSY_TIMEOUT_S = 30.0
_WRITE = "trackway_write"


def _sqlite_engine(url) -> Engine:
    database = url.database
    if database and database != ":memory:":
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        poolclass=NullPool,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Hand transaction control to the "begin" hook below (pysqlite's own BEGIN is deferred).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")

    return engine


def create_ledger_engine(url_text: str) -> Engine:
    """An engine for a `sqlite:///PATH` or `postgresql+psycopg://...` URL."""
    try:
        url = make_url(url_text)
    except ArgumentError:
        raise InputError(
            f"ledger URL {url_text!r}: expected sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url)
    if backend == "postgresql":
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)
    raise InputError(f"ledger URL {url_text!r}: expected a sqlite:// or postgresql+psycopg:// URL, got {backend}://")


class Ledger:
    """A migrated ledger: `read()` and `write()` hand out connections in a transaction."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        self._write_lock = threading.Lock()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: committed on clean exit, rolled back on exception."""
        with self._write_lock, self._connect() as conn:
            conn = conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        try:
            conn = self.engine.connect()
        except OperationalError as exc:
            raise LedgerUnavailable(f"cannot open the ledger at {self.engine.url!r}: {_first_line(exc)}") from None
        try:
            yield conn
        finally:
            conn.close()

    def dispose(self) -> None:
        self.engine.dispose()


def _first_line(exc: BaseException) -> str:
    message = str(getattr(exc, "orig", None) or exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


def open_ledger(url: str, migrate: bool = True) -> Ledger:
    """Open (and, on first use, migrate) the ledger at `url`."""
    ledger = Ledger(create_ledger_engine(url))
    if migrate:
        from trackway.ledger.migrate import upgrade_to_head

        upgrade_to_head(ledger)
    return ledger

