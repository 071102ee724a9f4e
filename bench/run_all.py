"""Run every benchmark in bench/ and print one table: figure, value, baseline, ratio, target, met.

Exits non-zero, naming the figures, when any target is missed (or a benchmark fails outright).
The figures are also written to bench/results.json (a run of some benches, `run_all.py NAME...`,
replaces only their rows), from which `scripts/gen_performance.py` writes README.md's table.
"""

from __future__ import annotations

import compileall
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import _shown  # noqa: E402

import trackway  # noqa: E402

BENCHES = [
    "bench_cli.py",
    "bench_submit.py",
    "bench_data_manifest.py",
    "bench_ledger.py",
    "bench_metrics_read.py",
    "bench_sdk.py",
    "bench_capture.py",
    "bench_checkpoint_speed.py",
    "bench_checkpoint_kills.py",
    "bench_object_store.py",
    "bench_supervisor.py",
    "bench_supervisor_kills.py",
    "bench_receipts_10k.py",
    "bench_local_memory.py",
    "bench_slurm.py",
    "bench_host_loss.py",
    "bench_evals.py",
    "bench_api.py",
    "bench_server_auth.py",
    "bench_server_load.py",
    "bench_sql_limits.py",
    "bench_notify_delivery.py",
    "bench_watchers.py",
    "bench_trials.py",  # the slow fault trials `make test` leaves out: each must pass
    "bench_suite.py",  # `make test` itself: 8 minutes at a quiet hour, judged against import torch that hour
]


def save_results(path: Path, rows: list[dict], ran: list[str], failed: list[str], load: tuple[float, ...]) -> None:
    """bench/results.json: this run's rows, and the rows an earlier run left for the benches not run now."""
    kept: list[dict] = []
    earlier_failed: list[str] = []
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        kept = [row for row in earlier.get("rows", []) if row["bench"] not in ran]
        earlier_failed = [name for name in earlier.get("failed", []) if name not in ran]
    # A bench exits non-zero when it misses a target; only one that printed no missed figure failed outright.
    missed_in = {row["bench"] for row in rows if row["met"] is False}
    failed = [name for name in failed if name not in missed_in]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [{**row, "measured_at": now} for row in rows]
    order = {name: index for index, name in enumerate(BENCHES)}
    merged = sorted(kept + rows, key=lambda row: order.get(row["bench"], len(order)))  # stable within a bench
    results = {
        "measured_at": now,
        "machine": {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in load],
                    "python": platform.python_version()},
        "rows": merged,
        "failed": sorted(earlier_failed + failed),
    }
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    chosen = [name for name in BENCHES if not argv or any(word in name for word in argv)]
    failed: list[str] = []
    # Where PYTHONDONTWRITEBYTECODE is set, or after an edit, each fresh interpreter would compile the
    # modules it imports, and the start-up figures would time that compiling rather than trackway.
    for package in (Path(trackway.__file__).parent, here):
        compileall.compile_dir(package, quiet=1)
    load = os.getloadavg()
    ran: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        for name in chosen:
            if not (here / name).exists():
                continue
            print(f"== {name}", flush=True)
            ran.append(name)
            env = {**os.environ, "TRACKWAY_BENCH_RESULTS": str(results)}
            if subprocess.run([sys.executable, str(here / name)], env=env).returncode != 0:
                failed.append(name)
        rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    table = Table(title="trackway benchmarks", show_lines=False)
    for column in ("figure", "value", "baseline", "ratio", "target", "met"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    missed = []
    for row in rows:
        sign = "≥" if row["higher_is_better"] else "≤"
        targets = []
        if row["target"] is not None:
            targets.append(f"{sign} {_shown(row['target'], row['unit'])}")
        if row["target_ratio"] is not None:
            targets.append(f"{sign} {row['target_ratio']:g}x")
        met = {None: "", True: "yes", False: "MISSED"}[row["met"]]
        if row["met"] is False:
            missed.append(row["figure"])
        baseline = _shown(row["baseline"], row["unit"]) if row["baseline"] else ""
        if row["baseline_name"] and baseline:
            baseline = f"{baseline} ({row['baseline_name']})"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else ""
        table.add_row(row["figure"], _shown(row["value"], row["unit"]), baseline, ratio, " and ".join(targets), met)
    Console(width=200).print(table)
    save_results(here / "results.json", rows, ran, failed, load)
    subprocess.run([sys.executable, str(here.parent / "scripts" / "gen_performance.py")], check=False)
    for name in failed:
        print(f"failed: {name} (exit status non-zero)")
    for name in missed:
        print(f"missed: {name}")
    if not failed and not missed:
        print("all targets met")
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
