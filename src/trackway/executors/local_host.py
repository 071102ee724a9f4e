"""The local host shim: one process per trackway home that runs every local attempt, with a keeper process per attempt.

Why this shape (issue 39). A Python shim per attempt held 7–11 MB each (1,000 attempts: 11 GB).
Two designs were weighed:

 (a) one host process that spawns and waits on every attempt's command. Its flaw: an attempt must
     keep a process of its own. job.json's `shim_pid` is the attempt's job id (unique per attempt,
     the key of every poll), and the contract every tool and test relies on is per attempt:
     SIGTERM to it stops that attempt (cancel, a host shutdown), SIGUSR1 sends that attempt a
     notice, and SIGKILL to it leaves that attempt unsupervised ("shim gone", no exit status).
 (b) a fork per attempt from a frozen parent. Measured: a forked process that runs the shim's
     Python loop dirties 3.6 MB of its own (refcounts, bytecode quickening, thread stacks), and a
     fork of a busy parent pays again for every page the parent writes afterwards.

So both: this host process does all the work of every attempt (in a thread per attempt, the
same `Shim` code: output capture, time limit, grace, process tree, node samples, GPU lease hand-over,
exit.json), and each attempt has a *keeper*: a process forked (fork(2), not os.fork()) from a
zygote that does nothing but fork keepers, and that runs next to no Python: the command starts in
one posix_spawn call. The keeper is the attempt's `shim_pid`: it is the command's parent and
child subreaper (the tree below it is the attempt's, as below the old shim), it holds the command
until the host thread says the tree is gone and then reaps it and sends back the exit status, and
it relays the signals sent to it (SIGTERM, SIGINT, SIGUSR1, and SIGCHLD as a wake-up) to its host
thread through its socket, as bytes written by CPython's C handler (signal.set_wakeup_fd).

Measured (bench/bench_local_memory.py, 200 attempts): 7.4 MB PSS per attempt with a shim each,
1.4 MB with this (a keeper ~1.0–1.3 MB of its own; the host and zygote ~0.1 MB an attempt).

    submit() ──connect home/local/host.sock──► host (main thread: accept; SIGTERM: stop all)
                                                 ├─ zygote ──fork──► keeper ──► command (own session)
                                                 └─ thread per attempt ◄──socket── keeper
                                                    (pipes of the command's stdout/stderr → output.log)

Failures, each as the per-attempt shim's were:
  - a keeper killed (SIGKILL): its attempt is left as a dead shim leaves it, the command still
    running, unsupervised; its end reads "no exit status" (`LocalExecutor.poll`, `settle_orphans`).
    The host goes on copying the command's output into the log until the pipes close.
  - the host killed: every keeper sees its socket close and exits, so every attempt reads as one
    whose shim died; the commands keep running (and lose their output pipes, as under a dead shim).
  - the submitter or the supervisor killed: the host and keepers are in sessions of their own,
    children of neither.

The host starts on demand: submit() connects, and when nobody answers, starts
`python -m trackway.executors.local_host HOME` and connects again. Only one per home runs: the
host holds an flock on home/local/host.lock for its life, and a second one started meanwhile
leaves at once. It leaves once it has had no attempt and no request for IDLE_S.

What the command inherits comes from the submitter, sent with each request: its environment
(unless the request's is complete), umask and resource limits. Not its cgroup: a command runs in
the host's (the first submitter's), where a per-attempt shim ran in each submitter's.

Stdlib only (and the shim's module), like the shim.
"""

from __future__ import annotations

import errno
import fcntl
import ctypes
import gc
import json
import math
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback

import _signal
from pathlib import Path

from trackway.executors import local_shim
from trackway.executors.local_shim import INTERRUPTED_LAUNCH_REASON, Shim, read_json
from trackway.executors.process_tree import (
    _GONE,
    TREE_ENV,
    _children,
    _read_stat,
    descendants,
    launch_times,
    live_members,
    process_create_time,
    process_groups,
)

