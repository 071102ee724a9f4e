"""Notifications: what needs a person, told once, through apprise (webhook, Slack, email, ... by URL).

What is told (`[notify] events` picks kinds):
- attempts     a training attempt that ended other than `completed` or a preemption resumed automatically
               (an OOM, a code error, a retry budget spent, a preemption not resumed);
- watchers     a watcher's alarm (stall, loss rising, NaN in the log, ...);
- evaluations  an evaluation that finished, with its metrics;
- experiments  an experiment concluded (its verdict) or stopped (why).

Each message is recorded in the ledger's `notifications` table under a key naming its happening
before it is sent, so two supervisors, or one that restarts, never send it twice; a send that
fails is tried again (three times, a minute apart) and its error is kept. Sending happens on a
thread of its own: a slow webhook never holds up a supervisor tick.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import or_, select, update

from trackway.ledger import Ledger
from trackway.ledger.happenings import happened
from trackway.ledger.schema import notifications
from trackway.settings import Settings
from trackway.supervisor.watchers import WATCHER_KINDS

LOOKBACK = timedelta(minutes=2)  # a supervisor that starts tells what ended just before it
OVERLAP = timedelta(seconds=10)
MAX_TRIES = 3
RETRY_AFTER = timedelta(minutes=1)
STUCK_AFTER = timedelta(minutes=5)  # a row claimed by a sender that died is sent again
KIND_OF = {"attempt_ended": "attempts", "watcher_fired": "watchers", "evaluation_finished": "evaluations",
           "experiment_concluded": "experiments"}


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
    return None


def _where(link: str | None, run_id: str | None, experiment_id: str | None) -> str:
    if experiment_id:
        return f"{link}/#/experiments/{experiment_id}" if link else f"trackway experiment show {experiment_id}"
    if run_id:
        return f"{link}/#/runs/{run_id}" if link else f"trackway explain {run_id}"
    return link or ""


class Notifier:
    """Records new messages each tick and sends pending ones on its own thread."""

    def __init__(self, ledger: Ledger, settings: Settings) -> None:
        self.ledger = ledger
        self.settings = settings
        self.cursor = datetime.now(timezone.utc) - LOOKBACK
        self._sender: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.settings.notify_urls)

    def tick(self) -> int:
        """Record what needs telling since the last tick; start sending. Returns how many were new."""
        if not self.enabled:
            return 0
        now = datetime.now(timezone.utc)
        with self.ledger.read() as conn:
            found = happened(conn, self.cursor - OVERLAP, WATCHER_KINDS)
        wanted = set(self.settings.notify_events)
        messages = [m for at, kind, key, data in found
                    if KIND_OF.get(kind) in wanted and (m := message_for(kind, key, data, self.settings.notify_link))]
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
        if self._sender is None or not self._sender.is_alive():
            self._sender = threading.Thread(target=self.send_pending, name="trackway-notify", daemon=True)
            self._sender.start()
        return new

    def wait(self, timeout: float) -> None:
        """Let the sender finish (a one-pass `supervise --once` exits right after)."""
        if self._sender is not None:
            self._sender.join(timeout)

    def send_pending(self) -> int:
        """Send every message due, each claimed first so that no other sender sends it too; returns how many were sent."""
        sent = 0
        while (claimed := self._claim()) is not None:
            error = deliver(self.settings.notify_urls, claimed["title"], claimed["body"])
            with self.ledger.write() as conn:
                tries = claimed["tries"] + 1
                if error is None:
                    values = {"state": "sent", "sent_at": datetime.now(timezone.utc), "tries": tries, "last_error": None}
                    sent += 1
                else:
                    values = {"state": "failed" if tries >= MAX_TRIES else "pending", "tries": tries, "last_error": error}
                conn.execute(update(notifications).where(notifications.c.key == claimed["key"]).values(**values))
        return sent

    def _claim(self):
        now = datetime.now(timezone.utc)
        due = or_(
            (notifications.c.state == "pending") & or_(notifications.c.claimed_at.is_(None),
                                                       notifications.c.claimed_at < now - RETRY_AFTER),
            (notifications.c.state == "sending") & (notifications.c.claimed_at < now - STUCK_AFTER),
        )
        with self.ledger.write() as conn:
            row = conn.execute(select(notifications).where(due).order_by(notifications.c.created_at).limit(1)).mappings().first()
            if row is None:
                return None
            taken = conn.execute(
                update(notifications).where(notifications.c.key == row["key"], notifications.c.state == row["state"])
                .values(state="sending", claimed_at=now)
            ).rowcount
        return row if taken == 1 else self._claim()


def deliver(urls: tuple[str, ...], title: str, body: str) -> str | None:
    """Send through apprise to every URL; None when all took it, else what went wrong (never raises)."""
    try:
        import apprise
    except ImportError:
        return "apprise is not installed (pip install 'trackway[notify]')"
    sender = apprise.Apprise()
    refused = [url.split("://")[0] + "://..." for url in urls if not sender.add(url)]
    if refused:
        return f"not a notification URL apprise knows: {', '.join(refused)}"
    try:
        ok = sender.notify(title=title, body=body)
    except Exception as exc:  # noqa: BLE001 - a notifier bug must not end the supervisor
        return f"{type(exc).__name__}: {exc}"
    return None if ok else "a notification service did not accept it (its log says why)"
