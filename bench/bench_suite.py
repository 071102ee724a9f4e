"""The test suite's wall time: `make test`'s own pytest command, against 8 minutes on a quiet 2-core machine.

Every change waits for the suite, on a 2-core machine in CI, so its time is a figure like any other.
The command is read from the Makefile's `test` recipe, so this times what `make test` and CI run,
every real component included.

One machine's speed moves by half from one hour to the next, and the suite's time with it: the same
code took 6:53 and 10:49 on one machine the same day (docs/guide/performance.md, "The test suite").
So the target is a ratio to a floor measured in the same run: the CPU one fresh `import torch` takes
(the start-up most of the suite's processes pay), measured before and after the suite. Eight
minutes on a machine where that probe takes REFERENCE_PROBE_S (this machine's quiet hours) is
TARGET_S / REFERENCE_PROBE_S probe-seconds; the wall time itself is printed beside it, with the
machine's CPU over the run (busy, stolen by the hypervisor, idle, from /proc/stat).

    python bench/bench_suite.py [PYTEST_ARGS...]   # e.g. -k ledger, to try the bench itself
"""

from __future__ import annotations

import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, junit_outcomes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 8 * 60
# `import torch`'s CPU on this machine in its quiet hours, when the suite took 7:02-7:14 (1.47-1.61 s on
# 2026-11-30). In its slow hours the probe took 2.25-2.65 s and the suite 10:35-11:57: over six runs of both
# kinds the wall time stayed at 262-295 times the probe (docs/guide/performance.md, "The test suite").
REFERENCE_PROBE_S = 1.5
PYTEST = "-m pytest"


def suite_command(makefile: Path = ROOT / "Makefile") -> list[str]:
    """pytest's arguments in the Makefile's `test` recipe, after `$(PY) -m pytest`."""
    lines = makefile.read_text(encoding="utf-8").splitlines()
    recipe = lines[lines.index("test: $(STAMP) services") + 1:]
    for line in recipe:
        if not line.startswith("\t"):
            break
        if PYTEST in line:
            return shlex.split(line.split(PYTEST, 1)[1])
    raise SystemExit("bench_suite: no `$(PY) -m pytest` line in the Makefile's test recipe")


def machine_ticks() -> dict[str, int]:
    """The machine's CPU time so far, in clock ticks: busy, steal and idle (the first line of /proc/stat)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return {"busy": user + nice + system + irq + softirq, "steal": steal, "idle": idle + iowait}


def import_torch_cpu(repeat: int = 3) -> list[float]:
    """CPU seconds of fresh `python -c "import torch"`s, `repeat` of them: how fast this machine is this hour."""
    samples = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return samples


def run_suite(extra: list[str]) -> tuple[int, list[str], int, float, dict[str, float]]:
    """(tests run, the failed ones' ids, pytest's exit status, wall seconds, the machine's CPU seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "suite.xml"
        env = {**os.environ, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
        ticks_before, started = machine_ticks(), time.monotonic()
        done = subprocess.run([sys.executable, *shlex.split(PYTEST), *suite_command(), "-q",
                               f"--junitxml={report}", *extra], cwd=ROOT, env=env)
        took, ticks_after = time.monotonic() - started, machine_ticks()
        hertz = os.sysconf("SC_CLK_TCK")
        cpu = {key: (ticks_after[key] - ticks_before[key]) / hertz for key in ticks_after}
        if not report.exists():
            return 0, [], done.returncode, took, cpu
        ran, failed = junit_outcomes(report)
    return ran, failed, done.returncode, took, cpu


def main(argv: list[str]) -> int:
    before = import_torch_cpu()
    ran, failed, status, took, cpu = run_suite(argv)
    # Before and after: an hour's speed can turn while the suite runs.
    probe = statistics.median(before + import_torch_cpu())
    for name in failed:
        print(f"test failed: {name}")
    passed = figure("the suite's tests passed (make test)", ran - len(failed), unit="tests", target=max(ran, 1),
                    higher_is_better=True)
    fast = figure(f"the suite (make test), wall time on {os.cpu_count()} cores", took, baseline=probe,
                  baseline_name="python -c 'import torch', CPU, that hour",
                  target_ratio=round(TARGET_S / REFERENCE_PROBE_S))
    figure("    the machine's CPU busy during it (/proc/stat)", cpu["busy"])
    whole = max(cpu["busy"] + cpu["idle"] + cpu["steal"], 1e-9)
    figure("    the share of the machine's CPU left idle", 100 * cpu["idle"] / whole, unit="%")
    figure("    stolen by the hypervisor while it ran", cpu["steal"])
    # pytest's status 5 is "no test collected": a selection that names nothing is no pass.
    return 0 if passed and fast and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
