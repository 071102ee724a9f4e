"""`trackway mcp`: serve the agent tools over MCP on stdin/stdout, for one declared agent (trackway/agents/)."""

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


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
