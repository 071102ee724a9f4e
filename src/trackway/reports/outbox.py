"""The notifications outbox: a recorded message claimed by one sender, sent to each destination once, each delivery recorded.

A claim names its claimant (host, pid, the process's start time). A claim by a process that is
gone on this host is taken over at once; another host's claim when its lease runs out (the sender
renews it before each destination). Each destination's delivery is recorded in its own short
transaction right after the send, so a sender killed between the two sends it again only to that
one destination; the message's key goes with it as an `Idempotency-Key` header to the webhooks that
take headers (json://, form://, xml://), so a receiver that honours it acts once. A destination is
recorded as its scheme and a hash of its URL: apprise URLs hold tokens and passwords.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

from sqlalchemy import RowMapping, or_, select, update

from trackway.ledger import Ledger
from trackway.ledger.schema import notification_deliveries, notifications

LEASE = timedelta(seconds=30)  # apprise gives up on one service within 8 s (4 s connect, 4 s read)
RETRY_AFTER = timedelta(minutes=1)
MAX_TRIES = 3  # per destination
HEADER_SCHEMES = frozenset({"json", "jsons", "form", "forms", "xml", "xmls"})
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class Claimant:
    """Who holds a message being sent: a process, told apart from a later one with the same pid by its start time."""

    host: str
    pid: int
    started: float

    def __str__(self) -> str:
        return f"{self.host} {self.pid} {self.started:.2f}"

    @classmethod
    def parse(cls, text: str | None) -> Claimant | None:
        try:
            host, pid, started = (text or "").rsplit(" ", 2)
            return cls(host, int(pid), float(started))
        except ValueError:
            return None

    def gone(self) -> bool:
        """Whether this claimant (on this host) has ended: no such pid, or a later process that reuses it."""
        import psutil

        try:
            process = psutil.Process(self.pid)
            started, state = process.create_time(), process.status()
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False  # there, but not ours to look at: alive
        return abs(started - self.started) > 1.0 or state == psutil.STATUS_ZOMBIE  # a zombie sends nothing more


def me() -> Claimant:
    import psutil

    pid = os.getpid()
    return Claimant(os.uname().nodename, pid, psutil.Process(pid).create_time())


def destination_of(url: str) -> str:
    """How the ledger names a destination: its scheme and a hash of its URL (never the URL: it holds secrets)."""
    scheme = url.split("://", 1)[0].lower()[:16] if "://" in url else "?"
    return f"{scheme}:{hashlib.sha256(url.encode()).hexdigest()[:16]}"


def with_idempotency_key(url: str, key: str) -> str:
    """`url` that sends `key` as an Idempotency-Key header, where apprise's service takes custom headers."""
    if url.split("://", 1)[0].lower() not in HEADER_SCHEMES:
        return url
    return f"{url}{'&' if '?' in url else '?'}+{IDEMPOTENCY_HEADER}={quote(key, safe='')}"


