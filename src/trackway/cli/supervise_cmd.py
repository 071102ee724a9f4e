"""`trackway supervise`: run the control loop (here or in the background), and say or end the background one."""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone

import typer

from trackway.cli.context import AppContext, app_context
from trackway.cli.render import console, err_console, print_json, say, say_lines
from trackway.errors import InputError, TrackwayError
from trackway.validation import finite

# Faster than this spins a core on ledger reads; slower than this lets ends and retries wait an hour.
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 3600.0


def supervise(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="One pass, then exit."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between passes."),
    status: bool = typer.Option(False, "--status", help="Say whether a background supervisor runs for this ledger: pid, since, log."),
    stop: bool = typer.Option(False, "--stop", help="End this ledger's background supervisor (it finishes its current pass)."),
    as_json: bool = typer.Option(False, "--json", help="With --status: print it as JSON."),
    background_child: bool = typer.Option(False, "--background-child", hidden=True),
    lock_fd: int = typer.Option(None, "--lock-fd", hidden=True),
    idle_exit: float = typer.Option(None, "--idle-exit", hidden=True),
) -> None:
    """Drive every unfinished run: notice ends, classify them, decide by policy, resume what should resume.

    `submit --detach`, `submit --eval`, `resume --detach` and `eval --detach` start a background
    supervisor for the ledger by themselves; it exits once nothing has been in flight for a while.
    """
    finite(interval, "--interval", MIN_INTERVAL_S, MAX_INTERVAL_S, "seconds")
    _refuse_mixed(once=once, status=status, stop=stop, background_child=background_child, as_json=as_json)
    app = app_context(ctx)
    if status:
        _status(app, as_json)
    elif stop:
        _stop(app)
    elif background_child:
        raise typer.Exit(_background_child(app, interval, lock_fd, idle_exit))
    else:
        _foreground(app, once, interval)


def _refuse_mixed(*, once: bool, status: bool, stop: bool, background_child: bool, as_json: bool) -> None:
    """One mode per call: --once, --status, --stop or the background child; --json goes with --status."""
    given = [flag for flag, on in (("--once", once), ("--status", status), ("--stop", stop),
                                    ("--background-child", background_child)) if on]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)}: expected one of them, not both")
    if as_json and not status:
        raise InputError("--json: expected together with --status")


def _foreground(app: AppContext, once: bool, interval: float) -> None:
    """The loop in this terminal, printing each end as it is recorded."""
    from trackway.supervisor.background import running
    from trackway.supervision import supervisor_for

    supervisor = supervisor_for(app.ledger, app.settings)
    if not once:
        holder = _safe(lambda: running(app.settings))
        if holder is not None:
            # Both are safe together (the ledger's guards record each end once); say it, so nobody wonders.
            say(err_console, f"a background supervisor (pid {holder.pid}) also drives this ledger; log: {holder.log}")
    if once:
        tell(supervisor.tick())
        supervisor.settle(timeout=30)  # what this pass recorded is sent before it exits
    else:
        from trackway.supervisor.background import follow_settings

        follower = _follower(app)

        def follow() -> bool:  # before each tick: an edit of trackway.toml takes effect
            follow_settings(follower, supervisor, lambda line: say(err_console, line))
            return False

        supervisor.run(follow, interval_s=interval, on_ends=tell)


def _follower(app: AppContext):
    """What follows trackway.toml for a supervisor that outlives an edit of it."""
    from trackway.settings import load_settings
    from trackway.settings.follow import SettingsFollower

    return SettingsFollower(app.settings, lambda: load_settings(home=app.home, db=app.db))


def tell(ends) -> None:
    """Print each recorded end with its classification and the policy's decision, a tick's ends at once."""
    say_lines(console, [describe_end(end) for end in ends])


def describe_end(end) -> str:
    """One line for one attempt end: reason and rule, then the decision and its rule."""
    from trackway.cli.end_line import decision_of, end_line

    return end_line(end.attempt_id, end.reason.value, decision_of(end), rule=end.rule, process=False)


def _safe(probe):
    """`probe()`, or None where this ledger cannot have a background supervisor (an in-memory SQLite one)."""
    try:
        return probe()
    except InputError:
        return None


# -- --status and --stop ----------------------------------------------------------------------------


