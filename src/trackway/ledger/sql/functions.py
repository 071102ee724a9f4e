"""PostgreSQL's date_trunc, date_part and `~` on a SQLite ledger: Python functions registered on its connection.

The SQLite text `dialect` makes calls them: DATE_TRUNC and DATE_PART (rewritten from date_trunc and
extract) and REGEXP (sqlglot's SQLite spelling of `~`). Timestamps are stored there as naive UTC text.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import lru_cache, partial

_EPOCH = datetime(1970, 1, 1)


def _naive_utc(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"expected a timestamp, got {value!r}")
    moment = datetime.fromisoformat(value.strip())
    return moment.astimezone(timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


TRUNCATIONS = {
    "second": lambda t: t.replace(microsecond=0),
    "minute": lambda t: t.replace(second=0, microsecond=0),
    "hour": lambda t: t.replace(minute=0, second=0, microsecond=0),
    "day": lambda t: t.replace(hour=0, minute=0, second=0, microsecond=0),
    "week": lambda t: (t - timedelta(days=t.weekday())).replace(hour=0, minute=0, second=0, microsecond=0),
    "month": lambda t: t.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
    "quarter": lambda t: t.replace(month=(t.month - 1) // 3 * 3 + 1, day=1, hour=0, minute=0, second=0, microsecond=0),
    "year": lambda t: t.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0),
}
DATE_PARTS = {
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
    return TRUNCATIONS[field.lower()](_naive_utc(value)).strftime("%Y-%m-%d %H:%M:%S")


def _date_part(field: str, value: object) -> float | int | None:
    return None if value is None else DATE_PARTS[field.lower()](_naive_utc(value))


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


def sqlite_functions(failures: list[str]) -> tuple:
    """(name, arity, function) to register; a bad regular expression's message is appended to `failures`."""
    return (("date_trunc", 2, _date_trunc), ("date_part", 2, _date_part), ("regexp", 2, partial(_regexp, failures)))

