"""The "inline" executor: attempts a script records itself when run without trackway (`trackway.init()` alone).

trackway did not start such a process, so it cannot start another: `submit` is refused. It
can still tell whether the process lives (pid and start time in the job id, so a reused pid
is not mistaken for it), end it, and report it vanished when it died before recording its end.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from trackway.errors import InputError
from trackway.executors.base import Executor, JobHandle, JobPhase, JobStatus, LaunchRequest, Submission
from trackway.executors.process_tree import process_create_time, same_process


def inline_job_id(pid: int) -> str:
    return f"{pid}@{process_create_time(pid) or 0:.2f}"


def _parse(job_id: str) -> tuple[int | None, float | None]:
    pid_text, _, created_text = job_id.partition("@")
    try:
        return int(pid_text), float(created_text) if created_text else None
    except ValueError:
        return None, None


def _refused() -> InputError:
    return InputError(
        "executor 'inline': runs recorded by a script alone cannot be relaunched by trackway; "
        "submit the script with `trackway submit` to get retries"
    )


class InlineExecutor(Executor):
    name = "inline"

    def __init__(self, home: Path):
        self.home = home

    def submit(self, request: LaunchRequest) -> Submission:
        raise _refused()

    def preview(self, request: LaunchRequest) -> str:
        """Submit starts nothing here: a preview is refused with submit's own words."""
        raise _refused()

    def poll(self, handle: JobHandle) -> JobStatus:
        pid, created = _parse(handle.job_id)
        if pid is not None and (same_process(pid, created) if created else process_create_time(pid) is not None):
            return JobStatus(phase=JobPhase.RUNNING)
        return JobStatus(
            phase=JobPhase.VANISHED,
            evidence=(f"the script's process (pid {pid}) is gone and did not record its end in the ledger",),
        )

    def cancel(self, handle: JobHandle) -> None:
        pid, created = _parse(handle.job_id)
        if pid is not None and same_process(pid, created):
            os.kill(pid, signal.SIGTERM)

    def logs(self, handle: JobHandle) -> Path:
        return handle.state_dir / "output.log"
