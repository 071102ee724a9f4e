"""The config snapshot: a TOML/YAML/JSON config file plus `--set` overrides, canonicalised and hashed."""

from __future__ import annotations

import datetime as dt
import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trackway.errors import InputError, NotFound
from trackway.receipts.canonical import canonical_json, sha256_hex

_SET_EXAMPLE = "e.g. --set optimizer.lr=3e-4"


@dataclass(frozen=True)
class ConfigSnapshot:
    """The resolved config values, their canonical JSON bytes, and the sha256 of those bytes."""

    values: dict
    canonical: bytes
    sha256: str


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ConfigSnapshot | None:
    """Load `path` (.toml, .yaml, .yml or .json), apply `KEY=VALUE` overrides, and hash the result.

    Returns None when there is neither a path nor an override. The hash depends only on the
    values, never on the file format, key order or formatting. Dates and times (TOML and YAML
    both have them) are recorded as ISO 8601 strings, since JSON has no such type.
    """
    if path is None and not overrides:
        return None
    values = _read(Path(path)) if path is not None else {}
    for item in overrides:
        _apply(values, item)
    canonical = canonical_json(values)
    return ConfigSnapshot(values=values, canonical=canonical, sha256=sha256_hex(canonical))


def _read(path: Path) -> dict:
    flag = f"--config {path}"
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise InputError(f"{flag}: expected a .toml, .yaml, .yml or .json file")
    if not path.exists():
        raise NotFound(f"{flag}: no such file")
    if not path.is_file():
        raise InputError(f"{flag}: expected a file, found a directory or special file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"{flag}: cannot read: {e.strerror}") from None
    if suffix == ".toml":
        values = _parse_toml(raw, flag)
    elif suffix == ".json":
        values = _parse_json(raw, flag)
    else:
        values = _parse_yaml(raw, flag)
    return _check_value(values, flag, "")


def _decode(raw: bytes, flag: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{flag}: not valid UTF-8 (byte {e.start})") from None


def _parse_toml(raw: bytes, flag: str) -> dict:
    try:
        return tomllib.loads(_decode(raw, flag))
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{flag}: not valid TOML: {_one_line(str(e))}") from None


def _parse_json(raw: bytes, flag: str) -> dict:
    try:
        values = json.loads(_decode(raw, flag))
    except json.JSONDecodeError as e:
        raise InputError(f"{flag}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    if not isinstance(values, dict):
        raise InputError(f"{flag}: expected a JSON object at the top level, found {_kind(values)}")
    return values


def _parse_yaml(raw: bytes, flag: str) -> dict:
    try:
        values = yaml.safe_load(_decode(raw, flag))
    except yaml.YAMLError as e:
        raise InputError(f"{flag}: not valid YAML: {_yaml_reason(e)}") from None
    if values is None:  # an empty or comment-only file is an empty config
        return {}
    if not isinstance(values, dict):
        raise InputError(f"{flag}: expected a mapping at the top level, found {_kind(values)}")
    return values


def _yaml_reason(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None) or getattr(e, "context", None)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    reason = _one_line(problem or str(e))
    if mark is not None:
        reason += f" (line {mark.line + 1}, column {mark.column + 1})"
    return reason


def _check_value(value: Any, flag: str, where: str) -> Any:
    """Return `value` in the JSON data model, or raise naming the key that cannot be recorded."""
    at = f" at '{where}'" if where else ""
    if isinstance(value, dict):
        checked = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputError(f"{flag}: key {key!r}{at} is not a string; quote it")
            checked[key] = _check_value(item, flag, f"{where}.{key}" if where else key)
        return checked
    if isinstance(value, list):
        return [_check_value(item, flag, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{flag}: value{at} is {value}; NaN and infinity cannot be recorded, quote it as a string")
    if isinstance(value, (dt.date, dt.time)):  # datetime is a date subclass
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float)):
        return value
    kind = type(value).__name__
    raise InputError(f"{flag}: value{at} is a {kind}; expected text, numbers, booleans, lists or tables")


def apply_overrides(values: dict, overrides: Sequence[str]) -> ConfigSnapshot:
    """`values` with each `KEY=VALUE` override applied (in place), hashed as a snapshot."""
    for item in overrides:
        _apply(values, item)
    canonical = canonical_json(values)
    return ConfigSnapshot(values=values, canonical=canonical, sha256=sha256_hex(canonical))


def _apply(values: dict, item: str) -> None:
    flag = f"--set {item!r}"
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(f"{flag}: expected KEY=VALUE, {_SET_EXAMPLE}")
    parts = key.split(".")
    if any(not part.strip() for part in parts):
        raise InputError(f"{flag}: KEY has an empty part; expected a dotted path, {_SET_EXAMPLE}")
    parts = [part.strip() for part in parts]
    value = _check_value(_parse_value(text, flag), flag, key)
    table = values
    for depth, part in enumerate(parts[:-1]):
        child = table.setdefault(part, {})
        if not isinstance(child, dict):
            parent = ".".join(parts[: depth + 1])
            raise InputError(f"{flag}: '{parent}' is {_kind(child)}, not a table, so '{key}' cannot be set")
        table = child
    table[parts[-1]] = value


def _parse_value(text: str, flag: str) -> Any:
    """JSON when it parses as JSON (3e-4, true, null, [1, 2], "quoted"), otherwise the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {dict: "a table", list: "a list", str: "text", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), f"a {type(value).__name__}")


def _one_line(text: str) -> str:
    return " ".join(text.split())
