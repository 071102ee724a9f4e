"""`trackway mcp` serves the agent tools over MCP for one declared agent; `trackway approve` lets its runs start (trackway/agents/)."""

from __future__ import annotations

from pathlib import Path

import typer

from trackway.cli.context import app_context


def mcp(
    ctx: typer.Context,
    agent: str = typer.Option(..., "--agent", help="The agent this server acts for, declared as [agents.NAME] in "
                                                   "trackway.toml (its budget and its cap on unfinished runs)."),
) -> None:
    """Serve trackway's tools to an agent over MCP on stdin/stdout: resources, budget, submit, wait, explain, metrics, logs, cancel, sql."""
    from trackway.agents.guardrails import agent_of
    from trackway.agents.mcp_server import serve_stdio
    from trackway.agents.tools import AgentSession

    app = app_context(ctx)
    declared = agent_of(app.settings, agent)  # an undeclared agent is refused before the protocol starts
    serve_stdio(AgentSession(app.ledger, app.settings, declared, Path.cwd()))


def approve(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A run awaiting approval, by id or name (`trackway runs` lists them)."),
    refuse: bool = typer.Option(False, "--refuse", help="End the run cancelled instead, before anything ran."),
    why: str = typer.Option("", "--why", help="Why (needed with --refuse; kept on the run)."),
) -> None:
    """Start a run an agent submitted that waits for a person's approval, or --refuse it with --why."""
    from trackway.agents.approval import approve as approve_run
    from trackway.agents.approval import refuse as refuse_run
    from trackway.cli.render import console, say
    from trackway.supervisor.launch import command_by

    app = app_context(ctx)
    by = command_by("trackway approve")
    if refuse:
        run_id = refuse_run(app.ledger, run, by, why)
        say(console, f"run {run_id} refused and cancelled; nothing ran")
        return
    if why:
        from trackway.errors import InputError

        raise InputError("--why: expected only with --refuse (an approval needs no reason)")
    attempt_id = approve_run(app.ledger, app.settings, run, by, app.supervisor().executor)
    say(console, f"approved; attempt {attempt_id} started (follow it with `trackway logs {attempt_id} -f`)")
    from trackway.cli.supervise_cmd import ensure_background_supervisor

    ensure_background_supervisor(app)


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
    app.command("approve")(approve)
