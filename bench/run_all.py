"""Run every benchmark in bench/ and say which targets were missed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = [
    "bench_submit.py",
    "bench_ledger.py",
    "bench_sdk.py",
    "bench_capture.py",
    "bench_checkpoint_speed.py",
    "bench_checkpoint_kills.py",
    "bench_supervisor.py",
    "bench_supervisor_kills.py",
    "bench_evals.py",
]


def main() -> int:
    here = Path(__file__).resolve().parent
    missed = []
    for name in BENCHES:
        print(f"== {name}", flush=True)
        if subprocess.run([sys.executable, str(here / name)]).returncode != 0:
            missed.append(name)
    print("all targets met" if not missed else f"targets missed in: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
