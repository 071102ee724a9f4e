"""The processes of an attempt on Linux, read from /proc and signalled: who started when, who is whose, who is left.

Used by the shim (local_shim.py) that runs each attempt, by the local executor's host process and
by the SSH executor's agent: a process is named by its pid and its create time (a pid alone may
be reused), a job by its process group, its session, or the mark TREE_ENV=<token> its
descendants inherit. Stdlib only, like the shim, and shipped beside it to SSH hosts and Slurm
jobs (psutil only where /proc cannot be read).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

# Set in the command's environment, unique per attempt: what finds its processes once the shim is
# gone, even those that left its session (torchrun starts every rank with start_new_session=True).
TREE_ENV = "TRACKWAY_JOB_TREE"
PR_SET_CHILD_SUBREAPER = 36
# How long processes sent SIGKILL may take to go (a process in uninterruptible sleep holds on).
KILL_WAIT_S = 10.0
NAMED_MAX = 16  # processes named in one evidence line; the rest are counted
_boot_time: float | None = None


def _linux_boot_time() -> float:
    global _boot_time
    if _boot_time is None:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime"):
                    _boot_time = float(line.split()[1])
                    break
            else:
                raise OSError("no btime in /proc/stat")
    return _boot_time


def process_create_time(pid: int) -> float | None:
    """When `pid` started, in seconds since the epoch, or None if it does not exist or is a zombie.

    Computed as psutil does on Linux, read straight from /proc: psutil costs the shim ~25 ms to import.
    """
    if pid <= 0:
        return None
    try:
        # os.open and one read, not a file object: a supervisor asks this of every running attempt each tick.
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return _psutil_create_time(pid)
    return _create_time(_stat_fields(stat))


def _create_time(fields: list[bytes]) -> float | None:
    if fields[0] in _GONE:
        return None
    return _linux_boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")


_GONE = (b"Z", b"X")  # a zombie, or dead: still listed in /proc, no longer running


def launch_times(pid: int) -> tuple[float | None, datetime]:
    """A command just launched: its `process_create_time` (which names the process) and when it started, in UTC.

    What launched a command learns its pid only once the command runs, later still on a loaded host: the
    time taken then would cut the start of every attempt short. The start is now less the process's age, to
    Linux's 10 ms tick (now where /proc does not say), not the create time: that adds ticks to /proc/stat's
    boot time, which is whole seconds. Both come from one read of /proc/PID/stat.
    """
    now = datetime.now(timezone.utc)
    fields = _read_stat(pid)
    if fields is None:
        return process_create_time(pid), now  # gone, or /proc unreadable: psutil's create time, if it has one
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _create_time(fields), now
    return _create_time(fields), now - timedelta(seconds=min(max(age, 0.0), uptime))


def _stat_fields(stat: bytes) -> list[bytes]:
    """/proc/PID/stat's fields after the command's name (which may hold spaces and ")"): the state first."""
    return stat[stat.rindex(b")") + 2 :].split()


def _psutil_create_time(pid: int) -> float | None:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def same_process(pid: int | None, create_time: float | None) -> bool:
    """Whether `pid` is alive and is still the process that started at `create_time` (not a reused pid)."""
    if pid is None or create_time is None:
        return False
    now = process_create_time(pid)
    # btime in /proc/stat is whole seconds and follows clock adjustments, so allow a second of slack.
    return now is not None and abs(now - create_time) < 1.0


def group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid`; False when the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


GROUP_NOT_SAID = -1  # process_groups' key for the processes getpgid() would not tell the group of


def group_members(pgid: int) -> list[int]:
    """Live pids in process group `pgid` (Linux /proc; empty where there is none).

    Every shim asks this as its command ends, and a machine running hundreds of attempts has
    thousands of processes: each is asked with one getpgid() call (~1 µs), and only the group's
    own are read from /proc to leave out zombies. Reading every process's /proc stat (~20 µs
    each) made a burst of 80 ends cost the machine seconds of CPU.
    """
    return live_members(process_groups(), pgid)


def all_pids() -> list[int]:
    """Every pid /proc lists now (none where /proc cannot be read)."""
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def process_groups() -> dict[int, list[int]]:
    """Every process's pid by its process group, as getpgid() says (zombies included: see `live_members`); those
    whose group getpgid() would not say under GROUP_NOT_SAID."""
    groups: dict[int, list[int]] = {}
    for pid in all_pids():
        try:
            pgid = os.getpgid(pid)
        except PermissionError:
            pgid = GROUP_NOT_SAID  # a security module may refuse to say: /proc does, in live_members
        except OSError:  # gone meanwhile
            continue
        groups.setdefault(pgid, []).append(pid)
    return groups


def live_members(groups: dict[int, list[int]], pgid: int) -> list[int]:
    """The pids `process_groups` found in process group `pgid` (or whose group it was not told) that are alive
    (not zombies) and in that group, as /proc says now."""
    members = []
    for pid in groups.get(pgid, []) + groups.get(GROUP_NOT_SAID, []):
        fields = _read_stat(pid)
        if fields is not None and fields[0] not in _GONE and int(fields[2]) == pgid:
            members.append(pid)
    return members


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux prctl), so they stay below it.

    A process that leaves the job's session still has the shim above it, whatever its own parent
    does; False where the kernel does not offer it (then only the group and the scan find them).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _read_stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return _stat_fields(f.read())
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    """Direct children of `pid` from /proc/PID/task/TID/children (each thread lists those it forked or adopted)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids.extend(int(kid) for kid in f.read().split())
        except OSError:
            continue
    return kids


