"""Real SSH hosts for the tests: OpenSSH's sshd on a loopback port, and more hosts in network namespaces.

Each `SshHost` runs its own sshd (own host key, port, pid file) that accepts one client key, and
has its own working directory, since every "host" here shares this machine's file system. A host
in a network namespace (`ip netns`, a veth pair on a private /30) is reached only at its own
address; `reclaim()` does to it what a spot provider does to a pod: every process in the
namespace is killed (sshd, the shim, the training process) and the working directory is wiped.

sshd comes from Debian's openssh-server (scripts/ensure-sshd.sh installs it); namespaces need
root, which CI and the dev machines have. Tests that need either are skipped with the reason
when it is missing, never faked.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

SSHD = "/usr/sbin/sshd"


def sshd_available() -> str | None:
    """Why SSH hosts cannot be made here, or None when they can."""
    if not Path(SSHD).exists():
        return "sshd is not installed (bash scripts/ensure-sshd.sh installs Debian's openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client (ssh, ssh-keygen) is not installed"
    return None


def netns_available() -> str | None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "network namespaces need root and iproute2's ip"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_key(directory: Path) -> Path:
    """An ed25519 key pair for the client, made once per directory."""
    key = directory / "id_ed25519"
    if not key.exists():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


class SshHost:
    """One sshd with its own host key and working directory; optionally inside a network namespace."""

    def __init__(self, name: str, root: Path, key: Path, netns: str | None = None, address: str = "127.0.0.1"):
        self.name = name
        self.root = root
        self.key = key
        self.netns = netns
        self.address = address
        self.port = free_port() if netns is None else 22
        self.work = root / "work"
        self.config = root / "sshd_config"
        self.pid_file = root / "sshd.pid"
        self.log = root / "sshd.log"

    @property
    def spec(self) -> str:
        """The host as a resource's `hosts` list names it."""
        return f"root@{self.address}:{self.port}"

    def _in_ns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    def start(self) -> SshHost:
        self.root.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        host_key = self.root / "host_ed25519"
        if not host_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        authorized = self.root / "authorized_keys"
        authorized.write_text(Path(str(self.key) + ".pub").read_text())
        self.config.write_text("\n".join([
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {authorized}",
            f"PidFile {self.pid_file}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            # The executor's control master multiplexes every call over one connection.
            "AllowTcpForwarding no",
            # Every login runs root's ~/.bashrc, whose `pyenv init` rehashes under a lock file shared by all
            # hosts (one home); a session killed mid-rehash (reclaim) leaves the lock, and each later login
            # would wait 60 s for it. A stale lock now costs a second. And every "host" shares this machine's two
            # cores with the suite's other workers: one intra-op thread for the PyTorch a job runs there, as the
            # suite sets for its own (tests/conftest.py).
            "SetEnv PYENV_REHASH_TIMEOUT=1 OMP_NUM_THREADS=1",
            "",
        ]))
        Path("/run/sshd").mkdir(exist_ok=True)
        _drop_stale_rehash_lock()  # one an earlier run's reclaimed host left
        self.pid_file.unlink(missing_ok=True)
        subprocess.run(self._in_ns([SSHD, "-f", str(self.config), "-E", str(self.log)]), check=True)
        try:
            self._wait_listening()
        except BaseException:
            # Spawned but not answering: no fixture will ever close a host it never got, so stop it here.
            self.stop_sshd()
            raise
        return self

    def _wait_listening(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            probe = subprocess.run(self.ssh_argv("true"), capture_output=True, timeout=timeout_s)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"sshd {self.name} did not answer on {self.spec}: {self.log.read_text()[-500:]}")

    def ssh_argv(self, command: str) -> list[str]:
        return ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=5", f"root@{self.address}", command]

    def stop_sshd(self) -> None:
        """Kill this host's sshd (its listener and every session): the host stops answering."""
        for proc in self._sshd_processes():
            with _gone():
                proc.kill()

    def _sshd_processes(self) -> list[psutil.Process]:
        """The listener (from its pid file: sshd rewrites its command line) and every session it forked."""
        try:
            listener = psutil.Process(int(self.pid_file.read_text().split()[0]))
        except (OSError, ValueError, psutil.Error):
            return []
        found = [listener]
        with _gone():
            found.extend(listener.children(recursive=True))
        return found

    def processes(self) -> list[psutil.Process]:
        """Every process that runs on this host: in its namespace, or (loopback) started from its work dir."""
        if self.netns:
            out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
            found = []
            for pid in out.split():
                with _gone():
                    found.append(psutil.Process(int(pid)))
            return found
        work = str(self.work)
        found = self._sshd_processes()
        for proc in psutil.process_iter(["cmdline", "cwd"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if work in cmdline or (proc.info["cwd"] or "").startswith(work):
                found.append(proc)
        return found

    def running(self, text: str) -> list[psutil.Process]:
        """The processes still running on this host whose command line holds `text`.

        One that ended between the listing and the look is not running: gone, or a zombie (it has
        exited and only waits for its parent to read its status; its command line can no longer be read).
        """
        found = []
        for proc in self.processes():
            with _gone():
                if proc.status() != psutil.STATUS_ZOMBIE and text in " ".join(proc.cmdline()):
                    found.append(proc)
        return found

    def reclaim(self) -> None:
        """A spot pod taken back: every process on the host killed at once, its disk gone."""
        for proc in self.processes():
            if proc.pid != os.getpid():
                with _gone():
                    proc.send_signal(signal.SIGKILL)
        shutil.rmtree(self.work, ignore_errors=True)
        _drop_stale_rehash_lock()

    def close(self) -> None:
        self.reclaim()
        self.stop_sshd()


PYENV_REHASH_LOCK = Path.home() / ".pyenv" / "shims" / ".pyenv-shim"


def _drop_stale_rehash_lock(older_than_s: float = 5.0) -> None:
    """Remove pyenv's rehash lock when a killed login left it (a live rehash holds it well under a second)."""
    try:
        if time.time() - PYENV_REHASH_LOCK.stat().st_mtime > older_than_s:
            PYENV_REHASH_LOCK.unlink()
    except FileNotFoundError:
        pass


class _gone:  # noqa: N801 - a context manager
    """Ignore a process that ended (or was never ours to see) between listing and signalling it."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        return exc_type is not None and issubclass(exc_type, (psutil.Error, ProcessLookupError, PermissionError))


class Namespaces:
    """Network namespaces with a veth pair each, on private /30s unique to this test process.

    Each namespace routes everything else through its veth to this (the root) namespace, so the
    hosts reach a service the test runs here (an S3 server) at `service_address`: an address on
    the root namespace's loopback, the same from every host and from the test itself.
    """

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []
        self._base = os.getpid() % 200 + 20
        self._dummy: str | None = None

    @property
    def service_address(self) -> str:
        if self._dummy is None:
            # On the root namespace's loopback (kernels without the dummy driver have it too): a
            # packet from a namespace's veth to it is delivered locally, like any address of ours.
            address = f"10.{self._base}.255.1/32"
            subprocess.run(["ip", "addr", "del", address, "dev", "lo"], capture_output=True)
            subprocess.run(["ip", "addr", "add", address, "dev", "lo"], check=True, capture_output=True)
            self._dummy = address
        return self._dummy.split("/")[0]

    def host(self, name: str, root: Path, key: Path) -> SshHost:
        index = len(self.made)
        ns = f"tw{os.getpid()}{name}"[:15]
        outer = f"twv{os.getpid() % 100000}{index}"[:15]
        inner = outer + "p" if len(outer) < 15 else outer[:-1] + "p"
        subnet = f"10.{self._base}.{index * 4}"
        run = lambda *argv: subprocess.run(list(argv), check=True, capture_output=True)  # noqa: E731
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # a leftover of a killed run
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        run("ip", "netns", "add", ns)
        self.made.append((ns, outer))
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", ns)
        run("ip", "addr", "add", f"{subnet}.1/30", "dev", outer)
        run("ip", "link", "set", outer, "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/30", "dev", inner)
        run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        run("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", f"{subnet}.1")
        return SshHost(name, root, key, netns=ns, address=f"{subnet}.2")

    def close(self) -> None:
        for ns, outer in self.made:
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self._dummy:
            subprocess.run(["ip", "addr", "del", self._dummy, "dev", "lo"], capture_output=True)


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory) -> Path:
    reason = sshd_available()
    if reason:
        pytest.skip(reason)
    return client_key(tmp_path_factory.mktemp("ssh-client"))


@pytest.fixture
def loopback_host(tmp_path, ssh_key) -> SshHost:
    host = SshHost("loop", tmp_path / "host-loop", ssh_key).start()
    yield host
    host.close()


class HostFactory:
    """`netns_hosts("a")` starts a host in a namespace of its own; `.service_address` is where they all reach us."""

    def __init__(self, root: Path, key: Path):
        self.root, self.key = root, key
        self.spaces = Namespaces()
        self.hosts: list[SshHost] = []

    def __call__(self, name: str) -> SshHost:
        host = self.spaces.host(name, self.root / f"host-{name}", self.key).start()
        self.hosts.append(host)
        return host

    @property
    def service_address(self) -> str:
        return self.spaces.service_address

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        self.spaces.close()


@pytest.fixture
def netns_hosts(tmp_path, ssh_key):
    """A factory of hosts in network namespaces; all are torn down after the test."""
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    factory = HostFactory(tmp_path, ssh_key)
    yield factory
    factory.close()