# Short: a submit after a quiet spell pays one host start (~0.3 s, what every submit paid for its own
# shim before), and a host left behind is a process someone must account for (a test session, a user).
IDLE_S = float(os.environ.get("TRACKWAY_LOCAL_HOST_IDLE_S", "5"))
SOCKET = "host.sock"
ENDED_FIFO = "ended.fifo"
LOCK = "host.lock"
ERR = "host.err"
REQUEST_TIMEOUT_S = 10.0
# The host's own threads are shallow (a loop, a readline): 8 MB stacks would only reserve address space.
THREAD_STACK = 512 << 10
RLIMITS = [name for name in ("RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK",
                             "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_AS") if hasattr(resource, name)]


def host_paths(home: Path) -> tuple[Path, Path]:
    directory = Path(home) / "local"
    return directory / SOCKET, directory / LOCK


# -- an end, said at once -------------------------------------------------------------------------
# The host writes a byte into home/local/ended.fifo after each exit.json; a supervisor holding it open
# for reading polls at once instead of at its next interval (1 s). Nobody reading, or a pipe already
# full of unread bytes, and the byte is dropped: the interval still finds every end.


def ended_fifo(home: Path) -> Path:
    return Path(home) / "local" / ENDED_FIFO


def say_ended(home: Path) -> None:
    """Wake a supervisor waiting on the home's ended.fifo, if one is."""
    try:
        fd = os.open(ended_fifo(home), os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:  # ENXIO: no reader; ENOENT: none ever made; ELOOP: a link, not ours
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):  # never a byte into a file that took its place
            os.write(fd, b"e")
    except OSError:  # EAGAIN: full, a wake-up is already waiting
        pass
    finally:
        os.close(fd)


def open_ended_signal(home: Path) -> int | None:
    """The read end of the home's ended.fifo (made, owner-only, when missing), non-blocking; None where it cannot be."""
    path = ended_fifo(home)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        # O_RDWR keeps the pipe open for reading even while no writer has it: with O_RDONLY, select()
        # would report it readable (at EOF) for good once the first writer closed.
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _short(path: Path, dir_fd: int) -> str:
    """`path` reached through an open descriptor of its directory: a socket address holds at most 107 bytes."""
    return f"/proc/self/fd/{dir_fd}/{path.name}"


# -- the submitter's side -------------------------------------------------------------------------

class HostUnavailable(Exception):
    """No host shim could be reached, or it did not answer in time."""


def submitter_state() -> dict:
    """What a command inherits from whoever submits it: environment, umask, resource limits."""
    umask = 0o022
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    umask = int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return {"environ": dict(os.environ), "umask": umask,
            "rlimits": {name: list(resource.getrlimit(getattr(resource, name))) for name in RLIMITS}}


def request_start(home: Path, state_dir: Path, timeout_s: float) -> dict:
    """Ask the home's host shim (started here if none runs) to start the attempt in `state_dir`; its job.json.

    Raises local_shim.StartFailed with one line when it did not start, HostUnavailable when no host answered.
    """
    sock_path, _ = host_paths(home)
    sock_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    request = json.dumps({"state_dir": str(state_dir), **submitter_state()}).encode() + b"\n"
    started_host = False
    while True:
        conn = _connect(sock_path)
        if conn is None:
            if not started_host:
                _start_host(home)
                started_host = True
            if time.monotonic() >= deadline:
                raise HostUnavailable(f"no host shim answered on {sock_path} within {timeout_s:g} s"
                                      f"{_err_tail(home)}")
            time.sleep(0.01)
            continue
        with conn:
            try:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                conn.sendall(request)
                reply = _read_line(conn)
            except (ConnectionError, BrokenPipeError):
                reply = b""
            except socket.timeout:
                raise local_shim.StartFailed(f"did not start the command within {timeout_s:g} s") from None
        if reply:
            answer = json.loads(reply)
            if "job" in answer:
                return answer["job"]
            raise local_shim.StartFailed(answer.get("error", "no answer"))
        # The host went away before answering (it was leaving idle, or was killed): the attempt
        # started only if its job.json says so; else ask the next host.
        job = read_json(Path(state_dir) / "job.json")
        if job is not None:
            return job
        started_host = False
        if time.monotonic() >= deadline:
            raise HostUnavailable(f"the host shim on {sock_path} closed without answering{_err_tail(home)}")


