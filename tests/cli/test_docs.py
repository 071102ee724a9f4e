"""The CLI reference documents every command and subcommand the CLI has; README.md keeps the two set-up commands.

docs/reference/cli.md is generated from the Typer app (scripts/gen_reference.py, run by `make docs`),
and tests/docs/test_reference.py holds it equal to what the code generates. This walks the app on its
own, so a generator that skipped a command, a subcommand or an option would fail here.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer

from trackway.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CLI_PAGE = (ROOT / "docs" / "reference" / "cli.md").read_text()


def commands() -> dict[str, object]:
    """Every visible command and subcommand of the app, by its full name (`trackway eval run`)."""
    root = typer.main.get_command(app)
    root.load_all()  # type: ignore[attr-defined]
    found: dict[str, object] = {}

    def visit(prefix: str, group) -> None:
        for name, command in sorted(getattr(group, "commands", {}).items()):
            if command.hidden:
                continue
            found[f"{prefix} {name}"] = command
            visit(f"{prefix} {name}", command)

    visit("trackway", root)
    return found


def section(title: str) -> str:
    """The text of the CLI reference under the heading `## `title``, up to the next heading of that level."""
    heading = f"## `{title}`\n"
    assert heading in CLI_PAGE, f"docs/reference/cli.md has no section for `{title}`: run `make docs`"
    return CLI_PAGE.split(heading, 1)[1].split("\n## ", 1)[0]


def test_every_command_is_in_the_cli_reference():
    names = commands()
    top = [name for name in names if name.count(" ") == 1]
    assert len(top) >= 20, f"too few commands found: {top}"
    missing = [name for name in names if f"## `{name}`\n" not in CLI_PAGE]
    assert missing == [], f"docs/reference/cli.md lacks these commands, run `make docs`: {missing}"


def test_every_option_of_every_command_is_in_its_section():
    missing = []
    for name, command in commands().items():
        text = section(name)
        for param in command.params:
            if getattr(param, "hidden", False) or param.param_type_name == "argument":
                continue
            if not re.search(rf"`{re.escape(param.opts[0])}[ ,`]", text):
                missing.append(f"{name} {param.opts[0]}")
    assert missing == [], f"docs/reference/cli.md lacks these options, run `make docs`: {missing}"


def test_the_global_options_are_in_the_cli_reference():
    root = typer.main.get_command(app)
    text = section("trackway")
    assert [p.opts[0] for p in root.params if not re.search(rf"`{re.escape(p.opts[0])}[ ,`]", text)] == []


def test_readme_gives_the_two_setup_commands():
    assert "make demo" in README and "make test" in README


def test_every_relative_link_of_the_readme_leads_to_a_file():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link and not link.startswith("mailto:")]
    assert local, "README.md links to no page"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"
