"""`trackway serve`: the REST API over this ledger (FastAPI, served by uvicorn)."""

from __future__ import annotations

from pathlib import Path

import typer

from trackway.cli.context import app_context


def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="The address to listen on (beyond loopback a token is required)."),
    port: int = typer.Option(8080, "--port", help="The port to listen on (0: any free one, printed)."),
) -> None:
    """Serve the REST API over this ledger: jobs, metrics, checkpoints, evaluations, explain, experiments, SQL, events."""
    import socket

    from trackway import validation
    from trackway.cli.render import err_console, say
    from trackway.errors import InputError

    validation.whole(port, "--port", 0, 65535)
    app = app_context(ctx)
    try:
        import uvicorn

        from trackway.server.app import create_app
        from trackway.server.auth import access_for
    except ImportError as exc:
        raise InputError(f"trackway serve needs the server extra: pip install 'trackway[server]' ({exc.name} is missing)") from None
    access = access_for(host, app.settings.home)
    server_app = create_app(app.settings, access, Path.cwd())
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise InputError(f"--host {host} --port {port}: cannot listen: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    say(err_console, f"serving the API on http://{host}:{bound}/api (OpenAPI: /docs, /openapi.json)")
    if access.generated:
        # Printed once, here; the file keeps it (mode 0600). It never reaches a log.
        say(err_console, f"token (saved in {access.source}): {access.token}")
        say(err_console, "send it as `Authorization: Bearer <token>`")
    elif access.token:
        say(err_console, f"a bearer token is required (from {access.source})")
    else:
        say(err_console, "no token: listening on loopback only")
    print(bound, flush=True)  # the port, on stdout: scripts and tests read it
    config = uvicorn.Config(server_app, log_level="info", access_log=True, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
