"""`trackway explain`: a run and one attempt, explained from the ledger alone, as text that fits the terminal."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.text import Text

from trackway.cli.context import app_context
from trackway.cli.render import console, hanging, print_json, printable, say

INDENT = "  "


def explain(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="RUN|RUN/N", help="A run (its latest attempt) or one attempt."),
    markdown: bool = typer.Option(False, "--markdown", help="Print Markdown (for an issue or a notebook)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: every fact, full hashes, every value."),
) -> None:
    """A run's attempts and decisions, then one attempt in full: config, data, placement, checkpoints,
    retries, evaluations and what happens next."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.reports.explain_layout import document, to_markdown
    from trackway.reports.explain import explain as gather
    from trackway.validation import attempt_ref

    attempt_ref(ref)
    app = app_context(ctx)
    reconcile(app)
    with app.reader() as reader:
        facts = gather(reader, ref)
    if as_json:
        print_json(facts)
    elif markdown:
        # Evidence lines are what a script printed: its escape codes must not act on the reader's terminal.
        sys.stdout.write(printable(to_markdown(facts)))
    else:
        # Wrapped here to the terminal's width; with no terminal (a file), each fact stays on one line for grep.
        width = console.width if getattr(console, "fits_width", True) else None
        for line, style in text_lines(document(facts), width):
            say(console, Text(line, style=style))


def text_lines(blocks: list[tuple], width: int | None) -> list[tuple[str, str]]:
    """The explain blocks as (line, style) pairs, each line at most `width` cells (None: unwrapped)."""
    out: list[tuple[str, str]] = []

    def add(lead: str, text: Any, style: str = "") -> None:
        out.extend((line, style) for line in hanging(lead, printable(text), width))

    for block in blocks:
        kind = block[0]
        if kind == "title":
            add("", block[1], "bold")
        elif kind == "heading":
            out.append(("", ""))
            add("", block[1], "bold")
        elif kind == "item":
            _, depth, label, text = block
            # Labelled facts hang under their value; plain items get a bullet so a wrapped one reads as one.
            add(INDENT * (depth + 1) + (f"{label}: " if label else "- "), text)
        elif kind == "para":
            out.append(("", ""))
            add(f"{block[1]}: " if block[2] else f"{block[1]}:", block[2])
        elif kind == "code":
            for line in block[1]:
                text = printable(line)
                stripped = text.lstrip(" ")
                add(INDENT * 2 + text[: len(text) - len(stripped)], stripped)
        elif kind == "timeline":
            _timeline(block[1], add)
    return out


def _timeline(rows: list[dict], add) -> None:
    """Each attempt as one entry: number, ending and decision on the first line, the rest under it."""
    from trackway.reports.explain_layout import timeline_entry

    number_width = len(str(max((row["number"] for row in rows), default=1)))
    for row in rows:
        head, lines = timeline_entry(row)
        lead = INDENT + f"{row['number']:>{number_width}}  "
        add(lead, head)
        for line in lines:
            add(" " * len(lead), line)


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
