"""The config snapshot: a TOML/YAML/JSON config file plus `--set` overrides, canonicalised and hashed."""

from __future__ import annotations

import datetime as dt
import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trackway.errors import InputError, NotFound
from trackway.receipts.canonical import canonical_json, sha256_hex

if TYPE_CHECKING:
    import yaml  # imported where a .yaml config is read: 10 ms every submit and supervisor paid for nothing

_SET_EXAMPLE = "e.g. --set optimizer.lr=3e-4"

# Bounds on what a config may hold. A config is a few kilobytes of hyperparameters; these are far
# above any real one, and low enough that a hostile file (a 100 MB blob, a YAML alias bomb, a
# 5,000-level nesting) is refused in milliseconds instead of filling memory, the ledger or the stack.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
# Values a YAML file may expand to once its aliases are followed (`*a` repeats the anchored value).
MAX_YAML_VALUES = 1_000_000


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
    return apply_overrides(values, overrides)


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
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)  # never more than the bound, whatever the file's size
    except OSError as e:
        raise InputError(f"{flag}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise InputError(f"{flag}: larger than {_mib(MAX_CONFIG_BYTES)}; expected a config of hyperparameters, "
                         "not data (pass data with --data)")
    try:
        if suffix == ".toml":
            values = _parse_toml(raw, flag)
        elif suffix == ".json":
            values = _parse_json(raw, flag)
        else:
            values = _parse_yaml(raw, flag)
    except RecursionError:  # the parsers recurse once per level: thousands of levels exhaust the stack
        raise _too_deep(flag, "") from None
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
    import yaml

    loader = yaml.SafeLoader(_decode(raw, flag))
    try:
        node = loader.get_single_node()
        if node is not None:
            # Aliases are checked on the node graph, before anything is built from it: a few
            # hundred bytes of nested aliases would otherwise expand to billions of values.
            _check_yaml_expansion(node, flag)
        values = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        raise InputError(f"{flag}: not valid YAML: {_yaml_reason(e)}") from None
    finally:
        loader.dispose()
    if values is None:  # an empty or comment-only file is an empty config
        return {}
    if not isinstance(values, dict):
        raise InputError(f"{flag}: expected a mapping at the top level, found {_kind(values)}")
    return values


def _check_yaml_expansion(root: yaml.Node, flag: str) -> None:
    """Refuse a YAML document whose aliases expand past MAX_YAML_VALUES values, or refer to themselves.

    An alias is the same node object as its anchor, so each distinct node's expanded size is
    computed once (post-order, without recursion) and a node met again on its own path is a cycle.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _yaml_children(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[key] > MAX_YAML_VALUES:
                raise InputError(f"{flag}: its aliases expand to more than {MAX_YAML_VALUES:,} values; "
                                 "expected a config of hyperparameters (write the values out, or fewer aliases)")
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise InputError(f"{flag}: an alias refers to a value that contains it; a config cannot hold itself")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    # PyYAML's node kinds by their `id` (SequenceNode.id == "sequence"): no import statement in a function
    # called twice for every node of the document.
    if node.id == "sequence":
        return list(node.value)
    if node.id == "mapping":
        return [part for pair in node.value for part in pair]
    return []


def _too_deep(flag: str, where: str) -> InputError:
    at = f" at '{_short(where)}'" if where else ""
    return InputError(f"{flag}: nested more than {MAX_DEPTH} levels deep{at}; expected a config of hyperparameters")


def _mib(size: int) -> str:
    return f"{size // (1024 * 1024)} MiB"


def _yaml_reason(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None) or getattr(e, "context", None)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    reason = _one_line(problem or str(e))
    if mark is not None:
        reason += f" (line {mark.line + 1}, column {mark.column + 1})"
    return reason


def _check_value(value: Any, flag: str, where: str, depth: int = 0) -> Any:
    """Return `value` in the JSON data model, or raise naming the key that cannot be recorded.

    `depth` is how many tables and lists already hold `value` (a `--set` key's dotted parts count).
    """
    at = f" at '{_short(where)}'" if where else ""
    if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
        raise _too_deep(flag, where)
    if isinstance(value, dict):
        checked = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputError(f"{flag}: key {_short(repr(key))}{at} is not a string; quote it")
            checked[key] = _check_value(item, flag, f"{where}.{key}" if where else key, depth + 1)
        return checked
    if isinstance(value, list):
        return [_check_value(item, flag, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
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
    if len(canonical) > MAX_CONFIG_BYTES:
        raise InputError(f"--set: the config comes to more than {_mib(MAX_CONFIG_BYTES)}; "
                         "expected a config of hyperparameters, not data (pass data with --data)")
    return ConfigSnapshot(values=values, canonical=canonical, sha256=sha256_hex(canonical))


def _apply(values: dict, item: str) -> None:
    flag = f"--set {_short(repr(item))}"
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(f"{flag}: expected KEY=VALUE, {_SET_EXAMPLE}")
    parts = key.split(".")
    if any(not part.strip() for part in parts):
        raise InputError(f"{flag}: KEY has an empty part; expected a dotted path, {_SET_EXAMPLE}")
    if len(parts) > MAX_DEPTH:
        raise InputError(f"--set: KEY has {len(parts)} dotted parts; expected at most {MAX_DEPTH}, {_SET_EXAMPLE}")
    parts = [part.strip() for part in parts]
    value = _check_value(_parse_value(text, flag), flag, _short(key), len(parts) - 1)
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
    except RecursionError:
        raise _too_deep(flag, "") from None


def _short(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters for an error line: a 5,000-part key is named, not printed."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {dict: "a table", list: "a list", str: "text", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), f"a {type(value).__name__}")


def _one_line(text: str) -> str:
    return " ".join(text.split())
