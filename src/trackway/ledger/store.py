"""Opening the ledger: engine from a URL, SQLite in WAL mode with one writer, migrations on first use.

SQLite allows many readers and one writer. Every write transaction here starts with
`BEGIN IMMEDIATE`, which takes the write lock up front (so two writers queue on the busy
timeout instead of failing half-way with "database is locked"), and writes from threads of
one process are serialized by a lock before they reach SQLite.

Every database failure that is not about the input (a lock held past the busy timeout, a full
disk, a server that cannot be reached, a damaged file) leaves `read()` and `write()` as one
`LedgerError` (exit 3) naming the ledger, with any password redacted, and what happened;
`ledger_error` is the one mapping, for both backends. Integrity, data and programming errors
pass through: they are about what was sent, not about the ledger.

SQLite copies its write-ahead log back into the database file (a checkpoint) at the commit that
finds the log past 1,000 pages. A supervisor writing a burst of ends batch after batch would pay
that copy, and its fsyncs, at nearly every batch, before the next batch's receipts: inside
`checkpoints_after()` the log may grow (to a bound), and is copied back at its end.

A SQLite ledger file is created 0600 (its evidence and blobs may quote secrets) in directories
created 0700.

A PostgreSQL connection taken from the pool is checked with a round trip (`SELECT 1`) only when it
sat unused for PING_AFTER_IDLE_S: a server restarted or a connection cut since then is replaced
before anyone uses it. SQLAlchemy's `pool_pre_ping` checked every checkout, and a supervisor's tick
takes a dozen in a row: that check was one in seven of its samples (py-spy over two supervisors on
one ledger). A connection cut within a second of its last use fails its statement instead, as one
LedgerError, and the pool is remade for the next.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

from trackway.errors import InputError, LedgerError, LedgerUnavailable
from trackway.ledger.busy_timeout import BUSY_TIMEOUT_ENV, sqlite_busy_timeout
from trackway.redaction import redact, redact_url

# Below this much free space, a SQLite I/O error is taken for the full disk it almost always is
# (WAL and shared-memory files grow in pages; a disk with less than this left cannot take one more).
NEARLY_FULL_BYTES = 1 << 20
_WRITE = "trackway_write"
# SQLite's own: a commit that finds the write-ahead log past this many pages copies it back into the file.
AUTOCHECKPOINT_PAGES = 1000
# Inside `Ledger.checkpoints_after()`: at most this many pages (128 MiB of 4 KiB pages) wait for its end.
# A burst of 10,000 ends writes about 27,000.
DEFERRED_CHECKPOINT_PAGES = 32768
# A log that grew past this is cut back to it once copied back, not kept at its largest size on disk.
WAL_SIZE_LIMIT_BYTES = 16 << 20
PAGE_CACHE_KIB = 16 << 10  # at most, per connection: pages are cached as they are read
# A pooled PostgreSQL connection unused for this long is pinged before it is handed out (see above).
PING_AFTER_IDLE_S = 1.0

# PEP 249 class names of errors about what was sent (a bug or bad input), not about the ledger.
_STATEMENT_ERRORS = frozenset({"IntegrityError", "DataError", "ProgrammingError", "NotSupportedError", "InternalError"})
_LEDGER_FAILURES = frozenset({"OperationalError", "InterfaceError", "DatabaseError"})
# SQLite reports a syntax error or a missing table as an OperationalError too; its result code
# tells them apart from a lock, a full disk or a damaged file.
_SQLITE_STATEMENT_CODES = ("SQLITE_ERROR", "SQLITE_CONSTRAINT", "SQLITE_MISMATCH", "SQLITE_RANGE", "SQLITE_TOOBIG", "SQLITE_INTERRUPT")

# The ledger this process opened last: errors that escape a Ledger still name it.
_last_url: URL | None = None


def _sqlite_engine(url: URL) -> Engine:
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        _create_private_file(url, Path(database).expanduser())
    busy_timeout = sqlite_busy_timeout()
    engine = create_engine(
        url,
        connect_args={"timeout": busy_timeout, "check_same_thread": False},
        # Connections are kept for reuse: opening one (and its PRAGMAs) costs about half a
        # millisecond, and a supervisor tick recording an attempt's end opens several.
        poolclass=QueuePool,
        pool_size=4,
        max_overflow=8,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Hand transaction control to the "begin" hook below (pysqlite's own BEGIN is deferred).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")  # first: the next one may wait
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        # A page cache of up to 16 MiB (SQLite's default is 2): a supervisor's tick over 10,000 attempts
        # reads each of their rows more than once, and every page that fell out is a read from the file.
        cursor.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")

    return engine


def _create_private_file(url: URL, path: Path) -> None:
    """Create the ledger file (0600) and its missing directories (0700) before SQLite would (0644, 0755)."""
    if path.exists():
        return
    try:
        make_private_dirs(path.parent)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # an empty file is an empty database
    except FileExistsError:
        pass  # another process created it a moment earlier
    except OSError as exc:
        raise LedgerUnavailable(f"ledger {_name(url)}: cannot be created: {exc.strerror or exc} ({exc.filename or path})") from None


def make_private_dirs(directory: Path) -> None:
    """Create `directory` and each missing parent with mode 0700 (`os.makedirs` gives parents the default)."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue


