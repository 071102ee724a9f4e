"""Two configs compared key by key: dotted keys (`train.lr`), and each leaf that differs (`train.lr: 0.003 → 0.006`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ABSENT = "<absent>"


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys: {"train": {"lr": 3e-3}} → {"train.lr": 3e-3}."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def changes(before: Any, after: Any) -> list[dict[str, Any]]:
    """Each leaf that differs, sorted by key: {key, before, after}, a missing side ABSENT."""
    old, new = flatten(before or {}), flatten(after or {})
    found = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key, ABSENT), new.get(key, ABSENT)
        # 1 and 1.0 are one setting; True and 1 are not (a flag is not a count).
        if a != b or isinstance(a, bool) != isinstance(b, bool):
            found.append({"key": key, "before": a, "after": b})
    return found


def change_text(change: Mapping[str, Any]) -> str:
    """`train.lr: 0.003 → 0.006` (values as JSON, as stored)."""
    return f"{change['key']}: {json.dumps(change['before'])} → {json.dumps(change['after'])}"