def _children_by_scan() -> dict[int, list[int]]:
    """Every process's children, from each one's parent in /proc (kernels without the children files)."""
    table: dict[int, list[int]] = {}
    for pid in all_pids():
        if (fields := _read_stat(pid)) is not None:
            table.setdefault(int(fields[1]), []).append(pid)
    return table


def descendants(root: int) -> list[int]:
    """The live processes below `root` (zombies left out), parents before their children."""
    if os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        children_of = _children
    else:
        table = _children_by_scan()
        children_of = lambda pid: table.get(pid, [])  # noqa: E731
    found, queue, seen = [], [root], {root}
    while queue:
        for kid in children_of(queue.pop(0)):
            if kid not in seen:
                seen.add(kid)
                queue.append(kid)
                found.append(kid)
    return [pid for pid in found if (fields := _read_stat(pid)) is not None and fields[0] not in _GONE]


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "name not known"
    except OSError:
        return "name not known"


def name_processes(named: list[tuple[int, str]]) -> str:
    """`pid 4101 (python3), pid 4102 (python3)`: at most NAMED_MAX of them, the rest counted."""
    text = ", ".join(f"pid {pid} ({name})" for pid, name in named[:NAMED_MAX])
    return text + (f" and {len(named) - NAMED_MAX} more" if len(named) > NAMED_MAX else "")


def processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"


def handles(pid: int, signum: int) -> bool:
    """Whether `pid` has a handler for `signum` (its SigCgt mask in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def job_survivors(job: dict) -> list[int]:
    """Live processes of a job whose shim is gone: in its group or session, or with its mark in their environment.

    Read from every process in /proc (the environment only of those this user may read): for
    the rare case of a dead shim, never on a running attempt's path.
    """
    pgid = job.get("pgid")
    token = job.get("tree_token")
    mark = f"{TREE_ENV}={token}".encode() if token else None
    started = job.get("child_create_time") or 0.0
    found = []
    me = os.getpid()
    for pid in all_pids():
        if pid == me:
            continue
        fields = _read_stat(pid)
        if fields is None or fields[0] in _GONE:
            continue
        # Started with or after the command: a pid reused as a group or session id later is not the job's.
        if pgid and pgid in (int(fields[2]), int(fields[3])):
            created = process_create_time(pid)
            if created is not None and created >= started - 1.0:
                found.append(pid)
                continue
        if mark is not None and _environ_has(pid, mark):
            found.append(pid)
    return found


def _environ_has(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


class Ending:
    """What stopping a job's leftover processes did, as (pid, name) pairs: sent SIGTERM, needed SIGKILL, outlived it."""

    def __init__(self) -> None:
        self.termed: list[tuple[int, str]] = []
        self.killed: list[tuple[int, str]] = []
        self.stuck: list[tuple[int, str]] = []


def end_processes(find: Callable[[], list[int]], grace_s: float, termed: bool,
                  wait: Callable[[float], None] = time.sleep) -> Ending:
    """Stop every process `find()` returns: SIGTERM (unless `termed`: it was sent already), the grace, SIGKILL.

    `find()` is asked again while waiting, so a process forked meanwhile is stopped too; returns
    once none is left, or KILL_WAIT_S after the SIGKILL with the ones still there in `stuck`.
    """
    ending = Ending()
    names: dict[int, str] = {}

    def left() -> list[int]:
        pids = find()
        for pid in pids:
            names.setdefault(pid, process_name(pid))
        return pids

    pids = left()
    if pids and not termed:
        signal_each(pids, signal.SIGTERM)
        signal_each(pids, signal.SIGCONT)  # a stopped process would sit on the SIGTERM
        ending.termed = [(pid, names[pid]) for pid in pids]
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            wait(0.05)
            pids = left()
    deadline = time.monotonic() + KILL_WAIT_S
    killed: set[int] = set()
    while pids:
        signal_each(pids, signal.SIGKILL)
        ending.killed += [(pid, names[pid]) for pid in pids if pid not in killed]
        killed.update(pids)
        if time.monotonic() >= deadline:
            ending.stuck = [(pid, names[pid]) for pid in pids]
            break
        wait(0.05)
        pids = left()
    return ending


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
