"""`trackway logs`: an attempt's timestamped output; followed across a run's attempts, or every running attempt's."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer
from sqlalchemy import select

from trackway.cli.context import AppContext, app_context
from trackway.cli.render import printable
from trackway.errors import InputError, NotFound
from trackway.ledger.records import active_attempts, get_attempt, resolve_run
from trackway.output_log import read_from, tail_offset
from trackway.ledger.schema import attempts, runs
from trackway.taxonomy import AttemptState, RunState
from trackway.validation import attempt_ref

FOLLOW_INTERVAL_S = 0.25
# `logs --all` starts an attempt that was already running at its last lines, as `tail` does.
TAIL_LINES = 10


def logs(
    ctx: typer.Context,
    ref: str = typer.Argument(
        None, metavar="RUN|RUN/N", help="A run (its latest attempt; with -f, each next one too) or an attempt RUN/N."
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f",
        help="Keep printing: a run's next attempts as the supervisor starts them, until the run has ended.",
    ),
    every: bool = typer.Option(False, "--all", help="Every running attempt, each line prefixed `RUN/N | `."),
) -> None:
    """Print an attempt's output log; with -f follow the run across its attempts."""
    app = app_context(ctx)
    if every:
        if ref is not None:
            raise InputError(f"--all: expected no RUN (it shows every running attempt), got {ref!r}")
        _until_interrupted(lambda interrupt: _tail_all(app, follow, interrupt))
        return
    if ref is None:
        raise InputError("RUN: expected a run id or name, or RUN/N, or --all")
    attempt_ref(ref)
    from trackway.cli.runs_cmd import resolve_ref

    with app.reader() as reader:
        run, asked = resolve_ref(reader, ref)
        attempt = asked or reader.latest_attempt(run["run_id"])
    if not follow:
        if attempt is None:
            raise NotFound(f"run {ref!r}: has no attempt yet")
        _copy_from(Path(attempt["log_path"]), 0)
        return
    supervisor = _supervisor(app)
    if asked is not None:
        _until_interrupted(lambda interrupt: _follow_attempt(app, supervisor, asked, interrupt))
    else:
        _until_interrupted(lambda interrupt: _follow_run(app, supervisor, run["run_id"], attempt, interrupt))


def _supervisor(app: AppContext):
    """The control loop, ticked while following: ends are recorded and retries start even with no other
    trackway command running."""
    from trackway.supervision import supervisor_for  # on use: only following needs the control loop

    return supervisor_for(app.ledger, app.settings)


def _until_interrupted(follow: Callable[[Interrupt], None]) -> None:
    """Run `follow` with Ctrl-C taken at its next look; exit 130 when that is how it stopped."""
    with Interrupt() as interrupt:
        follow(interrupt)
    if interrupt.pressed:
        raise typer.Exit(130)


class Interrupt:
    """Ctrl-C while following: the loop stops at its next look instead of wherever the signal lands (inside a
    ledger transaction or a launch, which would turn a plain stop into an error). A second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous = None

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_interrupt(self, signum, frame) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True


def _follow_attempt(app: AppContext, supervisor, attempt, interrupt: Interrupt) -> None:
    """One attempt's log until that attempt has ended."""
    path, offset = Path(attempt["log_path"]), 0
    while not interrupt.pressed:
        offset = _copy_from(path, offset)
        supervisor.tick()
        with app.ledger.read() as conn:
            if get_attempt(conn, attempt["attempt_id"])["state"] == AttemptState.ENDED.value:
                _copy_from(path, offset)
                return
        time.sleep(FOLLOW_INTERVAL_S)


