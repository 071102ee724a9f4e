"""Receipt latency at 10,000 concurrent attempts, all ending at once, under one supervisor.

Target (issue 39): for every attempt, the time from its end to its receipt being readable in
the ledger, p99 ≤ 2 s, and every one of the 10,000 receipts recorded.

The attempts run on an executor of this file's (`FileEndings`), not on processes: 10,000 shims
do not fit this machine, and what is measured is the supervisor's side of an end. It answers
`poll_many` from one endings file the bench writes at the moment they all end (exit code and
end time of each job), as the local executor answers from each attempt's `exit.json`, and says
so through the home's ended.fifo as the local host does after each `exit.json`; every
attempt has its `output.log`, and one in ten fails with a traceback (exit 3), so each receipt
is read, classified and decided as a real one. Runs are submitted and launched through
`submit_run` and `start_attempt` as any run is (ten of them; the rest copy their rows), in a project
whose trackway.toml declares its resource. The supervisor is `trackway supervise`'s
(supervision.supervisor_for, ticking every 1 s) in a process of its own, and the ledger is
polled every 50 ms from this one with sqlite3, as a user would read it. With two CPUs, that
supervisor records the burst in two processes, as it does anywhere (supervisor/burst_split.py).

`BENCH_ATTEMPTS` changes the count (default 10,000); `--supervise HOME` is the child's entry point.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

from trackway.executors.base import Executor, JobHandle, JobPhase, JobStatus, LaunchRequest, Submission  # noqa: E402
from trackway.executors.local_host import open_ended_signal, say_ended  # noqa: E402

ATTEMPTS = int(os.environ.get("BENCH_ATTEMPTS", "10000"))
TARGET_P99_S = 2.0
ENDINGS = "endings.json"
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "train.py", line 12, in <module>',
    "    loader = build_loader(cfg)",
    "ValueError: batch_size must divide the dataset's 4096 rows",
]


RUNNING = JobStatus(phase=JobPhase.RUNNING)  # one for every job still running: it is not changed


class FileEndings(Executor):
    """Jobs that run until the endings file names them: {job id: {exit_code, ended_at}}, written at once for all."""

    name = "local"

    def __init__(self, home: Path):
        self.home = Path(home)
        self.endings = self.home / ENDINGS
        self._read: tuple[float, dict] = (-1.0, {})
        self._signal: int | None = None

    def ended_signal(self) -> int | None:
        if self._signal is None:
            self._signal = open_ended_signal(self.home)
        return self._signal

    def submit(self, request: LaunchRequest) -> Submission:
        Path(request.log_path).parent.mkdir(parents=True, exist_ok=True)
        failing = request.env.get("BENCH_FAILS") == "1"
        Path(request.log_path).write_text("\n".join(["loading data", "step 0 loss 2.31", "step 1 loss 2.02",
                                                     *(TRACEBACK if failing else [])]) + "\n")
        return Submission(handle=JobHandle(self.name, request.attempt_id, Path(request.state_dir)), host="bench",
                          gpu_ids=[], gpu_model=None, started_at=datetime.now(timezone.utc), pid=None)

    def poll_many(self, handles: Iterable[JobHandle]) -> dict[str, JobStatus]:
        endings = self._endings()
        statuses = {}
        for handle in handles:
            ended = endings.get(handle.job_id)
            statuses[handle.job_id] = RUNNING if ended is None else JobStatus(
                phase=JobPhase.ENDED, exit_code=ended["exit_code"], signal=None,
                ended_at=datetime.fromtimestamp(ended["ended_at"], timezone.utc))
        return statuses

    def poll(self, handle: JobHandle) -> JobStatus:
        return self.poll_many([handle])[handle.job_id]

    def _endings(self) -> dict:
        try:
            mtime = self.endings.stat().st_mtime
        except FileNotFoundError:
            return {}
        if mtime != self._read[0]:
            self._read = (mtime, json.loads(self.endings.read_text()))
        return self._read[1]

    def cancel(self, handle: JobHandle) -> None:
        raise NotImplementedError("the bench cancels nothing")

    def logs(self, handle: JobHandle) -> Path:
        return handle.state_dir / "output.log"


TEMPLATES = 10  # runs submitted and launched as any run is; the rest are copies of their rows and files


def launch(home: Path, db_url: str, work: Path, count: int) -> list[tuple[str, bool]]:
    """`count` running attempts on FileEndings, one run each; (job id, fails) of each.

    The first TEMPLATES runs go through `submit_run` and `start_attempt` (about 60 ms a run here);
    the others copy one of them, its run and attempt rows and its output.log, under ids of their
    own, so that 10,000 attempts are ready in seconds rather than ten minutes.
    """
    import secrets

    from sqlalchemy import insert, select

    from trackway.ledger import open_ledger
    from trackway.ledger.schema import attempts, runs
    from trackway.settings import load_settings
    from trackway.supervisor.launch import start_attempt
    from trackway.supervisor.submit import RunSpec, submit_run

    settings = load_settings(home=home, db=db_url, cwd=work)
    ledger = open_ledger(db_url)
    executor = FileEndings(home)
    jobs = []
    for i in range(min(count, TEMPLATES)):
        fails = i % 10 == 0
        spec = RunSpec(command=["python", "train.py"], cwd=work, env={"BENCH_FAILS": "1" if fails else "0"})
        run_id = submit_run(ledger, settings, spec)
        jobs.append((start_attempt(ledger, settings, run_id, executor), fails))
    with ledger.read() as conn:
        run_rows = {row["run_id"]: dict(row) for row in conn.execute(select(runs)).mappings()}
        attempt_rows = [dict(row) for row in conn.execute(select(attempts)).mappings()]
    new_runs, new_attempts = [], []
    for i in range(len(jobs), count):
        template = attempt_rows[i % len(attempt_rows)]
        run_id = "r" + secrets.token_hex(5)
        state_dir = settings.runs_dir / run_id / "attempts" / "1"
        state_dir.mkdir(parents=True)
        (state_dir / "output.log").write_bytes(Path(template["log_path"]).read_bytes())
        new_runs.append({**run_rows[template["run_id"]], "run_id": run_id})
        attempt_id = f"{run_id}/1"
        new_attempts.append({**template, "attempt_id": attempt_id, "run_id": run_id, "executor_job_id": attempt_id,
                             "state_dir": str(state_dir), "log_path": str(state_dir / "output.log")})
        jobs.append((attempt_id, template["run_id"] == jobs[0][0].split("/")[0]))
    with ledger.write() as conn:
        for start in range(0, len(new_runs), 1000):
            conn.execute(insert(runs), new_runs[start:start + 1000])
            conn.execute(insert(attempts), new_attempts[start:start + 1000])
    ledger.dispose()
    return jobs


def supervise(home: Path, db_url: str, work: Path) -> None:
    """The child: `trackway supervise`'s loop over FileEndings, until SIGTERM."""
    from trackway.cli.supervise_cmd import tell
    from trackway.ledger import open_ledger
    from trackway.settings import load_settings
    from trackway.supervision import supervisor_for

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    settings = load_settings(home=home, db=db_url, cwd=work)
    executor = FileEndings(home)
    supervisor = supervisor_for(open_ledger(db_url), settings, executor_for=lambda name: executor)
    supervisor.run(lambda: bool(stop), interval_s=1.0, on_ends=tell)


