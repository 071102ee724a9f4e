"""`/mcp` under `trackway serve`: the agent tools over MCP's streamable HTTP, behind the REST API's tokens.

The token says which agent calls: a token named as a declared agent (`trackway token add NAME
--role submit` for `[agents.NAME]`) acts as that agent, with its budget, cap and approvals. The
server's own token and tokens of other names are people's, and are refused here: an agent's work
is credited to the agent, never to a person's token. One MCP server per declared agent is built
at start-up (an agent declared later needs a restart, as any trackway.toml change to `serve`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from anyio import to_thread

from trackway.ledger import Ledger
from trackway.server.auth import NO_TOKEN, Access, caller_of
from trackway.settings import Settings

PATH = "/mcp"


def available() -> bool:
    """Whether the MCP SDK is installed (the `agents` extra)."""
    import importlib.util

    return importlib.util.find_spec("mcp") is not None


class AgentEndpoint:
    """ASGI middleware: requests to /mcp go to the calling agent's MCP app, the rest to the API."""

    def __init__(self, app, access: Access, ledger: Ledger, agent_apps: dict[str, Any]) -> None:
        self.app = app
        self.access = access
        self.ledger = ledger
        self.agent_apps = agent_apps

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != PATH:
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        # The ledger lookup of a named token is a blocking read: not on the event loop.
        caller = await to_thread.run_sync(caller_of, self.access, self.ledger, headers.get("authorization", ""))
        if caller is None:
            await _refuse(send, 401, NO_TOKEN, {"www-authenticate": "Bearer"})
            return
        agent_app = self.agent_apps.get(caller.name)
        if agent_app is None:
            known = ", ".join(sorted(self.agent_apps)) or "none is declared"
            await _refuse(send, 403, f"token {caller.name!r} is not an agent's: /mcp takes a token named as an "
                                     f"[agents.NAME] in trackway.toml ({known}), made with `trackway token add NAME "
                                     "--role submit`")
            return
        if not caller.may("submit"):
            await _refuse(send, 403, f"token {caller.name!r} has the role {caller.role}; an agent needs submit")
            return
        await agent_app(scope, receive, send)


async def _refuse(send, status: int, message: str, extra: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": {"type": "Unauthorized" if status == 401 else "Forbidden", "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def agent_apps(settings: Settings, ledger: Ledger, workdir: Path) -> dict[str, Any]:
    """Each declared agent's MCP app (streamable HTTP, stateless, JSON answers), by name."""
    from trackway.agents.guardrails import agent_of
    from trackway.agents.mcp_server import build_server
    from trackway.agents.tools import AgentSession

    from mcp.server.transport_security import TransportSecuritySettings

    apps = {}
    for name in settings.agents:
        server = build_server(AgentSession(ledger, settings, agent_of(settings, name), workdir))
        # The Host header is checked by the API's own guard (server/guard.py) in front of this.
        apps[name] = server.streamable_http_app(
            streamable_http_path=PATH, stateless_http=True, json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    return apps


@contextlib.asynccontextmanager
async def running(apps: dict[str, Any]) -> AsyncIterator[None]:
    """Each agent app's lifespan (its MCP session manager) for as long as the server runs."""
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        yield
