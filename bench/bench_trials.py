"""The slow fault trials: the tests marked `slow`, which `make test` leaves out, run here and must all pass.

They are whole-minute Slurm time limits, time limits on every executor, a run cut into pieces on
Slurm's tiers, every launcher of every framework preempted and resumed, two-rank checkpoint shards,
the example agent: minutes of real waiting each, for paths the suite also crosses once by a
shorter route. This runs them as the suite runs (pytest, real components, three workers) and prints
how many passed, which failed, and how long they took. `make trials` runs this alone.

    python bench/bench_trials.py [PYTEST_ARGS...]   # e.g. -k slurm
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, junit_outcomes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_trials(extra: list[str]) -> tuple[int, list[str], int, float]:
    """(tests run, the failed ones' ids, pytest's exit status, seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "trials.xml"
        env = {**os.environ, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "slow", "-n", "3", "--dist", "loadfile",
                               "-p", "no:cacheprovider", "-q", f"--junitxml={report}", *extra],
                              cwd=ROOT, env=env)
        took = time.monotonic() - started
        if not report.exists():
            return 0, [], done.returncode, took
        ran, failed = junit_outcomes(report)
    return ran, failed, done.returncode, took


def main(argv: list[str]) -> int:
    ran, failed, status, took = run_trials(argv)
    for name in failed:
        print(f"trial failed: {name}")
    ok = figure("slow fault trials passed (pytest -m slow)", ran - len(failed), unit="trials",
                target=max(ran, 1), higher_is_better=True)
    figure("slow fault trials, wall time on three workers", took)
    # pytest's status 5 is "no test collected": a selection that names nothing is no pass.
    return 0 if ok and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
