"""The server under a team's load: 50 clients for 30 s while 10 follow a job's log and the job trains.

Issue 31's target, on loopback with auth on: 50 clients, each sending its next request as soon as
the previous one is answered (no pause: harsher than any dashboard), for 30 s, while 10 more
clients follow a running job's log (`GET /api/jobs/RUN/logs?follow=true`) and the background
supervisor ingests that job's metrics and output: 0 errors (every answer a 2xx, every follower's
stream still open and still moving at the end), and the p99 latency of the 50 clients ≤ 1 s.

What the clients ask, in turn: the jobs list, the job, its explain, its metrics downsampled for a
chart, a read-only SQL count, and the dashboard page. The baseline printed beside the p99 is the
same requests' p99 asked one at a time before the load, on the same server.
TRACKWAY_BENCH_LOAD_CLIENTS and TRACKWAY_BENCH_LOAD_SECONDS scale the run.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

CLIENTS = int(os.environ.get("TRACKWAY_BENCH_LOAD_CLIENTS", "50"))
FOLLOWERS = 10
SECONDS = float(os.environ.get("TRACKWAY_BENCH_LOAD_SECONDS", "30"))
TOKEN = "bench-token-0123456789abcdef"

# A job that trains for as long as the load lasts: a line of output and a logged loss every 20 ms.
TRAIN = """\
import time
import trackway

run = trackway.init()
started = time.monotonic()
step = 0
while time.monotonic() - started < {seconds}:
    print(f"step {{step}} loss {{1.0 / (step + 1):.5f}}", flush=True)
    run.log({{"loss": 1.0 / (step + 1)}}, step=step)
    step += 1
    time.sleep(0.02)
run.finish()
"""


class Client:
    """One keep-alive connection with the token, as a dashboard or a script holds one."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def ask(self, method: str, path: str, body: dict | None = None) -> int:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            self.connection.request(method, path, body=data, headers=headers)
            response = self.connection.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            return 0


def requests_for(run_id: str) -> list[tuple[str, str, dict | None]]:
    return [
        ("GET", "/api/jobs?limit=20", None),
        ("GET", f"/api/jobs/{run_id}", None),
        ("GET", f"/api/runs/{run_id}/explain", None),
        ("GET", f"/api/runs/{run_id}/metrics?keys=loss&max_points=500", None),
        ("POST", "/api/sql", {"query": "select count(*) from attempts"}),
        ("GET", "/", None),
    ]


def follow(port: int, run_id: str, seen: list[int], errors: list[str], stop: threading.Event) -> None:
    """Read the job's log as it grows; `seen[0]` counts the bytes, so a stalled stream shows."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", f"/api/jobs/{run_id}/logs?follow=true", headers={"Authorization": f"Bearer {TOKEN}"})
        response = connection.getresponse()
        if response.status != 200:
            errors.append(f"follow: {response.status}")
            return
        while not stop.is_set():
            chunk = response.read1(65536)
            if not chunk:
                if not stop.is_set():
                    errors.append("follow: the stream ended while the job ran")
                return
            seen[0] += len(chunk)
    except (OSError, http.client.HTTPException) as exc:
        if not stop.is_set():
            errors.append(f"follow: {type(exc).__name__}: {exc}")
    finally:
        connection.close()


def load(port: int, run_id: str, latencies: list[float], errors: list[str], until: float) -> None:
    client = Client(port)
    asks = requests_for(run_id)
    turn = 0
    while time.monotonic() < until:
        method, path, body = asks[turn % len(asks)]
        turn += 1
        started = time.perf_counter()
        status = client.ask(method, path, body)
        latencies.append(time.perf_counter() - started)
        if not 200 <= status < 300:
            errors.append(f"{method} {path}: {status or 'connection failed'}")


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = {**os.environ, "TRACKWAY_DB": f"sqlite:///{home / 'ledger.db'}", "TRACKWAY_HOME": str(home),
               "TRACKWAY_SERVER_TOKEN": TOKEN, "TRACKWAY_BACKGROUND_SUPERVISOR": "1"}
        (home / "train.py").write_text(TRAIN.format(seconds=SECONDS + 30))
        submitted = subprocess.run([sys.executable, "-m", "trackway", "submit", "--detach", "--", sys.executable,
                                    "train.py"], cwd=home, env=env, capture_output=True, text=True, timeout=120)
        if submitted.returncode != 0:
            print(f"submit failed: {submitted.stderr.strip()}")
            return 1
        run_id = submitted.stdout.split()[-1]
        server = subprocess.Popen([sys.executable, "-m", "trackway", "serve", "--port", "0"], cwd=home, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            port = int(server.stdout.readline())
            # The access log goes to stdout: drained, or a full pipe would block the server mid-request.
            threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()
            return measure(port, run_id)
        finally:
            server.terminate()
            server.wait(timeout=30)
            subprocess.run([sys.executable, "-m", "trackway", "cancel", run_id], cwd=home, env=env,
                           capture_output=True, timeout=60)
            subprocess.run([sys.executable, "-m", "trackway", "supervise", "--stop"], cwd=home, env=env,
                           capture_output=True, timeout=60)


def measure(port: int, run_id: str) -> int:
    alone = Client(port)
    quiet: list[float] = []
    for _ in range(10):
        for method, path, body in requests_for(run_id):
            started = time.perf_counter()
            status = alone.ask(method, path, body)
            quiet.append(time.perf_counter() - started)
            if status != 200:
                print(f"{method} {path} answered {status} before the load")
                return 1
    stop = threading.Event()
    errors: list[str] = []
    seen = [[0] for _ in range(FOLLOWERS)]
    followers = [threading.Thread(target=follow, args=(port, run_id, seen[i], errors, stop), daemon=True)
                 for i in range(FOLLOWERS)]
    for thread in followers:
        thread.start()
    time.sleep(1.0)
    before = [count[0] for count in seen]
    latencies: list[float] = []
    until = time.monotonic() + SECONDS
    clients = [threading.Thread(target=load, args=(port, run_id, latencies, errors, until)) for _ in range(CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    moved = sum(count[0] > was for count, was in zip(seen, before))
    stop.set()
    if moved < FOLLOWERS:
        errors.append(f"{FOLLOWERS - moved} of {FOLLOWERS} log followers saw nothing new during the load")
    print(f"{len(latencies):,} requests by {CLIENTS} clients in {SECONDS:g} s ({len(latencies) / SECONDS:,.0f}/s), "
          f"{FOLLOWERS} log followers; errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
    ok = figure(f"{CLIENTS} clients + {FOLLOWERS} log followers, {SECONDS:g} s: errors", len(errors), unit="errors",
                target=0)
    ok &= figure(f"{CLIENTS} clients + {FOLLOWERS} log followers, {SECONDS:g} s: p99 latency", p99(latencies),
                 baseline=p99(quiet), baseline_name="one at a time", target=1.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
