"""What every request meets before a route: the Host allow-list, the Origin check, the body cap, safe headers.

An ASGI middleware, so it costs a header look-up per request, not a task:

- **Host**: only the loopback names, the `--host` the server listens on and each `--allowed-host`.
  A page that rebinds its own DNS name to 127.0.0.1 is same-origin to the browser, and CORS does
  not stop it; its requests still say `Host: its-name`, and are refused here (400).
- **Origin**: a request that changes something (POST, PUT, PATCH, DELETE) that carries an `Origin`
  must come from this server's own origin (403 otherwise). Scripts and the CLI send none.
- **Body**: at most `max_body` bytes (413), chunked or not: a request is read whole before a route
  sees it, so a 100 MB config never reaches the ledger. Nested at most MAX_BODY_DEPTH levels (400):
  the JSON parser recurses once per level, and a megabyte of `[` would end in a RecursionError.
- **Headers**: `X-Content-Type-Options: nosniff`, and a Content-Security-Policy without inline
  script that forbids framing, on every response (the dashboard and the logs included).

Rejections use the API's one error shape (server/errors.py).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from itertools import accumulate
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_MAX_BODY = 1 << 20
# A job's body holds its config two levels down, and a config may nest 64 levels
# (receipts/config.py's MAX_DEPTH): this leaves room for both, and none for a parser's stack.
MAX_BODY_DEPTH = 100
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a request's Host may carry: loopback, the address listened on (unless a wildcard), `extra`."""
    names = set(LOOPBACK_NAMES)
    if host.strip("[]") not in WILDCARDS:
        names.add(host.strip("[]").lower())
    names.update(name.strip("[]").lower() for name in extra if name.strip())
    return frozenset(names)


def host_name(value: str) -> str:
    """`example.com:8080` → `example.com`; `[::1]:8080` → `::1`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app, hosts: frozenset[str], max_body: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.hosts = hosts
        self.max_body = max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if host_name(host) not in self.hosts:
            shown = ", ".join(sorted(self.hosts))
            await _refuse(send, 400, "HostNotAllowed", f"Host {host!r}: expected one of {shown} (a name the server "
                                                        "answers to is added with `trackway serve --allowed-host NAME`)")
            return
        if scope["method"] not in SAFE_METHODS:
            origin = headers.get(b"origin")
            if origin is not None and not _same_origin(origin.decode("latin-1"), host, scope.get("scheme", "http")):
                await _refuse(send, 403, "CrossOrigin", f"Origin {origin.decode('latin-1')!r}: a request that changes "
                                                        "something is taken only from this server's own pages")
                return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _refuse(send, 413, "BodyTooLarge", f"request body: expected at most {self.max_body} bytes")
            return
        if scope["method"] not in SAFE_METHODS:
            body = await _read_body(receive, self.max_body)
            if body is None:
                await _refuse(send, 413, "BodyTooLarge", f"request body: expected at most {self.max_body} bytes")
                return
            if json_depth(body) > MAX_BODY_DEPTH:
                await _refuse(send, 400, "TooDeep", f"request body: nested more than {MAX_BODY_DEPTH} levels deep; "
                                                    "expected a job whose config nests at most 64 levels")
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, _with_headers(send))


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # unrolled: one step per run of plain characters
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(set(range(256)) - set(_BRACKETS))


def json_depth(body: bytes) -> int:
    """How deep `body` nests as JSON: brackets outside strings, counted in one linear pass."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(accumulate(1 if byte in b"[{" else -1 for byte in brackets))


def _same_origin(origin: str, host: str, scheme: str) -> bool:
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    default = {"http": "80", "https": "443"}
    mine = host.lower() if ":" in host.rsplit("]", 1)[-1] else f"{host.lower()}:{default.get(scheme, '80')}"
    theirs = parts.netloc.lower() if parts.port else f"{parts.netloc.lower()}:{default[parts.scheme]}"
    return theirs == mine


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    return replay


def _with_headers(send):
    async def send_with_headers(message):
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            message = {**message, "headers": [*message.get("headers", []),
                                              *((k, v) for k, v in SECURITY_HEADERS if k not in present)]}
        await send(message)

    return send_with_headers


async def _refuse(send, status: int, kind: str, message: str) -> None:
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})


class NoQueryStrings(logging.Filter):
    """uvicorn's access log without query strings: a token or a secret put in a URL stays out of the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?…", *args[3:])
        return True
