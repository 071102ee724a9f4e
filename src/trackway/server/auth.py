"""Who may ask: a bearer token, required unless the server listens on loopback only.

The token comes from $TRACKWAY_SERVER_TOKEN, else the file `$TRACKWAY_HOME/server-token`
(mode 0600), else it is generated on the first start that needs one, written there and
printed once. A token that is configured is required on loopback too. It is compared in
constant time and never logged: uvicorn's access log shows the request line, not its headers.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from starlette.exceptions import HTTPException

from trackway.errors import InputError

TOKEN_ENV = "TRACKWAY_SERVER_TOKEN"
TOKEN_FILE = "server-token"


@dataclass(frozen=True)
class Access:
    token: str | None  # None: anyone who can reach the (loopback) address may ask
    generated: bool = False  # made on this start: the CLI prints it once
    source: str = ""  # where it came from, for the start-up line (never the token itself)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def access_for(host: str, home: Path) -> Access:
    """The token this server requires listening on `host`; InputError when a non-loopback address would have none."""
    configured = os.environ.get(TOKEN_ENV, "").strip()
    if configured:
        return Access(configured, source=f"${TOKEN_ENV}")
    path = home / TOKEN_FILE
    if path.is_file():
        stored = path.read_text().strip()
        if stored:
            return Access(stored, source=str(path))
    if is_loopback(host):
        return Access(None)
    token = secrets.token_urlsafe(32)
    try:
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
    except OSError as exc:
        raise InputError(f"--host {host}: listening beyond loopback needs a token, and {path} could not be written "
                         f"({exc.strerror}); set ${TOKEN_ENV}") from None
    return Access(token, generated=True, source=str(path))


def checker(access: Access):
    """A FastAPI dependency: 401 unless the request carries `Authorization: Bearer <token>`."""
    expected = access.token.encode() if access.token else None

    def require(request: Request) -> None:
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise HTTPException(401, "a bearer token is required (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})

    return require
