"""A script run without a supervisor: it records its own run and attempt, and ingests its own spool.

Ids are made locally, the receipt goes to a pending registration file and everything logged to
the spool, so a ledger that is down costs nothing. The ledger is written by a process of its own,
the ingester (`main()` below, in its own process group), which `init()` starts: the training
process never imports the ledger's code and never shares its GIL with an ingest. It registers the
run and ingests the spool every INGEST_INTERVAL_S while the ledger answers; the script's end is
recorded when `finish()` (or the exit) says how it ended.

Only the ingests made while the script trains are niced (NICE, on a thread of their own: Linux keeps
a niceness per thread), so that training comes first on a machine short of cores, and they take a
backlog in slices (SLICE_BYTES of each file a transaction), so that `finish()` waits for one slice
at most. The start-up (imports, opening the ledger, registering the run) and everything from
`finish()` on run at the script's own priority: a script in `finish()` trains no more and waits for
them, and a short script's `finish()` would otherwise wait behind every other process of a loaded
machine. `finish()` says so before it flushes what the script logged last, so that the ingest of a
large last flush runs beside the flush rather than after it.

    training process                               ingester
      init: receipt -> pending file, spool
            start the ingester  ── {"start": ...} ──►  register; ingest every INGEST_INTERVAL_S (niced)
      log, log, ...                                     (reads what the spool writer flushed)
      finish()  ──────────── {"finishing": true} ────►  ingest as the spool grows, at the script's priority
        flush the spool
      finish() / exit  ───────── {"end": code} ──────►  ingest the rest, record the end
                       ◄──────── {"ended": bool} ─────  exits

`finish()` waits for that answer: up to $TRACKWAY_LEDGER_PATIENCE_S (10 s) for a ledger that is
away, then it says so and leaves the rest to the next `trackway` command that reaches the ledger
(it registers the run, ingests the spool and classifies the end from the script's own note). A
script killed without a word (SIGKILL) leaves the ingester without its parent: it ingests what
was flushed and exits, leaving the end to the next `trackway` command in the same way.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from trackway.pending import write_pending
from trackway.spool import NOTE_FILE, read_json
from trackway.taxonomy import AttemptState, RunKind, RunState, TerminationReason

if TYPE_CHECKING:
    from trackway.settings import Settings

INGEST_INTERVAL_S = 0.5
# How long finish() waits for an absent ledger before leaving the rest to the next `trackway` command.
FINAL_INGEST_PATIENCE_S = float(os.environ.get("TRACKWAY_LEDGER_PATIENCE_S", "10"))
# How long past that patience finish() waits for the ingester's answer (a long final ingest) before
# the script exits anyway; the ingester finishes its work and records the end on its own.
ANSWER_GRACE_S = 60.0
NICE = 10  # the niceness of the ingests made while the script trains: below the training process
SLICE_BYTES = 256 << 10  # of each spool file, per niced ingest: two metrics lines of 2048 steps × 5 keys
FINISHING_POLL_S = 0.01  # from "finishing" to "end", how often a quiet spool is looked at again


class StandaloneSession:
    """The run and attempt a standalone script records, and the ingester process that keeps the ledger current."""

    def __init__(self, settings: Settings, context, pending: Path, ingester: subprocess.Popen | None = None):
        self.settings = settings
        self.context = context
        self._pending = pending
        self._ingester = ingester

    @classmethod
    def start(cls, config: dict | None, name: str | None, project: str, model_family: str | None) -> StandaloneSession:
        from trackway.executors.inline import inline_job_id
        from trackway.receipts.canonical import canonical_json
        from trackway.receipts.code import capture_code
        from trackway.receipts.environment import capture_environment
        from trackway.receipts.placement import host_name
        from trackway.sdk.context import AttemptContext
        from trackway.settings import load_settings

        settings = load_settings()
        ingester = _start_ingester(settings.db_url)  # first: its start-up (imports) overlaps the captures below
        run_id = "r" + secrets.token_hex(5)  # as trackway.ledger.records.new_run_id
        run_dir = settings.runs_dir / run_id
        state_dir = run_dir / "attempts" / "1"
        (state_dir / "spool").mkdir(parents=True, exist_ok=True)
        config_bytes = canonical_json(config) if config is not None else None
        if config_bytes is not None:
            # A config may carry a credential (an API key among the hyperparameters): owner only.
            fd = os.open(run_dir / "config.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(config_bytes)
        context = AttemptContext(
            run_id=run_id,
            attempt_id=f"{run_id}/1",
            attempt_number=1,
            spool_dir=state_dir / "spool",
            checkpoint_dir=run_dir / "checkpoints",
            config_path=run_dir / "config.json" if config_bytes is not None else None,
        )
        now = datetime.now(timezone.utc)
        code = capture_code(Path.cwd())
        run = dict(
            run_id=run_id, name=name, project=project, model_family=model_family, kind=RunKind.FULL.value,
            state=RunState.RUNNING.value, command=json.dumps(_recorded_command()), workdir=str(Path.cwd()),
            resource="local", executor="inline", gpus=0, code_repo=code.repo, code_branch=code.branch,
            code_commit=code.commit, created_at=now,
        )
        attempt = dict(
            run_id=run_id, attempt_number=1, state=AttemptState.RUNNING.value, executor="inline",
            executor_job_id=inline_job_id(os.getpid()), state_dir=str(state_dir), log_path=str(state_dir / "output.log"),
            host=host_name(), gpu_count=0, code_commit=code.commit, started_at=now,
        )
        blobs = {"config": config_bytes, "environment": capture_environment().canonical, "git_diff": code.dirty_diff}
        pending = write_pending(settings.home, run, attempt, blobs)
        return cls(settings, context, pending, _hand_over(ingester, settings, context, pending))

    def finishing(self) -> None:
        """Tell the ingester that the script is in `finish()`: from now on it ingests at once, at the script's priority."""
        if self._ingester is None:
            return
        try:
            self._ingester.stdin.write(b'{"finishing": true}\n')
            self._ingester.stdin.flush()
        except (OSError, ValueError):
            pass  # gone: close() says so

    def close(self, exit_code: int | None) -> None:
        """Tell the ingester how the script ended, and wait for it to ingest the rest and record the end."""
        ingester, self._ingester = self._ingester, None
        if ingester is None:
            _tell(f"trackway: this run was not recorded in the ledger yet; the spool at {self.context.spool_dir} "
                  "keeps everything it logged for the next trackway command")
            return
        answer = None
        try:
            ingester.stdin.write(json.dumps({"end": {"exit_code": exit_code}}).encode() + b"\n")
            ingester.stdin.close()
            answer = _read_answer(ingester.stdout, FINAL_INGEST_PATIENCE_S + ANSWER_GRACE_S)
        except (OSError, ValueError):
            pass
        finally:
            ingester.stdout.close()
        if answer is None and ingester.poll() is None:
            _tell(f"trackway: the ingester (pid {ingester.pid}) is still writing this run to the ledger; "
                  "it records the end when it is done")
            return
        if answer is None:
            _tell(f"trackway: the ingester exited with status {ingester.returncode} before recording the end; "
                  f"the spool at {self.context.spool_dir} keeps everything for the next trackway command")
        try:
            ingester.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


