"""A run's own watcher thresholds (`submit --watch KIND.KEY=VALUE`), laid over trackway.toml's `[watchers]`.

A team sets the project's windows once; one run may still need its own: a run that logs every
100 steps wants a longer `loss_rising` window, a data-loading-bound run a lower `gpu_underused`
threshold. Each value is checked by the same table models as trackway.toml's (settings/model.py),
so a run cannot hold what the file could not, and a refusal says it in the same words:

    --watch loss_rising.window: expected a number of steps or a duration, such as "500 steps", ..., got '3 parsecs'

The run keeps only what it set (`runs.watchers`, JSON); the rest follows trackway.toml as it is
when the supervisor reads it, so an edit of the file still reaches the run's other thresholds.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

from trackway.errors import InputError

EXAMPLE = "KIND.KEY=VALUE, e.g. loss_rising.window=200 steps or gpu_underused.threshold=50"


def parse_watch(given: list[str], field: str = "--watch") -> dict[str, dict[str, Any]]:
    """Each `KIND.KEY=VALUE` as given, checked and typed: {kind: {key: value}}; InputError names the first bad one."""
    if not given:
        return {}  # most submits: no models to build
    # Imported here: explain and show read a run's thresholds without loading the settings models.
    from pydantic import ValidationError

    from trackway.settings.model import WatchersTable
    from trackway.settings.refusal import fields_of

    overrides: dict[str, dict[str, Any]] = {}
    for text in given:
        key, equals, value = text.partition("=")
        kind, dot, name = key.strip().partition(".")
        if not equals or not dot or not kind or not name.strip() or not value.strip():
            raise InputError(f"{field} {text!r}: expected {EXAMPLE}")
        overrides.setdefault(kind, {})[name.strip()] = _value(value.strip())
    kinds = fields_of(WatchersTable)
    for kind, keys in overrides.items():
        if kind not in kinds:
            raise InputError(f"{field} {kind}: unknown watcher; expected one of {', '.join(kinds)}")
        table = kinds[kind].annotation
        try:
            checked = table.model_validate(keys)
        except ValidationError as exc:
            raise _refusal(exc, field, kind, table, keys) from None
        overrides[kind] = {name: getattr(checked, name) for name in keys}
    return overrides


def _value(text: str) -> Any:
    """A value as trackway.toml would read it (50, 0.2, "3h"); a bare word is the text itself (200 steps)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _refusal(exc: Any, field: str, kind: str, table: Any, keys: dict[str, Any]) -> InputError:
    from trackway.settings.refusal import fields_of, shown

    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    known = fields_of(table)
    if name not in known:
        return InputError(f"{field} {kind}.{name}: unknown key; expected one of {', '.join(known)}")
    return InputError(f"{field} {kind}.{name}: expected {known[name].description}, got {shown(keys.get(name))}")


def recorded(overrides: dict[str, dict[str, Any]]) -> str | None:
    """What `runs.watchers` holds for them (None: the run set none)."""
    return json.dumps(overrides, sort_keys=True) if overrides else None


def for_run(project: dict[str, dict[str, Any]], stored: str | None) -> dict[str, dict[str, Any]]:
    """The watchers' settings one run is judged by: trackway.toml's, with the run's own over them.

    A stored value that no longer reads (a ledger edited by hand) leaves the project's: the
    watchers go on, on thresholds the file states.
    """
    try:
        own = json.loads(stored) if stored else {}
    except ValueError:
        own = {}
    if not isinstance(own, dict):
        own = {}
    return {kind: {**(project.get(kind) or {}), **(own.get(kind) or {})}
            for kind in {*project, *(k for k, v in own.items() if isinstance(v, dict))}}


def described(stored: str | None) -> list[str]:
    """The run's own thresholds as `KIND.KEY=VALUE` lines, for show and explain (empty: it set none)."""
    try:
        own = json.loads(stored) if stored else {}
    except ValueError:
        return []
    return [f"{kind}.{key}={value}" for kind, keys in sorted(own.items()) if isinstance(keys, dict)
            for key, value in sorted(keys.items())]