def _follow_run(app: AppContext, supervisor, run_id: str, attempt, interrupt: Interrupt) -> None:
    """A run's logs from `attempt` on: each next attempt after a separator line, until the run has ended."""
    offset = 0
    while not interrupt.pressed:
        if attempt is not None:
            offset = _copy_from(Path(attempt["log_path"]), offset)
        supervisor.tick()
        with app.ledger.read() as conn:
            run = resolve_run(conn, run_id)
            current = get_attempt(conn, attempt["attempt_id"]) if attempt is not None else None
            following = _next_attempt(conn, run_id, current["attempt_number"] if current is not None else 0)
        if following is not None:
            if current is not None:
                _copy_from(Path(current["log_path"]), offset)  # what it wrote after the last look
            _write_line(separator(current, following))
            attempt, offset = following, 0
            continue
        ended = current is None or current["state"] == AttemptState.ENDED.value
        if ended and RunState(run["state"]).is_terminal():
            if current is not None:
                _copy_from(Path(current["log_path"]), offset)
            return
        time.sleep(FOLLOW_INTERVAL_S)


def _next_attempt(conn, run_id: str, after: int):
    """The run's attempt right after number `after`, if the supervisor (or a person) has started one."""
    query = (
        select(attempts)
        .where(attempts.c.run_id == run_id, attempts.c.attempt_number > after)
        .order_by(attempts.c.attempt_number)
        .limit(1)
    )
    return conn.execute(query).mappings().first()


def separator(previous, attempt) -> str:
    """`── attempt 2 (resumed from step-00000040; attempt 1 ended preempted) ──`: where the next log begins and why."""
    facts = [f"resumed from {attempt['resumed_from_checkpoint']}" if attempt["resumed_from_checkpoint"]
             else "from the start: no committed checkpoint"]
    if previous is not None:
        ended = previous["termination_reason"] or "without a recorded reason"
        facts.append(f"attempt {previous['attempt_number']} ended {ended}")
    started_by = attempt["started_by"] or ""
    if started_by and not started_by.startswith("supervisor"):
        facts.append(f"started by {printable(started_by)}")  # a person's command: say so
    return f"── attempt {attempt['attempt_number']} ({'; '.join(facts)}) ──"


# -- every running attempt ------------------------------------------------------------------------


@dataclass
class _Tail:
    """One attempt's log being followed: where reading got to, and a line not finished yet."""

    prefix: bytes
    path: Path
    offset: int = 0
    partial: bytes = b""

    def pump(self, final: bool = False) -> None:
        """Print the whole lines written since the last call, each after the prefix (the rest too when `final`)."""
        data = read_from(self.path, self.offset)
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        if lines:
            sys.stdout.buffer.write(b"".join(self.prefix + line + b"\n" for line in lines))
            sys.stdout.flush()


def _tail_all(app: AppContext, follow: bool, interrupt: Interrupt) -> None:
    """The last lines of every running attempt; with `follow`, every new line, and new attempts as they start,
    until interrupted."""
    tails: dict[str, _Tail] = {}
    first = True
    supervisor = _supervisor(app) if follow else None
    while not interrupt.pressed:
        with app.ledger.read() as conn:
            running = {a["attempt_id"]: a for a in active_attempts(conn)}
            for attempt_id, attempt in running.items():
                if attempt_id not in tails:
                    path = Path(attempt["log_path"])
                    # Started before this command: its last lines; started since: all of it.
                    tails[attempt_id] = _Tail(_prefix(conn, attempt), path, tail_offset(path, TAIL_LINES) if first else 0)
        for attempt_id, tail in list(tails.items()):
            tail.pump(final=attempt_id not in running)
            if attempt_id not in running:
                del tails[attempt_id]
        if supervisor is None:
            for tail in tails.values():
                tail.pump(final=True)
            return
        first = False
        supervisor.tick()
        time.sleep(FOLLOW_INTERVAL_S)


def _prefix(conn, attempt) -> bytes:
    """`NAME/N | ` (or `RUN_ID/N | ` for a run without a name)."""
    name = conn.execute(select(runs.c.name).where(runs.c.run_id == attempt["run_id"])).scalar()
    return f"{printable(name or attempt['run_id'])}/{attempt['attempt_number']} | ".encode()


# -- bytes ----------------------------------------------------------------------------------------


def _copy_from(path: Path, offset: int) -> int:
    data = read_from(path, offset)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return offset + len(data)


def _write_line(line: str) -> None:
    sys.stdout.buffer.write((line + "\n").encode())
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)