# How the ingester starts: with no working directory on its path (`-P`: a user's `select.py` must not
# shadow the standard library), and with the directory holding this `trackway` on it when nothing
# else provides it (a checkout the script put on sys.path itself).
_BOOT = (
    "import sys; root = sys.argv[1]; sys.path[:0] = [] if root in sys.path else [root]; "
    "from trackway.sdk.standalone import main; sys.exit(main())"
)


def _recorded_command() -> list[str]:
    """This process's command line as the ledger may hold it: no run retries it, so its words as typed are not kept."""
    from trackway.receipts import submitted_argv

    return submitted_argv.capture([sys.executable, *sys.argv], _secret_values()).recorded


def _secret_values() -> list[str]:
    """The values of this process's secret-named variables: masked wherever the run's records repeat them."""
    from trackway.receipts import submitted_env

    return list(submitted_env.capture().secret.values())


def _start_ingester(db_url: str) -> subprocess.Popen | OSError:
    """Start the ingester process (it waits for `_hand_over`); the error when it cannot start."""
    root = str(Path(__file__).resolve().parents[2])
    backend = "sqlite" if db_url.startswith("sqlite:///") else "other"  # what it imports before it is told more
    try:
        return subprocess.Popen(
            [sys.executable or "python3", "-P", "-c", _BOOT, root, backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            # Its own process group, so that a Ctrl-C meant for the script does not kill the ingest of
            # its end; the same session, so that the scheduler weighs its niceness against the script's.
            process_group=0,
        )
    except OSError as exc:
        return exc


def _hand_over(
    ingester: subprocess.Popen | OSError, settings: Settings, context, pending: Path
) -> subprocess.Popen | None:
    """Give the ingester its attempt; None (said on stderr) when it could not start or is gone."""
    order = {
        "db_url": settings.db_url, "cost_per_gpu_hour": settings.resource("local").cost_per_gpu_hour,
        "pending": str(pending),
        "attempt_id": context.attempt_id, "spool_dir": str(context.spool_dir), "parent": os.getpid(),
    }
    try:
        if isinstance(ingester, OSError):
            raise ingester
        ingester.stdin.write(json.dumps({"start": order}).encode() + b"\n")
        ingester.stdin.flush()
    except OSError as exc:
        _tell(f"trackway: could not start the ledger ingester ({exc}); the spool at {context.spool_dir} keeps "
              "everything this run logs for the next trackway command")
        return None
    return ingester


def _read_answer(stream, timeout: float) -> dict | None:
    """The ingester's one-line answer, or None when it closed its end or did not answer within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            ready, _, _ = select.select([stream], [], [], left)
        except InterruptedError:
            continue
        if ready:
            line = stream.readline()
            return json.loads(line) if line.strip() else None


def _tell(message: str) -> None:
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


# -- the ingester process ---------------------------------------------------------------------------


class Ingester:
    """Registers a standalone run (once), ingests its attempt's spool, and records the attempt's end.

    On a SQLite ledger at the newest migration it writes through `sqlite3` alone
    (`ledger/script_ingest.py`), so that it is ready long before a short script's `finish()`; from
    the first thing that module declines on, it goes through the ledger's own modules (SQLAlchemy).
    """

    def __init__(self, db_url: str, cost_per_gpu_hour: float, attempt_id: str, pending: Path, spool_dir: Path):
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
                _tell(f"trackway: could not reach the ledger ({self.last_error}); the spool at "
                      f"{self.spool_dir} keeps everything this run logged")
                return False
            time.sleep(0.5)
        if record_end:
            self._record_end(exit_code)
        if self._script is not None:
            self._script.close()
        if self._ledger is not None:
            self._ledger.dispose()
        return True

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
        secrets = known_values(_secret_values())  # the ingester was started with the script's environment
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
        self._thread.start()

    def _loop(self) -> None:
        try:
            # This thread's niceness only (Linux); where it is the process's, the whole ingester is
            # niced, as it was before the start-up and the last ingest ran at the script's priority.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + NICE)
        except (OSError, AttributeError):
            pass
        while not self._stop.wait(INGEST_INTERVAL_S):
            # A backlog in slices, one transaction each: stop() waits for one slice at most.
            while self._ingester.sync(SLICE_BYTES) and self._ingester.last_points and not self._stop.is_set():
                pass

    def stop(self) -> None:
        """Return once the ingest under way (if any) is done: the caller ingests the rest itself."""
        self._stop.set()
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

    start = orders.next(timeout=60.0)
    if not start or "start" not in start:
        return 2
    order = start["start"]
    # The script's settings, as it read them: the ingester reads none itself (their module alone costs
    # more than the rest of its start-up).
    ingester = Ingester(order["db_url"], order["cost_per_gpu_hour"], order["attempt_id"], Path(order["pending"]),
                        Path(order["spool_dir"]))
    ingester.sync(SLICE_BYTES)  # registered at once, while the script starts; a backlog is the thread's
    periodic = _Periodic(ingester)
    finishing = False
    while True:
        wait = INGEST_INTERVAL_S if not finishing else 0.0 if ingester.last_points else FINISHING_POLL_S
        message = orders.next(timeout=wait)
        if message is not None and "end" in message:
            periodic.stop()
            ended = ingester.finish(message["end"].get("exit_code"), record_end=True)
            try:
                answers.write(json.dumps({"ended": ended}) + "\n")
                answers.flush()
            except (OSError, ValueError):
                pass  # the script is gone; the end is recorded all the same
            # Everything is written and the ledger disposed of: skip the interpreter's teardown, which
            # the script would otherwise wait for.
            sys.stderr.flush()
            os._exit(0)
        if orders.closed or os.getppid() != order["parent"]:
            # The script ended without a word (killed): ingest what it flushed; its end is for later.
            periodic.stop()
            ingester.finish(None, record_end=False)
            return 0
        if message is not None and message.get("finishing") and not finishing:
            periodic.stop()
            finishing = True
        if finishing:
            ingester.sync()  # beside the script's last flush, at its priority


if __name__ == "__main__":
    sys.exit(main())
