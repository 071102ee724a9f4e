"""Submit-to-process-start overhead of the local executor.

Target (issue 2): trackway's overhead under 0.5 s. Each trial starts a child that prints the
wall clock as its first statement; the figure is the time from `LocalExecutor.submit()` being
called to that print. Baseline, in the same run: `subprocess.Popen` of the same child, which
is what starting any Python process costs on this machine. The end-to-end `trackway submit
--detach` (CLI start, receipts, ledger writes) is printed too, for information.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report  # noqa: E402

from trackway.executors.base import LaunchRequest  # noqa: E402
from trackway.executors.local import LocalExecutor  # noqa: E402

TRIALS = 10
CHILD = [sys.executable, "-S", "-c", "import time, sys; sys.stdout.write(repr(time.time())); sys.stdout.flush()"]


def _wait_for_number(path: Path, timeout_s: float = 20.0) -> float:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = path.read_text() if path.exists() else ""
        for token in reversed(text.split()):
            try:
                return float(token)
            except ValueError:
                continue
        time.sleep(0.002)
    raise SystemExit(f"no start time appeared in {path}")


def trackway_start(home: Path, i: int) -> float:
    executor = LocalExecutor(home)
    state = home / f"attempt-{i}"
    request = LaunchRequest(
        attempt_id=f"rbench/{i}", command=CHILD, cwd=home, env={}, state_dir=state, log_path=state / "output.log"
    )
    called = time.time()
    executor.submit(request)
    return _wait_for_number(state / "output.log") - called


def popen_start(home: Path, i: int) -> float:
    out = home / f"popen-{i}.txt"
    called = time.time()
    with out.open("w") as f:
        subprocess.Popen(CHILD, stdout=f).wait()
    return _wait_for_number(out) - called


def cli_submit(home: Path, i: int) -> float:
    env = {**os.environ, "TRACKWAY_HOME": str(home / "cli"), "TRACKWAY_DB": f"sqlite:///{home / 'cli.db'}"}
    called = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "trackway", "submit", "--detach", "--", *CHILD],
        cwd=home, env=env, capture_output=True, text=True, check=True,
    )
    run_id = out.stdout.split()[0]
    return _wait_for_number(home / "cli" / "runs" / run_id / "attempts" / "1" / "output.log") - called


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        cli_submit(home, -1)  # first use migrates the ledger; not what is measured
        baseline = statistics.median(popen_start(home, i) for i in range(TRIALS))
        ours = statistics.median(trackway_start(home, i) for i in range(TRIALS))
        cli = statistics.median(cli_submit(home, i) for i in range(TRIALS))
    report("plain Popen of the child (baseline)", baseline)
    ok = report("LocalExecutor.submit() → child's first statement", ours, baseline=baseline)
    ok &= report("  of which trackway's overhead", ours - baseline, target=0.5)
    report("`trackway submit --detach` → child's first statement", cli, baseline=baseline)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
