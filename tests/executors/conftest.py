"""Helpers for executor tests: real processes, polled with generous deadlines (CI runs on 2 loaded cores)."""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
import waiting

from trackway.executors.base import Executor, JobHandle, JobPhase, JobStatus, LaunchRequest
from trackway.executors.local import LocalExecutor
from trackway.executors.local_shim import read_json
from trackway.executors.process_tree import process_create_time, same_process

DEADLINE_S = 30.0


def wait_for(predicate, what: str, timeout: float = DEADLINE_S, interval: float = 0.02):
    """tests/waiting.py's, asked more often: executors answer in milliseconds."""
    return waiting.wait_for(predicate, what, timeout, interval)


def wait_terminal(executor: Executor, handle: JobHandle, timeout: float = DEADLINE_S) -> JobStatus:
    def terminal():
        status = executor.poll(handle)
        return status if status.phase.is_terminal() else None

    return wait_for(terminal, f"job {handle.job_id} to end", timeout)


def wait_ended(executor: Executor, handle: JobHandle, timeout: float = DEADLINE_S) -> JobStatus:
    status = wait_terminal(executor, handle, timeout)
    assert status.phase is JobPhase.ENDED, status
    return status


def is_alive(pid: int) -> bool:
    return process_create_time(pid) is not None


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *map(str, args)]


LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6})Z (out|err) (.*)$")


def log_lines(path: Path) -> list[tuple[datetime, str, str]]:
    """The log as (UTC time, "out" | "err", text); fails on any line not in the log format."""
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        match = LOG_LINE.match(raw)
        assert match, f"not a log line: {raw!r}"
        stamp = datetime.fromisoformat(match[1]).replace(tzinfo=timezone.utc)
        lines.append((stamp, match[2], match[3]))
    return lines


def log_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


@dataclass(frozen=True)
class FakeGpu:
    """Shaped like trackway.receipts.placement.GpuInfo."""

    index: int
    uuid: str = "GPU-fake"
    name: str = "NVIDIA Fake 80GB"
    memory_total_bytes: int = 80 << 30
    memory_used_bytes: int = 0
    processes: int = 0


class Requests:
    """Builds LaunchRequests, each with its own state directory under tmp_path."""

    def __init__(self, root: Path):
        self.root = root
        self.count = 0

    def __call__(self, command: list[str], **kwargs) -> LaunchRequest:
        self.count += 1
        state_dir = self.root / "attempts" / str(self.count)
        kwargs.setdefault("cwd", self.root)
        kwargs.setdefault("env", {})
        kwargs.setdefault("log_path", state_dir / "output.log")
        return LaunchRequest(attempt_id=f"r0000000000/{self.count}", command=command, state_dir=state_dir, **kwargs)


@pytest.fixture
def make_request(tmp_path: Path) -> Requests:
    return Requests(tmp_path)


@pytest.fixture(autouse=True)
def _kill_leftover_jobs(tmp_path: Path):
    """A failed test must not leave its sleepers behind: kill every job still running under tmp_path."""
    yield
    for job_file in tmp_path.rglob("job.json"):
        job = read_json(job_file)
        if same_process(job["shim_pid"], job["create_time"]):
            try:
                os.kill(job["shim_pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass  # it ended between the look and the kill
        if job["pgid"] and same_process(job["child_pid"], job["child_create_time"]):
            try:
                os.killpg(job["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def executor(tmp_path: Path) -> LocalExecutor:
    return LocalExecutor(tmp_path / "home", gpu_inventory=lambda: [])
