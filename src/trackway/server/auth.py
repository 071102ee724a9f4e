"""Who may ask: every /api request carries a bearer token, on loopback too, and each token has a role.

The server's own token (role admin, named `server`) comes from $TRACKWAY_SERVER_TOKEN, else the
file `$TRACKWAY_HOME/server-token`, generated on the first start (mode 0600). The start-up lines
name the file, never the token, so no log (systemd's journal, a terminal recording) holds it; a
token file that group or others may read is refused, with the fix. Named tokens with a role
(`trackway token add NAME --role read|submit|admin`, ledger/tokens.py) are looked up by their
sha256. Roles: `read` (GET, and the read-only SQL), `submit` (also starting and cancelling jobs),
`admin` (everything). `--no-auth` exists for loopback only, and says so at every start.
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
from trackway.ledger.tokens import Caller, caller_for

TOKEN_ENV = "TRACKWAY_SERVER_TOKEN"
TOKEN_FILE = "server-token"
SERVER_CALLER = Caller("server", "admin")
OPEN_CALLER = Caller("no-auth", "admin")


@dataclass(frozen=True)
class Access:
    token: str | None  # the server's own token; None only with --no-auth
    generated: bool = False  # made on this start
    source: str = ""  # where it came from, for the start-up line (never the token itself)
    open: bool = False  # --no-auth: anyone who can reach the loopback port may do anything


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def access_for(host: str, home: Path, no_auth: bool = False) -> Access:
    """The token this server requires; InputError for --no-auth beyond loopback or an exposed token file."""
    if no_auth:
        if not is_loopback(host):
            raise InputError(f"--no-auth: expected a loopback --host (127.0.0.1, ::1 or localhost), got {host!r}: "
                             "beyond loopback anyone who reaches the port could start jobs as you")
        return Access(None, open=True)
    configured = os.environ.get(TOKEN_ENV, "").strip()
    if configured:
        return Access(configured, source=f"${TOKEN_ENV}")
    path = home / TOKEN_FILE
    if path.is_file():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise InputError(f"{path}: readable by group or others (mode {mode:o}); whoever reads it can start jobs "
                             f"as you: `chmod 600 {path}`, or remove it and a new one is made")
        stored = path.read_text().strip()
        if stored:
            return Access(stored, source=str(path))
    token = secrets.token_urlsafe(32)
    try:
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        os.chmod(path, 0o600)
    except OSError as exc:
        raise InputError(f"{path}: the server's token could not be written ({exc.strerror}); set ${TOKEN_ENV}") from None
    return Access(token, generated=True, source=str(path))


NO_TOKEN = ("a bearer token is required (Authorization: Bearer <token>): the server's own, in "
            "$TRACKWAY_HOME/server-token, or one from `trackway token add`")


def caller_of(access: Access, ledger, authorization: str) -> Caller | None:
    """Whose token an Authorization header carries (None: no token, or one nobody was given)."""
    if access.open:
        return OPEN_CALLER
    scheme, _, given = authorization.partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        return None
    if access.token and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), access.token.encode()):
        return SERVER_CALLER
    with ledger.read() as conn:
        return caller_for(conn, given)


def requires(access: Access, role: str):
    """A FastAPI dependency: 401 without a known token, 403 when its role is below `role`; the caller on request.state."""

    def require(request: Request) -> Caller:
        caller = caller_of(access, request.app.state.ledger, request.headers.get("authorization", ""))
        if caller is None:
            raise HTTPException(401, NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})
        if not caller.may(role):
            raise HTTPException(403, f"token {caller.name!r} has the role {caller.role}; this needs {role} or above")
        request.state.caller = caller
        return caller

    return require
