"""`trackway schema`: the JSON Schema of trackway.toml or of an eval spec, for editors that check TOML as it is typed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from trackway.errors import InputError

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def toml_schema() -> dict[str, Any]:
    """trackway.toml's models (settings/model.py) as one JSON Schema, `[retry]` as the retry policy reads it."""
    from trackway.settings.model import TrackwayToml
    from trackway.supervisor.policy_schema import policy_json_schema

    schema = TrackwayToml.model_json_schema()
    retry = policy_json_schema()
    retry["description"] = "what the supervisor does after an attempt ends, per termination reason"
    schema["properties"]["retry"] = retry
    return {"$schema": DRAFT, **schema}


def eval_spec_schema() -> dict[str, Any]:
    """An eval spec file's model (evals/spec_model.py) as a JSON Schema."""
    from trackway.evals.spec_model import EvalSpecFile

    return {"$schema": DRAFT, **EvalSpecFile.model_json_schema()}


# `--for`: the file whose schema is written.
SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {"trackway.toml": toml_schema, "eval-spec": eval_spec_schema}


def schema(
    output: Path = typer.Option(None, "--output", "-o",
                                help="Write the schema to this file (default: print it). Point an editor at it, "
                                     "e.g. a first line `#:schema ./trackway.schema.json` in trackway.toml "
                                     "(Taplo, Even Better TOML)."),
    target: str = typer.Option("trackway.toml", "--for",
                               help="Whose schema: trackway.toml (the default) or eval-spec (an eval spec file, "
                                    "as `trackway eval --spec` and `submit --eval` read it)."),
) -> None:
    """Print the JSON Schema of trackway.toml: every table and field, what each expects, unknown keys refused.

    With `--for eval-spec`, the same for an eval spec file.
    """
    if target not in SCHEMAS:
        raise InputError(f"--for {target!r}: expected one of {', '.join(SCHEMAS)}")
    text = json.dumps(SCHEMAS[target](), indent=2, sort_keys=True) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise InputError(f"--output {output}: cannot write: {exc.strerror or exc}") from None


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)
