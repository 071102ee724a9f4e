"""`trackway serve`: the REST API over this ledger (FastAPI, served by uvicorn)."""

from __future__ import annotations

from pathlib import Path

import typer

from trackway.cli.context import app_context


def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="The address to listen on."),
    port: int = typer.Option(8080, "--port", help="The port to listen on (0: any free one, printed)."),
    allowed_hosts: list[str] = typer.Option(
        [], "--allowed-host",
        help="A name the server answers to besides loopback and --host, e.g. gpu3.lab (repeatable): requests whose Host "
             "header names anything else are refused (DNS rebinding).",
    ),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes", help="The largest request body taken (413 above)."),
    no_auth: bool = typer.Option(
        False, "--no-auth",
        help="Take requests without a token (loopback only): anyone on this machine may then start jobs as you.",
    ),
) -> None:
    """Serve the REST API over this ledger: jobs, metrics, checkpoints, evaluations, explain, experiments, SQL, events.

    Every /api request needs a bearer token: the server's own (made on the first start, in
    $TRACKWAY_HOME/server-token, mode 0600), or one from `trackway token add NAME --role ROLE`.
    """
    import logging
    import socket

    from trackway import validation
    from trackway.cli.render import err_console, say
    from trackway.errors import InputError

    validation.whole(port, "--port", 0, 65535)
    validation.whole(max_body_bytes, "--max-body-bytes", 1024, 1 << 30)
    app = app_context(ctx)
    try:
        import uvicorn

        from trackway.server.app import create_app
        from trackway.server.auth import access_for
        from trackway.server.guard import NoQueryStrings, allowed_hosts as host_names
    except ImportError as exc:
        raise InputError(f"trackway serve needs the server extra: pip install 'trackway[server]' ({exc.name} is missing)") from None
    for name in allowed_hosts:
        if not name.strip() or any(c in name for c in "/?#@ \t"):
            raise InputError(f"--allowed-host {name!r}: expected a host name or address, e.g. gpu3.lab")
    access = access_for(host, app.settings.home, no_auth=no_auth)
    server_app = create_app(app.settings, access, Path.cwd(), hosts=host_names(host, allowed_hosts),
                            max_body=max_body_bytes)
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise InputError(f"--host {host} --port {port}: cannot listen: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    say(err_console, f"serving the API on http://{shown}:{bound}/api (OpenAPI: /docs, /openapi.json)")
    if access.open:
        say(err_console, "WARNING: --no-auth: no token is asked for; anyone who can reach this port on this machine "
                         "can start jobs, as you, on your GPUs")
    else:
        # The file's path, never the token: a server's output ends up in logs.
        made = "made now, " if access.generated else ""
        say(err_console, f"every request needs a bearer token: the server's own ({made}in {access.source}), or one from "
                         "`trackway token add NAME --role read|submit|admin`")
        say(err_console, f"dashboard: http://{shown}:{bound}/ (it asks for the token once per tab)")
    from trackway.server.agent_endpoint import available

    if app.settings.agents:
        say(err_console, f"agents over MCP: http://{shown}:{bound}/mcp, each with a token named as its [agents.NAME] "
                         f"({', '.join(sorted(app.settings.agents))})" if available() else
                         "agents declared, but /mcp is off: the MCP SDK is not installed (pip install 'trackway[agents]')")
    print(bound, flush=True)  # the port, on stdout: scripts and tests read it
    # "on": agents' MCP apps (/mcp) run their session managers for as long as the server runs.
    config = uvicorn.Config(server_app, log_level="info", access_log=True, lifespan="on")
    logging.getLogger("uvicorn.access").addFilter(NoQueryStrings())  # after uvicorn configured its loggers
    uvicorn.Server(config).run(sockets=[sock])


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
