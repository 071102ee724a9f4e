"""A PostgreSQL connection through libpq itself (ctypes), for the plain reads: no psycopg import.

Importing psycopg costs about 0.3 s of CPU on a loaded 2-core machine (asyncio, its type system,
its C extension), three times a whole `trackway runs` on SQLite; libpq, the C library psycopg
calls, loads in about 10 ms. A read needs little of a driver: one statement at a time with text
parameters, and the text of each value turned into what psycopg gives for the column types the
ledger uses (`tests/ledger/test_libpq.py` holds the two equal). The library is the one psycopg
itself loads (psycopg_binary's copy), else the system's; with neither, `connect` returns None and
the caller reads through SQLAlchemy.
"""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

_CONNECTION_OK = 0
_COMMAND_OK, _TUPLES_OK = 1, 2
_DIAG_SQLSTATE = ord("C")


class Error(Exception):
    """A failure libpq reported; `sqlstate` as the server gave it ("" for one on the client side)."""

    def __init__(self, message: str, sqlstate: str = ""):
        super().__init__(message)
        self.sqlstate = sqlstate


# Named as the DB-API (and psycopg) name them, which is how ledger/store.py tells a ledger failure from a bad statement.
class DatabaseError(Error): ...
class OperationalError(DatabaseError): ...
class ProgrammingError(DatabaseError): ...
class DataError(DatabaseError): ...
class IntegrityError(DatabaseError): ...
class InternalError(DatabaseError): ...
class NotSupportedError(DatabaseError): ...


# The SQLSTATE class of each error as psycopg maps it (psycopg/errors.py).
_BY_CLASS = {
    "08": OperationalError, "0A": NotSupportedError, "20": ProgrammingError, "21": ProgrammingError,
    "22": DataError, "23": IntegrityError, "24": InternalError, "25": InternalError, "26": InternalError,
    "27": InternalError, "28": OperationalError, "2B": InternalError, "2D": InternalError, "2F": InternalError,
    "34": ProgrammingError, "38": InternalError, "39": InternalError, "3B": InternalError, "3D": ProgrammingError,
    "3F": ProgrammingError, "40": OperationalError, "42": ProgrammingError, "44": ProgrammingError,
    "53": OperationalError, "54": OperationalError, "55": OperationalError, "57": OperationalError,
    "58": OperationalError, "72": InternalError, "F0": InternalError, "HV": OperationalError,
    "P0": InternalError, "XX": InternalError,
}


_SEVERITY = re.compile(r"^(?:ERROR|FATAL|PANIC):  ")


def _error(message: str, sqlstate: str) -> Error:
    """The error psycopg raises for it: its class by SQLSTATE, its text without libpq's `ERROR:  ` in front."""
    return _BY_CLASS.get(sqlstate[:2], DatabaseError)(_SEVERITY.sub("", message.strip()), sqlstate)


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """libpq as psycopg_binary ships it (what psycopg would use), else the system's; None without either."""
    import importlib.util

    candidates: list[str] = []
    spec = importlib.util.find_spec("psycopg_binary")
    if spec is not None and spec.submodule_search_locations:
        libs = Path(next(iter(spec.submodule_search_locations))).parent / "psycopg_binary.libs"
        candidates += sorted(str(p) for p in libs.glob("libpq-*.so*"))
    candidates.append("libpq.so.5")
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        _declare(lib)
        return lib
    return None


def _declare(lib: ctypes.CDLL) -> None:
    p, s, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for name, restype, argtypes in (
        ("PQconnectdbParams", p, [ctypes.POINTER(s), ctypes.POINTER(s), i]),
        ("PQstatus", i, [p]), ("PQerrorMessage", s, [p]), ("PQfinish", None, [p]),
        ("PQexecParams", p, [p, s, i, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(s), p, p, i]),
        ("PQexec", p, [p, s]), ("PQprepare", p, [p, s, s, i, p]), ("PQdescribePrepared", p, [p, s]),
        ("PQresultStatus", i, [p]), ("PQresultErrorMessage", s, [p]), ("PQresultErrorField", s, [p, i]),
        ("PQclear", None, [p]), ("PQntuples", i, [p]), ("PQnfields", i, [p]), ("PQfname", s, [p, i]),
        ("PQftype", ctypes.c_uint, [p, i]), ("PQgetisnull", i, [p, i, i]),
        ("PQgetvalue", s, [p, i, i]),  # text results hold no NUL byte: c_char_p reads each whole
    ):
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def connect(conninfo: str) -> Connection | None:
    """A connection to the database the libpq URI `conninfo` names, with ISO dates; None without libpq.

    Raises `Error` (an OperationalError) when the server cannot be reached or refuses the connection.
    """
    lib = _library()
    if lib is None:
        return None
    # The session's own time zone, as psycopg leaves it: a timestamptz comes back in it, with its offset.
    settings = {"dbname": conninfo, "client_encoding": "UTF8", "options": "-c DateStyle=ISO"}
    keys = (ctypes.c_char_p * (len(settings) + 1))(*[k.encode() for k in settings], None)
    values = (ctypes.c_char_p * (len(settings) + 1))(*[v.encode() for v in settings.values()], None)
    handle = lib.PQconnectdbParams(keys, values, 1)  # 1: dbname is a URI to expand
    if lib.PQstatus(handle) != _CONNECTION_OK:
        message = (lib.PQerrorMessage(handle) or b"").decode("utf-8", "replace")
        lib.PQfinish(handle)
        raise OperationalError(message, "08006")
    return Connection(lib, handle, conninfo)


