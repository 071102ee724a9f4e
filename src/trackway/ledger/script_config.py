"""The config a script handed `trackway.init(config=...)`, merged into its attempt's receipt with conflicts kept.

Under `trackway submit` the submitted config (`--config`/`--set`) is what trackway passed in; the
dict the script gives `init()` is what it says it runs with (its argparse defaults, its own
files). The receipt holds both: the attempt's `config_sha256` becomes the merge (the script's
value wins where both set a key, because that is the value the code used), and every key where
they disagree is kept as a supervisor event `config_conflicts` for `explain` to show. Secret
values are masked on both sides before they are compared, as the submitted config is recorded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, RowMapping, update

from trackway.ledger.blobs import get_blob, put_blob
from trackway.ledger.event_kinds import CONFLICTS_EVENT
from trackway.ledger.schema import attempts
from trackway.ledger.supervisor_events import add_supervisor_event
from trackway.receipts.canonical import canonical_json
from trackway.redaction import redact_structure

ABSENT = object()


def merge_script_config(conn: Connection, attempt: RowMapping, said: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Store the merge of the attempt's config and `said` as its config; return the conflicting keys."""
    current = attempt["config_sha256"]
    submitted = json.loads(get_blob(conn, current)) if current else {}
    if not isinstance(submitted, dict):
        submitted = {}
    # Both sides masked (receipts/submitted_config.py): the script's own config may hold its API key too.
    merged, conflicts = merge(redact_structure(submitted), redact_structure(_storable(said)))
    sha = put_blob(conn, canonical_json(merged), "config")
    if sha != current:
        conn.execute(update(attempts).where(attempts.c.attempt_id == attempt["attempt_id"]).values(config_sha256=sha))
    if conflicts:
        shown = ", ".join(f"{c['key']} (submitted {json.dumps(c['submitted'])}, script {json.dumps(c['script'])})"
                          for c in conflicts)
        add_supervisor_event(conn, attempt["attempt_id"], CONFLICTS_EVENT, {
            "conflicts": conflicts,
            "message": f"the script's trackway.init(config=...) overrides the submitted config at {shown}",
        })
    return conflicts


def merge(submitted: Mapping[str, Any], said: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`submitted` with `said` laid over it (tables merged key by key), and each leaf they disagree on."""
    merged: dict[str, Any] = dict(submitted)
    conflicts: list[dict[str, Any]] = []
    for key, value in said.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        before = submitted.get(key, ABSENT)
        if isinstance(before, Mapping) and isinstance(value, Mapping):
            merged[key], inner = merge(before, value, path)
            conflicts += inner
            continue
        if before is not ABSENT and not _same(before, value):
            conflicts.append({"key": path, "submitted": before, "script": value})
        merged[key] = value
    return merged, conflicts


def _same(a: Any, b: Any) -> bool:
    # 1 and 1.0 are the same setting; True and 1 are not (a flag is not a count).
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _storable(node: Any) -> Any:
    """`node` as canonical JSON can hold it: string keys, and NaN/inf spelled as text."""
    if isinstance(node, Mapping):
        return {str(key): _storable(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_storable(value) for value in node]
    if isinstance(node, float) and not math.isfinite(node):
        return repr(node)
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    return repr(node)