def create_ledger_engine(url_text: str) -> Engine:
    """An engine for a `sqlite:///PATH` or `postgresql+psycopg://...` URL."""
    global _last_url
    try:
        url = make_url(url_text)
    except ArgumentError:
        raise InputError(
            f"ledger URL {redact_url(url_text)!r}: expected sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    backend = url.get_backend_name()
    _last_url = url
    if backend == "sqlite":
        return _sqlite_engine(url)
    if backend == "postgresql":
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return _ping_when_idle(create_engine(url, pool_size=2, max_overflow=4))
    raise InputError(
        f"ledger URL {redact_url(url_text)!r}: expected a sqlite:// or postgresql+psycopg:// URL, got {backend}://"
    )


def _ping_when_idle(engine: Engine) -> Engine:
    """Check a pooled connection with a round trip when it comes out of the pool after PING_AFTER_IDLE_S unused."""

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection, record):
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection, record, _proxy):
        # A new connection has no stamp: `info` starts empty, and is emptied when an invalidated one is replaced.
        returned_at = record.info.get("returned_at")
        if returned_at is None or time.monotonic() - returned_at < PING_AFTER_IDLE_S:
            return
        dialect = engine.dialect
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi_connection, None):
                # The pool drops this connection and hands out a new one (or says why it cannot).
                raise DisconnectionError(f"a pooled connection was cut while unused: {exc}") from exc
            raise

    return engine


class Ledger:
    """A migrated ledger: `read()` and `write()` hand out connections in a transaction."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.dialect = engine.dialect.name
        self._write_lock = threading.Lock()
        self._checkpoint_pages = AUTOCHECKPOINT_PAGES
        self._copied_pools: list = []  # a forked child's copies of its parent's connections (use_own_connections)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: committed on clean exit, rolled back on exception."""
        with self._write_lock, self._failures_named(), self._connect() as conn:
            if self.dialect == "sqlite":
                self._set_checkpoint_pages(conn)
            conn = conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn

    @contextmanager
    def checkpoints_after(self) -> Iterator[None]:
        """Writes inside leave SQLite's checkpoint to the end (see the module); elsewhere nothing changes.

        Readers read the log as they read the file, and a process that dies inside loses no commit.
        The log is flushed to disk when it is copied back, so a machine losing power could lose the
        commits since the last copy: that was one batch's, here the burst's until it ends (seconds).
        """
        with self._write_lock:
            self._checkpoint_pages = DEFERRED_CHECKPOINT_PAGES
        try:
            yield
        finally:
            with self._write_lock:
                self._checkpoint_pages = AUTOCHECKPOINT_PAGES
            if self.dialect == "sqlite":
                self._copy_back()

    def _copy_back(self) -> None:
        """Copy the log back now (PASSIVE: readers are not waited for), rather than at some later commit."""
        try:
            with self._connect() as conn:
                # On the driver's connection: a checkpoint cannot run inside the transaction SQLAlchemy would open.
                conn.connection.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except (DBAPIError, sqlite3.Error):
            pass  # the log stays the database's until a later commit copies it back: nothing is lost

    def _set_checkpoint_pages(self, conn: Connection) -> None:
        """Give this connection the checkpoint bound in force, once per change: it is a setting of the connection."""
        kept = conn.connection.info  # stays with the driver's connection from one checkout to the next
        if kept.get("wal_autocheckpoint", AUTOCHECKPOINT_PAGES) != self._checkpoint_pages:
            # On the driver's connection: a statement through SQLAlchemy would open its transaction first.
            conn.connection.driver_connection.execute(f"PRAGMA wal_autocheckpoint={self._checkpoint_pages}")
            kept["wal_autocheckpoint"] = self._checkpoint_pages

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self._failures_named(), self._connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _failures_named(self) -> Iterator[None]:
        """Turn a database failure anywhere in the transaction (BEGIN, a statement, COMMIT) into a LedgerError."""
        try:
            yield
        except (DBAPIError, PoolTimeout, sqlite3.Error) as exc:
            mapped = as_ledger_error(exc, self.engine.url)
            if mapped is None:
                raise
            raise mapped from exc

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            raise ledger_error(exc, self.engine.url, unavailable=True) from exc
        try:
            yield conn
        finally:
            conn.close()

    def dispose(self) -> None:
        self.engine.dispose()

    def forkable(self) -> bool:
        """Whether a child forked now copies no connection in use (none in a transaction half-way)."""
        checked_out = getattr(self.engine.pool, "checkedout", None)
        return checked_out is not None and checked_out() == 0 and not self._write_lock.locked()

    def use_own_connections(self) -> None:
        """In a forked child: connections of its own from here on (see supervisor/burst_split.py).

        The copied ones are kept, never used and never closed: closing a copy of a PostgreSQL
        connection ends the parent's session, and closing a copied SQLite file lets go of this
        process's own locks on it.
        """
        self._copied_pools.append(self.engine.pool)
        self.engine.dispose(close=False)


