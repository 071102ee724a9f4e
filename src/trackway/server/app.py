"""The FastAPI application: one ledger, its routes behind one token check, errors in one shape."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from trackway.errors import TrackwayError
from trackway.server import dashboard, errors, events, jobs, reads
from trackway.server.auth import Access, requires
from trackway.server.guard import DEFAULT_MAX_BODY, LOOPBACK_NAMES, Guard
from trackway.settings import Settings

log = logging.getLogger("trackway.server")


class LedgerJSON(JSONResponse):
    """JSON without NaN or infinities (which JSON cannot hold): a non-finite number is null."""

    def render(self, content: Any) -> bytes:
        return json.dumps(_finite(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _finite(node: Any) -> Any:
    if isinstance(node, float):
        return node if math.isfinite(node) else None
    if isinstance(node, dict):
        return {k: _finite(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_finite(v) for v in node]
    return node


class State:
    """What every request reads: the settings, the ledger, the executors (for cancel), where jobs run."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        from trackway.ledger import open_ledger
        from trackway.supervision import supervisor_for

        self.settings = settings
        self.workdir = workdir
        self.ledger = open_ledger(settings.db_url)
        self.supervisor = supervisor_for(self.ledger, settings)

    def after_submit(self) -> None:
        """A job was started: make sure a background supervisor drives it (as `submit --detach` does)."""
        from trackway.supervisor.background import autostart_enabled, ensure_running

        if not autostart_enabled():
            return
        try:
            ensure_running(self.settings)
        except TrackwayError as exc:
            log.warning("no background supervisor: %s; jobs wait for `trackway supervise`", exc)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI, agents: dict[str, Any]) -> AsyncIterator[None]:
    """The agents' MCP apps run while the server does; its SQL worker processes end with it."""
    from trackway.server import agent_endpoint

    try:
        async with agent_endpoint.running(agents):
            yield
    finally:
        reads.close_sql_workers(app)


def create_app(settings: Settings, access: Access, workdir: Path, hosts: frozenset[str] = LOOPBACK_NAMES,
               max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The API over `settings`' ledger; `hosts`: the names a request's Host may carry (server/guard.py)."""
    from trackway.server import agent_endpoint

    state = State(settings, workdir)
    # Agents over MCP at /mcp (server/agent_endpoint.py), when the agents extra is installed and any is declared.
    agents = agent_endpoint.agent_apps(settings, state.ledger, workdir) \
        if settings.agents and agent_endpoint.available() else {}
    app = FastAPI(
        title="trackway",
        summary="Training runs that leave tracks: jobs, attempts, metrics, checkpoints, evaluations, experiments.",
        version="1",
        default_response_class=LedgerJSON,
        lifespan=lambda app: _lifespan(app, agents),
    )
    app.state.settings = settings
    for name in ("ledger", "supervisor", "workdir", "after_submit"):
        setattr(app.state, name, getattr(state, name))
    errors.install(app)
    # Every /api route asks for a token with the role `read` at least (starting and cancelling jobs check
    # `submit` themselves); the dashboard's page and assets hold no data and do not.
    guarded = [Depends(requires(access, "read"))]
    for router in (jobs.router, reads.router, events.router):
        app.include_router(router, dependencies=guarded, responses=errors.RESPONSES)
    dashboard.install(app)
    if agents:
        app.add_middleware(agent_endpoint.AgentEndpoint, access=access, ledger=state.ledger, agent_apps=agents)
    app.add_middleware(Guard, hosts=hosts, max_body=max_body)  # outermost: /mcp is guarded as /api is
    return app