def _connect(sock_path: Path) -> socket.socket | None:
    try:
        dir_fd = os.open(sock_path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_short(sock_path, dir_fd))
        return conn
    except OSError:
        conn.close()
        return None
    finally:
        os.close(dir_fd)


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


def _start_host(home: Path) -> None:
    err = Path(home) / "local" / ERR
    with os.fdopen(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as f:
        launcher = subprocess.Popen([sys.executable, "-m", "trackway.executors.local_host", str(home)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
                                    start_new_session=True)
    launcher.wait()  # it forks the host and leaves at once: the host is nobody's zombie


def _err_tail(home: Path) -> str:
    try:
        lines = (Path(home) / "local" / ERR).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f" (host.err: {lines[-1]})" if lines else ""


# -- the keeper: one per attempt, forked from the zygote ------------------------------------------

def _send(sock: socket.socket, data: bytes) -> None:
    while True:
        try:
            sock.send(data)
            return
        except BlockingIOError:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            poller.poll()


def _recv(sock: socket.socket, timeout_ms: int | None = None) -> bytes | None:
    """One message (b"" once the other end closed); None when `timeout_ms` passed first."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        try:
            # With MSG_PEEK | MSG_TRUNC, recv_into says how long the waiting message is, whole.
            size = sock.recv_into(bytearray(1), 1, socket.MSG_PEEK | socket.MSG_TRUNC)
            return sock.recv(max(1, size))
        except BlockingIOError:
            if not poller.poll(timeout_ms):
                return None


class _Prepared:
    """What a keeper needs to start its command, worked out in the zygote before the fork (see `_keeper`)."""

    def __init__(self, launch: dict):
        command = launch["command"]
        self.command = command
        self.cwd = launch["cwd"]
        self.env = launch["env"]
        self.umask = launch["umask"]
        self.rlimits = [(getattr(resource, name), soft, hard) for name, (soft, hard) in launch["rlimits"].items()
                        if hasattr(resource, name)]
        program = command[0] if command else ""
        self.program = program
        self.candidates = [program] if os.path.dirname(program) else \
            [os.path.join(directory, program) for directory in os.get_exec_path(self.env)]
        self.err_fd = os.open(launch["shim_err"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)


# Python ignores SIGPIPE and SIGXFSZ; a command starts with every signal as the system sets it.
_SPAWN_DEFAULTS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGUSR2)
_RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_PR_SET_CHILD_SUBREAPER = 36


def _keeper(sock_fd: int, out_w: int, err_w: int, job: _Prepared, prctl) -> None:
    """The attempt's own process: the command's parent and subreaper, and the ear for its signals.

    Every page it writes is a page of its own, so it runs as little Python as it can: everything
    that can be was worked out by the zygote before the fork, the signals go to the host thread as
    bytes written by the C handler (set_wakeup_fd), and the command starts in one C call.
    """
    try:
        os.setsid()
        os.dup2(job.err_fd, 2)  # shim.err: where a keeper's own failure is said
        leader: list[int] = []
        _signal.signal(signal.SIGCHLD, _reap_orphans(leader))
        for signum in _RELAYED:
            _signal.signal(signum, _ignore)
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        os.set_blocking(sock_fd, False)
        _signal.set_wakeup_fd(sock_fd, warn_on_full_buffer=False)
        sock = socket.socket(fileno=sock_fd)
        os.umask(job.umask)
        for which, soft, hard in job.rlimits:
            try:
                resource.setrlimit(which, (soft, hard))
            except (ValueError, OSError):
                pass
        try:
            child_pid = _spawn(job, out_w, err_w)
        except (OSError, ValueError) as exc:
            _send(sock, b"E" + str(exc).encode())
            while _recv(sock):
                pass
            return
        os.close(out_w)
        os.close(err_w)
        leader.append(child_pid)
        _send(sock, b"P%d" % child_pid)
        while True:
            message = _recv(sock)
            if not message:
                break
            if message == b"reap":
                _send(sock, b"S%d" % os.waitpid(child_pid, 0)[1])
        _reap_orphans(leader)()
    finally:
        os._exit(0)


def _reap_orphans(leader: list[int]):
    """The keeper's SIGCHLD handler: reap what it adopted; the command only when the host says so (its zombie holds
    the group id)."""

    def reap(signum=None, frame=None) -> None:
        if not leader:
            return
        for pid in _children(os.getpid()):
            if pid not in leader:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    return reap


def _spawn(job: _Prepared, out_w: int, err_w: int) -> int:
    """Start the command as subprocess.Popen(start_new_session=True, stdin=DEVNULL) would, in one C call.

    Popen's Python code, run in every keeper, copied about a megabyte of the zygote's pages
    (reference counts, specialized bytecode). Errors read as Popen's: `[Errno 2] No such file or directory: 'cmd'`.
    """
    os.chdir(job.cwd)  # the keeper's own directory: the command inherits it
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    failed: OSError | None = None
    for path in job.candidates:
        try:
            return os.posix_spawn(path, job.command, job.env, file_actions=actions, setsid=True,
                                  setsigdef=_SPAWN_DEFAULTS, setsigmask=())
        except OSError as exc:
            # As execvpe: a directory without it is passed over; the first other failure is the one said.
            if failed is None or (failed.errno in (errno.ENOENT, errno.ENOTDIR)
                                  and exc.errno not in (errno.ENOENT, errno.ENOTDIR)):
                failed = exc
    code = failed.errno if failed is not None else errno.ENOENT
    raise OSError(code, os.strerror(code), job.program)


def _ignore(signum, frame) -> None:
    pass


def _read_exact(channel: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        part = channel.recv(min(size - len(data), 1 << 20))
        if not part:
            os._exit(0)
        data += part
    return bytes(data)


def _zygote(channel: socket.socket) -> None:
    """Forks a keeper for each request (its launch, three descriptors), answers with its pid; leaves with the host."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    # fork(2) itself, not os.fork(): the zygote has one thread, so Python's after-fork work (its
    # locks, threading's bookkeeping) has nothing to mend, and would cost every keeper pages.
    fork = ctypes.PyDLL(None).fork
    # A collection in a keeper would write to every object it shares with the zygote (the
    # collector's marks), copying all their pages: what is here now is never collected again.
    gc.collect()
    gc.freeze()
    while True:
        try:
            header, fds, _, _ = socket.recv_fds(channel, 16, 3, socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            continue
        if not header or len(fds) != 3:
            os._exit(0)
        header += _read_exact(channel, 16 - len(header))
        try:
            job = _Prepared(json.loads(_read_exact(channel, int(header))))
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            channel.sendall(b"E%s\n" % str(exc).replace("\n", " ").encode())
            continue
        pid = fork()
        if pid == 0:
            gc.disable()  # a keeper allocates next to nothing, and frees it all with os._exit
            _keeper(*fds, job, prctl)
        for fd in fds:
            os.close(fd)
        os.close(job.err_fd)
        del job
        channel.sendall(b"P%d\n" % pid if pid > 0 else b"Ecannot fork: %s\n" % os.strerror(ctypes.get_errno()).encode())


class Zygote:
    """The host's handle on its zygote: one request at a time."""

    def __init__(self, close: list[int]) -> None:
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lock = threading.Lock()
        self.pid = os.fork()
        if self.pid == 0:
            self.channel.close()
            for fd in close:
                os.close(fd)
            try:
                _zygote(theirs)
            finally:
                os._exit(0)
        theirs.close()

    def keeper(self, launch: bytes, sock_fd: int, out_w: int, err_w: int) -> int:
        """A keeper for `launch` (JSON), given the three descriptors; its pid. OSError when the zygote could not."""
        with self.lock:
            socket.send_fds(self.channel, [b"%015d\n" % len(launch)], [sock_fd, out_w, err_w])
            self.channel.sendall(launch)
            reply = b""
            while not reply.endswith(b"\n"):
                part = self.channel.recv(4096)
                if not part:
                    raise OSError("the host shim's zygote is gone")
                reply += part
        if reply[:1] != b"P":
            raise OSError(f"the host shim's zygote could not start a keeper: {reply[1:].decode(errors='replace').strip()}")
        return int(reply[1:])


class HostedShim(Shim):
    """The shim's work for one attempt, done in the host, its process tree kept below its keeper."""

    def __init__(self, host: Host, state_dir: Path, launch: dict, request: dict, conn: socket.socket):
        super().__init__(state_dir, launch)
        self.host = host
        self.request = request
        self.conn = conn
        self.keeper: socket.socket | None = None
        self.abandoned = False

    def run(self) -> int:
        # The shim's own stderr, as before: empty unless it broke (the keeper writes there, and this thread).
        os.close(os.open(self.state_dir / "shim.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        env = {} if self.launch.get("env_is_complete") else dict(self.request.get("environ", {}))
        env.update(self.launch.get("env", {}))
        env[TREE_ENV] = self.tree_token
        launch = json.dumps({"command": self.launch["command"], "cwd": self.launch["cwd"], "env": env,
                             "shim_err": str(self.state_dir / "shim.err"),
                             "umask": self.request.get("umask", 0o022),
                             "rlimits": self.request.get("rlimits", {})}).encode()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.owner_pid = self.host.zygote.keeper(launch, theirs.fileno(), out_w, err_w)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            mine.close()
            raise
        finally:
            theirs.close()
            os.close(out_w)
            os.close(err_w)
        mine.setblocking(False)  # _recv waits with poll(), and may not wait at all
        self.keeper = mine
        self.create_time = process_create_time(self.owner_pid)
        log = self._take_over_attempt()
        answer = self._answer()
        if answer is None or answer[:1] == b"E":
            for fd in (out_r, err_r):
                os.close(fd)
        if answer is None:
            # Whether the command started is not known (the keeper may have died just after): nothing
            # is written down, and the submitter kills any command of the job.json that turns up.
            self._reply({"error": f"the attempt's keeper process (pid {self.owner_pid}) died before saying whether"
                                  " the command started"})
            return 0
        if answer[:1] == b"E":
            self._cannot_start(log, answer[1:].decode(errors="replace"))
            self._reply({"job": read_json(self.state_dir / "job.json")})
            return 0
        child_pid = int(answer[1:])
        self.child_pid = child_pid
        create_time, started_at = launch_times(child_pid)
        started = time.monotonic()
        job = self._write_job(child_pid, create_time, started_at)
        if not self._reply({"job": job}):
            # Whoever launched the attempt is gone (killed) without hearing that it started: the launch
            # was interrupted, and trackway stops the command. A retry starts it again; the SIGTERM is ours.
            self.reason = INTERRUPTED_LAUNCH_REASON
            self._terminate(child_pid, "the launch was interrupted: the submitter stopped waiting for the command"
                                       " to start", log)
        pumps = [
            threading.Thread(target=log.pump, args=(os.fdopen(out_r, "rb"), b"out"), daemon=True),
            threading.Thread(target=log.pump, args=(os.fdopen(err_r, "rb"), b"err"), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        child = _Leader(child_pid)
        self._supervise(child, started, -1, log)
        if self.abandoned:
            # The output still goes to the log while the command runs; the host stays for it.
            for pump in pumps:
                pump.join()
            return 0
        self._end_tree(child_pid, log)
        returncode = self._reap_leader()
        if returncode is None:
            return 0
        self._drain_and_finish(pumps, log, returncode)
        return 0

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()  # the keeper leaves once its socket closes
            self.keeper = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _finish(self, exit_code: int | None, signum: int | None) -> None:
        super()._finish(exit_code, signum)
        say_ended(self.host.home)

    def _reply(self, answer: dict) -> bool:
        """Tell the submitter how the start went; False when it is no longer there to hear it."""
        conn, self.conn = self.conn, None
        if conn is None:
            return False
        try:
            conn.sendall(json.dumps(answer).encode() + b"\n")
            return True
        except OSError:
            return False
        finally:
            conn.close()

    def _answer(self, timeout_ms: int | None = None) -> bytes | None:
        """The keeper's next answer (P<pid>, E<error>, S<wait status>); the signals it relays meanwhile are taken
        in. None once it is gone."""
        while True:
            message = _recv(self.keeper, timeout_ms)
            if not message:
                return None
            if len(message) == 1:
                self._signalled(message[0])
                continue
            return message

    def _signalled(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self._on_stop(signum, None)
        elif signum == signal.SIGUSR1:
            self._on_notice(signum, None)

    def _child_exited(self, pid: int) -> bool:
        if self.abandoned:
            return True  # a killed keeper ends supervision: nothing is stopped or written for it after that
        fields = _read_stat(pid)
        return fields is None or fields[0] in _GONE

    def _idle(self, timeout: float, wake_r: int, child_pid: int) -> None:
        if self.host.stopping and self.stop_signal is None:
            self.stop_signal = signal.SIGTERM
            return
        poller = select.poll()
        poller.register(self.keeper, select.POLLIN)
        if not self.host.stopping:
            poller.register(self.host.stop_r, select.POLLIN)
        if not poller.poll(int(timeout * 1000) + 1):
            return
        while True:
            message = _recv(self.keeper, 0)
            if message is None:
                return
            if not message:
                self._abandon()
                return
            if len(message) == 1:
                self._signalled(message[0])

    def _abandon(self) -> None:
        """The keeper was killed: the attempt is left as a dead shim leaves it (see `LocalExecutor.poll`)."""
        self.abandoned = True

    def _job_processes(self, pgid: int) -> list[int]:
        found = descendants(self.owner_pid)
        return found + [pid for pid in self.host.groups.members(pgid) if pid not in found]

    def _wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def _reap_orphans(self, keep: int | None) -> None:
        pass  # the keeper reaps what it adopted

    def _reap_leader(self) -> int | None:
        """The command's exit status, from the keeper that reaps it (as Popen.returncode); None if the keeper is gone."""
        try:
            _send(self.keeper, b"reap")
        except OSError:
            self.abandoned = True
            return None
        answer = self._answer()
        if answer is None:
            self.abandoned = True
            return None
        return os.waitstatus_to_exitcode(int(answer[1:]))


class _Leader:
    """Shim._supervise's view of the command: its pid."""

    def __init__(self, pid: int):
        self.pid = pid


class GroupScans:
    """The machine's process groups, read from /proc once for the attempts of this host that end together.

    Each attempt's end looks for what is left of its command's process group (process_tree.group_members),
    and that reads every process of the machine: a few milliseconds with a thousand attempts running,
    under the host's one interpreter lock. A thousand attempts ending at once made that a thousand scans,
    and each end's exit.json waited behind the others' for up to 8 s. One scan serves every end that
    asks within MAX_AGE_S of it: as fresh as end_processes' own 50 ms between looks, each pid found is
    checked alive and in the group when asked, and every group gets SIGKILL at its end whatever a scan missed.
    """

    MAX_AGE_S = 0.05

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken_at = -math.inf
        self._groups: dict[int, list[int]] = {}

    def members(self, pgid: int) -> list[int]:
        """Live pids in process group `pgid`, from a scan begun at most MAX_AGE_S ago."""
        with self._lock:
            if time.monotonic() - self._taken_at > self.MAX_AGE_S:
                taken_at = time.monotonic()
                self._groups = process_groups()
                self._taken_at = taken_at
            groups = self._groups
        return live_members(groups, pgid)


class Host:
    """Accepts start requests on home/local/host.sock and runs each attempt in a thread; see the module docstring."""

    def __init__(self, home: Path, lock_fd: int):
        self.home = home
        self.lock_fd = lock_fd
        self.sock_path, _ = host_paths(home)
        # Forked first, while the host has no thread and holds little: what it shares with every keeper.
        # It must not keep the lock: it would outlive a killed host and refuse the next one.
        self.zygote = Zygote(close=[lock_fd])
        self.stop_r, self.stop_w = os.pipe()
        self.stopping = False
        self.attempts: set[HostedShim] = set()
        self.groups = GroupScans()
        self.guard = threading.Lock()
        self.last_busy = time.monotonic()

    def serve(self) -> int:
        threading.stack_size(THREAD_STACK)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, _ignore)
        signal.signal(signal.SIGINT, _ignore)
        signal.signal(signal.SIGUSR1, _ignore)
        dir_fd = os.open(self.sock_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock_path.unlink(missing_ok=True)  # a dead host's: the lock says none runs
        listener.bind(_short(self.sock_path, dir_fd))
        os.close(dir_fd)
        listener.listen(128)
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll(1000):
                if fd == wake_r:
                    signums = os.read(wake_r, 512)
                    if signal.SIGTERM in signums or signal.SIGINT in signums:
                        self._stop(listener, poller)
                elif fd == listener.fileno() and not self.stopping:
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    self._start(conn)
            with self.guard:
                busy = bool(self.attempts)
            if busy:
                self.last_busy = time.monotonic()
            elif self.stopping:
                return 0
            elif time.monotonic() - self.last_busy >= IDLE_S or not self.sock_path.parent.is_dir():
                # Gone from the address first: a request queued meanwhile is refused, and its
                # submitter starts the next host.
                self.sock_path.unlink(missing_ok=True)
                listener.close()
                return 0

    def _stop(self, listener: socket.socket, poller) -> None:
        """A host shutdown (SIGTERM): every attempt is stopped as its shim's SIGTERM would, and no new one starts."""
        if self.stopping:
            return
        self.stopping = True
        poller.unregister(listener)
        self.sock_path.unlink(missing_ok=True)
        listener.close()
        os.write(self.stop_w, b"x")

    def _start(self, conn: socket.socket) -> None:
        with self.guard:
            self.last_busy = time.monotonic()
            placeholder = object()
            self.attempts.add(placeholder)  # type: ignore[arg-type]
        threading.Thread(target=self._attempt, args=(conn, placeholder), daemon=True).start()

    def _attempt(self, conn: socket.socket, placeholder) -> None:
        shim = None
        state_dir = None
        try:
            conn.settimeout(REQUEST_TIMEOUT_S)
            line = _read_line(conn)
            if not line:
                conn.close()
                return
            request = json.loads(line)
            conn.settimeout(None)
            state_dir = Path(request["state_dir"])
            launch = read_json(state_dir / "launch.json")
            if launch is None:
                conn.sendall(json.dumps({"error": f"no launch.json in {state_dir}"}).encode() + b"\n")
                conn.close()
                return
            shim = HostedShim(self, state_dir, launch, request, conn)
            with self.guard:
                self.attempts.add(shim)
            shim.run()
        except BaseException as exc:
            # As a shim that broke: its traceback in shim.err, and its keeper gone, so the attempt
            # reads as one whose shim died (never a made-up end).
            if state_dir is not None:
                try:
                    with open(state_dir / "shim.err", "a", encoding="utf-8") as err:
                        err.write(f"local shim failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                except OSError:
                    pass
            if shim is not None and shim.conn is not None:
                shim._reply({"error": f"local shim failed: {type(exc).__name__}: {exc}"})
        finally:
            if shim is not None:
                shim.close()
            else:
                conn.close()
            with self.guard:
                self.attempts.discard(placeholder)
                self.attempts.discard(shim)
                self.last_busy = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trackway.executors.local_host HOME", file=sys.stderr)
        return 2
    home = Path(args[0])
    _, lock_path = host_paths(home)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another host serves this home
    if os.fork() != 0:
        os._exit(0)  # the lock is held by the open file, which the host keeps
    os.ftruncate(lock_fd, 0)
    os.write(lock_fd, b"%d\n" % os.getpid())
    # Three descriptors per running attempt: a submitter's 1,024 would stop the host at ~300. The
    # commands get the submitter's own limits back (its request's rlimits, set by their keepers).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    host = Host(home, lock_fd)
    try:
        return host.serve()
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