def as_ledger_error(exc: BaseException, url: URL | None = None) -> LedgerError | None:
    """`exc` as a LedgerError if it is a failure of the ledger itself; None if it is about what was sent."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, PoolTimeout):
        return ledger_error(exc, url)
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else exc
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return ledger_error(exc, url)
    names = {cls.__name__ for cls in type(orig if orig is not None else exc).__mro__}
    if names & _STATEMENT_ERRORS or not names & _LEDGER_FAILURES:
        return None
    code = str(getattr(orig, "sqlite_errorname", ""))
    if code.startswith(_SQLITE_STATEMENT_CODES):
        return None
    return ledger_error(exc, url)


def ledger_error(exc: BaseException, url: URL | None = None, *, unavailable: bool = False) -> LedgerError:
    """The one line a user gets for a ledger failure: which ledger, and locked / disk full / unreachable / ...."""
    url = url or _last_url
    what = _what_happened(exc, url)
    if unavailable or what.startswith(("unreachable", "cannot be opened")):
        return LedgerUnavailable(f"cannot open the ledger {_name(url)}: {what}")
    return LedgerError(f"ledger {_name(url)}: {what}")


def _what_happened(exc: BaseException, url: URL | None) -> str:
    orig = getattr(exc, "orig", None) or exc
    detail = redact(_first_line(orig))
    lowered = detail.lower()
    sqlite_name = str(getattr(orig, "sqlite_errorname", ""))
    sqlstate = str(getattr(orig, "sqlstate", "") or "")
    database = url.database if url is not None and url.get_backend_name() == "sqlite" else None
    if sqlite_name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in lowered:
        return (
            f"locked by another process for longer than the busy timeout ({sqlite_busy_timeout():g} s; "
            f"{BUSY_TIMEOUT_ENV} sets it); nothing was changed"
        )
    if sqlstate == "55P03" or "lock timeout" in lowered:
        return f"locked by another session; nothing was changed ({detail})"
    if _disk_full(sqlite_name, sqlstate, lowered, database):
        return f"disk full{_free_space(database)}; the change was not recorded ({detail})"
    if sqlite_name.startswith("SQLITE_CANTOPEN"):
        return f"cannot be opened: {detail} ({database})"
    if sqlite_name.startswith("SQLITE_READONLY"):
        return f"read-only: {detail}; the change was not recorded"
    if sqlite_name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return f"damaged: {detail}"
    if isinstance(exc, PoolTimeout):
        return f"busy: no connection to it came free in time ({detail})"
    if database is None and (sqlstate == "" or sqlstate.startswith(("08", "57P"))):
        return f"unreachable: {detail}"
    return f"failed: {detail}"


def _disk_full(sqlite_name: str, sqlstate: str, lowered: str, database: str | None) -> bool:
    if sqlite_name.startswith("SQLITE_FULL") or sqlstate == "53100":
        return True
    if "no space left on device" in lowered or "disk is full" in lowered or "could not extend file" in lowered:
        return True
    if sqlite_name.startswith("SQLITE_IOERR") or "disk i/o error" in lowered:
        # SQLite says only "disk I/O error" when a WAL or shared-memory file cannot grow: ask the disk.
        free = _free_bytes(database)
        return free is not None and free < NEARLY_FULL_BYTES
    return False


def _free_space(database: str | None) -> str:
    free = _free_bytes(database)
    if free is None or database is None:
        return ""
    return f": {free} bytes free on the file system holding {Path(database).expanduser().parent}"


def _free_bytes(database: str | None) -> int | None:
    if not database or database == ":memory:":
        return None
    try:
        return shutil.disk_usage(Path(database).expanduser().parent).free
    except OSError:
        return None


def _name(url: URL | None) -> str:
    """The ledger's URL as a user may see it: password and secret parameters redacted."""
    if url is None:
        return "(not opened)"
    return redact_url(url.render_as_string(hide_password=False))


def _first_line(exc: BaseException) -> str:
    message = str(getattr(exc, "orig", None) or exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__


def dialect_insert(conn: Connection):
    """The INSERT of this connection's dialect: both SQLite's and PostgreSQL's know ON CONFLICT."""
    # Imported here: the PostgreSQL dialect module pulls in asyncio, which a process on a SQLite ledger (a
    # script's ingester, whose start-up a short script's finish() waits for) would pay for at import.
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert
