"""What capturing the environment digest costs at submit time (moved here from a unit test's timing bound).

Targets: ≤ 0.3 s for the first capture in a fresh interpreter (what every `trackway submit` pays),
and ≤ 0.3 s for a capture after the first in the same process. For scale, the same run measures
starting a fresh interpreter that only imports trackway.receipts.environment (what a submit pays
before capture begins).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median_seconds, report  # noqa: E402

from trackway.receipts.environment import capture_environment  # noqa: E402

TRIALS = 7
COLD = (
    "import sys, time\n"
    "from trackway.receipts.environment import capture_environment\n"
    "start = time.perf_counter(); capture_environment({}); print(time.perf_counter() - start)\n"
)
IMPORT_ONLY = "import trackway.receipts.environment\n"


def cold_capture() -> float:
    """Seconds for the first capture in a fresh interpreter, as that interpreter measures it."""
    done = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def interpreter_with_import() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORT_ONLY], check=True)
    return time.perf_counter() - started


def main() -> int:
    baseline = statistics.median(interpreter_with_import() for _ in range(TRIALS))
    cold = statistics.median(cold_capture() for _ in range(TRIALS))
    warm = median_seconds(lambda: capture_environment({}), repeat=TRIALS)
    report("python start + import of the module (for scale)", baseline)
    ok = report("capture_environment(), first call in a fresh interpreter", cold, target=0.3)
    ok &= report("capture_environment(), later calls in one process", warm, target=0.3)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
