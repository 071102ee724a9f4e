"""API tokens in the ledger: named, each with a role, kept as their sha256 only.

    read    every GET under /api, and POST /api/sql (read-only by construction)
    submit  read, and starting and cancelling jobs
    admin   everything (the server's own token, from $TRACKWAY_HOME/server-token, is admin)

A token is shown once, when `trackway token add` makes it; the ledger holds its sha256, so a
copy of the ledger gives no one a token. Looking a token up hashes what the caller sent and
compares the digests in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Connection, insert, select, update

from trackway.errors import InputError, NotFound
from trackway.ledger.schema import api_tokens

ROLES = ("read", "submit", "admin")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
PREFIX = "tw_"  # a shape redaction recognises (redaction.py)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: a token's name and role."""

    name: str
    role: str

    def may(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def add_token(conn: Connection, name: str, role: str, created_by: str | None = None) -> str:
    """Make a token named `name` with `role`; return it (the only time it is seen)."""
    if not NAME.match(name):
        raise InputError(f"NAME {name!r}: expected 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a "
                         "letter or digit")
    if role not in ROLES:
        raise InputError(f"--role {role!r}: expected one of {', '.join(ROLES)}")
    if conn.execute(select(api_tokens.c.name).where(api_tokens.c.name == name)).first() is not None:
        raise InputError(f"NAME {name!r}: a token has that name; revoke it or pick another")
    token = new_token()
    conn.execute(insert(api_tokens).values(name=name, role=role, token_sha256=digest(token),
                                           created_at=datetime.now(timezone.utc), created_by=created_by))
    return token


def revoke_token(conn: Connection, name: str) -> None:
    done = conn.execute(update(api_tokens).where(api_tokens.c.name == name, api_tokens.c.revoked_at.is_(None))
                        .values(revoked_at=datetime.now(timezone.utc))).rowcount
    if not done:
        known = conn.execute(select(api_tokens.c.name).where(api_tokens.c.name == name)).first()
        raise NotFound(f"token {name!r}: " + ("already revoked" if known else "no token has that name "
                                                                               "(see `trackway token list`)"))


def list_tokens(conn: Connection) -> list[dict]:
    rows = conn.execute(select(api_tokens.c.name, api_tokens.c.role, api_tokens.c.created_at,
                               api_tokens.c.created_by, api_tokens.c.revoked_at).order_by(api_tokens.c.name))
    return [dict(row) for row in rows.mappings()]


def caller_for(conn: Connection, token: str) -> Caller | None:
    """The unrevoked token's holder, or None."""
    wanted = digest(token)
    row = conn.execute(select(api_tokens.c.name, api_tokens.c.role, api_tokens.c.token_sha256).where(
        api_tokens.c.token_sha256 == wanted, api_tokens.c.revoked_at.is_(None))).first()
    if row is None or not hmac.compare_digest(row.token_sha256, wanted):
        return None
    return Caller(row.name, row.role)
