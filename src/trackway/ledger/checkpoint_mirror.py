"""Reconciling the ledger's checkpoint rows from storage, which is the truth.

Storage decides every state: what storage holds is written as it is; a row whose directory
is gone becomes `deleted`. The attempt that wrote a checkpoint comes from its manifest.

A checkpoint set aside on the way to a restore (`step-N.corrupt-<time>`, `step-N.refused-<time>`)
is `set_aside`, not `deleted`: it is still there for whoever investigates, and its row keeps the
attempt that wrote it. Why it was set aside is what the restoring attempt recorded in its
`checkpoint_restored` event (storage keeps the directory untouched, as evidence). The ledger keeps
one row per step, so once the step is committed again the new checkpoint's row wins; storage
(and `trackway checkpoints`) still show both.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select, update

from trackway.checkpoints.layout import CheckpointInfo, CheckpointState, parse_step
from trackway.checkpoints.store import CheckpointStore

from trackway.ledger.schema import attempt_events, attempts, checkpoints
from trackway.ledger.store import Ledger, dialect_insert

if TYPE_CHECKING:
    from trackway.checkpoints.object_store import RemoteCheckpoint, RemoteCheckpointStore

SET_ASIDE = CheckpointState.SET_ASIDE.value
# Why a checkpoint was set aside goes in this column where the schema has it (see _with_reason).
REASON_COLUMN = "problem"


def checkpoint_root(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / run_id / "checkpoints"


def mirror_checkpoint(conn: Connection, run_id: str, attempt_id: str | None, record: dict[str, Any]) -> None:
    """Upsert the ledger's row for one checkpoint from what storage (or the SDK's event) says."""
    committed_at = record.get("committed_at")
    values = {
        "name": record["name"],
        "state": record.get("state", "committed"),
        "path": record["path"],
        "size_bytes": record.get("size_bytes"),
        "attempt_id": attempt_id,
        "parent": record.get("parent"),
        "metrics": json.dumps(record.get("metrics")) if record.get("metrics") is not None else None,
        "committed_at": datetime.fromisoformat(committed_at) if isinstance(committed_at, str) else committed_at,
        "updated_at": datetime.now(timezone.utc),
    }
    statement = dialect_insert(conn)(checkpoints).values(run_id=run_id, step=int(record["step"]), **values)
    conn.execute(statement.on_conflict_do_update(index_elements=["run_id", "step"], set_=values))


def reconcile_run_checkpoints(ledger: Ledger, run_id: str, store: CheckpointStore) -> list[CheckpointInfo]:
    """Mirror `store` into the ledger for `run_id`; return what storage holds, set-aside ones included, by step.

    A set-aside checkpoint's one problem is the reason recorded when it was set aside, where one was.
    """
    held = store.list() if store.root.is_dir() else []
    aside = store.set_aside_list() if store.root.is_dir() else []
    return reconcile_listed_checkpoints(ledger, run_id, held, aside)


def reconcile_listed_checkpoints(ledger: Ledger, run_id: str, held: list[CheckpointInfo], aside: list[CheckpointInfo],
                                 gone_under: tuple[str, ...] | None = None) -> list[CheckpointInfo]:
    """Mirror what storage was seen to hold (`held`, `aside`: one store, or the copies on several hosts).

    A row no listing holds becomes `deleted` only where storage could say so: every row (None, one
    store that is the run's whole truth), or a row whose path lies under one of `gone_under` (the
    directories that were read); () marks nothing deleted, as when a host holding some could not be read.
    """
    steps = {info.step for info in held}
    with ledger.write() as conn:
        recorded = recorded_set_aside_reasons(conn, run_id)
        aside = [replace(info, problems=(recorded[info.name],)) if info.name in recorded else info for info in aside]
        for info in held:
            mirror_checkpoint(conn, run_id, (info.manifest or {}).get("attempt_id"), _record(info))
        newest_aside = {info.step: info for info in aside if info.step not in steps}  # sorted: the last one wins
        for info in newest_aside.values():
            _upsert_set_aside(conn, run_id, info.step, _record(info), info.problems[0])
        present = steps | set(newest_aside)
        prefixes = None if gone_under is None else tuple(root.rstrip("/") + "/" for root in gone_under)
        gone = [
            step
            for step, path in conn.execute(
                select(checkpoints.c.step, checkpoints.c.path).where(checkpoints.c.run_id == run_id))
            if step not in present and (prefixes is None or (path or "").startswith(prefixes))
        ]
        if gone:
            conn.execute(
                update(checkpoints)
                .where(checkpoints.c.run_id == run_id, checkpoints.c.step.in_(gone))
                .values(state=CheckpointState.DELETED.value, updated_at=datetime.now(timezone.utc))
            )
    return sorted([*held, *aside], key=lambda i: (i.step, i.name))


def reconcile_remote_checkpoints(ledger: Ledger, run_id: str, store: RemoteCheckpointStore) -> list[RemoteCheckpoint]:
    """Mirror a run's object store into the ledger; return what it holds, by step.

    Rows point at the checkpoints' URLs. Only a step that was uploaded (its row holds a URL under
    the store's) and is no longer listed counts as deleted: one committed on a host and not yet
    uploaded is not the store's to judge.
    """
    held = store.list()
    listed = {ckpt.step for ckpt in held}
    with ledger.write() as conn:
        for ckpt in held:
            if ckpt.state is CheckpointState.DELETED:
                continue
            manifest = ckpt.manifest or {}
            metrics = manifest.get("metrics")
            record = {
                "step": ckpt.step, "name": ckpt.name, "state": ckpt.state.value, "path": ckpt.url,
                "size_bytes": ckpt.size_bytes, "attempt_id": _text(manifest.get("attempt_id"), 48),
                "parent": _text(manifest.get("parent"), 64), "metrics": metrics if isinstance(metrics, dict) else None,
                "committed_at": ckpt.committed_at,
            }
            if ckpt.state.readable:
                mirror_checkpoint(conn, run_id, record["attempt_id"], record)
            elif ckpt.state in (CheckpointState.CORRUPT, CheckpointState.SET_ASIDE):
                _upsert_set_aside(conn, run_id, ckpt.step, record, "; ".join(ckpt.problems) or ckpt.state.value)
            # writing: an upload in flight (or cut short: debris for `gc`), nothing to mirror yet
        prefix = store.url.rstrip("/") + "/"
        gone = [
            step for step, path in conn.execute(
                select(checkpoints.c.step, checkpoints.c.path).where(checkpoints.c.run_id == run_id))
            if step not in listed and (path or "").startswith(prefix)
        ]
        if gone:
            conn.execute(
                update(checkpoints)
                .where(checkpoints.c.run_id == run_id, checkpoints.c.step.in_(gone))
                .values(state=CheckpointState.DELETED.value, updated_at=datetime.now(timezone.utc))
            )
    return [ckpt for ckpt in held if ckpt.state is not CheckpointState.DELETED]


def recorded_set_aside_reasons(conn: Connection, run_id: str) -> dict[str, str]:
    """{set-aside directory name: why}, from the run's `checkpoint_restored` events."""
    payloads = conn.execute(
        select(attempt_events.c.payload)
        .join(attempts, attempts.c.attempt_id == attempt_events.c.attempt_id)
        .where(attempts.c.run_id == run_id, attempt_events.c.kind == "checkpoint_restored")
    ).scalars()
    reasons = {}
    for payload in payloads:
        for item in json.loads(payload).get("fallback_from") or []:
            if isinstance(item, dict) and isinstance(item.get("set_aside_as"), str) and item.get("reason"):
                reasons[item["set_aside_as"]] = str(item["reason"])
    return reasons