class Outbox:
    """Claims due messages and delivers each to the destinations that have not taken it yet."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.claimant = str(me())

    def claim(self) -> RowMapping | None:
        """The oldest message due (pending and not tried lately, or held by a sender that is gone), now ours."""
        now = datetime.now(timezone.utc)
        host = os.uname().nodename
        due = or_(
            (notifications.c.state == "pending") & or_(notifications.c.claimed_at.is_(None),
                                                       notifications.c.claimed_at < now - RETRY_AFTER),
            (notifications.c.state == "sending") & or_(
                notifications.c.lease_until < now,
                notifications.c.lease_until.is_(None) & (notifications.c.claimed_at < now - LEASE),
                notifications.c.claimed_by.startswith(f"{host} ", autoescape=True),
            ),
        )
        # Looked for in a read first: a sender asks every tick, and nothing is due most of the time
        # (a write transaction would take SQLite's write lock from everyone for nothing).
        with self.ledger.read() as conn:
            rows = conn.execute(select(notifications).where(due).order_by(notifications.c.created_at).limit(50)).mappings().all()
        rows = [row for row in rows if self._takeable(row, now, host)]
        if not rows:
            return None
        with self.ledger.write() as conn:
            for row in rows:  # taken only if no other sender took it since it was read
                same_holder = (notifications.c.claimed_by.is_(None) if row["claimed_by"] is None
                               else notifications.c.claimed_by == row["claimed_by"])
                taken = conn.execute(
                    update(notifications)
                    .where(notifications.c.key == row["key"], notifications.c.state == row["state"], same_holder, due)
                    .values(state="sending", claimed_at=now, claimed_by=self.claimant, lease_until=now + LEASE)
                ).rowcount
                if taken == 1:
                    return row
        return None

    @staticmethod
    def _takeable(row: RowMapping, now: datetime, host: str) -> bool:
        """A due row, unless a live sender on this host, or another host's within its lease, holds it."""
        if row["state"] != "sending" or row["lease_until"] is None or row["lease_until"] < now:
            return True
        holder = Claimant.parse(row["claimed_by"])
        return holder is not None and holder.host == host and holder.gone()

    def renew(self, key: str) -> bool:
        """Extend our claim on `key`; False when it is no longer ours (another sender took it over)."""
        now = datetime.now(timezone.utc)
        with self.ledger.write() as conn:
            return conn.execute(
                update(notifications)
                .where(notifications.c.key == key, notifications.c.state == "sending",
                       notifications.c.claimed_by == self.claimant)
                .values(lease_until=now + LEASE)
            ).rowcount == 1

    def deliver(self, row: RowMapping, urls: tuple[str, ...]) -> str | None:
        """Send a claimed message to each destination that has not taken it; the message's state afterwards.

        None when the claim was lost to another sender half-way (it finishes the message).
        """
        key = row["key"]
        with self.ledger.read() as conn:
            before = {d["destination"]: d for d in conn.execute(
                select(notification_deliveries).where(notification_deliveries.c.key == key)).mappings()}
        for url in urls:
            destination = destination_of(url)
            prior = before.get(destination)
            if prior is not None and prior["state"] in ("sent", "failed"):
                continue
            if not self.renew(key):
                return None
            error = send_one(with_idempotency_key(url, key), row["title"], row["body"])
            before[destination] = self._record(key, destination, error)
        return self._finish(row, [before[destination_of(url)] for url in urls])

    def _record(self, key: str, destination: str, error: str | None) -> RowMapping:
        """This destination's answer, in its own transaction right after the send."""
        now = datetime.now(timezone.utc)
        table = notification_deliveries
        with self.ledger.write() as conn:
            where = (table.c.key == key) & (table.c.destination == destination)
            prior = conn.execute(select(table).where(where)).mappings().first()
            tries = (prior["tries"] if prior is not None else 0) + 1
            values = {"tries": tries, "tried_at": now, "idempotency_key": key}
            if error is None:
                values |= {"state": "sent", "sent_at": now, "last_error": None}
            else:
                values |= {"state": "failed" if tries >= MAX_TRIES else "pending", "last_error": error}
            if prior is None:
                conn.execute(table.insert().values(key=key, destination=destination, **values))
            else:
                conn.execute(update(table).where(where).values(**values))
            return conn.execute(select(table).where(where)).mappings().one()

    def _finish(self, row: RowMapping, deliveries: list[RowMapping]) -> str:
        """The message's state from its destinations': sent by all, failed at one for good, else pending (tried again)."""
        now = datetime.now(timezone.utc)
        states = {d["state"] for d in deliveries}
        errors = [f"{d['destination']}: {d['last_error']}" for d in deliveries if d["last_error"]]
        if states <= {"sent"}:
            values = {"state": "sent", "sent_at": max((d["sent_at"] for d in deliveries), default=now),
                      "last_error": None}
        elif "pending" in states:
            values = {"state": "pending", "last_error": "; ".join(errors)}
        else:
            values = {"state": "failed", "last_error": "; ".join(errors)}
        with self.ledger.write() as conn:
            conn.execute(
                update(notifications).where(notifications.c.key == row["key"], notifications.c.claimed_by == self.claimant)
                .values(tries=row["tries"] + 1, claimed_at=now, claimed_by=None, lease_until=None, **values)
            )
        return values["state"]


def prepare(urls: tuple[str, ...]) -> bool:
    """Import what sending needs (apprise loads its services on first use); False when that cannot be done now.

    Done before a message is claimed: once the interpreter is shutting down (a command exiting
    while its sender still works) nothing new may be imported that starts a thread pool.
    """
    try:
        import concurrent.futures.thread

        import apprise
    except ImportError:
        return True  # each send says that apprise is missing
    except RuntimeError:
        return False
    del concurrent  # imported for apprise's services, which cannot import it once the interpreter shuts down
    try:
        for url in urls:
            apprise.Apprise.instantiate(url)
    except RuntimeError:
        return False
    return True


def send_one(url: str, title: str, body: str) -> str | None:
    """Send through apprise to one URL; None when it took it, else what went wrong, secrets masked (never raises)."""
    try:
        import apprise
    except ImportError:
        return "apprise is not installed (pip install 'trackway[notify]')"
    # Sent on this thread, not apprise's pool (no service_timeout: that runs the send on the pool): a
    # command that is exiting waits for this thread, and a shutting-down interpreter refuses pool work.
    # The socket's own timeouts (4 s to connect, 4 s to read) bound the send.
    sender = apprise.Apprise(asset=apprise.AppriseAsset(async_mode=False, service_timeout=0))
    if not sender.add(url):
        return f"not a notification URL apprise knows: {url.split('://')[0]}://..."
    try:
        with apprise.LogCapture(level=apprise.logging.WARNING) as log:
            ok = sender.notify(title=title, body=body)
        said = [line for line in log.getvalue().splitlines() if line.strip()]
    except Exception as exc:  # noqa: BLE001 - a notifier bug must not end the supervisor
        return masked(f"{type(exc).__name__}: {exc}", url)
    if ok:
        return None
    why = said[-1].split(" - ", 2)[-1] if said else "the service did not accept it"
    return masked(why, url)


def masked(text: str, url: str) -> str:
    """`text` without any word of `url` past its scheme (a service's error may quote its token)."""
    for word in sorted(set(re.findall(r"[^/:@?&=#+\s]{6,}", url.split("://", 1)[-1])), key=len, reverse=True):
        text = text.replace(word, "***")
    return text
