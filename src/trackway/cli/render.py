"""Turning ledger rows into what people read: rich tables, JSON, short times and durations."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

def _console(stderr: bool = False) -> Console:
    """A console; when piped, wide enough that tables keep every column instead of folding to 80."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=int(os.environ.get("COLUMNS", 200)))


console = _console()
err_console = _console(stderr=True)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return value


def print_json(payload: Any) -> None:
    def default(value: Any) -> Any:
        converted = to_jsonable(value)
        if converted is value:
            return str(value)
        return converted

    sys.stdout.write(json.dumps(payload, default=default, indent=2, ensure_ascii=False) + "\n")


def rows_to_dicts(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return [{k: to_jsonable(row[k]) for k in (columns or list(row.keys()))} for row in rows]


def short_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def short_sha(value: str | None) -> str:
    return value[:12] if value else "-"


def table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], squeeze: Sequence[str] = ()
) -> Table:
    """A table whose values stay whole on one line, except in `squeeze` columns, which are cut with an ellipsis."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    out = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for i, column in enumerate(columns):
        if column in squeeze:
            out.add_column(column, overflow="ellipsis", no_wrap=True, max_width=60)
        else:
            widest = max([len(column)] + [len(row[i]) for row in cells])
            out.add_column(column, no_wrap=True, min_width=widest)
    for row in cells:
        out.add_row(*row)
    return out
