"""The background supervisor: owns the one detached supervisor per ledger (per host) that nobody has to babysit.

`submit --detach`, `submit --eval`, `resume --detach` and `eval --detach` leave work behind them
(retries, evaluations) that only a supervisor drives. They call `ensure_running`, which starts
`python -m trackway supervise --background-child` detached from the terminal (its own session,
stdin from /dev/null, output to its own log) unless one already holds the ledger's lock.

One per ledger: the child holds an exclusive `flock` for its whole life. For a SQLite ledger the
lock file lies beside the database file, so that two homes pointing at one file still never run
two; for PostgreSQL it lies under `$TRACKWAY_HOME/supervisor/` (several hosts may each run one;
the ledger's transaction guards keep that safe). The lock file also holds who holds it (pid,
since, log), which `trackway supervise --status` prints.

The child follows trackway.toml: an edit (of `stop_on`, a watcher's window, a resource) takes
effect at its next tick and is logged; an edit that does not read keeps the running settings.

The child exits once nothing has been in flight for the idle period (`TRACKWAY_SUPERVISOR_IDLE_S`,
else `[supervisor] idle_exit_seconds`, else 300 s): no unfinished attempt, no queued or running
run (a due or future retry, a queued evaluation seed), no evaluation in flight and no committed
checkpoint an attached eval spec has yet to consider.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from trackway.errors import InputError, TrackwayError
from trackway.ledger.reader import Reader
from trackway.settings import Settings
from trackway.supervisor.lock_file import held, ledger_key, lock_path, sqlite_database
from trackway.validation import finite

if TYPE_CHECKING:
    from trackway.settings.follow import SettingsFollower
    from trackway.supervisor.loop import Supervisor

AUTOSTART_ENV = "TRACKWAY_BACKGROUND_SUPERVISOR"  # "0", "off", "no" or "false": commands start none
IDLE_ENV = "TRACKWAY_SUPERVISOR_IDLE_S"
DEFAULT_IDLE_S = 300.0
MAX_IDLE_S = 7 * 86400.0
# A ledger that cannot be read this long (or the idle period, if longer) ends the child: it is
# gone (a dropped database) or down for long enough that the next command should start afresh.
UNREACHABLE_EXIT_S = 600.0
DEFAULT_INTERVAL_S = 1.0
# Past this a log is moved aside to `.1` when a supervisor starts, so a busy ledger's log stays bounded.
MAX_LOG_BYTES = 10 * 1024 * 1024
# How long `stop` waits for the child to finish its tick and let go of the lock, then for SIGKILL.
STOP_GRACE_S = 15.0
KILL_WAIT_S = 5.0
CHILD_FLAG = "--background-child"


class BackgroundError(TrackwayError):
    """The background supervisor could not be started or stopped (the message says where and why)."""


@dataclass(frozen=True)
class Place:
    """Owns where one ledger's background supervisor keeps its lock and its log."""

    ledger: str  # the URL as people may see it (password masked)
    lock: Path
    log: Path


@dataclass(frozen=True)
class Holder:
    """Owns what a running background supervisor recorded about itself in its lock file."""

    pid: int | None  # None: it took the lock a moment ago and has not written itself down yet
    since: datetime | None
    log: Path
    host: str
    idle_exit_s: float | None
    started: bool = False  # this call started it (rather than finding it running)

    def to_json(self) -> dict:
        return {
            "running": True,
            "pid": self.pid,
            "since": self.since.isoformat().replace("+00:00", "Z") if self.since else None,
            "log": str(self.log),
            "host": self.host,
            "idle_exit_seconds": self.idle_exit_s,
        }


# -- where ------------------------------------------------------------------------------------------


def place_of(settings: Settings) -> Place:
    """The lock and log paths of `settings`' ledger; InputError for a ledger no other process can open."""
    from trackway.redaction import redact_url

    key = ledger_key(settings.db_url)
    return Place(ledger=redact_url(settings.db_url), lock=lock_path(settings, key),
                 log=settings.home / "supervisor" / f"{key}.log")


def _host() -> str:
    return os.uname().nodename  # what socket.gethostname() returns, without importing socket


# -- the lock ---------------------------------------------------------------------------------------


def _open_lock(path: Path) -> int:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


