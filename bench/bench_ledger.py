"""Ledger at scale: `trackway runs --json` and the seed query over 100,000 synthetic attempts, SQLite and PostgreSQL.

Targets (issue 2): each under 1 s, end to end as a user runs them (process start included).
Baseline, measured in the same run: the same seed query sent straight through the database
driver from an open connection, i.e. what trackway's CLI adds on top of the database.
"""

from __future__ import annotations

import random
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median_seconds, postgres_database, report, sqlite_database, trackway  # noqa: E402
from sqlalchemy import insert, text  # noqa: E402

from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.schema import attempts, runs  # noqa: E402

ATTEMPTS = 100_000
ATTEMPTS_PER_RUN = 4
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
REASONS = ["completed", "preempted", "oom", "timeout", "code_error", "infra_transient", "user_cancelled"]
FAMILIES = ["reasoning", "vision", "speech"]


def fill(url: str) -> None:
    rng = random.Random(0)
    ledger = open_ledger(url)
    now = datetime.now(timezone.utc)
    run_rows, attempt_rows = [], []
    for r in range(ATTEMPTS // ATTEMPTS_PER_RUN):
        run_id = f"r{r:010d}"
        created = now - timedelta(hours=rng.uniform(0, 24 * 30))
        run_rows.append(dict(
            run_id=run_id, name=None, project="bench", model_family=rng.choice(FAMILIES), kind="full",
            state="completed", command='["python", "train.py"]', workdir="/work", resource="local",
            executor="local", gpus=8, created_at=created,
        ))
        for n in range(1, ATTEMPTS_PER_RUN + 1):
            started = created + timedelta(minutes=30 * n)
            wall = rng.uniform(60, 7200)
            attempt_rows.append(dict(
                attempt_id=f"{run_id}/{n}", run_id=run_id, attempt_number=n, state="ended", executor="local",
                executor_job_id=str(rng.randint(1000, 99999)), state_dir="/x", log_path="/x/output.log",
                host=f"node{rng.randint(1, 64):03d}", gpu_model="NVIDIA H100 80GB HBM3", gpu_count=8,
                started_at=started, ended_at=started + timedelta(seconds=wall), gpu_seconds=wall * 8,
                cost_usd=wall * 8 / 3600 * 2.5, exit_code=0, termination_reason=rng.choice(REASONS),
            ))
    with ledger.write() as conn:
        for i in range(0, len(run_rows), 5000):
            conn.execute(insert(runs), run_rows[i : i + 5000])
        for i in range(0, len(attempt_rows), 5000):
            conn.execute(insert(attempts), attempt_rows[i : i + 5000])
    # Settle the tables as a ledger in steady use is: otherwise PostgreSQL's autovacuum of the
    # fresh 100k rows runs during the measurement.
    with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE" if ledger.dialect == "postgresql" else "ANALYZE"))
        if ledger.dialect == "postgresql":
            conn.execute(text("CHECKPOINT"))
    ledger.dispose()


def measure(backend: str, url: str) -> bool:
    print(f"filling a {backend} ledger with {ATTEMPTS:,} attempts ...", flush=True)
    fill(url)
    env = {"TRACKWAY_DB": url}
    ledger = open_ledger(url)
    direct = SQLITE_SEED_QUERY if backend == "sqlite" else SEED_QUERY.rstrip(";")
    with ledger.engine.connect() as conn:
        baseline = median_seconds(lambda: conn.execute(text(direct)).all())
    ledger.dispose()
    ok = report(f"{backend}: trackway runs --json", median_seconds(lambda: trackway(["runs", "--json"], env)), 1.0)
    ok &= report(
        f"{backend}: trackway sql <seed query>",
        median_seconds(lambda: trackway(["sql", SEED_QUERY, "--json"], env)),
        1.0,
        baseline,
    )
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
