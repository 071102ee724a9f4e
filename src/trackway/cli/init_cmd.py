"""`trackway init`: create $TRACKWAY_HOME, the ledger, and a commented trackway.toml."""

from __future__ import annotations

import os
import subprocess
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
    ignored = _ignore_home(settings.home)
    if ignored:
        say(console, ignored)


def _ignore_home(home: Path) -> str | None:
    """Add the home (relative, with a trailing /) to the work tree's .gitignore; a line saying what was done.

    The home holds the ledger and checkpoints: committed by accident they bloat the repository, and
    `git status` should not list them. Idempotent: a home git already ignores is left alone.
    """
    top = _git(Path.cwd(), "rev-parse", "--show-toplevel")
    if top is None:
        return None
    root = Path(top).resolve()
    try:
        relative = home.resolve().relative_to(root).as_posix()
    except ValueError:
        return None  # the home is outside the work tree: git never sees it
    if relative == ".":
        return None
    gitignore = root / ".gitignore"
    if _git(root, "check-ignore", "--quiet", "--no-index", relative + "/") is not None:
        return f"ignore  {relative}/ (already in git's ignore rules)"
    existing = gitignore.read_text() if gitignore.exists() else ""
    separator = "" if not existing or existing.endswith("\n") else "\n"
    with gitignore.open("a") as f:
        f.write(f"{separator}# trackway's ledger and checkpoints (trackway init)\n/{relative}/\n")
    return f"ignore  added /{relative}/ to {gitignore}"


def _git(cwd: Path, *args: str) -> str | None:
    """git's output when it exits 0, else None (git missing counts as not a repository)."""
    try:
        result = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False,
                                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def register(app: typer.Typer) -> None:
    app.command("init")(init)
