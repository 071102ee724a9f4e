"""Shared by the benchmarks: timing, result lines, and throwaway ledgers on both backends."""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

SRC = Path(__file__).resolve().parent.parent / "src"
# An installed package has its bytecode compiled; an editable checkout under PYTHONDONTWRITEBYTECODE
# would recompile trackway's modules on every start, which is not what a user's command costs.
compileall.compile_dir(SRC, quiet=1)

PG_ADMIN_URL = os.environ.get("TRACKWAY_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def median_seconds(fn: Callable[[], object], repeat: int = 9) -> float:
    """The median of `repeat` timed calls, after one untimed warm-up call."""
    fn()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def human(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _shown(value: float, unit: str) -> str:
    return human(value) if unit == "s" else f"{value:,.0f} {unit}"


def figure(
    name: str,
    value: float,
    *,
    unit: str = "s",
    baseline: float | None = None,
    baseline_name: str = "",
    target: float | None = None,
    target_ratio: float | None = None,
    higher_is_better: bool = False,
) -> bool:
    """Print one measured figure and return whether it met its target.

    A target is absolute (`target`, in `unit`) or a ratio against the baseline measured in the same
    run (`target_ratio`). Every figure is also appended as one JSON line to $TRACKWAY_BENCH_RESULTS
    when set, which is how `bench/run_all.py` builds its one table.
    """
    ratio = value / baseline if baseline else None
    met: bool | None = None
    if target is not None:
        met = value >= target if higher_is_better else value <= target
    if target_ratio is not None:
        if ratio is None:
            raise ValueError(f"{name}: a ratio target needs a baseline")
        met_ratio = ratio >= target_ratio if higher_is_better else ratio <= target_ratio
        met = met_ratio if met is None else met and met_ratio
    sign = "≥" if higher_is_better else "≤"
    parts = [f"{name:<58} {_shown(value, unit):>12}"]
    if baseline:
        parts.append(f"{ratio:6.2f}x {baseline_name or 'baseline'} ({_shown(baseline, unit)})")
    if target is not None:
        parts.append(f"target {sign} {_shown(target, unit)}")
    if target_ratio is not None:
        parts.append(f"target {sign} {target_ratio:g}x")
    if met is not None:
        parts.append("ok" if met else "MISSED")
    print("  ".join(parts), flush=True)
    results = os.environ.get("TRACKWAY_BENCH_RESULTS")
    if results:
        row = {
            "bench": Path(sys.argv[0]).name, "figure": name, "value": value, "unit": unit,
            "baseline": baseline, "baseline_name": baseline_name, "ratio": ratio, "target": target,
            "target_ratio": target_ratio, "higher_is_better": higher_is_better, "met": met,
        }
        with open(results, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
    return met is not False


def junit_outcomes(report: Path) -> tuple[int, list[str]]:
    """(tests run, the failed ones' ids) from pytest's --junitxml report; skipped tests are not counted as run."""
    ran, failed = 0, []
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = {child.tag for child in case}
        if "skipped" in outcome:
            continue
        ran += 1
        if outcome & {"failure", "error"}:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return ran, failed


def report(name: str, seconds: float, target: float | None = None, baseline: float | None = None) -> bool:
    """Print one timing with an absolute target (seconds); see `figure` for ratio targets."""
    return figure(name, seconds, target=target, baseline=baseline)


def interleaved_medians(fns: dict[str, Callable[[], object]], repeat: int = 9) -> dict[str, float]:
    """Median seconds of each callable, timed in turn round after round (after one warm-up round).

    A figure and its baseline measured in alternation see the same machine load, so their ratio
    means something on a shared 2-core box; timed one after the other they do not.
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeat + 1):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            if round_:
                samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def trackway(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "trackway", *args], env={**os.environ, **env}, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"trackway {' '.join(args)} failed: {result.stderr.strip()}")
    return result


@contextmanager
def postgres_database() -> Iterator[str]:
    """A throwaway PostgreSQL database, dropped afterwards."""
    name = f"trackway_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def sqlite_database(directory: Path) -> str:
    return f"sqlite:///{directory / 'ledger.db'}"


def fill_ledger(url: str, attempts_total: int, attempts_per_run: int = 4, seed: int = 0) -> None:
    """Add `attempts_total` ended attempts (a month of history over `attempts_total / attempts_per_run` runs).

    The rows are what real attempts leave (hosts, GPUs, times, reasons). On PostgreSQL the tables
    are then vacuumed and analyzed, as autovacuum keeps a ledger in steady use; SQLite is left
    without planner statistics, as trackway leaves it: ANALYZE keeps only an average per index,
    which tells SQLite's planner that the few running attempts are as many as the ended ones, and
    the supervisor's query for them then scans every attempt (seen at 1M attempts).
    """
    import random
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import insert

    from trackway.ledger import open_ledger
    from trackway.ledger.schema import attempts, runs

    reasons = ["completed", "preempted", "oom", "timeout", "code_error", "infra_transient", "user_cancelled"]
    families = ["reasoning", "vision", "speech"]
    rng = random.Random(seed)
    ledger = open_ledger(url)
    now = datetime.now(timezone.utc)
    batch_runs = 5000
    with ledger.write() as conn:
        for first in range(0, attempts_total // attempts_per_run, batch_runs):
            run_rows, attempt_rows = [], []
            for r in range(first, min(first + batch_runs, attempts_total // attempts_per_run)):
                run_id = f"r{seed:02d}{r:010d}"
                created = now - timedelta(hours=rng.uniform(0, 24 * 30))
                run_rows.append(dict(
                    run_id=run_id, name=None, project="bench", model_family=rng.choice(families), kind="full",
                    state="completed", command='["python", "train.py"]', workdir="/work", resource="local",
                    executor="local", gpus=8, created_at=created,
                ))
                for n in range(1, attempts_per_run + 1):
                    started = created + timedelta(minutes=30 * n)
                    wall = rng.uniform(60, 7200)
                    attempt_rows.append(dict(
                        attempt_id=f"{run_id}/{n}", run_id=run_id, attempt_number=n, state="ended", executor="local",
                        executor_job_id=str(rng.randint(1000, 99999)), state_dir="/x", log_path="/x/output.log",
                        host=f"node{rng.randint(1, 64):03d}", gpu_model="NVIDIA H100 80GB HBM3", gpu_count=8,
                        started_at=started, ended_at=started + timedelta(seconds=wall), gpu_seconds=wall * 8,
                        cost_usd=wall * 8 / 3600 * 2.5, exit_code=0, termination_reason=rng.choice(reasons),
                    ))
            conn.execute(insert(runs), run_rows)
            conn.execute(insert(attempts), attempt_rows)
    if ledger.dialect == "postgresql":
        with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
            conn.execute(text("CHECKPOINT"))
    ledger.dispose()


def first_logged_step(conn, run_id: str, attempt_number: int, key: str = "loss"):
    """The first point of `key` an attempt logged: (logged_at, step), by the SDK's own clock."""
    from sqlalchemy import select

    from trackway.ledger.schema import metric_points, metric_series

    return conn.execute(
        select(metric_points.c.logged_at, metric_points.c.step)
        .join(metric_series, metric_series.c.series_id == metric_points.c.series_id)
        .where(metric_series.c.run_id == run_id, metric_series.c.key == key,
               metric_points.c.attempt_number == attempt_number)
        .order_by(metric_points.c.logged_at).limit(1)).one()