def _try_lock(fd: int, tries: int = 5) -> bool:
    """Take the exclusive lock on `fd`; a few tries, because a `--status` probe holds it for microseconds."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(0.02)
    return False


def _write_holder(fd: int, pid: int, log: Path, idle_exit_s: float) -> None:
    """Record the holder in the lock file itself, in place (replacing the file would replace the lock)."""
    data = json.dumps({
        "pid": pid,
        "since": datetime.now(timezone.utc).isoformat(),
        "log": str(log),
        "host": _host(),
        "idle_exit_s": idle_exit_s,
    }).encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _read_holder(path: Path, fallback_log: Path) -> Holder:
    """The holder as its lock file says; a file being written right now is read again."""
    record: dict = {}
    for _ in range(25):
        try:
            record = json.loads(path.read_bytes() or b"{}")
            break
        except ValueError:
            time.sleep(0.02)
        except OSError:
            break
    return Holder(
        pid=record.get("pid") if isinstance(record.get("pid"), int) else None,
        since=_moment(record.get("since")),
        log=Path(record.get("log") or fallback_log),
        host=str(record.get("host") or _host()),
        idle_exit_s=record.get("idle_exit_s"),
    )


def _moment(value) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def running(settings: Settings) -> Holder | None:
    """The background supervisor holding this ledger's lock, or None when none does."""
    if not held(settings):
        return None
    place = place_of(settings)
    return _read_holder(place.lock, place.log)


# -- starting and stopping --------------------------------------------------------------------------


def autostart_enabled() -> bool:
    """Whether commands start a background supervisor (`TRACKWAY_BACKGROUND_SUPERVISOR=0` turns that off)."""
    return os.environ.get(AUTOSTART_ENV, "").strip().lower() not in ("0", "off", "no", "false")


def idle_exit_seconds(settings: Settings) -> float:
    """How long the child waits with nothing in flight before it exits: the environment, then trackway.toml."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise InputError(f"{IDLE_ENV} {raw!r}: expected a number of seconds from 0 to {MAX_IDLE_S:g}") from None
        return finite(value, IDLE_ENV, 0.0, MAX_IDLE_S, "seconds")
    return float(getattr(settings, "idle_exit_seconds", DEFAULT_IDLE_S))


def ensure_running(settings: Settings) -> Holder:
    """Start this ledger's background supervisor unless one already runs; return the one that runs.

    The lock is taken here and handed to the child (the same open file), so that two commands
    racing to ensure one never start two, and `--status` is right the moment this returns.
    """
    place = place_of(settings)
    idle = idle_exit_seconds(settings)
    try:
        fd = _open_lock(place.lock)
    except OSError as exc:
        raise BackgroundError(f"{place.lock}: cannot open the background supervisor's lock: {exc.strerror}") from None
    try:
        if not _try_lock(fd):
            return _read_holder(place.lock, place.log)
        try:
            child = _spawn(settings, place, fd, idle)
        except OSError as exc:
            raise BackgroundError(f"{place.log}: cannot start the background supervisor: {exc.strerror}") from None
        _write_holder(fd, child.pid, place.log, idle)
        return Holder(pid=child.pid, since=datetime.now(timezone.utc), log=place.log,
                      host=_host(), idle_exit_s=idle, started=True)
    finally:
        # The child holds the lock through its inherited descriptor; ours must not outlive this call.
        os.close(fd)


def _spawn(settings: Settings, place: Place, lock_fd: int, idle: float) -> subprocess.Popen:
    """`python -m trackway supervise --background-child`, in its own session, its output to its log."""
    place.log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _rotate(place.log)
    # The ledger and home travel in the environment, not argv: `ps` would show a password.
    env = {**os.environ, "TRACKWAY_HOME": str(settings.home), "TRACKWAY_DB": settings.db_url}
    env.pop(AUTOSTART_ENV, None)
    command = [sys.executable, "-m", "trackway", "supervise", CHILD_FLAG,
               "--lock-fd", str(lock_fd), "--idle-exit", repr(idle)]
    log = os.open(place.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            pass_fds=(lock_fd,), start_new_session=True,
        )
    finally:
        os.close(log)


def _rotate(log: Path) -> None:
    try:
        if log.stat().st_size > MAX_LOG_BYTES:
            log.replace(log.with_name(log.name + ".1"))
    except FileNotFoundError:
        pass


def stop(settings: Settings) -> Holder | None:
    """End this ledger's background supervisor (SIGTERM: it finishes its tick; SIGKILL past the grace).

    Returns the one stopped, or None when none was running.
    """
    place = place_of(settings)
    holder = running(settings)
    if holder is None:
        return None
    if holder.pid is None or not _is_background_child(holder.pid):
        raise BackgroundError(
            f"{place.lock}: held by pid {holder.pid if holder.pid is not None else 'unknown'}, which is not a "
            "trackway background supervisor on this host; stop it by hand"
        )
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
        try:
            os.kill(holder.pid, sig)
        except ProcessLookupError:
            pass
        if _wait_released(settings, wait_s):
            return holder
    raise BackgroundError(f"{place.lock}: pid {holder.pid} still holds the lock after SIGKILL")


def _wait_released(settings: Settings, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running(settings) is None:
            return True
        time.sleep(0.05)
    return running(settings) is None


def _is_background_child(pid: int) -> bool:
    """Whether `pid` is a trackway background supervisor (where /proc can tell; elsewhere, trusted)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return False
    return CHILD_FLAG.encode() in cmdline.split(b"\0")


