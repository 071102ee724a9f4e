"""What `--json` prints: ledger values made JSON (times as UTC `Z`, bytes as hex).

Kept apart from `render` so that a `--json` command never imports rich.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any


def to_jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return value


def _default(value: Any) -> Any:
    converted = to_jsonable(value)
    if converted is value:
        return str(value)
    return converted


def print_json(payload: Any) -> None:
    """A whole document, indented for people (listings and records: small)."""
    sys.stdout.write(json.dumps(payload, default=_default, indent=2, ensure_ascii=False) + "\n")


def rows_to_dicts(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    return [{k: to_jsonable(row[k]) for k in (columns or list(row.keys()))} for row in rows]

