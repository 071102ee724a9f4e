"""Notifications: how soon an alert arrives with only foreground commands running, and how often one arrives twice when its sender is killed.

Targets (issue 34, item 5):
- p99 from the happening (an attempt's end, as the ledger records it) to the alert's arrival at a
  local webhook ≤ 10 s, with no background supervisor: each alert is sent by the foreground
  `trackway submit` that recorded it, before it exits;
- 0 duplicate effects over ≥ 200 messages while their senders (`trackway supervise --once`, real
  subprocesses) are SIGKILLed at random moments: the receiver honours the Idempotency-Key header
  the outbox sends, and a message delivered twice counts as a raw duplicate (the same key POSTed
  again: the sender was killed between the destination's answer and its record). Exactly once over
  HTTP needs the receiver's help; raw duplicates are printed as measured, at most one per kill (the
  one message a killed sender had in flight: the receiver takes 30 ms to answer, so most kills that
  land mid-send make one); every message must arrive.

The 200 messages are put in the outbox directly (pending rows, as a tick records them): what is
measured there is the sending, not the recording, which the first part does for real.

    python bench/bench_notify_delivery.py [--events 200] [--submits 12]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _common import SRC, figure

LATENCY_TARGET_S = 10.0


class Receiver:
    """A webhook on loopback: every POST's arrival time and Idempotency-Key; each key's effect applied once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.arrivals: list[tuple[float, str, str]] = []  # (time, key, title)
        self.posts: Counter[str] = Counter()  # POSTs per message (its title names its happening)
        self.effects: Counter[str] = Counter()  # what a receiver that honours the key acted on, per message
        self.keys: set[str] = set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                key = self.headers.get("Idempotency-Key") or ""
                with receiver.lock:
                    title = body.get("title", "")
                    receiver.arrivals.append((time.time(), key, title))
                    receiver.posts[title] += 1
                    if not key or key not in receiver.keys:  # a key seen before: answered, not acted on again
                        receiver.keys.add(key)
                        receiver.effects[title] += 1
                if delay_s:
                    time.sleep(delay_s)  # a service that takes a moment: the kills land mid-send
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def environment(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"TRACKWAY_HOME": str(work / "home"), "TRACKWAY_DB": f"sqlite:///{work / 'ledger.db'}",
                "TRACKWAY_BACKGROUND_SUPERVISOR": "0", "PYTHONPATH": str(SRC)})
    return env