# -- what is in flight ------------------------------------------------------------------------------


def in_flight(conn) -> dict[str, int]:
    """What a supervisor still has to drive, by kind; empty when nothing is in flight (see `Reader.in_flight`)."""
    return Reader.over(conn).in_flight()


# -- the child --------------------------------------------------------------------------------------


def take_lock(settings: Settings, lock_fd: int | None, idle: float) -> int | None:
    """The child's hold on the lock: the descriptor its starter handed over, or one taken now (None: held elsewhere)."""
    if lock_fd is not None:
        if not _try_lock(lock_fd, tries=1):  # ours already: flock on the same open file succeeds
            return None
        # Handed over as inheritable; an attempt launched with it would hold the lock after we exit.
        os.set_inheritable(lock_fd, False)
        return lock_fd
    place = place_of(settings)
    fd = _open_lock(place.lock)
    if not _try_lock(fd):
        os.close(fd)
        return None
    _write_holder(fd, os.getpid(), place.log, idle)
    return fd


def log_line(message: str) -> None:
    """One timestamped line to the child's log (its stdout)."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{stamp} {message}", flush=True)


def serve(
    supervisor: Supervisor,
    idle_exit_s: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    stop_requested: threading.Event | None = None,
    on_ends: Callable[[list], None] | None = None,
    follow: SettingsFollower | None = None,
) -> str:
    """Tick `supervisor` until nothing has been in flight for `idle_exit_s` (or a stop is requested); return why it ended.

    With `follow`, an edit of trackway.toml takes effect at the next tick, said in the log.
    """
    ledger, settings = supervisor.ledger, supervisor.settings
    stop_requested = stop_requested or threading.Event()
    idle_since: float | None = None
    failing_since: float | None = None
    errors = _ErrorLog()
    while not stop_requested.is_set():
        gone = _ledger_gone(settings)
        if gone:
            return gone
        now = time.monotonic()
        if follow is not None:
            follow_settings(follow, supervisor, log_line)
        try:
            ends = supervisor.tick()
            with ledger.read() as conn:
                busy = in_flight(conn)
            failing_since = None
            errors.recovered()
        except TrackwayError as exc:
            errors.say(f"tick failed: {exc}")
            failing_since = failing_since or now
            if now - failing_since >= max(idle_exit_s, UNREACHABLE_EXIT_S):
                return f"the ledger failed for {now - failing_since:.0f} s; exiting"
            stop_requested.wait(interval_s)
            continue
        except Exception:  # noqa: BLE001 - a bug in one tick must not end the supervisor silently
            errors.say("tick failed:\n" + traceback.format_exc().rstrip())
            stop_requested.wait(interval_s)
            continue
        if on_ends is not None and ends:
            on_ends(ends)
        if busy:
            idle_since = None
        else:
            idle_since = idle_since if idle_since is not None else now
            if now - idle_since >= idle_exit_s:
                return f"nothing in flight for {idle_exit_s:g} s; exiting"
        if not supervisor.backlog:  # a backlog is worked off at once
            supervisor.pause(now, interval_s, stop_requested)
    return "asked to stop; exiting"


def follow_settings(follow: SettingsFollower, supervisor: Supervisor, say: Callable[[str], None]) -> None:
    """Put an edited trackway.toml into effect for `supervisor`'s next tick, saying what changed (or why not)."""
    loaded, lines = follow.check()
    for line in lines:
        say(line)
    if loaded is not None:
        supervisor.settings = loaded


class _ErrorLog:
    """Owns the log's error lines: a failure repeated every tick is written once a minute, not every second."""

    REPEAT_S = 60.0

    def __init__(self) -> None:
        self.last: str | None = None
        self.logged_at = 0.0
        self.repeats = 0

    def say(self, message: str) -> None:
        now = time.monotonic()
        if message == self.last and now - self.logged_at < self.REPEAT_S:
            self.repeats += 1
            return
        again = f" (and {self.repeats} more times)" if message == self.last and self.repeats else ""
        log_line(message + again)
        self.last, self.logged_at, self.repeats = message, now, 0

    def recovered(self) -> None:
        if self.last is not None:
            log_line("ticks succeed again")
        self.last, self.repeats = None, 0


def _ledger_gone(settings: Settings) -> str | None:
    """Why there is no ledger left to supervise (its SQLite file was removed), or None."""
    database = sqlite_database(settings.db_url)
    if database and database != ":memory:" and not Path(database).expanduser().exists():
        return f"the ledger file {database} is gone; exiting"
    return None


def install_stop_handlers(stop_requested: threading.Event) -> None:
    """SIGTERM and SIGINT end the child after its current tick; a hang-up is not its business."""
    def request(signum, frame) -> None:  # noqa: ARG001 - the signal module's handler signature
        stop_requested.set()

    signal.signal(signal.SIGTERM, request)
    signal.signal(signal.SIGINT, request)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
