"""Server-sent events: what happened in the ledger, as it happens (attempt started/ended, checkpoint committed,
evaluation finished, watcher fired, experiment concluded).

The ledger is the source: each pass reads the rows whose timestamps fall in a window that
overlaps the previous one (a row committed a moment after its timestamp is not missed), and
an event already sent is not sent again. Each event's `id` is its time, so a client that
reconnects with `Last-Event-ID` (or `?since=`) continues where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from trackway.errors import InputError
from trackway.ledger.happenings import happened
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


async def stream(ledger, start: datetime, poll_s: float = POLL_S, passes: int | None = None) -> AsyncIterator[str]:
    """The event stream's text from `start` on (`passes`: stop after that many reads, for tests).

    An async generator: a follower waits on the event loop, not in one of the thread pool's threads
    (which every other route shares); each read of the ledger borrows a thread only for its length.
    """
    sent: dict[tuple[str, str], datetime] = {}
    cursor = start
    quiet_since = time.monotonic()
    yield ": connected\n\n"
    done = 0
    while passes is None or done < passes:
        now = datetime.now(timezone.utc)
        found = await run_in_threadpool(_read, ledger, max(start, cursor - OVERLAP))
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
            await asyncio.sleep(poll_s)


def _read(ledger, since: datetime) -> list:
    with ledger.read() as conn:
        return happened(conn, since, WATCHER_KINDS)


def _moment(text: str, field: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{field} {text!r}: expected an ISO 8601 time, e.g. 2026-11-26T12:00:00Z") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
