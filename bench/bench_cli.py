"""CLI start-up: what a command costs before it answers, on an empty ledger and at 1M attempts (SQLite).

Targets (issue 12): `trackway --help` ≤ 6× `python -c pass`; `runs --json`, `show RUN` and
`sql "select 1"` ≤ 10× `python -c pass` on a ledger with one run, and each less than 20% slower at
1,000,000 attempts. Every figure is a median of fresh processes, timed interleaved with its
baselines (`python -c pass`, and for the 1M figures the same command on the small ledger).

Issue 39: `explain RUN` ≤ 1.5× `show RUN` on the same ledger (it had read the ledger through
SQLAlchemy, 3.7× `show`). TRACKWAY_BENCH_ATTEMPTS sets the large ledger's size (default 1,000,000).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, fill_ledger, interleaved_medians  # noqa: E402

ATTEMPTS = int(os.environ.get("TRACKWAY_BENCH_ATTEMPTS", "1000000"))
REPEAT = 11
COMMANDS = {
    "runs --json": ["runs", "--json"],
    "show RUN": ["show", "bench-run"],
    'sql "select 1"': ["sql", "select 1"],
}


def one_run_ledger(home: Path) -> dict[str, str]:
    """A home whose ledger holds one finished run named bench-run (what `show` shows)."""
    home.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    env.pop("TRACKWAY_DB", None)
    subprocess.run([sys.executable, "-m", "trackway", "submit", "--name", "bench-run", "--", sys.executable, "-c",
                    "pass"], env=env, check=True, capture_output=True, cwd=home.parent)
    return env


def process(argv: list[str], env: dict[str, str]):
    return lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def main() -> int:
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        small = one_run_ledger(Path(tmp) / "small" / ".trackway")
        big = one_run_ledger(Path(tmp) / "big" / ".trackway")
        print(f"filling a SQLite ledger with {ATTEMPTS:,} attempts ...", flush=True)
        started = time.perf_counter()
        fill_ledger(f"sqlite:///{Path(big['TRACKWAY_HOME']) / 'ledger.db'}", ATTEMPTS)
        print(f"  filled in {time.perf_counter() - started:.0f} s", flush=True)
        trackway = [sys.executable, "-m", "trackway"]
        timed = {"pass": process([sys.executable, "-c", "pass"], small),
                 "--help": process([*trackway, "--help"], small)}
        for name, words in COMMANDS.items():
            timed[f"small {name}"] = process([*trackway, *words], small)
            timed[f"big {name}"] = process([*trackway, *words], big)
        timed["small explain RUN"] = process([*trackway, "explain", "bench-run"], small)
        medians = interleaved_medians(timed, repeat=REPEAT)
        floor = medians["pass"]
        ok &= figure("trackway --help", medians["--help"], baseline=floor, baseline_name="python -c pass",
                     target_ratio=6)
        for name in COMMANDS:
            ok &= figure(f"trackway {name}, ledger of 1 run", medians[f"small {name}"], baseline=floor,
                         baseline_name="python -c pass", target_ratio=10)
        for name in COMMANDS:
            ok &= figure(f"trackway {name}, {ATTEMPTS:,} attempts", medians[f"big {name}"],
                         baseline=medians[f"small {name}"], baseline_name="ledger of 1 run", target_ratio=1.2)
        ok &= figure("trackway explain RUN, ledger of 1 run", medians["small explain RUN"],
                     baseline=medians["small show RUN"], baseline_name="show RUN", target_ratio=1.5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
