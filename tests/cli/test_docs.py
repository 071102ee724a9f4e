"""README.md documents every command the CLI has, and the two set-up commands."""

from __future__ import annotations

from pathlib import Path

import typer

from trackway.cli.main import app

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_command_is_in_the_readme():
    names = sorted(typer.main.get_command(app).load_all())  # type: ignore[attr-defined]
    assert names, "no commands registered"
    missing = [name for name in names if f"`trackway {name}" not in README]
    assert missing == [], f"add these commands to README.md's CLI reference: {missing}"


def test_readme_gives_the_two_setup_commands():
    assert "make demo" in README and "make test" in README