class Connection:
    """One libpq connection: statements with `:name` parameters, rows as tuples of psycopg's Python values."""

    def __init__(self, lib: ctypes.CDLL, handle: int, conninfo: str):
        self._lib = lib
        self._handle = handle
        self.conninfo = conninfo

    def script(self, sql: str) -> None:
        """Run `sql`, one statement or several (the simple protocol), for what it does, not for rows."""
        self._result(self._lib.PQexec(self._handle, sql.encode()))

    def result_types(self, sql: str) -> list[int]:
        """The type OID of each column `sql` returns, from the server's parse of it, without running it."""
        self._result(self._lib.PQprepare(self._handle, b"", sql.encode(), 0, None))
        return self._result(self._lib.PQdescribePrepared(self._handle, b""), self._types)

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        """Run one statement (the extended protocol: never more than one); (column names, rows)."""
        text, names = _numbered(sql)
        typed = [_param(params[name]) for name in names] if names else []
        values = (ctypes.c_char_p * len(typed))(*[value for _, value in typed]) if typed else None
        types = (ctypes.c_uint * len(typed))(*[oid for oid, _ in typed]) if typed else None
        result = self._lib.PQexecParams(self._handle, text.encode(), len(typed), types, values, None, None, 0)
        return self._result(result, self._rows)

    def _result(self, result: int, read: Callable[[int], Any] | None = None) -> Any:
        """What `read` takes from a result that succeeded (the result freed after); the error it holds raised."""
        lib = self._lib
        if not result:
            raise OperationalError((lib.PQerrorMessage(self._handle) or b"").decode("utf-8", "replace"), "08006")
        try:
            if lib.PQresultStatus(result) not in (_COMMAND_OK, _TUPLES_OK):
                message = (lib.PQresultErrorMessage(result) or b"").decode("utf-8", "replace")
                raise _error(message, (lib.PQresultErrorField(result, _DIAG_SQLSTATE) or b"").decode())
            return read(result) if read is not None else None
        finally:
            lib.PQclear(result)

    def _types(self, result: int) -> list[int]:
        return [self._lib.PQftype(result, j) for j in range(self._lib.PQnfields(result))]

    def _rows(self, result: int) -> tuple[list[str], list[tuple]]:
        lib = self._lib
        fields = lib.PQnfields(result)
        columns = [lib.PQfname(result, j).decode() for j in range(fields)]
        loaders = [_LOADERS.get(lib.PQftype(result, j), _text) for j in range(fields)]
        rows = []
        for i in range(lib.PQntuples(result)):
            row = []
            for j in range(fields):
                raw = lib.PQgetvalue(result, i, j)
                # A NULL reads as b"", as an empty text does: only then is it worth asking which.
                row.append(None if not raw and lib.PQgetisnull(result, i, j) else loaders[j](raw))
            rows.append(tuple(row))
        return columns, rows

    def close(self) -> None:
        if self._handle:
            self._lib.PQfinish(self._handle)  # an open transaction is rolled back
            self._handle = None


# A `:name` parameter as SQLAlchemy's text() finds one (not a `::type` cast, not inside a word).
_NAMED = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


@lru_cache(maxsize=256)
def _numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with each `:name` as `$N` (a name used twice is one parameter), and the names in order."""
    names: list[str] = []

    def number(found: re.Match) -> str:
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    return _NAMED.sub(number, sql), tuple(names)


def _param(value: Any) -> tuple[int, bytes | None]:
    """(type OID, text) of a parameter, typed as psycopg types it (a str is left for the server to infer)."""
    if value is None:
        return 0, None
    if isinstance(value, bool):
        return 16, b"true" if value else b"false"
    if isinstance(value, int):
        oid = 21 if -2**15 <= value < 2**15 else 23 if -2**31 <= value < 2**31 else 20 if -2**63 <= value < 2**63 else 1700
        return oid, str(value).encode()
    if isinstance(value, float):
        return 701, repr(value).encode()
    if isinstance(value, datetime):
        return (1114 if value.tzinfo is None else 1184), value.isoformat().encode()
    if isinstance(value, date):
        return 1082, value.isoformat().encode()
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):  # text[]
        quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in value)
        return 1009, ("{" + ",".join(quoted) + "}").encode()
    return 0, str(value).encode()


def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


def _bytea(raw: bytes) -> bytes:
    return bytes.fromhex(raw[2:].decode()) if raw.startswith(b"\\x") else raw


def _timestamp(raw: bytes) -> datetime:
    return datetime.fromisoformat(raw.decode())


_LOADERS = {
    16: lambda raw: raw == b"t",  # bool
    17: _bytea,
    20: int, 21: int, 23: int, 26: int,  # int8, int2, int4, oid
    700: float, 701: float,  # float4, float8 (PostgreSQL prints the shortest text that reads back exactly)
    1700: lambda raw: Decimal(raw.decode()),  # numeric
    114: json.loads, 3802: json.loads,  # json, jsonb
    1082: lambda raw: date.fromisoformat(raw.decode()),
    1114: _timestamp, 1184: _timestamp,  # timestamp, timestamptz
    18: _text, 19: _text, 25: _text, 1042: _text, 1043: _text,  # "char", name, text, char(n), varchar
    2950: lambda raw: __import__("uuid").UUID(raw.decode()),
}


def loads_as_psycopg(oid: int) -> bool:
    """Whether a column of this type comes back here as psycopg gives it (arrays, intervals and the like do not)."""
    return oid in _LOADERS
