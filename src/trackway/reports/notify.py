"""Notifications: what needs a person, told once, through apprise (webhook, Slack, email, ... by URL).

What is told (`[notify] events` picks kinds):
- attempts     a training attempt that ended other than `completed` or a preemption resumed automatically
               (an OOM, a code error, a retry budget spent, a preemption not resumed);
- watchers     a watcher's alarm (stall, loss rising, NaN in the log, ...);
- evaluations  an evaluation that finished, with its metrics;
- experiments  an experiment concluded (its verdict) or stopped (why);
- expectations a run's own criterion (`submit --expect`) met, or no longer able to be met.

Each message is recorded in the ledger's `notifications` table under a key naming its happening
(the outbox: reports/outbox.py), then sent by whichever process delivers: a foreground command
(submit, resume, eval, experiment start, cancel, ...) sends what it recorded and waits for it, at
most `EXIT_WAIT_S`, before it exits; the background supervisor and `trackway serve` send on a thread
of their own each tick, so a slow webhook never holds up a tick. A read-only command (show, runs,
experiment show, metrics, ...) records but never sends: it starts the background supervisor to
deliver (unless TRACKWAY_BACKGROUND_SUPERVISOR=0; then the next deliverer sends it).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select

from trackway.ledger import Ledger
from trackway.ledger.happenings import happened
from trackway.ledger.schema import notifications
from trackway.reports.outbox import Outbox, prepare
from trackway.settings import Settings
from trackway.supervisor.watchers import WATCHER_KINDS

LOOKBACK = timedelta(minutes=2)  # a supervisor that starts tells what ended just before it
OVERLAP = timedelta(seconds=10)
EXIT_WAIT_S = 5.0  # how long a command that is exiting waits for its messages to be sent
KIND_OF = {"attempt_ended": "attempts", "watcher_fired": "watchers", "evaluation_finished": "evaluations",
           "experiment_concluded": "experiments", "expectation_settled": "expectations"}


@dataclass(frozen=True)
class Message:
    key: str
    kind: str
    run_id: str | None
    title: str
    body: str


def message_for(kind: str, key: str, data: dict[str, Any], link: str | None) -> Message | None:
    """The message a happening deserves, or None when nobody needs to hear of it."""
    run_id = data.get("run_id")
    where = _where(link, run_id, data.get("experiment_id"))
    if kind == "attempt_ended":
        reason = data.get("termination_reason")
        decision = data.get("decision") or {}
        if data.get("kind") == "eval" or reason == "completed":
            return None
        if reason == "preempted" and decision.get("action") == "resume":
            return None
        name = f" ({data['run_name']})" if data.get("run_name") else ""
        lines = [f"{data['attempt_id']}{name} ended {reason}.",
                 f"trackway: {decision.get('action', 'nothing')}: {decision.get('message', '')}".rstrip(": ")]
        if data.get("evidence"):
            lines.append(f"evidence: {data['evidence']}")
        return Message(f"{kind}:{key}", "attempts", run_id, f"trackway: {data['attempt_id']} ended {reason}",
                       "\n".join(lines + [where]))
    if kind == "watcher_fired":
        attempt = data["attempt_id"]
        return Message(f"{kind}:{key}", "watchers", attempt.split("/")[0],
                       f"trackway: {attempt} {data['watcher']}", f"{data.get('message') or data['watcher']}\n"
                       + _where(link, attempt.split("/")[0], None))
    if kind == "evaluation_finished":
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted((data.get("metrics") or {}).items()))
        return Message(f"{kind}:{key}", "evaluations", run_id,
                       f"trackway: {run_id} step {data['step']} {data['spec']} evaluation {data['state']}",
                       (metrics or "no metric") + "\n" + where)
    if kind == "experiment_concluded":
        outcome = data.get("verdict") or data.get("status")
        return Message(f"{kind}:{key}", "experiments", run_id,
                       f"trackway: experiment {data['experiment_id']} ({data.get('title')}): {outcome}",
                       f"{data.get('why') or ''}\n{where}".strip())
    if kind == "expectation_settled":
        name = data.get("run_name") or run_id
        said = {"met": "met", "not met": "can no longer be met", "not known": "can no longer be decided"}
        outcome = said.get(data["state"], data["state"])
        return Message(f"{kind}:{key}", "expectations", run_id,
                       f"trackway: {name}: {data['criterion']} {outcome}",
                       f"{data.get('why') or ''}\n{where}".strip())
    return None


def _where(link: str | None, run_id: str | None, experiment_id: str | None) -> str:
    if experiment_id:
        return f"{link}/#/experiments/{experiment_id}" if link else f"trackway experiment show {experiment_id}"
    if run_id:
        return f"{link}/#/runs/{run_id}" if link else f"trackway explain {run_id}"
    return link or ""


class Notifier:
    """Records new messages each tick; when it delivers, sends the due ones on its own thread."""

    def __init__(self, ledger: Ledger, deliver: bool = True) -> None:
        self.ledger = ledger
        self.delivers = deliver
        self.recorded = 0  # messages this process recorded (a read-only command hands them on)
        self.cursor = datetime.now(timezone.utc) - LOOKBACK
        self._sender: threading.Thread | None = None

    def tick(self, settings: Settings) -> int:
        """Record what needs telling since the last tick; start sending. Returns how many were new."""
        if not settings.notify_urls:
            return 0
        now = datetime.now(timezone.utc)
        with self.ledger.read() as conn:
            found = happened(conn, self.cursor - OVERLAP, WATCHER_KINDS)
        wanted = set(settings.notify_events)
        messages = [m for at, kind, key, data in found
                    if KIND_OF.get(kind) in wanted and (m := message_for(kind, key, data, settings.notify_link))]
        new = 0
        if messages:
            with self.ledger.write() as conn:
                known = set(conn.execute(
                    select(notifications.c.key).where(notifications.c.key.in_([m.key for m in messages]))
                ).scalars())
                for m in messages:
                    if m.key in known:
                        continue
                    conn.execute(notifications.insert().values(
                        key=m.key, kind=m.kind, run_id=m.run_id, title=m.title, body=m.body, state="pending",
                        tries=0, created_at=now,
                    ))
                    known.add(m.key)
                    new += 1
        self.cursor = now
        self.recorded += new
        if self.delivers and new:
            prepare(settings.notify_urls)  # here, while this process is sure not to be exiting yet
        if self.delivers and (self._sender is None or not self._sender.is_alive()):
            self._sender = threading.Thread(target=self.send_pending, args=(settings.notify_urls,),
                                            name="trackway-notify", daemon=True)
            _SENDERS.add(self._sender)
            self._sender.start()
        return new

    def wait(self, timeout: float) -> None:
        """Let the sender finish (a one-pass `supervise --once` exits right after)."""
        if self._sender is not None:
            self._sender.join(timeout)

    def send_pending(self, urls: tuple[str, ...]) -> int:
        """Send every message due, each claimed first so that no other sender sends it too; returns how many were sent."""
        sent = 0
        try:
            if not prepare(urls):
                return 0  # the process is exiting: claim nothing it could not send
            outbox = Outbox(self.ledger)
            while (claimed := outbox.claim()) is not None:
                sent += outbox.deliver(claimed, urls) == "sent"
        except Exception as exc:  # noqa: BLE001 - a ledger that failed now: our claim's lease runs out, it is sent again
            print(f"trackway: notifications not sent now: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            _SENDERS.discard(threading.current_thread())
        return sent


# Senders still at work when the process exits: it waits for them (EXIT_WAIT_S in all), so that a
# command's own alert leaves before it does. A sender cut off there leaves its claim to a process
# that outlives it, which takes it over at once (the claimant is gone).
_SENDERS: set[threading.Thread] = set()


@atexit.register
def _wait_for_senders() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for sender in list(_SENDERS):
        sender.join(max(0.0, deadline - time.monotonic()))
