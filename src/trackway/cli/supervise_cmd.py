"""`trackway supervise`: run the control loop: record attempt ends, apply the retry policy, relaunch."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.render import console


def supervise(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="One pass, then exit."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between passes."),
) -> None:
    """Drive every unfinished run: notice ends, classify them, decide by policy, resume what should resume."""
    from trackway.supervisor.loop import Supervisor

    app = app_context(ctx)
    supervisor = Supervisor(app.ledger, app.settings)

    def say(ends) -> None:
        for end in ends:
            console.print(
                f"{end.attempt_id} ended: {end.reason.value} [{end.rule}]; {end.decision.action}: "
                f"{end.decision.message} [{end.decision.rule}]",
                highlight=False,
            )

    if once:
        say(supervisor.tick())
    else:
        supervisor.run(lambda: False, interval_s=interval, on_ends=say)


def register(app: typer.Typer) -> None:
    app.command("supervise")(supervise)
