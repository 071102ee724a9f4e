"""A bad trackway.toml refused in one line: the file, the line, the table, the field and what was expected.

    trackway.toml:10: [resources.ailab] gpu_memory_gb: expected a number of GB above 0 and at most 10000, got '180GB'

pydantic finds what is wrong (settings/model.py); this module says it the way every trackway
refusal is said, with the words of the field's own description.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from trackway.errors import InputError

if TYPE_CHECKING:
    from trackway.settings.model import Table


def refusal(exc: ValidationError, model: type[Table], doc: dict[str, Any], path: Path, text: str) -> InputError:
    """The first thing `exc` found wrong in `doc` (read from `text` at `path`), as one InputError."""
    error = exc.errors()[0]
    loc = tuple(str(part) for part in error["loc"])
    where = Locator(path, text)
    if error["type"] == "trackway":
        ctx = error["ctx"]
        table = tuple(ctx["table"]) if ctx.get("table") else _table_of(model, loc)
        return where.error(table, ctx["key"], ctx["message"])
    owner, table, key, deeper = _field_at(model, loc)
    if key is None:  # the table itself: not a table, or a required field missing
        missing = error["type"] == "missing"
        return where.error(table, None, "expected a table" if not missing else "a required field is missing")
    if error["type"] == "extra_forbidden":
        known = list(fields_of(owner))
        return where.error(table, key, owner.unknown.format(known=", ".join(known), sorted=", ".join(sorted(known))))
    if error["type"] == "missing":
        return where.error(table, None, owner.missing.get(key, f"expected {key}"))
    described = fields_of(owner)[key].description or "a valid value"
    if deeper and key in owner.items:
        return where.error(table, key, f"expected {owner.items[key]}, got {shown(error['input'])}")
    return where.error(table, key, f"expected {described}, got {shown(_value_at(doc, (*table, key)))}")


def _field_at(model: type[Table], loc: tuple[str, ...]) -> tuple[type[Table], tuple[str, ...], str | None, tuple[str, ...]]:
    """Walk `loc` down the models: the innermost table holding the error, its path, the field, what lies below it."""
    owner, table, index = model, (), 0
    while index < len(loc):
        name = loc[index]
        fields = fields_of(owner)
        if name not in fields:
            return owner, table, name, loc[index + 1:]
        inner = _model_below(fields[name].annotation)
        rest = loc[index + 1:]
        if inner is None:
            return owner, table, name, rest
        kind, model_type = inner
        if kind == "table":
            owner, table, index = model_type, (*table, name), index + 1
        elif rest:  # a dict or list of tables: the key or index names the table
            owner, table, index = model_type, (*table, name, rest[0]), index + 2
        else:
            return owner, table, name, ()
    return owner, table, None, ()


def fields_of(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A table's fields by the key a file spells them with (an alias where pydantic's own name is taken)."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _model_below(annotation: Any) -> tuple[str, type[Table]] | None:
    """Whether a field holds a table ("table"), or a dict or list of them ("many"), and which."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table", annotation
    args = getattr(annotation, "__args__", ())
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return "many", arg
    return None


def _table_of(model: type[Table], loc: tuple[str, ...]) -> tuple[str, ...]:
    owner, table, key, deeper = _field_at(model, loc)
    return table if key is None else (*table, key, *deeper)


def _value_at(doc: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(doc, dict):
            doc = doc.get(part)
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return None
    return doc


def shown(value: Any) -> str:
    """A value as trackway.toml spells it where that differs from Python (true, a table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    return repr(value)


class Locator:
    """Finds the line of a table's field in trackway.toml's text, so that an error can point at it.

    tomllib keeps no positions; the text is scanned for the table's header and then the key, which
    is right for every trackway.toml written by hand (dotted keys and inline tables fall back to
    the enclosing table's line, or to none).
    """

    def __init__(self, path: Path, text: str):
        self.path, self.lines = path, text.splitlines()

    def error(self, table: tuple[str, ...], key: str | None, message: str) -> InputError:
        if not table and key:  # a key at the top of the file is a table of its own: [zz]
            table, key = (key,), None
        line = self.line(table, key)
        place = f"{self.path}:{line}" if line else str(self.path)
        shown = table_name(table) + (f" {key}" if key else "")
        return InputError(f"{place}: {shown}: {message}" if shown else f"{place}: {message}")

    def line(self, table: tuple[str, ...], key: str | None) -> int | None:
        if not table:
            return None
        found = self._table_line(table, key)
        if found is None and len(table) > 1:  # an inline table (keys = { ... }): the line of its key
            return self.line(table[:-1], table[-1])
        if found is None:  # only dotted headers ([zz.sub]) or a key (zz = 3) at the top
            return self._top_line(table[0])
        return found

    def _table_line(self, table: tuple[str, ...], key: str | None) -> int | None:
        header, index = _header(table)
        seen = -1
        start = None
        for number, raw in enumerate(self.lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line.startswith("["):
                if start is not None and key and re.match(rf"^\"?{re.escape(key)}\"?\s*=", line):
                    return number
                continue
            if start is not None:  # the next table: the key was not in ours
                return start
            if _normalize(line) == header:
                seen += 1
                if seen == index:
                    start = number
        return start

    def _top_line(self, key: str) -> int | None:
        """The first line that opens `key` at the top of the file: `[key.sub]`, `[[key]]` or `key = ...`."""
        for number, raw in enumerate(self.lines, 1):
            line = _normalize(raw.split("#", 1)[0].strip())
            if line in (f"[{key}]", f"[[{key}]]") or line.startswith(f"[{key}.") or re.match(rf"^\"?{re.escape(key)}\"?=", line):
                return number
        return None


# A resource's arrays of tables ([[resources.NAME.qos]], [[resources.NAME.tolerations]]): named by number.
ARRAYS_OF_TABLES = ("qos", "tolerations")


def _header(table: tuple[str, ...]) -> tuple[str, int]:
    """The header text of a table path (`[[resources.a.qos]]` for ('resources', 'a', 'qos', '1')) and its index."""
    if len(table) == 4 and table[2] in ARRAYS_OF_TABLES:
        return f"[[{'.'.join(table[:3])}]]", int(table[3])
    return f"[{'.'.join(table)}]", 0


def _normalize(header: str) -> str:
    return re.sub(r"\s+", "", header).replace('"', "")


def table_name(table: tuple[str, ...]) -> str:
    if not table:
        return ""
    if len(table) == 4 and table[2] in ARRAYS_OF_TABLES:
        return f"[[{'.'.join(table[:3])}]] #{int(table[3]) + 1}"
    return f"[{'.'.join(table)}]"