def receipt_latencies(tmp: Path, count: int) -> tuple[list[float], int]:
    """Seconds from the common end to each receipt readable in the ledger, and how many were recorded."""
    home, work, db = tmp / "home", tmp / "work", tmp / "ledger.db"
    work.mkdir()
    # A project as a user's is: its trackway.toml declares where it runs and what a GPU hour costs, and
    # each end is priced (and its retry placed) by that file.
    (work / "trackway.toml").write_text('[resources.here]\nexecutor = "local"\ncost_per_gpu_hour = 1.5\n')
    db_url = f"sqlite:///{db}"
    print(f"submitting and launching {count} runs on a file-driven executor ...", flush=True)
    jobs = launch(home, db_url, work, count)
    env = {**os.environ, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    child = subprocess.Popen([sys.executable, __file__, "--supervise", str(home), db_url, str(work)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: dict[str, float] = {}
    try:
        time.sleep(5)  # a few ticks over the running attempts first: the supervisor as it is when they end
        if child.poll() is not None:
            raise SystemExit(f"the supervisor exited: {child.stderr.read()[-2000:]}")
        ended_at = time.time()
        endings = {job: {"exit_code": 3 if fails else 0, "ended_at": ended_at} for job, fails in jobs}
        part = home / (ENDINGS + ".part")
        part.write_text(json.dumps(endings))
        os.replace(part, home / ENDINGS)
        say_ended(home)
        deadline = time.monotonic() + 120
        with sqlite3.connect(db, timeout=30) as conn:
            while len(seen) < count and time.monotonic() < deadline:
                now = time.time()
                for (attempt_id,) in conn.execute("SELECT attempt_id FROM attempts WHERE state = 'ended' "
                                                  "AND attempt_number = 1"):
                    seen.setdefault(attempt_id, now - ended_at)
                time.sleep(0.05)
    finally:
        child.terminate()
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    with sqlite3.connect(db) as conn:
        recorded = conn.execute("SELECT count(*) FROM attempts WHERE attempt_number = 1 AND state = 'ended' "
                                "AND termination_reason IS NOT NULL AND retry_decision IS NOT NULL").fetchone()[0]
    if len(seen) < count:
        print(f"only {len(seen)} of {count} receipts were recorded in 120 s: {child.stderr.read()[-2000:]}")
    return sorted(seen.values()), recorded


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        latencies, recorded = receipt_latencies(Path(tmp), ATTEMPTS)
    ok = figure(f"receipts recorded of {ATTEMPTS} attempts ending at once", recorded, unit="receipts",
                target=ATTEMPTS, higher_is_better=True)
    if latencies:
        # The first receipt says how long the burst waits before any is written (the tick under way, the
        # poll of every attempt); the rest of the p99 is the cost of each receipt after it.
        figure(f"attempt end → first receipt, of {ATTEMPTS} ending at once", latencies[0])
        figure(f"attempt end → receipt, median of {ATTEMPTS} ending at once", statistics.median(latencies))
        ok &= figure(f"attempt end → receipt, p99 of {ATTEMPTS} ending at once",
                     latencies[int(0.99 * (len(latencies) - 1))] if len(latencies) == ATTEMPTS else float("inf"),
                     target=TARGET_P99_S)
        figure(f"attempt end → receipt, slowest of {ATTEMPTS} ending at once", latencies[-1])
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--supervise"]:
        supervise(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    else:
        sys.exit(main())