def mirror_restored(conn: Connection, run_id: str, attempt_id: str, record: dict[str, Any]) -> None:
    """Ingest a `checkpoint_restored` event: the receipt's resumed-from, and each checkpoint set aside on the way.

    What the SDK really restored overrides what the launch expected (None: it started from the
    beginning). A set-aside checkpoint's row becomes `set_aside` with the reason, unless the step
    was committed again after the event (a later commit is newer news).
    """
    conn.execute(
        update(attempts).where(attempts.c.attempt_id == attempt_id).values(resumed_from_checkpoint=record.get("name"))
    )
    at = _event_time(record)
    for item in record.get("fallback_from") or []:
        step = parse_step(str(item.get("name")))
        if step is None:
            continue
        row = conn.execute(
            select(checkpoints).where(checkpoints.c.run_id == run_id, checkpoints.c.step == step)
        ).mappings().first()
        recommitted = row is not None and row["committed_at"] is not None and row["state"] != SET_ASIDE
        if recommitted and at is not None and row["committed_at"] > at:
            continue
        name = item.get("set_aside_as") or item["name"]
        path = item.get("path") or (str(Path(row["path"]).with_name(name)) if row is not None else name)
        _upsert_set_aside(conn, run_id, step, {"step": step, "name": name, "path": path}, str(item.get("reason") or ""))


def _upsert_set_aside(conn: Connection, run_id: str, step: int, record: dict[str, Any], reason: str) -> None:
    """Make the row for `step` say set aside (name, path, reason), keeping who wrote it when the row exists."""
    values = _with_reason(
        {"name": record["name"], "state": SET_ASIDE, "path": record["path"], "committed_at": None,
         "updated_at": datetime.now(timezone.utc)},
        reason,
    )
    exists = conn.execute(
        select(checkpoints.c.step).where(checkpoints.c.run_id == run_id, checkpoints.c.step == step)
    ).first()
    if exists is None:
        manifest_attempt = record.get("attempt_id")
        mirror_checkpoint(conn, run_id, manifest_attempt, {**record, "state": SET_ASIDE, "committed_at": None})
    conn.execute(update(checkpoints).where(checkpoints.c.run_id == run_id, checkpoints.c.step == step).values(**values))


def _with_reason(values: dict[str, Any], reason: str) -> dict[str, Any]:
    # The reason always reaches storage (the SET_ASIDE note) and the attempt's checkpoint_restored
    # event; the checkpoints table holds it too once the schema has the column.
    if REASON_COLUMN in checkpoints.c:
        values[REASON_COLUMN] = reason
    return values


def _record(info: CheckpointInfo) -> dict[str, Any]:
    """The row for one checkpoint; from a corrupt or set-aside one's manifest, only values that fit the columns."""
    manifest = info.manifest or {}
    metrics = manifest.get("metrics")
    return {
        "step": info.step,
        "name": info.name,
        "state": info.state.value,
        "path": str(info.path),
        "size_bytes": info.size_bytes,
        "attempt_id": _text(manifest.get("attempt_id"), 48),
        "parent": _text(manifest.get("parent"), 64),
        "metrics": metrics if isinstance(metrics, dict) else None,
        "committed_at": info.committed_at,
    }


def _text(value: Any, longest: int) -> str | None:
    return value if isinstance(value, str) and len(value) <= longest else None


def _event_time(record: dict[str, Any]) -> datetime | None:
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(float(t), timezone.utc)
