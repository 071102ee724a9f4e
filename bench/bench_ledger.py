"""Ledger at scale: the seed query and `trackway runs --json` over 1,000,000 attempts, SQLite and PostgreSQL.

Each figure is shown three ways side by side: straight through the database driver on an open
connection (the baseline: what the database itself costs), in-process through trackway's
read-only query path (what trackway adds to a query), and as a user runs it, a whole
`trackway` process (what start-up adds on top). Targets (issues 2 and 12): a whole process under
1 s. The start-up figures against `python -c pass` are bench_cli.py's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, fill_ledger, interleaved_medians, postgres_database, sqlite_database, trackway  # noqa: E402
from sqlalchemy import text  # noqa: E402

from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.sql.readonly import run_readonly_query  # noqa: E402

ATTEMPTS = int(os.environ.get("TRACKWAY_BENCH_ATTEMPTS", "1000000"))
REPEAT = 5
SEED_QUERY = (
    "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
    "from training_attempts where model_family = 'reasoning' and started_at >= now() - interval '7 days' "
    "group by termination_reason order by gpu_hours desc;"
)
SQLITE_SEED_QUERY = (
    "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
    "from training_attempts where model_family = 'reasoning' and started_at >= datetime('now', '-7 days') "
    "group by termination_reason order by gpu_hours desc"
)


def measure(backend: str, url: str) -> bool:
    print(f"filling a {backend} ledger with {ATTEMPTS:,} attempts ...", flush=True)
    started = time.perf_counter()
    fill_ledger(url, ATTEMPTS)
    print(f"  filled in {time.perf_counter() - started:.0f} s", flush=True)
    env = {"TRACKWAY_DB": url, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    ledger = open_ledger(url)
    direct = SQLITE_SEED_QUERY if backend == "sqlite" else SEED_QUERY.rstrip(";")
    conn = ledger.engine.connect()
    try:
        times = interleaved_medians({
            "driver": lambda: conn.execute(text(direct)).all(),
            "in-process": lambda: run_readonly_query(url, SEED_QUERY),
            "process": lambda: trackway(["sql", SEED_QUERY, "--json"], env),
            "runs": lambda: trackway(["runs", "--json"], env),
        }, repeat=REPEAT)
    finally:
        conn.close()
        ledger.dispose()
    figure(f"{backend}: seed query, driver on an open connection", times["driver"])
    figure(f"{backend}: seed query, trackway in-process", times["in-process"], baseline=times["driver"],
           baseline_name="driver")
    ok = figure(f"{backend}: trackway sql <seed query> --json, whole process", times["process"],
                baseline=times["driver"], baseline_name="driver", target=1.0)
    ok &= figure(f"{backend}: trackway runs --json, whole process", times["runs"], target=1.0)
    return ok


def main() -> int:
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ok &= measure("sqlite", sqlite_database(Path(tmp)))
    with postgres_database() as url:
        ok &= measure("postgresql", url)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
