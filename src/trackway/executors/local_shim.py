"""The local shim: the one process per attempt that runs the command and writes down how it ended.

The SSH executor's agent starts `python local_shim.py STATE_DIR` detached on its host (the Slurm
executor runs it in the foreground, below); the local executor runs the same `Shim` inside its
host shim, one process for every attempt (see `local_host`). The shim forks once more (so that it
is nobody's zombie), reads `STATE_DIR/launch.json`, and leaves:

    job.json     as soon as the command runs (or failed to start): shim and child pids, create times, pgid,
                 tree_token
    exit.json    once it ended: exit_code or signal, ended_at, timed_out, cancelled, reason (one the shim knows
                 because it stopped the command itself), evidence
    exit.reserve room for exit.json taken before the command starts (EXIT_RESERVE_BYTES): on a disk
                 the command filled up, the exit status is written into it and renamed to exit.json
    shim.err     the shim's own stderr, empty unless the shim itself broke
    stopping.lock, stopped.json   only with the shim gone: see `--kill-tree` below

A full disk never hides how the command ended: output lines the log cannot take are counted and
the count, the path and the bytes free go into exit.json's evidence; exit.json itself goes into
the room reserved at the start when no new file can be written.

The command runs in its own session and process group, but its processes need not stay there:
torchrun starts every rank in a session of its own. So the shim is a child subreaper (Linux):
whatever leaves the group, or is orphaned by a launcher that died, stays below the shim. Every
stop signal goes to the group and to every process below the shim, and the end is written down
only once none of them is left, each one that had to be stopped named in the evidence:

    started ──► exited on its own ──► any left: SIGTERM ─► grace ─► SIGKILL ─────► exit.json
       │
       ├─ time limit reached ─┐
       └─ shim got SIGTERM  ──┴─► SIGTERM to all ─► grace ─► SIGKILL to all ─────► exit.json
                                  (the command exits before that: what is left gets SIGKILL at once)

Once the shim is gone (killed itself), its job's processes are found by group, session, or the
mark TRACKWAY_JOB_TREE=<job.json's tree_token> in their environment (`process_tree.job_survivors`), which
every descendant inherits unless it clears its environment.

A shim SIGTERM is how `cancel()` works (it writes `cancel.json` first) and how a host shutdown
arrives. A shim SIGUSR1 (a preemption or time-limit notice, e.g. Slurm's `--signal=B:USR1@N`) is
sent on to the job's processes that handle it (to the group when none does: torchrun does not,
and would die of it) and noted, with its time, in `exit.json`'s `notices`; it stops nothing.
`--kill-tree STATE_DIR` is a second mode, for a job whose shim is gone: SIGTERM, then SIGKILL
after the grace, to every process of the job still running (see `process_tree.job_survivors`), and what it
killed in `stopped.json`.

`--foreground STATE_DIR` runs the shim without forking, as the batch step of a Slurm job (the
Slurm executor's sbatch script execs it): the job's environment is the shim's own, GPUs are what
the scheduler put in CUDA_VISIBLE_DEVICES, job.json keeps the scheduler's job variables
(`batch_env`), and the shim exits as the command did (its exit code, or 128 + the signal), so
that the scheduler's record agrees with exit.json. A SIGTERM is not sent on there: Slurm signals
every process of the job itself (scancel, time limit, preemption), while `--signal=B:USR1` reaches
only the batch step, the shim, which sends it on.

Stdlib only, on purpose: this starts for every attempt and submit() waits for it. Reading and
signalling the attempt's processes is process_tree.py's; where trackway is not installed (an SSH
host, a Slurm job) it and node_sampler.py are delivered beside this file and imported from there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

try:  # installed; else the copy delivered beside this file, as node_sampler below
    from trackway.executors import process_tree
except ImportError:
    import process_tree  # type: ignore[no-redef]
try:  # installed; else the copy delivered beside this file (a Slurm job's state directory, an SSH host)
    from trackway.executors.node_sampler import NodeSamples
except ImportError:
    try:
        from node_sampler import NodeSamples  # type: ignore[no-redef]
    except ImportError:  # an older delivery without it: the attempt runs, unsampled
        NodeSamples = None  # type: ignore[assignment,misc]

PUMP_DRAIN_S = 2.0
CANNOT_START_EXIT_CODE = 127
EXIT_RESERVE = "exit.reserve"
# exit.json is about 1 KiB; its evidence is cut to fit when it must go into the reserve.
EXIT_RESERVE_BYTES = 16 << 10
# What a batch job's shim keeps from its environment in job.json: where the scheduler placed it.
BATCH_ENV = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION", "SLURM_JOB_QOS", "SLURM_JOB_ACCOUNT",
             "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES", "SLURM_RESTART_COUNT")
# exit.json's "reason" for a command the shim stopped because its launch was interrupted (its submitter
# died before hearing that it started): TerminationReason.INFRA_TRANSIENT, spelled out (stdlib only).
INTERRUPTED_LAUNCH_REASON = "infra_transient"
# Output with no newline (a progress bar redrawn with \r) is cut into log lines of at most this many bytes.
_MAX_LINE = 1 << 16


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def format_seconds(seconds: float) -> str:
    return f"{seconds:g}"


def write_json_atomic(path: Path, data: dict) -> None:
    """Readers see the old file, no file, or the whole new one; never a torn write.

    Owner-only (0600) from creation: launch.json holds the attempt's environment and ledger URL.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reserve_room(path: Path, size: int) -> bool:
    """Write `size` bytes to `path` and fsync: blocks that later writes reuse without asking the disk for more."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b" " * size)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return False


def write_json_into_reserve(reserve: Path, path: Path, data: dict) -> None:
    """Write `data` over the reserved room at `reserve` (padded with spaces, which JSON ignores), then rename it to `path`.

    Evidence lines are dropped from the end until the text fits.
    """
    size = reserve.stat().st_size
    data = dict(data)
    while True:
        text = json.dumps(data, indent=1).encode()
        if len(text) <= size or not data.get("evidence"):
            break
        data["evidence"] = data["evidence"][:-1]
    fd = os.open(reserve, os.O_WRONLY)
    try:
        os.pwrite(fd, text[:size].ljust(size), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(reserve, path)


def free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


class LeaseFiles:
    """GPU lease files under `home/local/gpu-leases`, one per GPU index, guarded by one flock."""

    def __init__(self, directory: Path):
        self.directory = directory

    def path(self, index: int) -> Path:
        return self.directory / str(index)

    def locked(self) -> _Flock:
        self.directory.mkdir(parents=True, exist_ok=True)
        return _Flock(self.directory / ".lock")

    def hand_over(self, indices: list[int], state_dir: Path, owner: dict) -> list[str]:
        """Make `owner` (the shim) the holder of leases the submitter took for `state_dir`."""
        problems = []
        with self.locked():
            for index in indices:
                current = self.read(index)
                if current is None or current.get("state_dir") != str(state_dir):
                    problems.append(f"GPU {index} lease was taken by another attempt before this one started")
                    continue
                write_json_atomic(self.path(index), owner)
        return problems

    def release(self, indices: list[int], owner_pid: int) -> None:
        with self.locked():
            for index in indices:
                current = self.read(index)
                if current is not None and current.get("pid") == owner_pid:
                    self.path(index).unlink(missing_ok=True)

    def read(self, index: int) -> dict | None:
        try:
            return read_json(self.path(index))
        except (ValueError, OSError):
            return None


class _Flock:
    def __init__(self, path: Path):
        self.path = path
        self.fd = -1

    def __enter__(self) -> _Flock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


class _Log:
    """The attempt's log: one line per output line, `<UTC time> out|err <line>`, flushed per line.

    The shim's own notes (time limit, cancel, cannot start) go in as `err` lines starting `trackway: `.
    """

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # 0600: what a script prints can include its tokens, and the log outlives the attempt.
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.lock = threading.Lock()
        self.muted = False
        self.dropped_lines = 0  # lines the log could not take (a full disk): counted, never a stuck pipe
        self.dropped_bytes = 0
        self.write_error: OSError | None = None

    def line(self, tag: bytes, text: bytes) -> None:
        if not text.endswith(b"\n"):
            text += b"\n"
        stamp = utc_now().strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        record = stamp + b" " + tag + b" " + text
        with self.lock:
            if self.muted:
                return
            try:
                written = os.write(self.fd, record)
            except OSError as exc:
                written = 0
                self.write_error = self.write_error or exc
            if written < len(record):
                # A torn line is finished, so the next one starts on its own (if even a newline fits).
                if written:
                    try:
                        os.write(self.fd, b"\n")
                    except OSError:
                        pass
                self.dropped_lines += 1
                self.dropped_bytes += len(record) - written

    def losses(self) -> str | None:
        """One evidence line about what the log could not take, or None if it took everything."""
        if not self.dropped_lines:
            return None
        exc = self.write_error
        why = f"{exc.strerror or exc}" if exc is not None else "short writes"
        if exc is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = free_bytes(self.path.parent)
            why = f"disk full: {self.path}" + (f", {free} bytes free" if free is not None else "")
        return f"output.log could not take {self.dropped_lines} lines ({self.dropped_bytes} bytes): {why}"

    def note(self, text: str) -> None:
        self.line(b"err", f"trackway: {text}".encode())

    def pump(self, stream, tag: bytes) -> None:
        with stream:
            for chunk in iter(lambda: stream.readline(_MAX_LINE), b""):
                self.line(tag, chunk)


class Shim:
    """One run of one command, from launch.json to exit.json."""

    def __init__(self, state_dir: Path, launch: dict, foreground: bool = False):
        self.state_dir = state_dir
        self.launch = launch
        self.foreground = foreground
        self.grace_s = float(launch.get("grace_s", 30.0))
        self.time_limit_s = launch.get("time_limit_s")
        self.gpu_ids = list(launch.get("gpu_ids", [])) or (_visible_gpus() if foreground else [])
        self.notices: list[dict] = []  # SIGUSR1s received: {"signal", "at"}, sent on to the group
        self._unforwarded: list[int] = []  # appended by the handler, popped by the loop (both atomic)
        self.leases = LeaseFiles(Path(launch["lease_dir"])) if launch.get("lease_dir") else None
        self.evidence: list[str] = []
        self.stop_signal: int | None = None
        self.timed_out = False
        # A reason the shim knows for certain because it ended the command itself for it (exit.json's
        # "reason", a TerminationReason value): the SIGTERM that did it is then trackway's, not the world's.
        self.reason: str | None = None
        self.term_at: float | None = None
        self.kill_sent = False
        # The process that stands for the attempt (job.json's shim_pid, the GPU leases' holder): this
        # one here; a keeper process for an attempt the host shim runs (see local_host).
        self.owner_pid = os.getpid()
        self.create_time = process_tree.process_create_time(os.getpid())
        self.reserved = False
        self.log: _Log | None = None
        self.tree_token = os.urandom(8).hex()
        self.child_pid: int | None = None

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_notice)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        # Before the command starts: a rank that leaves the job's session (torchrun starts each in
        # its own) stays below the shim when its launcher dies, so the shim can end it too.
        process_tree.become_subreaper()
        log = self._take_over_attempt()
        # A complete environment is the run's own, as submitted: the shim's (whichever process
        # launched this attempt) must not leak in, or a retry would train with other settings.
        env = {} if self.launch.get("env_is_complete") else dict(os.environ)
        env.update(self.launch.get("env", {}))
        env[process_tree.TREE_ENV] = self.tree_token
        try:
            child = subprocess.Popen(
                self.launch["command"],
                cwd=self.launch["cwd"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            return self._cannot_start(log, exc)

        create_time, started_at = process_tree.launch_times(child.pid)
        started = time.monotonic()
        self.child_pid = child.pid
        self._write_job(child.pid, create_time, started_at)
        pumps = [
            threading.Thread(target=log.pump, args=(child.stdout, b"out"), daemon=True),
            threading.Thread(target=log.pump, args=(child.stderr, b"err"), daemon=True),
        ]
        for pump in pumps:
            pump.start()

        self._supervise(child, started, wake_r, log)
        self._end_tree(child.pid, log)
        returncode = child.wait()
        self._reap_orphans(None)
        self._drain_and_finish(pumps, log, returncode)
        if self.foreground:
            return returncode if returncode >= 0 else 128 - returncode
        return 0

    def _take_over_attempt(self) -> _Log:
        """Before the command starts: its GPU leases handed to this process, room for its exit status, its log."""
        if self.leases is not None and self.gpu_ids:
            owner = {"pid": self.owner_pid, "create_time": self.create_time, "state_dir": str(self.state_dir),
                     "attempt_id": self.launch.get("attempt_id")}
            self.evidence.extend(self.leases.hand_over(self.gpu_ids, self.state_dir, owner))
        # Before the command can fill the disk: the exit status must find room whatever it does.
        self.reserved = reserve_room(self.state_dir / EXIT_RESERVE, EXIT_RESERVE_BYTES)
        self.log = _Log(Path(self.launch["log_path"]))
        return self.log

    def _drain_and_finish(self, pumps: list[threading.Thread], log: _Log, returncode: int) -> None:
        """The output read to its end (at most PUMP_DRAIN_S after the exit), then the end written."""
        deadline = time.monotonic() + PUMP_DRAIN_S
        for pump in pumps:
            pump.join(max(0.0, deadline - time.monotonic()))
        if any(pump.is_alive() for pump in pumps):
            with log.lock:
                log.muted = True
            self.evidence.append(
                f"output pipes still open {format_seconds(PUMP_DRAIN_S)} s after the command exited"
                " (held by a process outside its group): stopped reading them"
            )
        self._finish(
            exit_code=returncode if returncode >= 0 else None,
            signum=-returncode if returncode < 0 else None,
        )

    def _on_stop(self, signum, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _on_notice(self, signum, frame) -> None:
        self.notices.append({"signal": process_tree.signal_name(signum), "at": utc_now().isoformat()})
        self._unforwarded.append(signum)

    def _forward_notices(self, pgid: int, log: _Log) -> None:
        """A notice goes to the processes of the job that handle it, or, when none does, to the group.

        A launcher that does not handle SIGUSR1 (torchrun) would die of it, and its ranks, which
        do, would never hear of it: with a handler anywhere in the job, only those processes get it.
        """
        while self._unforwarded:
            signum = self._unforwarded.pop(0)
            handlers = [pid for pid in self._job_processes(pgid) if process_tree.handles(pid, signum)]
            if handlers:
                process_tree.signal_each(handlers, signum)
                named = process_tree.name_processes([(pid, process_tree.process_name(pid)) for pid in handlers])
                to = f"{process_tree.processes(len(handlers))} of the job with a handler for it ({named})"
            else:
                process_tree.signal_group(pgid, signum)
                to = f"process group {pgid}"
            note = f"executor shim received {process_tree.signal_name(signum)} (a notice): sent it on to {to}"
            self.evidence.append(note)
            log.note(note)

    def _supervise(self, child: subprocess.Popen, started: float, wake_r: int, log: _Log) -> None:
        pgid = child.pid
        deadline = started + float(self.time_limit_s) if self.time_limit_s is not None else None
        samples = None if NodeSamples is None else NodeSamples(
            self.state_dir / "spool", lambda: self._job_processes(pgid), self.gpu_ids, log.note)
        while not self._child_exited(child.pid):
            now = time.monotonic()
            if samples is not None:
                samples.maybe()
            self._forward_notices(pgid, log)
            if self.term_at is None and self.stop_signal is not None:
                if (self.state_dir / "cancel.json").exists():
                    why = "cancel requested"
                else:
                    why = f"executor shim received {process_tree.signal_name(self.stop_signal)}"
                if self.foreground and self.stop_signal == signal.SIGTERM:
                    self._await_scheduler_kill(why, log)
                else:
                    self._terminate(pgid, why, log)
            if self.term_at is None and deadline is not None and now >= deadline:
                self.timed_out = True
                self._terminate(pgid, f"time limit {format_seconds(float(self.time_limit_s))} s reached", log)
            if self.term_at is not None and not self.kill_sent and now >= self.term_at + self.grace_s:
                self.kill_sent = True
                left = self._job_processes(pgid)
                named = [(pid, process_tree.process_name(pid)) for pid in left]
                process_tree.signal_group(pgid, signal.SIGKILL)
                process_tree.signal_each(left, signal.SIGKILL)
                note = (f"process group {pgid} still running {format_seconds(self.grace_s)} s after SIGTERM"
                        f" ({process_tree.name_processes(named)}): sent SIGKILL")
                self.evidence.append(note)
                log.note(note)
            wake_at = [now + 5.0]
            if samples is not None and not samples.broken:
                wake_at.append(samples.next_at)
            if deadline is not None and self.term_at is None:
                wake_at.append(deadline)
            if self.term_at is not None and not self.kill_sent:
                wake_at.append(self.term_at + self.grace_s)
            self._idle(max(0.0, min(wake_at) - time.monotonic()), wake_r, child.pid)

    def _child_exited(self, pid: int) -> bool:
        return _has_exited(pid)

    def _idle(self, timeout: float, wake_r: int, child_pid: int) -> None:
        """Wait up to `timeout` for a signal, then reap what the shim adopted."""
        # Signals (SIGCHLD, SIGTERM) write to wake_r, so this returns as soon as anything happens.
        if select.select([wake_r], [], [], timeout)[0]:
            os.read(wake_r, 512)
        self._reap_orphans(child_pid)

    def _await_scheduler_kill(self, why: str, log: _Log) -> None:
        """A batch job's SIGTERM: the scheduler sent it to every process of the job, the command included.

        Sending it on would deliver it twice, and a second SIGTERM that lands while Python exits
        kills the process by the signal instead of its own exit code (seen on Slurm: the SDK's
        exit 75 after a preemption became "killed by SIGTERM"). Only the SIGKILL after the grace is
        the shim's; the scheduler's own (after its KillWait) usually comes first.
        """
        self.term_at = time.monotonic()
        note = (f"{why} (sent by the scheduler to every process of the job, the command included):"
                f" SIGKILL after {format_seconds(self.grace_s)} s grace")
        self.evidence.append(note)
        log.note(note)

    def _terminate(self, pgid: int, why: str, log: _Log) -> None:
        self.term_at = time.monotonic()
        # Processes that left the group (torchrun's ranks, each in its own session) get it too, as
        # Slurm sends it to every process of a job.
        outside = [pid for pid in self._job_processes(pgid) if _pgid_of(pid) != pgid]
        process_tree.signal_group(pgid, signal.SIGTERM)
        process_tree.signal_each(outside, signal.SIGTERM)
        # A stopped process would sit on the SIGTERM until the grace ran out.
        process_tree.signal_group(pgid, signal.SIGCONT)
        process_tree.signal_each(outside, signal.SIGCONT)
        to = f"process group {pgid}"
        if outside:
            named = process_tree.name_processes([(pid, process_tree.process_name(pid)) for pid in outside])
            to += f" and to {process_tree.processes(len(outside))} outside it ({named})"
        note = f"{why}: sent SIGTERM to {to}, SIGKILL after {format_seconds(self.grace_s)} s grace"
        self.evidence.append(note)
        log.note(note)

    def _job_processes(self, pgid: int) -> list[int]:
        """The command's live processes: all below the shim (a subreaper keeps orphans there) and its group."""
        found = process_tree.descendants(os.getpid())
        return found + [pid for pid in process_tree.group_members(pgid) if pid not in found]

    def _end_tree(self, pgid: int, log: _Log) -> None:
        """The command exited: every process left of it is gone before its end is written down.

        Whatever holds on is stopped: after a SIGTERM to the job (cancel, time limit) with SIGKILL at
        once, after an exit of its own with SIGTERM, the grace, then SIGKILL. So the end, and a retry,
        never come while a rank of this attempt still runs. The leader is an unreaped zombie until
        then, so its pid cannot have been reused as a group id meanwhile.
        """
        outside: set[int] = set()

        def left() -> list[int]:
            pids = self._job_processes(pgid)
            outside.update(pid for pid in pids if _pgid_of(pid) != pgid)
            return pids

        termed = self.term_at is not None
        ending = process_tree.end_processes(left, self.grace_s, termed, self._wait)
        process_tree.signal_group(pgid, signal.SIGKILL)
        grace = format_seconds(self.grace_s)
        notes = []
        if ending.termed:
            notes.append(f"the command exited with {process_tree.processes(len(ending.termed))} of it still running"
                         f" ({process_tree.name_processes(ending.termed)}): sent SIGTERM,"
                         f" SIGKILL after {grace} s grace")
        if ending.killed and termed:
            killed_outside = [pid for pid, _ in ending.killed if pid in outside]
            where = f"in process group {pgid}"
            if killed_outside:
                where = (f"outside process group {pgid}" if len(killed_outside) == len(ending.killed)
                         else f"in process group {pgid} and outside it")
            notes.append(f"killed {process_tree.processes(len(ending.killed))} left {where} after the command exited:"
                         f" {process_tree.name_processes(ending.killed)}")
        elif ending.killed:
            notes.append(f"{process_tree.name_processes(ending.killed)} still running {grace} s after SIGTERM:"
                         " sent SIGKILL")
        if ending.stuck:
            notes.append(f"{process_tree.name_processes(ending.stuck)} still there"
                         f" {format_seconds(process_tree.KILL_WAIT_S)} s after SIGKILL")
        for note in notes:
            self.evidence.append(note)
            log.note(note)

    def _wait(self, seconds: float) -> None:
        time.sleep(seconds)
        self._reap_orphans(self.child_pid)

    def _reap_orphans(self, keep: int | None) -> None:
        """Reap the orphans the shim adopted as subreaper; `keep` (the command, whose pid holds the group id) stays."""
        if keep is None:
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        return
                except ChildProcessError:
                    return
        for pid in process_tree._children(os.getpid()):
            if pid != keep:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def _cannot_start(self, log: _Log, exc: BaseException | str) -> int:
        note = f"cannot start command: {exc}"
        log.note(note)
        self.evidence.append(note)
        self._write_job(None, None, utc_now())
        self._finish(exit_code=CANNOT_START_EXIT_CODE, signum=None)
        return CANNOT_START_EXIT_CODE if self.foreground else 0

    def _write_job(self, child_pid: int | None, child_create_time: float | None, started_at: datetime) -> dict:
        job = {
            "shim_pid": self.owner_pid,
            "create_time": self.create_time,
            "child_pid": child_pid,
            "child_create_time": child_create_time,
            "pgid": child_pid,
            "tree_token": self.tree_token,
            "started_at": started_at.isoformat(),
            "host": socket.gethostname(),
            "gpu_ids": self.gpu_ids,
        }
        if self.foreground:
            job["batch_env"] = {name: os.environ[name] for name in BATCH_ENV if name in os.environ}
        write_json_atomic(self.state_dir / "job.json", job)
        return job

    def _finish(self, exit_code: int | None, signum: int | None) -> None:
        # Leases go first: whoever sees exit.json may submit again at once and expect the GPUs free.
        if self.leases is not None and self.gpu_ids:
            self.leases.release(self.gpu_ids, self.owner_pid)
        lost = self.log.losses() if self.log is not None else None
        if lost is not None:
            self.evidence.append(lost)
        status = {
            "exit_code": exit_code,
            "signal": signum,
            "ended_at": utc_now().isoformat(),
            "timed_out": self.timed_out,
            "cancelled": (self.state_dir / "cancel.json").exists(),
            "reason": self.reason,
            "evidence": self.evidence,
            "notices": self.notices,
        }
        reserve = self.state_dir / EXIT_RESERVE
        try:
            write_json_atomic(self.state_dir / "exit.json", status)
        except OSError as exc:
            if not self.reserved:
                raise
            free = free_bytes(self.state_dir)
            said = f"disk full: {self.state_dir}, {free} bytes free" if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
                else f"{exc.strerror or exc}: {self.state_dir}"
            status["evidence"] = [f"exit.json written into the room reserved at the start ({said})", *self.evidence]
            for tmp in self.state_dir.glob(".exit.json.*.tmp"):
                tmp.unlink(missing_ok=True)
            write_json_into_reserve(reserve, self.state_dir / "exit.json", status)
            return
        reserve.unlink(missing_ok=True)


