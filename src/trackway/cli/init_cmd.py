"""`trackway init`: create $TRACKWAY_HOME, the ledger, and a commented trackway.toml."""

from __future__ import annotations

from pathlib import Path

import typer

from trackway.cli.context import app_context
from trackway.cli.render import console, say
from trackway.ledger.store import make_private_dirs
from trackway.settings import CONFIG_FILE_NAME, DEFAULT_TRACKWAY_TOML


def init(ctx: typer.Context) -> None:
    """Create trackway's home, migrate the ledger, and write a commented trackway.toml here."""
    app = app_context(ctx)
    toml_path = Path.cwd() / CONFIG_FILE_NAME
    wrote_toml = not toml_path.exists()
    if wrote_toml:
        toml_path.write_text(DEFAULT_TRACKWAY_TOML)
    settings = app.settings
    make_private_dirs(settings.home)
    app.ledger  # opening migrates
    say(console, f"home    {settings.home}")
    say(console, f"ledger  {app.ledger.engine.url.render_as_string(hide_password=True)}")
    say(console, f"config  {toml_path}{'' if wrote_toml else ' (kept as it was)'}")


def register(app: typer.Typer) -> None:
    app.command("init")(init)
