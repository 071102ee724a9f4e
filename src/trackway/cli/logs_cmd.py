"""`trackway logs`: an attempt's timestamped output, optionally followed until the attempt ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from trackway.cli.context import app_context
from trackway.ledger.records import get_attempt, resolve_attempt
from trackway.taxonomy import AttemptState

FOLLOW_INTERVAL_S = 0.25


def logs(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="RUN|RUN/N", help="A run (its latest attempt) or one attempt as RUN/N."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the attempt ends."),
) -> None:
    """Print an attempt's output log."""
    app = app_context(ctx)
    with app.ledger.read() as conn:
        attempt = resolve_attempt(conn, ref)
    path = Path(attempt["log_path"])
    supervisor = None
    if follow:
        from trackway.supervisor.loop import Supervisor  # on use: only following needs the control loop

        supervisor = Supervisor(app.ledger, app.settings)
    offset = 0
    while True:
        offset = _copy_from(path, offset)
        if supervisor is None:
            return
        supervisor.tick()
        with app.ledger.read() as conn:
            if get_attempt(conn, attempt["attempt_id"])["state"] == AttemptState.ENDED.value:
                _copy_from(path, offset)
                return
        time.sleep(FOLLOW_INTERVAL_S)


def _copy_from(path: Path, offset: int) -> int:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return offset + len(data)


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)
