"""One SSH connection per host, reused: the system `ssh` client with a control master.

Why the system client and not a Python SSH library: it is what our users already configured
(~/.ssh/config, agents, ProxyJump to a bastion, certificates, known_hosts), it ships with every
machine trackway runs on, and with ControlMaster/ControlPersist a call over the open connection
costs a few milliseconds instead of a key exchange. Every call has a timeout; the connection's
own keepalives notice a host that went silent.

ssh exits 255 when the connection itself failed (refused, timed out, reset, authentication):
that is `HostUnreachable`, which the executor counts against the host's unreachable window. Any
other failure is the remote command's, an ordinary `ExecutorError`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trackway.errors import ExecutorError, InputError
from trackway.private_dir import make_private_dir

CONNECT_TIMEOUT_S = float(os.environ.get("TRACKWAY_SSH_CONNECT_TIMEOUT_S", "10"))
CALL_TIMEOUT_S = float(os.environ.get("TRACKWAY_SSH_TIMEOUT_S", "60"))
CONTROL_PERSIST_S = 120
_SPEC = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d{1,5}))?$")


class HostUnreachable(ExecutorError):
    """The connection to the host failed (not the command run over it)."""


@dataclass(frozen=True)
class SshTarget:
    """A host as a resource's `hosts` list names it: `user@host:port` (user and port optional)."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, spec: str, field: str = "hosts") -> SshTarget:
        match = _SPEC.match(spec.strip())
        if not match or (match["port"] and not 0 < int(match["port"]) < 65536):
            raise InputError(f"{field}: expected user@host or user@host:port, got {spec!r}")
        return cls(host=match["host"].strip("[]"), user=match["user"], port=int(match["port"]) if match["port"] else None)

    @property
    def spec(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}{':' + str(self.port) if self.port else ''}"


class SshClient:
    """Runs commands on one host over a shared connection."""

    def __init__(self, target: SshTarget, key_file: str | None = None, options: tuple[str, ...] = (),
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        if shutil.which("ssh") is None:
            raise ExecutorError("ssh is not on PATH: install the OpenSSH client (Debian: openssh-client)")
        self.target = target
        self.key_file = key_file
        self.options = tuple(options)
        self.connect_timeout_s = connect_timeout_s

    def argv(self, command: str) -> list[str]:
        return ["ssh", *self._options(), "--", self._destination(), command]

    def _destination(self) -> str:
        return f"{self.target.user}@{self.target.host}" if self.target.user else self.target.host

    def _options(self) -> list[str]:
        argv = ["-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(self.connect_timeout_s))}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self._control_path()}",
                "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        if self.key_file:
            argv += ["-i", os.path.expanduser(self.key_file), "-o", "IdentitiesOnly=yes"]
        if self.target.port:
            argv += ["-p", str(self.target.port)]
        return argv + list(self.options)

    def run(self, command: str, stdin: bytes | None = None, timeout_s: float = CALL_TIMEOUT_S) -> bytes:
        """The command's stdout; HostUnreachable when the connection failed, ExecutorError when the command did."""
        try:
            done = subprocess.run(self.argv(command), input=stdin if stdin is not None else b"",
                                  capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{self.target.spec}: no answer within {timeout_s:g} s") from None
        except OSError as exc:
            raise ExecutorError(f"ssh could not run: {exc}") from None
        if done.returncode == 255:
            said = _first_lines(done.stderr) or "the connection failed (ssh exit code 255)"
            raise HostUnreachable(f"{self.target.spec}: {said}")
        if done.returncode != 0:
            said = _first_lines(done.stderr) or f"exit code {done.returncode}"
            raise ExecutorError(f"{self.target.spec}: {said}")
        return done.stdout

    def _control_path(self) -> str:
        # Unix socket paths are short (108 bytes): a private directory in /tmp, one socket per
        # (host, port, user, key, options), so that a test's fresh sshd on a reused address never
        # inherits another key's connection.
        directory = control_dir()
        identity = "\0".join([self.target.spec, self.key_file or "", *self.options])
        return str(directory / hashlib.sha256(identity.encode()).hexdigest()[:20])

    def close(self) -> None:
        """Stop the shared connection (the next call opens a new one)."""
        subprocess.run(["ssh", *self._options(), "-O", "exit", self._destination()],
                       capture_output=True, timeout=10, check=False)


def control_dir() -> Path:
    """The directory of this user's control sockets, private to them; ExecutorError, saying the fix, when it is not.

    Whoever can replace a socket there gets every command sent to the host, and its output.
    """
    directory = Path(tempfile.gettempdir()) / f"trackway-ssh-{os.getuid()}"
    try:
        return make_private_dir(directory)
    except OSError as exc:
        raise ExecutorError(
            f"SSH control directory {directory}: {exc.strerror or exc}; remove it (after checking who made it) or "
            "set TMPDIR to a directory only you can write, then try again"
        ) from None


def _first_lines(stderr: bytes, most: int = 2) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return "; ".join(lines[:most])[:300]