def _visible_gpus() -> list[int]:
    """The GPU indices the scheduler gave this job (CUDA_VISIBLE_DEVICES), when they are numbers."""
    ids = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return [int(part) for part in ids] if all(part.isdigit() for part in ids) else []


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _has_exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it (WNOWAIT keeps its pid and pgid reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class StartFailed(Exception):
    """The shim did not start the command: exited first, or too slow (then it and its group were killed)."""


def start_detached(argv: list[str], state_dir: Path, timeout_s: float) -> dict:
    """Run `argv` (the shim for `state_dir`) detached and wait for its job.json; StartFailed in one line if none came.

    Shared by the local executor and the SSH executor's remote agent. A shim too slow to start
    is killed, with any command it started late, so that nothing starts after the caller gave up.
    """
    err_path = state_dir / "shim.err"
    # 0600 like the log: a command that cannot start can print its environment.
    with os.fdopen(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as err:
        launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        job = read_json(state_dir / "job.json")
        if job is not None:
            launcher.wait()
            return job
        code = launcher.poll()
        if code not in (None, 0):
            raise StartFailed(f"exited with code {code}: {first_line(err_path)}")
        if time.monotonic() >= deadline:
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 0.02)
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launcher.wait()
    late = read_json(state_dir / "job.json")
    if late is not None and late.get("pgid"):
        process_tree.signal_group(late["pgid"], signal.SIGKILL)
    raise StartFailed(f"did not start the command within {timeout_s:g} s: "
                      f"{first_line(err_path) or 'shim.err is empty'}")


def stop_job(state_dir: Path, job: dict, shim: list[str]) -> str | None:
    """Ask a started job to stop: cancel.json, then SIGTERM to its shim, which escalates to SIGKILL.

    With the shim gone but processes of the job running, a detached `shim --kill-tree` (`shim`:
    how to run this module) does the same escalation to all of them, so the caller can return at
    once. Says what was signalled ("shim", "group") or None (already ended, or nothing left).
    """
    if (state_dir / "exit.json").exists():
        return None
    if not (state_dir / "cancel.json").exists():
        write_json_atomic(state_dir / "cancel.json", {"requested_at": utc_now().isoformat()})
    if process_tree.same_process(job["shim_pid"], job["create_time"]):
        try:
            os.kill(job["shim_pid"], signal.SIGTERM)
            return "shim"
        except ProcessLookupError:
            pass
    if _stopper_at_work(state_dir):
        return "group"
    if process_tree.job_survivors(job):
        start_stopper(state_dir, shim)
        return "group"
    return None


# Files of a job whose shim is gone: held locked by the `--kill-tree` helper while it stops what
# is left, and what it did, written once it is done.
STOPPING = "stopping.lock"
STOPPED = "stopped.json"


def settle_orphans(state_dir: Path, job: dict, shim: list[str]) -> tuple[list[tuple[int, str]], list[str] | None]:
    """For a job whose shim is gone and whose command has exited: (its processes still running, evidence of their end).

    While any runs, a detached `--kill-tree` helper stops them (started here if none is at it) and
    the evidence is None: the job has not ended. Then the helper's lines naming what it killed.
    """
    at_work = _stopper_at_work(state_dir)
    survivors = process_tree.job_survivors(job)
    stopped = read_json(state_dir / STOPPED)
    if survivors and not at_work and stopped is None:
        start_stopper(state_dir, shim)
        at_work = True
    if at_work or (survivors and stopped is None):
        return [(pid, process_tree.process_name(pid)) for pid in survivors], None
    return [], list((stopped or {}).get("evidence", []))


def start_stopper(state_dir: Path, shim: list[str]) -> None:
    subprocess.Popen([*shim, "--kill-tree", str(state_dir)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def _stopper_at_work(state_dir: Path) -> bool:
    try:
        fd = os.open(state_dir / STOPPING, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def first_line(path: Path) -> str:
    """The first non-blank line of a file, stripped; "" when there is none or it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def kill_tree(state_dir: Path) -> int:
    """Stop what is left of a job whose shim is gone (SIGTERM, the grace, SIGKILL); say what in stopped.json.

    One helper per job at a time (the flock on stopping.lock); a second one started meanwhile leaves.
    """
    job = read_json(state_dir / "job.json")
    if job is None:
        return 0
    grace_s = float((read_json(state_dir / "launch.json") or {}).get("grace_s", 30.0))
    fd = os.open(state_dir / STOPPING, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    if (state_dir / STOPPED).exists():
        return 0  # a helper before this one did it all
    ending = process_tree.end_processes(lambda: process_tree.job_survivors(job), grace_s, termed=False)
    gone = f"executor shim pid {job['shim_pid']} gone"
    evidence = []
    if ending.termed:
        evidence.append(f"{gone}: sent SIGTERM to {process_tree.processes(len(ending.termed))} of the job still running"
                        f" ({process_tree.name_processes(ending.termed)}),"
                        f" SIGKILL after {format_seconds(grace_s)} s grace")
    if ending.killed:
        evidence.append(f"{process_tree.name_processes(ending.killed)} still running {format_seconds(grace_s)} s"
                        " after SIGTERM: sent SIGKILL")
    if ending.stuck:
        evidence.append(f"{process_tree.name_processes(ending.stuck)} still there"
                        f" {format_seconds(process_tree.KILL_WAIT_S)} s after SIGKILL")
    write_json_atomic(state_dir / STOPPED, {"ended_at": utc_now().isoformat(), "evidence": evidence})
    os.close(fd)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--kill-tree":
        return kill_tree(Path(args[1]))
    foreground = len(args) == 2 and args[0] == "--foreground"
    if foreground:
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m trackway.executors.local_shim [--foreground] STATE_DIR", file=sys.stderr)
        return 2
    state_dir = Path(args[0])
    try:
        launch = read_json(state_dir / "launch.json")
        if launch is None:
            raise FileNotFoundError(f"no launch.json in {state_dir}")
    except Exception as exc:
        print(f"local shim cannot read its launch file: {exc}", file=sys.stderr)
        return 1
    # Fork once more so the shim is reparented to init: no submitter has to reap it, ever. In the
    # foreground (a batch job's step), the shim stays the process the scheduler started and watches.
    if not foreground and os.fork() != 0:
        os._exit(0)
    try:
        return Shim(state_dir, launch, foreground=foreground).run()
    except BaseException as exc:
        print(f"local shim failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        return 1


if __name__ == "__main__":
    sys.exit(main())
