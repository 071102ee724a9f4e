"""The ingester: the process of its own that writes a script run alone to the ledger.

`trackway.init()` starts it first thing (sdk/standalone.py), so that its start-up overlaps the
script's: it imports only this module and, for a SQLite ledger, ledger/script_ingest.py (sqlite3
alone). Its orders come one JSON object per line on stdin, its one answer goes to stdout:

    {"start": {...}}       register the run; ingest the spool every INGEST_INTERVAL_S (niced)
    {"finishing": true}    the script is in finish(): ingest as the spool grows, at its priority
    {"end": {...}}         ingest the rest, record the end, answer {"ended": bool}, then close the ledger

A script killed without a word (SIGKILL) leaves the ingester without its parent: it ingests what
was flushed and exits, leaving the end to the next `trackway` command.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from trackway.spool import NOTE_FILE, read_json
from trackway.taxonomy import TerminationReason

INGEST_INTERVAL_S = 0.5
# How long finish() waits for an absent ledger before leaving the rest to the next `trackway` command.
FINAL_INGEST_PATIENCE_S = float(os.environ.get("TRACKWAY_LEDGER_PATIENCE_S", "10"))
NICE = 10  # the niceness of the ingests made while the script trains: below the training process
SLICE_BYTES = 256 << 10  # of each spool file, per niced ingest: two metrics lines of 2048 steps × 5 keys
FINISHING_POLL_S = 0.01  # from "finishing" to "end", how often a quiet spool is looked at again


def secret_values() -> list[str]:
    """The values of this process's secret-named variables: masked wherever the run's records repeat them."""
    from trackway.receipts import submitted_env

    return list(submitted_env.capture().secret.values())


def tell(message: str) -> None:
    """A line on stderr, if stderr is still there."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Ingester:
    """Registers a standalone run (once), ingests its attempt's spool, and records the attempt's end.

    On a SQLite ledger at the newest migration it writes through `sqlite3` alone
    (`ledger/script_ingest.py`), so that it is ready long before a short script's `finish()`; from
    the first thing that module declines on, it goes through the ledger's own modules (SQLAlchemy).
    """

    def __init__(self, db_url: str, cost_per_gpu_hour: float, attempt_id: str, pending: Path, spool_dir: Path,
                 secrets: list[str] | None = None):
        self.db_url = db_url
        self.cost_per_gpu_hour = cost_per_gpu_hour
        self.attempt_id = attempt_id
        self.spool_dir = spool_dir
        self._pending = pending
        self._ledger = None
        self._script = None  # the ScriptLedger while it serves; None before it is opened and once it declined
        self._declined = False
        self._registered = False
        self.last_error: str | None = None
        self.last_points = 0  # stored by the last sync through sqlite3 (0 through the ledger's own modules)
        self._secrets = secrets  # masked in the end's evidence; read from the environment when not given

    def sync(self, limit: int | None = None) -> bool:
        """Register (once) and ingest (about `limit` bytes of each file, or all that is new); False while the ledger does not answer."""
        self.last_points = 0
        if not self._declined:
            from trackway.ledger.script_ingest import Declined, ScriptLedger

            try:
                if self._script is None:
                    self._script = ScriptLedger.open(self.db_url)
                if not self._registered:
                    self._script.register(self._pending)
                    self._registered = True
                self.last_points = self._script.ingest(self.attempt_id, self.spool_dir, limit)
                self.last_error = None
                return True
            except Declined:
                self._decline()
            except Exception as exc:  # noqa: BLE001 - a ledger that is away (locked, unreadable) is waited for
                self.last_error = f"{type(exc).__name__}: {exc}"
                return False
        try:
            from trackway.ledger import open_ledger
            from trackway.ledger.ingest import ingest_attempt
            from trackway.ledger.records import get_attempt
            from trackway.ledger.registration import register_pending

            if self._ledger is None:
                self._ledger = open_ledger(self.db_url)
            if not self._registered:
                register_pending(self._ledger, self._pending)
                self._registered = True
            with self._ledger.read() as conn:
                attempt = get_attempt(conn, self.attempt_id)
            ingest_attempt(self._ledger, attempt)
            self.last_error = None
            return True
        except Exception as exc:  # noqa: BLE001 - a ledger that is away is waited for, whatever it raises
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False

    def _decline(self) -> None:
        """From now on, the ledger's own modules."""
        self._declined = True
        if self._script is not None:
            self._script.close()
            self._script = None

    def finish(self, exit_code: int | None, record_end: bool) -> bool:
        """The last ingest, waiting up to FINAL_INGEST_PATIENCE_S for the ledger; then (if asked) the end."""
        deadline = time.monotonic() + FINAL_INGEST_PATIENCE_S
        while not self.sync():
            if time.monotonic() > deadline:
                tell(f"trackway: could not reach the ledger ({self.last_error}); the spool at "
                     f"{self.spool_dir} keeps everything this run logged")
                return False
            time.sleep(0.5)
        if record_end:
            self._record_end(exit_code)
        return True

    def close(self) -> None:
        """Let go of the ledger: on SQLite, the last connection to close copies the write-ahead log into the
        database and syncs it, which is why the script is answered before this."""
        if self._script is not None:
            self._script.close()
            self._script = None
        if self._ledger is not None:
            self._ledger.dispose()
            self._ledger = None

    def _record_end(self, exit_code: int | None) -> None:
        from trackway.redaction import known_values

        note = read_json(self.spool_dir / NOTE_FILE)
        if note and note.get("reason") in TerminationReason._value2member_map_:
            reason, rule, lines = TerminationReason(note["reason"]), "sdk:note", [note.get("message", "")]
        else:
            reason, rule = TerminationReason.UNKNOWN, "sdk:no-finish"
            lines = ["the script exited without run.finish() and without an uncaught exception"]
        evidence = json.dumps({"rule": rule, "lines": lines, "exit_code": exit_code, "signal": None})
        cost = self.cost_per_gpu_hour
        # The ingester was started with the script's environment.
        secrets = known_values(self._secrets if self._secrets is not None else secret_values())
        if self._script is not None:
            from trackway.ledger.script_ingest import Declined

            try:
                self._script.record_end(self.attempt_id, reason, evidence, exit_code, cost, secrets)
                return
            except Declined:
                self._decline()
        from trackway.ledger import open_ledger
        from trackway.ledger.records import get_attempt, record_attempt_end

        if self._ledger is None:
            self._ledger = open_ledger(self.db_url)
        with self._ledger.write() as conn:
            attempt = get_attempt(conn, self.attempt_id)
            record_attempt_end(
                conn,
                attempt,
                ended_at=datetime.now(timezone.utc),
                reason=reason,
                evidence_json=evidence,
                exit_code=exit_code,
                signal=None,
                cost_per_gpu_hour=cost,
                secrets=secrets,
            )


