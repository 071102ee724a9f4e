"""What capturing the environment digest costs at submit time and in `trackway.init()`.

The description is read from every installed distribution once per environment and cached
(`trackway.receipts.environment`). Targets: ≤ 0.3 s for a capture in a fresh interpreter with
nothing cached (the first submit or script in a new environment pays it once); ≤ 50 ms for a
capture in a fresh interpreter once the environment is cached (what every later submit and script
pays); ≤ 50 ms for later captures in one process. For scale, the same run measures starting a
fresh interpreter that only imports trackway.receipts.environment (what a submit pays before
capture begins). Cold and cached captures alternate, trial by trial.
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

from _common import figure, median_seconds  # noqa: E402

from trackway.receipts.environment import capture_environment  # noqa: E402

TRIALS = 7
TIMED = (
    "import sys, time\n"
    "from trackway.receipts.environment import capture_environment\n"
    "start = time.perf_counter(); d = capture_environment({}); print(time.perf_counter() - start, d.cached)\n"
)
IMPORT_ONLY = "import trackway.receipts.environment\n"


def capture_in_fresh_interpreter(cache_dir: Path) -> tuple[float, bool]:
    """Seconds for one capture in a fresh interpreter, as that interpreter measures it, and whether it was cached."""
    env = {**os.environ, "TRACKWAY_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", TIMED], capture_output=True, text=True, check=True, env=env)
    seconds, cached = done.stdout.split()[-2:]
    return float(seconds), cached == "True"


def interpreter_with_import() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORT_ONLY], check=True)
    return time.perf_counter() - started


def main() -> int:
    baseline = statistics.median(interpreter_with_import() for _ in range(TRIALS))
    cold, cached = [], []
    with tempfile.TemporaryDirectory() as tmp:
        warm_dir = Path(tmp) / "warm"
        capture_in_fresh_interpreter(warm_dir)  # fills it (unless a package changed in the last seconds)
        for trial in range(TRIALS):
            seconds, hit = capture_in_fresh_interpreter(Path(tmp) / f"cold-{trial}")
            assert not hit
            cold.append(seconds)
            seconds, hit = capture_in_fresh_interpreter(warm_dir)
            if hit:
                cached.append(seconds)
        os.environ["TRACKWAY_CACHE_DIR"] = str(warm_dir)
        warm = median_seconds(lambda: capture_environment({}), repeat=TRIALS)
    figure("python start + import of the module (for scale)", baseline)
    ok = figure("capture_environment(), fresh interpreter, nothing cached", statistics.median(cold), target=0.3)
    if cached:
        ok &= figure("capture_environment(), fresh interpreter, environment cached", statistics.median(cached),
                     target=0.05)
    else:
        print("capture_environment(), fresh interpreter, environment cached: never cached (packages changing?)")
        ok = False
    ok &= figure("capture_environment(), later calls in one process", warm, target=0.05)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
