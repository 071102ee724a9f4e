"""Server-sent events: what happened in the ledger, as it happens (attempt started/ended, checkpoint committed,
evaluation finished, watcher fired, experiment concluded).

The ledger is the source: each pass reads the rows whose timestamps fall in a window that
overlaps the previous one (a row committed a moment after its timestamp is not missed), and
an event already sent is not sent again. Each event's `id` is its time, so a client that
reconnects with `Last-Event-ID` (or `?since=`) continues where it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from trackway.errors import InputError
from trackway.ledger.ingest import SUPERVISOR_RANK
from trackway.ledger.schema import attempt_events, attempts, checkpoints, evaluations, experiments
from trackway.supervisor.watchers import WATCHER_KINDS

router = APIRouter(prefix="/api", tags=["events"])
POLL_S = 1.0
OVERLAP = timedelta(seconds=10)
KEEPALIVE_S = 15.0


@router.get("/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": "An endless event stream."}})
def events(
    request: Request,
    since: str | None = Query(None, max_length=64, description="ISO time: send what happened after it (default: now)."),
    last_event_id: str | None = Header(None, max_length=64),
) -> StreamingResponse:
    start = _moment(since or last_event_id, "since") if (since or last_event_id) else datetime.now(timezone.utc)
    return StreamingResponse(stream(request.app.state.ledger, start), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def stream(ledger, start: datetime, poll_s: float = POLL_S, passes: int | None = None) -> Iterator[str]:
    """The event stream's text from `start` on (`passes`: stop after that many reads, for tests)."""
    sent: dict[tuple[str, str], datetime] = {}
    cursor = start
    quiet_since = time.monotonic()
    yield ": connected\n\n"
    done = 0
    while passes is None or done < passes:
        now = datetime.now(timezone.utc)
        with ledger.read() as conn:
            found = happened(conn, max(start, cursor - OVERLAP))
        for at, kind, key, data in found:
            if (kind, key) in sent:
                continue
            sent[(kind, key)] = at
            quiet_since = time.monotonic()
            yield f"id: {at.isoformat()}\nevent: {kind}\ndata: {json.dumps(data, default=str)}\n\n"
        cursor = now
        for seen, at in list(sent.items()):
            if at < cursor - 2 * OVERLAP:
                del sent[seen]
        if time.monotonic() - quiet_since > KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        done += 1
        if passes is None or done < passes:
            time.sleep(poll_s)


def happened(conn, after: datetime) -> list[tuple[datetime, str, str, dict[str, Any]]]:
    """Every event after `after`, oldest first: (time, kind, key, data)."""
    out: list[tuple[datetime, str, str, dict[str, Any]]] = []
    for row in conn.execute(select(attempts.c.attempt_id, attempts.c.run_id, attempts.c.started_at, attempts.c.resource)
                            .where(attempts.c.started_at > after)).mappings():
        out.append((row["started_at"], "attempt_started", row["attempt_id"],
                    {"attempt_id": row["attempt_id"], "run_id": row["run_id"], "resource": row["resource"]}))
    for row in conn.execute(select(attempts.c.attempt_id, attempts.c.run_id, attempts.c.ended_at,
                                   attempts.c.termination_reason, attempts.c.retry_decision)
                            .where(attempts.c.ended_at > after)).mappings():
        decision = json.loads(row["retry_decision"]) if row["retry_decision"] else None
        out.append((row["ended_at"], "attempt_ended", row["attempt_id"],
                    {"attempt_id": row["attempt_id"], "run_id": row["run_id"],
                     "termination_reason": row["termination_reason"], "decision": decision}))
    for row in conn.execute(select(checkpoints.c.run_id, checkpoints.c.step, checkpoints.c.name,
                                   checkpoints.c.committed_at, checkpoints.c.attempt_id)
                            .where(checkpoints.c.committed_at > after)).mappings():
        out.append((row["committed_at"], "checkpoint_committed", f"{row['run_id']}/{row['name']}",
                    {"run_id": row["run_id"], "step": row["step"], "name": row["name"], "attempt_id": row["attempt_id"]}))
    for row in conn.execute(select(evaluations.c.eval_id, evaluations.c.run_id, evaluations.c.checkpoint_step,
                                   evaluations.c.spec_name, evaluations.c.state, evaluations.c.ended_at)
                            .where(evaluations.c.ended_at > after)).mappings():
        out.append((row["ended_at"], "evaluation_finished", row["eval_id"],
                    {"eval_id": row["eval_id"], "run_id": row["run_id"], "step": row["checkpoint_step"],
                     "spec": row["spec_name"], "state": row["state"]}))
    for row in conn.execute(select(attempt_events.c.attempt_id, attempt_events.c.kind, attempt_events.c.at,
                                   attempt_events.c.payload)
                            .where(attempt_events.c.at > after, attempt_events.c.rank == SUPERVISOR_RANK,
                                   attempt_events.c.kind.in_(WATCHER_KINDS))).mappings():
        message = json.loads(row["payload"]).get("message")
        out.append((row["at"], "watcher_fired", f"{row['attempt_id']}/{row['kind']}",
                    {"attempt_id": row["attempt_id"], "watcher": row["kind"], "message": message}))
    for row in conn.execute(select(experiments.c.experiment_id, experiments.c.status, experiments.c.verdict,
                                   experiments.c.concluded_at)
                            .where(experiments.c.concluded_at > after)).mappings():
        out.append((row["concluded_at"], "experiment_concluded", row["experiment_id"],
                    {"experiment_id": row["experiment_id"], "status": row["status"], "verdict": row["verdict"]}))
    out.sort(key=lambda e: e[0])
    return out


def _moment(text: str, field: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{field} {text!r}: expected an ISO 8601 time, e.g. 2026-11-26T12:00:00Z") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
