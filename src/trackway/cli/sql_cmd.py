"""`trackway sql`: read-only SQL over the ledger, written in PostgreSQL's dialect on every backend."""

from __future__ import annotations

import csv
import sys

import typer

from trackway.cli.context import app_context
from trackway.cli.render import console, print_json, table, to_jsonable


def sql(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="One read-only statement, e.g. \"select * from training_attempts limit 5\"."),
    as_json: bool = typer.Option(False, "--json", help="Print rows as JSON objects."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV with a header row."),
) -> None:
    """Run a read-only query (PostgreSQL dialect; transpiled for SQLite)."""
    from trackway.ledger.readonly_sql import run_readonly_query  # sqlglot is slow to import; only sql needs it

    app = app_context(ctx)
    result = run_readonly_query(app.ledger, query)
    if as_json:
        print_json([dict(zip(result.columns, row)) for row in result.rows])
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(result.columns)
        writer.writerows([[to_jsonable(v) for v in row] for row in result.rows])
    else:
        console.print(table(None, result.columns, result.rows))


def register(app: typer.Typer) -> None:
    app.command("sql")(sql)
