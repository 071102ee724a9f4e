"""The supervisor at work: preemption notice → resumed attempt's first new step, and receipts over 500 runs.

Targets (issues 4 and 12): notice → first new step of the resumed attempt ≤ 5 s plus model load
(the script here loads no model), with the supervisor ticking at its default 1 s interval.
Receipt latency (issue 39): 1,000 runs on the local executor that all end at once, driven by
`trackway supervise` in its own process as a user runs it; for every attempt, the time from its
process's end (the shim's `exit.json`) to its receipt being readable in the ledger, polled every
50 ms from outside. The target is p99 ≤ 1 s on a quiet machine; on this shared 2-core machine
the load of the moment moves it several-fold (the other helpers' work: loads of 2 to 22 were seen
within one hour), so the figure is a ratio to a floor measured in the same run, after the ends: the same
1,000 exit.json files read and 1,000 rows updated in one sqlite3 transaction (the least any
supervisor does per end), median of 5. Baseline for the first figure, measured in the same run:
starting the same script cold with `subprocess` and waiting for its first step (what a restart
costs without any supervisor).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.records import latest_attempt  # noqa: E402
from trackway.settings import load_settings  # noqa: E402
from trackway.supervisor.launch import start_attempt  # noqa: E402
from trackway.supervisor.submit import RunSpec, submit_run  # noqa: E402
from trackway.supervisor.loop import Supervisor  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "1000"))
# p99 over the floor (see the module docstring): 1 s over a quiet machine's floor. Quiet runs of this
# bench on 2026-11-29 (2 cores, load under 1 before the burst) measured the floor at 11.8-14.5 ms:
# 1 s / 13 ms. (Until then it was taken as about 50 ms, that is 20x.)
RECEIPT_TARGET_RATIO = 75.0
SCRIPT = textwrap.dedent(
    """
    import sys, time, trackway
    run = trackway.init(checkpoint_every_steps=20)
    latest = run.checkpoints.latest()
    start = int((latest.path / "s").read_text()) + 1 if latest else 0
    print("first-step", start, time.time(), flush=True)
    for step in range(start, 100000):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        time.sleep(0.01)
        if run.checkpoints.due(step) or run.should_stop:
            with run.checkpoints.writing(step) as d:
                (d / "s").write_text(str(step))
        if run.should_stop:
            run.exit_preempted()
    """
)


def _first_step_time(log: Path) -> float | None:
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        if " first-step " in line:
            return float(line.split()[-1])
    return None


def notice_to_resume(tmp: Path) -> tuple[float, float]:
    os.environ["TRACKWAY_HOME"] = str(tmp / "home")
    os.environ["TRACKWAY_DB"] = f"sqlite:///{tmp / 'ledger.db'}"
    script = tmp / "loop.py"
    script.write_text(SCRIPT)
    settings = load_settings()
    ledger = open_ledger(settings.db_url)
    supervisor = Supervisor(ledger, settings)
    run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, str(script)], cwd=tmp))
    first = start_attempt(ledger, settings, run_id, supervisor.executor("local"))
    state = settings.runs_dir / run_id / "attempts"
    while _first_step_time(state / "1" / "output.log") is None:
        time.sleep(0.05)
    time.sleep(1.0)
    job = json.loads((state / "1" / "job.json").read_text())
    notice = time.time()
    os.kill(job["shim_pid"], signal.SIGTERM)
    while (resumed := _first_step_time(state / "2" / "output.log")) is None:
        supervisor.tick()
        time.sleep(1.0)  # `trackway supervise`'s default interval
    with ledger.read() as conn:
        second = latest_attempt(conn, run_id)
    supervisor.cancel(run_id)
    ledger.dispose()
    assert first.endswith("/1") and second["attempt_number"] == 2
    started = time.time()
    cold = subprocess.Popen([sys.executable, "-c", "import time, trackway; print(time.time(), flush=True)"],
                            stdout=subprocess.PIPE, text=True)
    baseline = float(cold.stdout.readline()) - started
    cold.wait()
    return resumed - notice, baseline


def receipt_latencies(tmp: Path) -> tuple[list[float], float]:
    """Seconds from each attempt's end to its receipt in the ledger, for RUNS runs ending at once; and the floor."""
    env = {**os.environ, "TRACKWAY_HOME": str(tmp / "home500"), "TRACKWAY_DB": f"sqlite:///{tmp / 'ledger500.db'}",
           "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    os.environ.update(env)
    settings = load_settings()
    ledger = open_ledger(settings.db_url)
    launcher = Supervisor(ledger, settings)
    print(f"starting {RUNS} runs of `sleep 5` that end at once, under `trackway supervise` ...", flush=True)
    supervise = subprocess.Popen([sys.executable, "-m", "trackway", "supervise"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Every run waits on a shared lock the bench holds until all are launched, so that the
    # launching (about 0.1 s a run) is not what the receipts wait for: then all sleep at once.
    gate = tmp / "gate.lock"
    hold = os.open(gate, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(hold, fcntl.LOCK_EX)
    for i in range(RUNS):
        work = ["sleep", "5"] if i % 10 else ["sh", "-c", "sleep 5; exit 3"]
        run_id = submit_run(ledger, settings, RunSpec(command=["flock", "-s", str(gate), *work], cwd=tmp))
        start_attempt(ledger, settings, run_id, launcher.executor("local"))
    ledger.dispose()
    os.close(hold)  # the runs start
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 120
    try:
        with sqlite3.connect(tmp / "ledger500.db", timeout=30) as conn:
            while len(seen) < RUNS and time.monotonic() < deadline:
                now = time.time()
                for attempt_id, ended_at in conn.execute(
                        "SELECT attempt_id, ended_at FROM attempts WHERE state = 'ended'"):
                    if attempt_id not in seen:
                        ended = datetime.fromisoformat(ended_at).replace(tzinfo=timezone.utc).timestamp()
                        seen[attempt_id] = now - ended
                time.sleep(0.05)
    finally:
        # SIGTERM, not SIGINT: a bench started in the background (`make bench &`) starts its children
        # with SIGINT ignored, and a supervise left ticking would slow every bench after this one.
        supervise.terminate()
        try:
            supervise.wait(30)
        except subprocess.TimeoutExpired:
            supervise.kill()
            supervise.wait()
    if len(seen) < RUNS:
        raise SystemExit(f"only {len(seen)} of {RUNS} receipts were recorded in 120 s: {supervise.stderr.read()[-500:]}")
    return list(seen.values()), recording_floor(tmp / "ledger500.db", settings.runs_dir)


def recording_floor(db: Path, runs_dir: Path, repeat: int = 5) -> float:
    """Median seconds to read every attempt's exit.json and update as many rows in one sqlite3 transaction."""
    exits = sorted(runs_dir.glob("*/attempts/*/exit.json"))
    samples = []
    # Autocommit: the transaction timed is the one this function begins.
    with sqlite3.connect(db, timeout=30, isolation_level=None) as conn:
        conn.execute("CREATE TEMP TABLE floor (attempt TEXT PRIMARY KEY, ended_at TEXT, exit_code INTEGER)")
        conn.executemany("INSERT INTO floor (attempt) VALUES (?)", [(str(path.parent),) for path in exits])
        for _ in range(repeat):
            started = time.perf_counter()
            rows = [(ended["ended_at"], ended["exit_code"], str(path.parent))
                    for path in exits for ended in (json.loads(path.read_bytes()),)]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("UPDATE floor SET ended_at = ?, exit_code = ? WHERE attempt = ?", rows)
            conn.execute("COMMIT")
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        resume_s, baseline_s = notice_to_resume(Path(tmp))
        ok = figure("preemption notice → resumed attempt's first new step", resume_s, target=5.0, baseline=baseline_s,
                    baseline_name="cold start of the script")
        latencies, floor = receipt_latencies(Path(tmp))
        latencies.sort()
    figure(f"attempt end → receipt in the ledger, median of {RUNS} ending at once", statistics.median(latencies))
    ok &= figure(f"attempt end → receipt in the ledger, p99 of {RUNS} ending at once",
                 latencies[int(0.99 * (len(latencies) - 1))], baseline=floor,
                 baseline_name="reading the exit.json files, one executemany", target_ratio=RECEIPT_TARGET_RATIO)
    figure(f"attempt end → receipt in the ledger, slowest of {RUNS} ending at once", latencies[-1])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
