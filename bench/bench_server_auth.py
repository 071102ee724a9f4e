"""What the server's trust boundary costs a request: the same requests with and without a token, p99.

Issue 31's target: with auth on (a bearer token checked on every request, the Host and Origin
checks, the body cap), the p99 latency of GET /api/jobs?limit=10 and of POST /api/sql is ≤ 1.2x
that of a server started with --no-auth on the same ledger. The two servers run side by side and
are asked in turn, request by request, so both see the same machine load. Also with a named token
from the ledger (looked up by its sha256 on every request).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

REQUESTS = 2000  # p99 is then the 20th-slowest of each: 400 left it to four, which one pause of either server moved past 1.2x
TOKEN = "bench-token-0123456789abcdef"


def start(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "trackway", "serve", "--port", "0", *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{int(server.stdout.readline())}"
    # The access log goes to stdout: drained, or a full pipe would block the server mid-request.
    threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()
    return server, base


def timed(base: str, token: str | None, path: str, body: dict | None) -> float:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method="POST" if data else "GET")
    if data:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
        assert response.status == 200
    return time.perf_counter() - started


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TRACKWAY_DB": f"sqlite:///{Path(tmp) / 'ledger.db'}", "TRACKWAY_HOME": str(Path(tmp)),
               "TRACKWAY_BACKGROUND_SUPERVISOR": "0", "TRACKWAY_SERVER_TOKEN": TOKEN}
        named = subprocess.run([sys.executable, "-m", "trackway", "token", "add", "bench", "--role", "read"],
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        guarded, guarded_base = start(env)
        open_, open_base = start(env, "--no-auth")
        ok = True
        try:
            for label, path, body in (("GET /api/jobs?limit=10", "/api/jobs?limit=10", None),
                                      ("POST /api/sql", "/api/sql", {"query": "select count(*) from runs"})):
                samples: dict[str, list[float]] = {"token": [], "named": [], "open": []}
                for _ in range(20):  # warm both servers' connections and caches
                    timed(guarded_base, TOKEN, path, body), timed(open_base, None, path, body)
                for _ in range(REQUESTS):
                    samples["token"].append(timed(guarded_base, TOKEN, path, body))
                    samples["named"].append(timed(guarded_base, named, path, body))
                    samples["open"].append(timed(open_base, None, path, body))
                ok &= figure(f"{label}: p99 with the server's token", p99(samples["token"]), baseline=p99(samples["open"]),
                             baseline_name="--no-auth", target_ratio=1.2)
                ok &= figure(f"{label}: p99 with a named token (ledger)", p99(samples["named"]),
                             baseline=p99(samples["open"]), baseline_name="--no-auth", target_ratio=1.2)
        finally:
            for server in (guarded, open_):
                server.terminate()
                server.wait(timeout=30)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
