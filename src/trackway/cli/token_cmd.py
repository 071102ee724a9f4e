"""`trackway token`: the named tokens `trackway serve` accepts, each with a role (ledger/tokens.py)."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json, rows_to_dicts

token_app = typer.Typer(help="Named API tokens for `trackway serve`, each with a role: add, list, revoke.",
                        no_args_is_help=True, rich_markup_mode=None)


@token_app.command("add")
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="What the token is called: `started_by` of what it starts says it."),
    role: str = typer.Option("read", "--role", help="read (GET and the read-only SQL), submit (also start and cancel "
                                                  "jobs) or admin (everything)."),
) -> None:
    """Make a token; it is printed once, on stdout, and the ledger keeps only its sha256."""
    from trackway.cli.render import err_console, say
    from trackway.ledger.tokens import add_token
    from trackway.supervisor.launch import command_by

    app = app_context(ctx)
    with app.ledger.write() as conn:
        token = add_token(conn, name, role, created_by=command_by("trackway token add"))
    print(token, flush=True)
    say(err_console, f"token {name!r} ({role}) made: this is the only time it is shown; send it as "
                     "`Authorization: Bearer <token>`, and `trackway token revoke` ends it")


@token_app.command("list")
def list_(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The tokens with their roles and who made them (never the tokens themselves)."""
    from trackway.ledger.tokens import list_tokens

    app = app_context(ctx)
    with app.ledger.read() as conn:
        rows = list_tokens(conn)
    if as_json:
        print_json(rows_to_dicts(rows))
        return
    from trackway.cli.render import KEY, Column, console, short_time, table

    console.print(table(None, [Column("name", KEY), Column("role", 60), Column("made (UTC)", 50),
                               Column("by", 40, shorten_to=10), Column("revoked (UTC)", 50)],
                        [[r["name"], r["role"], short_time(r["created_at"]), r["created_by"] or "-",
                          short_time(r["revoked_at"]) if r["revoked_at"] else "-"] for r in rows]))


@token_app.command("revoke")
def revoke(ctx: typer.Context, name: str = typer.Argument(..., help="The token's name.")) -> None:
    """End a token: the server refuses it from the next request on."""
    from trackway.cli.render import console, say
    from trackway.ledger.tokens import revoke_token

    app = app_context(ctx)
    with app.ledger.write() as conn:
        revoke_token(conn, name)
    say(console, f"token {name!r} revoked")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
