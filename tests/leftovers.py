"""Nothing a test session started outlives it: pytest hooks, used by tests/conftest.py and by its own test.

Processes are found by the session's temporary directory in their command line or working directory
(sshd test hosts, training scripts, shims, background supervisors all run from there). Under xdist each
worker checks its own, and the controller fails the run with what any worker found: a worker's own
exit status never reaches the run's.
"""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

# How long a process still ending may take; its own test sets less, to see a leak found without the wait.
LEFTOVER_GRACE_S = float(os.environ.get("TRACKWAY_TEST_LEFTOVER_GRACE_S", "15"))


def pytest_sessionfinish(session, exitstatus):
    """Every process started from this session's temporary directories (sshd test hosts, training scripts, shims,
    background supervisors) must have ended with its test: one still alive after a short grace is killed, named,
    and fails the run, so that the next suite on the machine does not inherit it."""
    found_by_workers = getattr(session.config, "_leftover_processes", None)
    if found_by_workers:
        _fail(session, found_by_workers)
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        base = str(factory.getbasetemp())
    except (OSError, ValueError):
        return
    ours = {os.getpid(), *(p.pid for p in psutil.Process().parents())}

    def leftovers() -> list:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
            try:
                if proc.info["pid"] in ours:
                    continue
                if base in " ".join(proc.info["cmdline"] or []) or (proc.info["cwd"] or "").startswith(base):
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    deadline = time.monotonic() + LEFTOVER_GRACE_S
    alive = leftovers()
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if not alive:
        return
    said = []
    for proc in alive:
        try:
            said.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            continue
    if said:
        _fail(session, said)


def _fail(session, said: list[str]) -> None:
    sys.stderr.write("processes this test session started were still alive at its end (killed now):\n  "
                     + "\n  ".join(said) + "\n")
    session.exitstatus = 1
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: told to the controller (pytest_testnodedown)
        workeroutput["leftover_processes"] = said


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """In the controller: a worker that found processes left alive fails the run."""
    said = getattr(node, "workeroutput", {}).get("leftover_processes")
    if said:
        node.config._leftover_processes = [*getattr(node.config, "_leftover_processes", []), *said]

