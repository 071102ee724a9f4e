"""`python -m trackway.evals.serve --server JSON --health-url URL -- COMMAND...`: an inference phase's model server.

Started as the inference attempt's command where the spec's `[inference]` names a `server`: it
picks a free port (`{port}` in the server's command and in `health_url`), starts the server in a
process group of its own, waits until the health URL answers 2xx (at most `--timeout` seconds,
and not once the server has exited), runs COMMAND with `$TRACKWAY_EVAL_SERVER_URL` (the URL's
scheme, host and port), then stops the server: SIGTERM to its group, SIGKILL after a grace
period. What happened is said on stderr (`trackway eval server: ...`, in the attempt's log) and kept in
`eval-server.json` beside the attempt's spool directory. The exit status is COMMAND's; a server
that never answers ends the attempt with exit 3 before COMMAND runs (no GPU time spent on it).
A SIGTERM (a cancel, a preemption) stops COMMAND and the server alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

NOT_READY_EXIT = 3
STOP_GRACE_S = 10.0
POLL_S = 0.2
RECORD_FILE = "eval-server.json"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def say(message: str) -> None:
    # Not "trackway serve": that is the REST API's command, and this line is read in an evaluation's log.
    print(f"trackway eval server: {message}", file=sys.stderr, flush=True)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - the spec's own health URL
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def stop(server: subprocess.Popen) -> str:
    """Stop the server's whole process group; how it ended."""
    if server.poll() is not None:
        return f"had exited by itself (exit {server.returncode})"
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return "had exited by itself"
    try:
        server.wait(timeout=STOP_GRACE_S)
        return f"stopped (SIGTERM, exit {server.returncode})"
    except subprocess.TimeoutExpired:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        return f"killed (no exit {STOP_GRACE_S:g} s after SIGTERM)"


def record(facts: dict) -> None:
    spool = os.environ.get("TRACKWAY_SPOOL_DIR")
    if not spool:
        return
    try:
        (Path(spool).parent / RECORD_FILE).write_text(json.dumps(facts, indent=1, sort_keys=True))
    except OSError:
        pass  # the log lines say the same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trackway.evals.serve")
    parser.add_argument("--server", required=True, help="the server's command, a JSON list")
    parser.add_argument("--health-url", required=True)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("expected -- COMMAND...")
    port = free_port()
    server_argv = [a.replace("{port}", str(port)) for a in json.loads(args.server)]
    health = args.health_url.replace("{port}", str(port))
    parts = urlsplit(health)
    base = f"{parts.scheme}://{parts.netloc}"
    facts: dict = {"server": server_argv, "health_url": health, "port": port}
    started = time.monotonic()
    say(f"starting the model server on port {port}: {' '.join(server_argv)}")
    server = subprocess.Popen(server_argv, start_new_session=True)
    facts["pid"] = server.pid
    child: subprocess.Popen | None = None

    def on_term(signum, frame):  # a cancel or a preemption: the command and the server both stop
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
        facts["stopped"] = stop(server)
        record(facts)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        while not answers(health):
            if server.poll() is not None:
                facts.update(ready=False, stopped=f"exited before it answered (exit {server.returncode})")
                say(f"the model server exited before {health} answered (exit {server.returncode})")
                record(facts)
                return NOT_READY_EXIT
            if time.monotonic() - started > args.timeout:
                facts.update(ready=False, stopped=stop(server))
                say(f"the model server did not answer {health} within {args.timeout:g} s; {facts['stopped']}")
                record(facts)
                return NOT_READY_EXIT
            time.sleep(POLL_S)
        facts.update(ready=True, ready_after_s=round(time.monotonic() - started, 3))
        say(f"the model server answered {health} after {facts['ready_after_s']:.1f} s; running the inference command")
        record(facts)
        child = subprocess.Popen(command, env={**os.environ, "TRACKWAY_EVAL_SERVER_URL": base})
        code = child.wait()
        facts["command_exit"] = code
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it
    finally:
        if "stopped" not in facts:
            facts["stopped"] = stop(server)
            say(f"the model server {facts['stopped']}")
            record(facts)


if __name__ == "__main__":
    sys.exit(main())
