"""docs/reference/ is what scripts/gen_reference.py makes of the code now: the pages cannot drift from it.

The CLI reference is generated from the Typer app and the REST API reference from the app's
OpenAPI document; a command, an option, a route or a field changed without `make docs` leaves the
committed pages stale, and this fails, saying so. The generator runs in a fresh interpreter, as
`make docs` runs it, and writes into a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
GENERATOR = ROOT / "scripts" / "gen_reference.py"
PAGES = ("cli.md", "rest-api.md", "openapi.json")


def generate(out: Path) -> Path:
    """Runs the generator as `make docs` does, into `out`, away from this shell's trackway settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRACKWAY_")}
    done = subprocess.run([sys.executable, str(GENERATOR), "--out", str(out)], env=env, cwd=out,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"scripts/gen_reference.py failed:\n{done.stderr}"
    return out


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("reference"))


@pytest.mark.parametrize("name", PAGES)
def test_the_committed_reference_is_what_the_code_generates(generated, name):
    committed = REFERENCE / name
    assert committed.is_file(), f"docs/reference/{name} is missing: run `make docs` and commit it"
    assert (generated / name).read_text() == committed.read_text(), (
        f"docs/reference/{name} differs from what the code generates: run `make docs` and commit docs/reference/"
    )


def test_the_generated_pages_hold_no_path_of_this_machine(generated):
    for name in PAGES:
        text = (generated / name).read_text()
        for path in {str(ROOT), str(generated), str(Path.home())} - {"/"}:
            assert path not in text, f"docs/reference/{name} names {path}, a path of this machine"


def test_the_generator_gives_the_same_pages_twice(generated, tmp_path):
    generate(tmp_path)
    for name in PAGES:
        assert (tmp_path / name).read_text() == (generated / name).read_text(), name


def test_the_rest_reference_lists_every_route_of_the_openapi_document():
    document = json.loads((REFERENCE / "openapi.json").read_text())
    page = (REFERENCE / "rest-api.md").read_text()
    routes = [(method.upper(), path) for path, methods in document["paths"].items() for method in methods]
    assert routes, "the OpenAPI document has no routes"
    missing = [f"{method} {path}" for method, path in routes if f"## `{method} {path}`" not in page]
    assert missing == [], f"docs/reference/rest-api.md lacks these routes: {missing}"
