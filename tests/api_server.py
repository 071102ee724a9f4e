"""A real `trackway serve` for tests: started as a user starts it, and a small client that keeps the error body."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHATTY_SOURCE = Path(__file__).parent / "server" / "scripts" / "chatty_preempted.py"
CHATTY = "chatty_preempted.py"  # posted relative: the API runs scripts inside the server's working directory
# The server's own token in tests (as $TRACKWAY_SERVER_TOKEN): what `Api` sends unless told otherwise.
TEST_TOKEN = "test-server-token-0123456789abcdef"


def put_script(source: Path, where: Path | None = None) -> str:
    """Copy a test script into the server's working directory (the test's cwd); its name, as a job posts it."""
    target = (where or Path.cwd()) / source.name
    target.write_text(source.read_text())
    return source.name


class Api:
    """`call(method, path, body)` → (status, JSON or text, headers): error answers are read, not raised."""

    def __init__(self, base: str, token: str | None = TEST_TOKEN) -> None:
        self.base = base
        self.token = token

    def call(self, method: str, path: str, body: object = None, token: str | None = None,
             timeout: float = 30) -> tuple[int, object, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        sent = self.token if token is None else token
        if sent:
            request.add_header("Authorization", f"Bearer {sent}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw, status, headers = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as error:
            raw, status, headers = error.read(), error.code, dict(error.headers)
        kind = headers.get("content-type", "")
        return status, json.loads(raw) if kind.startswith("application/json") else raw.decode(), headers

    def get(self, path: str, **kw):
        return self.call("GET", path, **kw)

    def post(self, path: str, body: object = None, **kw):
        return self.call("POST", path, body, **kw)


@contextmanager
def serving(home: Path, db: str, *args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`trackway serve` on a free port, with TEST_TOKEN as its own token unless `env` says otherwise; the
    scripts jobs post are put in the test's working directory (the server's)."""
    put_script(CHATTY_SOURCE)
    environ = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": db, "TRACKWAY_SERVER_TOKEN": TEST_TOKEN,
               **(env or {})}
    process = subprocess.Popen([sys.executable, "-m", "trackway", "serve", "--port", "0", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    try:
        line = process.stdout.readline()
        if not line.strip().isdigit():
            process.kill()
            raise AssertionError(f"serve did not start: {line!r} {process.stderr.read()}")
        # uvicorn's access log goes to stdout: drained (and kept, in `process.access_log`), or a full pipe
        # would block the server mid-request.
        process.access_log = []
        threading.Thread(target=lambda: process.access_log.extend(process.stdout), daemon=True).start()
        host = "127.0.0.1"
        yield f"http://{host}:{int(line)}", process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
