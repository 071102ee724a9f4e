"""One long-lived agent on an SSH host, asked over one login: a request line in, an answer line out.

Every SSH call is a login, and a login runs the host's rc files (a pyenv init, a conda hook): on
our hosts that is 0.1-0.2 s of CPU a call, on the host and here, every supervisor tick. A session
starts `agent.py serve` once and asks it each tick over the same channel (of the shared
connection that ssh_transport keeps), so a poll costs the agent's work alone.

A session is a shortcut, never a different answer: whatever goes wrong with it (the agent gone,
the channel closed, an answer that is not one) ends it and raises `SessionLost`, and the caller
asks over a call of its own as before; the next ask starts a new session. A host that does not
answer within the call's timeout is `HostUnreachable`, as a call of its own would be. The agent
ends itself after `remote_agent.SERVE_IDLE_S` without a request, and when this process ends its
ssh client does, and the agent with it.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import threading
import time
import weakref
from typing import NoReturn

from trackway.executors.ssh_transport import CALL_TIMEOUT_S, HostUnreachable, SshClient

_LIVE: weakref.WeakSet[AgentSession] = weakref.WeakSet()


class SessionLost(Exception):
    """The session cannot answer: ask over a call of its own (and a new session next time)."""


class AgentSession:
    """`python agent serve` on `client`'s host, kept running; `ask` one action at a time (a lock holds them in turn)."""

    def __init__(self, client: SshClient, python: str, agent: str):
        self.client = client
        self.command = (f"if [ -f {shlex.quote(agent)} ]; then exec {shlex.quote(python)} {shlex.quote(agent)} serve; "
                        "else echo '{\"agent_missing\": true}'; fi")
        self._process: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        _LIVE.add(self)

    def ask(self, args: list[str], request: dict | None = None, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        """The agent's answer; SessionLost when the session cannot give one, HostUnreachable when the host is silent."""
        with self._lock:
            process = self._started()
            line = json.dumps({"args": args, "input": request}).encode() + b"\n"
            try:
                process.stdin.write(line)
                process.stdin.flush()
            except (OSError, ValueError):
                self._lost("the session's channel is closed")
            answer = self._read_line(time.monotonic() + timeout_s, timeout_s)
            try:
                said = json.loads(answer)
            except ValueError:
                self._end()
                raise SessionLost(f"the agent answered {answer[:200]!r}, not JSON") from None
            if not isinstance(said, dict) or said.get("agent_missing") or ("error" in said and len(said) == 1):
                self._end()  # no agent there (a wiped workdir), or one that refused: asked again by a call
                raise SessionLost(f"the session answered {answer[:200]!r}")
            return said

    def _started(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._end()
        self._buffer = b""
        try:
            self._process = subprocess.Popen(self.client.argv(self.command), stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise SessionLost(f"ssh could not run: {exc}") from None
        return self._process

    def _read_line(self, deadline: float, timeout_s: float) -> bytes:
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._end()
                raise HostUnreachable(f"{self.client.target.spec}: no answer within {timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._lost("the session ended")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _lost(self, why: str) -> NoReturn:
        """The session is over. Whether the agent or the connection ended it, a call of its own says which (an
        agent killed on the host and a connection lost both end ssh with 255), so it is asked that way."""
        self._end()
        raise SessionLost(why)

    def close(self) -> None:
        with self._lock:
            self._end()

    def _end(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=2)  # EOF on its stdin ends the agent, and the channel with it
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def close_all() -> None:
    """End every session this process holds (a test's end; the process's own end does it anyway)."""
    for session in list(_LIVE):
        session.close()
