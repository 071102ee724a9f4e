"""Shared by the benchmarks: timing, result lines, and throwaway ledgers on both backends."""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import sys
import time
import uuid
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


def report(name: str, seconds: float, target: float | None = None, baseline: float | None = None) -> bool:
    """Print one figure; return whether it met its target."""
    parts = [f"{name:<58} {human(seconds):>10}"]
    if baseline:
        parts.append(f"{seconds / baseline:6.2f}x baseline ({human(baseline)})")
    ok = True
    if target is not None:
        ok = seconds <= target
        parts.append(f"target ≤ {human(target)}: {'ok' if ok else 'MISSED'}")
    print("  ".join(parts), flush=True)
    return ok


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
