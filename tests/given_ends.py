"""An executor whose jobs run until a test says they ended: a supervisor's recording of ends, tested on a real ledger.

It reports the ends a test gives it as the local executor reports an `exit.json`, and writes each
attempt's log as a failing script's: a traceback after a first step.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from trackway.executors.base import Executor, JobHandle, JobPhase, JobStatus, Submission


class Given(Executor):
    """Jobs that run until the test ends them: `ended[job id] = exit code`."""

    name = "local"

    def __init__(self):
        self.ended: dict[str, int] = {}

    def submit(self, request):
        Path(request.log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(request.log_path).write_text("step 0\nTraceback (most recent call last):\nValueError: bad batch\n")
        return Submission(JobHandle(self.name, request.attempt_id, Path(request.state_dir)), host="here", gpu_ids=[],
                          gpu_model=None, started_at=datetime.now(timezone.utc), pid=None)

    def poll(self, handle):
        code = self.ended.get(handle.job_id)
        if code is None:
            return JobStatus(phase=JobPhase.RUNNING)
        return JobStatus(phase=JobPhase.ENDED, exit_code=code, ended_at=datetime.now(timezone.utc))

    def cancel(self, handle):
        raise NotImplementedError

    def logs(self, handle):
        return Path(handle.state_dir) / "output.log"