class _Orders:
    """One JSON object per line from the training process, read without blocking past a timeout."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = b""
        self.closed = False

    def next(self, timeout: float) -> dict | None:
        """The next order; None when none came within `timeout` or the training process closed its end."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer and not self.closed:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(left, 0.0))  # looked at once even when the time is up
            if ready:
                chunk = os.read(self.fd, 65536)
                self.closed = not chunk
                self._buffer += chunk
            elif left <= 0:
                return None
        if b"\n" not in self._buffer:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


class _Periodic:
    """The ingests made while the script trains: every INGEST_INTERVAL_S, niced, on a thread of their own."""

    def __init__(self, ingester: Ingester):
        self._ingester = ingester
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trackway-ingest", daemon=True)

    def start(self) -> None:
        """Start the thread (once, and not after `stop`), an interval after the last ingest: it ingests at once."""
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()

    def _loop(self) -> None:
        try:
            # This thread's niceness only (Linux); where it is the process's, the whole ingester is
            # niced, as it was before the start-up and the last ingest ran at the script's priority.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + NICE)
        except (OSError, AttributeError):
            pass
        while not self._stop.is_set():
            # A backlog in slices, one transaction each: stop() waits for one slice at most.
            while self._ingester.sync(SLICE_BYTES) and self._ingester.last_points and not self._stop.is_set():
                pass
            self._stop.wait(INGEST_INTERVAL_S)

    def stop(self) -> None:
        """Return once the ingest under way (if any) is done: the caller ingests the rest itself."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()


def main() -> int:
    """The ingester (see the module docstring): orders on stdin, one answer on stdout."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever else prints goes to stderr, not into the answer
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may write to the terminal (stderr)
    orders = _Orders(sys.stdin.fileno())
    # Imported while the script captures its receipt: for a SQLite ledger, the module that writes
    # it through sqlite3; for any other, the ledger's own (SQLAlchemy).
    if sys.argv[2:3] == ["sqlite"]:
        import trackway.ledger.script_ingest  # noqa: F401
    else:
        import trackway.ledger.ingest  # noqa: F401
        import trackway.ledger.registration  # noqa: F401

    secrets = secret_values()  # read while the script starts, rather than in the wait for its end
    start = orders.next(timeout=60.0)
    if not start or "start" not in start:
        return 2
    order = start["start"]
    # The script's settings, as it read them: the ingester reads none itself (their module alone costs
    # more than the rest of its start-up).
    ingester = Ingester(order["db_url"], order["cost_per_gpu_hour"], order["attempt_id"], Path(order["pending"]),
                        Path(order["spool_dir"]), secrets)
    ingester.sync(SLICE_BYTES)  # registered at once, while the script starts; a backlog is the thread's
    # The periodic ingests' thread starts once the script has trained for an interval: a script that is
    # done sooner (its "end" or "finishing" here already) never waits for a thread to start.
    periodic = _Periodic(ingester)
    finishing = False
    while True:
        wait = INGEST_INTERVAL_S if not finishing else 0.0 if ingester.last_points else FINISHING_POLL_S
        message = orders.next(timeout=wait)
        if message is None and not finishing and not orders.closed:
            periodic.start()
        if message is not None and "end" in message:
            periodic.stop()
            ended = ingester.finish(message["end"].get("exit_code"), record_end=True)
            try:
                answers.write(json.dumps({"ended": ended}) + "\n")
                answers.flush()
                answers.close()
            except (OSError, ValueError):
                pass  # the script is gone; the end is recorded all the same
            # What the script waits for is committed (readable by any reader of the ledger) and its spool
            # synced before it said "end": closing the ledger (a checkpoint of SQLite's log, on a short
            # script's ledger most of finish()'s wait) is left until after the answer.
            ingester.close()
            # Everything is written and the ledger closed: skip the interpreter's teardown.
            sys.stderr.flush()
            os._exit(0)
        if orders.closed or os.getppid() != order["parent"]:
            # The script ended without a word (killed): ingest what it flushed; its end is for later.
            periodic.stop()
            ingester.finish(None, record_end=False)
            ingester.close()
            return 0
        if message is not None and message.get("finishing") and not finishing:
            periodic.stop()
            finishing = True
        if finishing:
            ingester.sync()  # beside the script's last flush, at its priority


if __name__ == "__main__":
    sys.exit(main())
