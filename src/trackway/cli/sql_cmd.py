"""`trackway sql`: read-only SQL over the ledger, written in PostgreSQL's dialect on every backend."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import threading
from datetime import date, datetime
from decimal import Decimal

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json, to_jsonable
from trackway.errors import InputError

_TIME_TEXT = re.compile(r"^\d{4}-\d\d-\d\d([ T]\d\d:\d\d|$)")
# Past --timeout, how long the database's own limit has to stop the statement before the process ends.
_WATCHDOG_MARGIN_S = 0.5


def sql(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="One read-only statement, e.g. \"select * from training_attempts limit 5\"."),
    as_json: bool = typer.Option(False, "--json", help="Print rows as JSON objects."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV with a header row."),
    timeout: float | None = typer.Option(
        None, "--timeout", metavar="SECONDS",
        help="Stop the query after this many seconds (above 0, at most 86400; default 30).",
    ),
    max_rows: int | None = typer.Option(
        None, "--max-rows", metavar="N",
        help="Print at most N rows (1 to 10000000; default 100000); a note on stderr says when there were more.",
    ),
) -> None:
    """Run a read-only query (PostgreSQL dialect; transpiled for SQLite)."""
    # sqlglot is slow to import; only sql needs it
    from trackway.ledger.sql.readonly import (
        CLI_MAX_ROWS, DEFAULT_TIMEOUT_S, check_max_rows, check_timeout, run_readonly_query, too_slow,
    )  # fmt: skip

    # Checked before the ledger is opened: a bad option is the answer whatever state the ledger is in.
    timeout_s = check_timeout(DEFAULT_TIMEOUT_S if timeout is None else timeout)
    row_cap = check_max_rows(CLI_MAX_ROWS if max_rows is None else max_rows)
    app = app_context(ctx)
    watchdog = _Watchdog(timeout_s, too_slow(timeout_s))
    try:
        result = run_readonly_query(app.settings.db_url, query, timeout_s=timeout_s, on_start=watchdog.arm,
                                    remember_in=app.settings.home / "cache" / "sql", max_rows=row_cap)
    finally:
        watchdog.disarm()  # before printing: a long table takes the time it takes
    if result.truncated:
        # Before the rows: a reader of a long table sees it where the table starts scrolling.
        print(f"trackway sql: showing the first {row_cap} rows; the query returned more — narrow it or pass "
              "--max-rows", file=sys.stderr)
    if as_json:
        print_json([dict(zip(result.columns, row)) for row in result.rows])
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(result.columns)
        writer.writerows([[_csv_value(v) for v in row] for row in result.rows])
    else:
        from trackway.cli.render import console, table  # rich: only for a table

        console.print(table(None, sql_columns(result.columns, result.rows), result.rows))


class _Watchdog:
    """Ends the process, exit 2, if the statement outlives its --timeout by _WATCHDOG_MARGIN_S.

    The database's own limit stops nearly every query (SQLite's progress handler, PostgreSQL's
    statement_timeout), but not one call of a SQLite built-in: `instr`, `replace` or `trim` over
    megabytes is a single step of its virtual machine, which neither the progress handler nor
    `interrupt()` can break into. Ending the process is safe: the query only read, in a transaction
    that is never committed, so nothing is lost or left half-written.
    """

    def __init__(self, timeout_s: float, error: InputError) -> None:
        self.timeout_s, self.error = timeout_s, error
        self.timer: threading.Timer | None = None

    def arm(self) -> None:
        self.timer = threading.Timer(self.timeout_s + _WATCHDOG_MARGIN_S, self._give_up)
        self.timer.daemon = True
        self.timer.start()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _give_up(self) -> None:
        print(f"trackway: error: {self.error}", file=sys.stderr, flush=True)
        os._exit(self.error.exit_code)


def _csv_value(value):
    """A CSV field: JSON values (PostgreSQL hands back dicts and lists) as JSON text, not Python's repr."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return to_jsonable(value)


def sql_columns(names: list[str], rows: list) -> list:
    """Columns of a query's result: the first one stays; the rest give way from the right on a narrow terminal.

    A column of numbers or times is shown whole or not at all. Text (JSON included) is shortened with
    an ellipsis before any column is dropped: every column asked for stays in view as long as it can.
    """
    from trackway.cli.render import KEY, Column

    count = len(names)
    return [
        Column(name, KEY if i == 0 else count - i, right=_numeric(rows, i), shorten_at=0,
               shorten_to=0 if i == 0 or _numeric(rows, i) or _times(rows, i) else 16)
        for i, name in enumerate(names)
    ]


def _numeric(rows: list, i: int) -> bool:
    values = [row[i] for row in rows if row[i] is not None]
    return bool(values) and all(isinstance(v, int | float | Decimal) for v in values)


def _times(rows: list, i: int) -> bool:
    # SQLite hands times back as text: a time is a time whichever backend answered.
    values = [row[i] for row in rows if row[i] is not None]
    return bool(values) and all(isinstance(v, datetime | date) or _TIME_TEXT.match(str(v)) for v in values)


def register(app: typer.Typer) -> None:
    app.command("sql")(sql)