def trackway(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trackway", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def latency(submits: int) -> bool:
    """Foreground `trackway submit`s of a script that fails: from the attempt's end to the alert's arrival."""
    from sqlalchemy import create_engine, select

    from trackway.ledger.schema import attempts

    receiver = Receiver()
    with tempfile.TemporaryDirectory(prefix="bench-notify-") as tmp:
        work = Path(tmp)
        (work / "trackway.toml").write_text(f'[notify]\nurls = ["{receiver.url}"]\nevents = ["attempts"]\n')
        env = environment(work)
        exited: dict[str, float] = {}
        for _ in range(submits):
            process = trackway(["submit", "--", sys.executable, "-c", "raise SystemExit(3)"], env, work)
            out, err = process.communicate(timeout=120)
            exited[out.split()[0] if out.split() else "?"] = time.time()
            if process.returncode != 1:
                print(f"submit exited {process.returncode}: {err.strip()[-300:]}", file=sys.stderr)
                return False
        engine = create_engine(env["TRACKWAY_DB"])
        with engine.connect() as conn:
            ended = {row.run_id: row.ended_at for row in conn.execute(select(attempts.c.run_id, attempts.c.ended_at))}
        engine.dispose()
    receiver.server.shutdown()
    arrived: dict[str, float] = {}  # run id → first arrival ("trackway: RUN/1 ended code_error")
    for at, _, title in receiver.arrivals:
        arrived.setdefault(title.split()[1].split("/")[0], at)
    delays = []
    for run_id, ended_at in ended.items():
        at = arrived.get(run_id)
        delays.append(math.inf if at is None else at - ended_at.replace(tzinfo=timezone.utc).timestamp())
    before_exit = sum(1 for run_id in ended if run_id in arrived and arrived[run_id] <= exited.get(run_id, 0))
    print(f"{len(ended)} alerts from foreground submits, {len(arrived)} arrived, {before_exit} before their command exited")
    ok = figure(f"event → delivery p99, foreground only ({len(delays)} alerts)", p99(delays), target=LATENCY_TARGET_S)
    figure("event → delivery median", sorted(delays)[len(delays) // 2])
    return ok and before_exit == len(ended)


def kills(events: int, seed: int) -> bool:
    """`events` pending messages, sent by `trackway supervise --once` processes SIGKILLed at random until all are sent."""
    from sqlalchemy import func, select

    from trackway.ledger import open_ledger
    from trackway.ledger.schema import notifications

    rng = random.Random(seed)
    receiver = Receiver(delay_s=0.03)
    with tempfile.TemporaryDirectory(prefix="bench-notify-") as tmp:
        work = Path(tmp)
        (work / "trackway.toml").write_text(f'[notify]\nurls = ["{receiver.url}"]\n')
        env = environment(work)
        ledger = open_ledger(env["TRACKWAY_DB"])
        now = datetime.now(timezone.utc)
        with ledger.write() as conn:
            conn.execute(notifications.insert(), [
                {"key": f"watcher_fired:b{i:04d}/1/stalled", "kind": "watchers", "run_id": f"b{i:04d}",
                 "title": f"trackway: b{i:04d}/1 stalled", "body": "no heartbeat", "state": "pending", "tries": 0,
                 "created_at": now} for i in range(events)])
        killed = runs = mid_work = 0
        deadline = time.monotonic() + 150
        left = events
        while left and time.monotonic() < deadline:
            # Two senders at once (two deliverers racing for the same messages), each killed at its own moment.
            senders = [trackway(["supervise", "--once"], env, work) for _ in range(2)]
            runs += 2
            kill_at = [time.monotonic() + rng.uniform(0.7, 2.5) for _ in senders]  # start-up takes ~1 s here
            for sender, at in zip(senders, kill_at):
                try:
                    sender.wait(timeout=max(0.0, at - time.monotonic()))
                except subprocess.TimeoutExpired:
                    sender.send_signal(signal.SIGKILL)
                    killed += 1
                sender.communicate()  # reaped: a dead claimant is then taken over at once
            with ledger.read() as conn:
                now_left = conn.execute(select(func.count()).select_from(notifications)
                                        .where(notifications.c.state != "sent")).scalar_one()
            mid_work += now_left and now_left < left  # this round sent some and was cut off before the rest
            left = now_left
        with ledger.read() as conn:
            states = Counter(conn.execute(select(notifications.c.state)).scalars())
        ledger.dispose()
    receiver.server.shutdown()
    raw = sum(count - 1 for count in receiver.posts.values())
    doubled = sum(count - 1 for count in receiver.effects.values())
    lost = events - len(receiver.posts)
    keyless = sum(1 for _, key, _ in receiver.arrivals if not key)
    print(f"{events} messages, {runs} senders started, {killed} SIGKILLed ({mid_work} rounds cut off mid-sending); "
          f"ledger states {dict(states)}")
    ok = figure("lost messages (never arrived)", lost, unit="messages", target=0)
    ok &= figure("duplicate effects (receiver honours Idempotency-Key)", doubled, unit="messages", target=0)
    # A kill can leave at most the one message in flight taken but not recorded: one raw duplicate per kill.
    # The receiver takes 30 ms before it answers, and a kill in those 30 ms is one too: most kills mid-send are.
    ok &= figure("raw duplicates (a message POSTed again)", raw, unit="posts", target=killed)
    ok &= figure("posts without an Idempotency-Key", keyless, unit="posts", target=0)
    return ok and states.get("sent", 0) == events and mid_work > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--submits", type=int, default=12)
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args()
    sys.path.insert(0, str(SRC))
    ok = latency(args.submits)
    ok &= kills(args.events, args.seed)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