def _status(app: AppContext, as_json: bool) -> None:
    """Say whether this ledger's background supervisor runs: pid, since, idle exit and log."""
    from trackway.display import when
    from trackway.supervisor.background import place_of, running

    place = place_of(app.settings)
    holder = running(app.settings)
    if as_json:
        payload = holder.to_json() if holder is not None else {
            "running": False, "log": str(place.log) if place.log.exists() else None}
        print_json({**payload, "ledger": place.ledger, "lock": str(place.lock)})
        return
    if holder is None:
        last = f"; last log: {place.log}" if place.log.exists() else ""
        say(console, f"no background supervisor is running for {place.ledger}{last}")
        say(err_console, app.hint("`trackway submit --detach` and `trackway resume --detach` start one; "
                                  "`trackway supervise` runs one in this terminal"))
        return
    idle = f"; exits after {holder.idle_exit_s:g} s with nothing in flight" if holder.idle_exit_s is not None else ""
    say(console, f"background supervisor running for {place.ledger}")
    say(console, f"  pid    {holder.pid if holder.pid is not None else 'starting'} on {holder.host}")
    say(console, f"  since  {when(holder.since, datetime.now(timezone.utc), missing='a moment ago')}{idle}")
    say(console, f"  log    {holder.log}")


def _stop(app: AppContext) -> None:
    """End this ledger's background supervisor; saying so when there was none is not an error."""
    from trackway.supervisor.background import place_of, stop

    place = place_of(app.settings)
    holder = stop(app.settings)
    if holder is None:
        say(console, f"no background supervisor is running for {place.ledger}")
        return
    say(console, f"stopped the background supervisor (pid {holder.pid}) of {place.ledger}; log: {holder.log}")


# -- what other commands call -----------------------------------------------------------------------


def ensure_background_supervisor(app: AppContext) -> None:
    """Make sure a background supervisor drives this ledger's retries and evaluations, and say which.

    Called after a command leaves work behind (`submit --detach`, `submit --eval`, `resume --detach`,
    `eval --detach`). Never fails that command: what it recorded stands; a problem is one line.
    """
    from trackway.supervisor.background import autostart_enabled, ensure_running

    if not autostart_enabled():
        say(err_console, app.hint("no background supervisor (TRACKWAY_BACKGROUND_SUPERVISOR is off): "
                                  "retries and evaluations wait for `trackway supervise`"))
        return
    try:
        holder = ensure_running(app.settings)
    except TrackwayError as exc:
        say(err_console, app.hint(f"trackway: warning: {exc}; retries and evaluations wait for `trackway supervise`"))
        return
    who = "started a background supervisor" if holder.started else "a background supervisor is already running"
    say(err_console, app.hint(
        f"{who} (pid {holder.pid if holder.pid is not None else 'starting'}): it drives retries and evaluations "
        f"and exits once nothing is in flight; log: {holder.log} (`trackway supervise --status`)"
    ))


# -- the background child ---------------------------------------------------------------------------


def _background_child(app: AppContext, interval: float, lock_fd: int | None, idle_exit: float | None) -> int:
    """The detached loop `ensure_background_supervisor` starts: hold the lock, tick until idle, log to stdout."""
    from trackway.supervisor.background import (
        MAX_IDLE_S,
        idle_exit_seconds,
        install_stop_handlers,
        log_line,
        place_of,
        serve,
        take_lock,
    )

    idle = idle_exit if idle_exit is not None else idle_exit_seconds(app.settings)
    finite(idle, "--idle-exit", 0.0, MAX_IDLE_S, "seconds")
    held = take_lock(app.settings, lock_fd, idle)
    if held is None:
        log_line(f"pid {os.getpid()}: another background supervisor holds this ledger's lock; exiting")
        return 0
    stop_requested = threading.Event()
    install_stop_handlers(stop_requested)
    log_line(f"pid {os.getpid()}: supervising {place_of(app.settings).ledger} from {os.getcwd()} "
             f"(exits after {idle:g} s with nothing in flight)")
    supervisor = app.supervisor()
    why = serve(supervisor, idle, interval, stop_requested,
                on_ends=lambda ends: [log_line(describe_end(end)) for end in ends], follow=_follower(app))
    log_line(f"pid {os.getpid()}: {why}")
    return 0


def register(app: typer.Typer) -> None:
    app.command("supervise")(supervise)
