"""`trackway schema`: the JSON Schema of trackway.toml, for editors that check and complete TOML as it is typed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from trackway.errors import InputError



def toml_schema() -> dict[str, Any]:
    """trackway.toml's models (settings/model.py) as one JSON Schema, `[retry]` as the retry policy reads it."""
    from trackway.settings.model import TrackwayToml
    from trackway.supervisor.policy import policy_json_schema

    schema = TrackwayToml.model_json_schema()
    retry = policy_json_schema()
    retry["description"] = "what the supervisor does after an attempt ends, per termination reason"
    schema["properties"]["retry"] = retry
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema(
    output: Path = typer.Option(None, "--output", "-o",
                                help="Write the schema to this file (default: print it). Point an editor at it, "
                                     "e.g. a first line `#:schema ./trackway.schema.json` in trackway.toml "
                                     "(Taplo, Even Better TOML)."),
) -> None:
    """Print the JSON Schema of trackway.toml: every table and field, what each expects, unknown keys refused."""
    text = json.dumps(toml_schema(), indent=2, sort_keys=True) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise InputError(f"--output {output}: cannot write: {exc.strerror or exc}") from None


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
