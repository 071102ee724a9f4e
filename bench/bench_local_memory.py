"""Memory the local executor's control plane holds per running attempt, and whether every receipt is still right.

N attempts (BENCH_ATTEMPTS, default 200) are submitted on the local executor and held running: each
runs `flock -s LOCK true`, which waits, idle like a `sleep`, until the bench releases LOCK, then
exits 0. With all N running, the figure is the proportional set size (PSS, psutil's
memory_full_info) summed over every process of the control plane (each attempt's shim, and
whatever serves them all: any process whose command line names this bench's directory), the
attempts' own processes left out, divided by N. PSS counts a page shared by k processes as 1/k
of a page in each, so the sum is the physical memory those processes hold together; the unique
set size (USS, what killing one would free) is printed beside it.

Target (issue 39): ≤ 2 MB per attempt, absolute: memory held is not a matter of machine load.
Then LOCK is released and every attempt must end recorded with exit code 0 (exit.json, through
the executor's poll): a smaller shim that loses a receipt would be no gain.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

import psutil  # noqa: E402

from trackway.executors.base import JobPhase, LaunchRequest  # noqa: E402
from trackway.executors.local import LocalExecutor  # noqa: E402
from trackway.executors.local_shim import read_json  # noqa: E402

ATTEMPTS = int(os.environ.get("BENCH_ATTEMPTS", "200"))
TARGET_MB = 2.0
END_TIMEOUT_S = 120.0


def control_plane(root: Path, commands: set[int]) -> list[psutil.Process]:
    """This bench's processes that are not an attempt's own: named by their command line, or a job.json's shim."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid in commands or proc.pid == os.getpid():
                continue
            if any(str(root) in part for part in proc.info["cmdline"] or ()):
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for job_file in root.rglob("job.json"):
        pid = (read_json(job_file) or {}).get("shim_pid")
        if pid and pid not in found:
            try:
                found[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                pass
    return list(found.values())


def attempt_processes(root: Path) -> set[int]:
    """The attempts' commands and everything below them."""
    pids = set()
    for job_file in root.rglob("job.json"):
        child = (read_json(job_file) or {}).get("child_pid")
        if not child:
            continue
        try:
            proc = psutil.Process(child)
            pids.add(child)
            pids.update(kid.pid for kid in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return pids


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-local-memory-"))
    executor = LocalExecutor(root / "home", gpu_inventory=lambda: [])
    lock_path = root / "hold.lock"
    hold = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(hold, fcntl.LOCK_EX)
    handles = []
    try:
        started = time.perf_counter()
        for number in range(1, ATTEMPTS + 1):
            state_dir = root / "attempts" / str(number)
            request = LaunchRequest(attempt_id=f"r0000000000/{number}", command=["flock", "-s", str(lock_path), "true"],
                                    cwd=root, env={}, state_dir=state_dir, log_path=state_dir / "output.log")
            handles.append(executor.submit(request).handle)
        submit_s = time.perf_counter() - started
        time.sleep(1.0)  # the last shims settle (their first samples, their pump threads)
        commands = attempt_processes(root)
        pss = uss = 0
        processes = control_plane(root, commands)
        for proc in processes:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            pss += info.pss
            uss += info.uss
        running = sum(executor.poll(handle).phase is JobPhase.RUNNING for handle in handles)
        print(f"{ATTEMPTS} attempts submitted in {submit_s:.1f} s, {running} running; control plane: "
              f"{len(processes)} processes, PSS {pss / 2**20:.1f} MB, USS {uss / 2**20:.1f} MB in all", flush=True)
        ok = figure(f"control-plane memory per running local attempt (PSS, {ATTEMPTS} attempts)",
                    pss / 2**20 / ATTEMPTS, unit="MB", target=TARGET_MB)
        # figure() shows MB without decimals: the figure to two places, and USS beside it.
        print(f"  per attempt: PSS {pss / 2**20 / ATTEMPTS:.2f} MB, USS {uss / 2**20 / ATTEMPTS:.2f} MB", flush=True)
    finally:
        fcntl.flock(hold, fcntl.LOCK_UN)
        os.close(hold)
    deadline = time.monotonic() + END_TIMEOUT_S
    statuses = {}
    while time.monotonic() < deadline and len(statuses) < len(handles):
        for handle in handles:
            if handle.job_id not in statuses:
                status = executor.poll(handle)
                if status.phase.is_terminal():
                    statuses[handle.job_id] = status
        time.sleep(0.2)
    right = sum(status.phase is JobPhase.ENDED and status.exit_code == 0 and status.signal is None
                for status in statuses.values())
    wrong = [f"{job_id}: {status}" for job_id, status in statuses.items()
             if not (status.phase is JobPhase.ENDED and status.exit_code == 0)]
    print(f"receipts: {right} of {ATTEMPTS} attempts ended recorded with exit code 0", flush=True)
    for line in wrong[:5]:
        print(f"  wrong: {line}", flush=True)
    receipts_ok = figure("attempts whose end is recorded with exit code 0", right, unit="attempts",
                         target=ATTEMPTS, higher_is_better=True)
    shutil.rmtree(root, ignore_errors=True)
    return 0 if ok and receipts_ok else 1


if __name__ == "__main__":
    sys.exit(main())
