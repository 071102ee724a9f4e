"""The `trackway` command: global options and the command groups."""

from __future__ import annotations

import sys

import typer

from trackway.cli import (
    checkpoints_cmd,
    evals_cmd,
    explain_cmd,
    init_cmd,
    logs_cmd,
    metrics_cmd,
    report_cmd,
    runs_cmd,
    sql_cmd,
    submit_cmd,
    supervise_cmd,
)
from trackway.cli.context import AppContext
from trackway.cli.errors import run_app

app = typer.Typer(
    name="trackway",
    help="Training runs that leave tracks: submit, supervise and explain ML training attempts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global(
    ctx: typer.Context,
    db: str = typer.Option(None, "--db", help="Ledger URL (sqlite:///PATH or postgresql+psycopg://...). Default: $TRACKWAY_DB, trackway.toml, then $TRACKWAY_HOME/ledger.db."),
    home: str = typer.Option(None, "--home", help="trackway's home directory. Default: $TRACKWAY_HOME or ./.trackway."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    ctx.obj = AppContext(home=home, db=db, debug=debug)


init_cmd.register(app)
submit_cmd.register(app)
runs_cmd.register(app)
logs_cmd.register(app)
sql_cmd.register(app)
metrics_cmd.register(app)
checkpoints_cmd.register(app)
evals_cmd.register(app)
supervise_cmd.register(app)
report_cmd.register(app)
explain_cmd.register(app)


def main() -> None:
    sys.exit(run_app(app))


if __name__ == "__main__":
    main()
