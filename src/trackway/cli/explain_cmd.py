"""`trackway explain`: one attempt, explained from the ledger alone."""

from __future__ import annotations

import sys

import typer
from trackway.cli.context import app_context
from trackway.cli.render import console, print_json


def explain(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="RUN|RUN/N", help="A run (its latest attempt) or one attempt."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown (for an issue or a notebook)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why an attempt ended, what changed, what was retried and why, and what happens next."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.supervisor.explain import explain as gather
    from trackway.supervisor.explain import to_markdown

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        facts = gather(conn, ref)
    if as_json:
        print_json(facts)
    elif markdown:
        sys.stdout.write(to_markdown(facts))
    else:
        from rich.markdown import Markdown  # 80 ms to import: only explain pays for it

        console.print(Markdown(to_markdown(facts)))


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
