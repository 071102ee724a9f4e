"""Ledger at scale: the seed query and `trackway runs --json` over 1,000,000 attempts, SQLite and PostgreSQL.

Each figure is shown three ways side by side: straight through the database driver on an open
connection (the baseline: what the database itself costs), in-process through trackway's
read-only query path (what trackway adds to a query), and as a user runs it, a whole
`trackway` process (what start-up adds on top). Targets (issues 2 and 12): a whole process under
1 s. The start-up figures against `python -c pass` are bench_cli.py's.

Issue 39: on PostgreSQL, `runs --json`, `show RUN` and `explain RUN` as whole processes within
1.5x the same command on the SQLite ledger of the same size, and the seed query (README's
GPU-hours by reason) through `trackway sql` within 2x `psql` running it. Both backends' commands
are timed in one interleaved round after round, so each ratio's two sides see the same load.
TRACKWAY_BENCH_ATTEMPTS sets the size (default 1,000,000; smaller to try a change quickly).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, fill_ledger, interleaved_medians, postgres_database, sqlite_database, trackway  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.sql.readonly import run_readonly_query  # noqa: E402

ATTEMPTS = int(os.environ.get("TRACKWAY_BENCH_ATTEMPTS", "1000000"))
REPEAT = 7
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


RUN = "r000000000000"  # fill_ledger's first run, the same on both backends (4 attempts)
COMMANDS = {"runs --json": ["runs", "--json"], "show RUN": ["show", RUN], "explain RUN": ["explain", RUN]}


def fill(backend: str, url: str) -> None:
    print(f"filling a {backend} ledger with {ATTEMPTS:,} attempts ...", flush=True)
    started = time.perf_counter()
    fill_ledger(url, ATTEMPTS)
    print(f"  filled in {time.perf_counter() - started:.0f} s", flush=True)


def timed(backend: str, url: str, conn) -> dict:
    """What is timed on one backend: the seed query three ways, and each read command as a whole process."""
    env = {"TRACKWAY_DB": url, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    direct = SQLITE_SEED_QUERY if backend == "sqlite" else SEED_QUERY.rstrip(";")
    fns = {
        f"{backend} driver": lambda: conn.execute(text(direct)).all(),
        f"{backend} in-process": lambda: run_readonly_query(url, SEED_QUERY),
        f"{backend} process": lambda: trackway(["sql", SEED_QUERY, "--json"], env),
    }
    for name, words in COMMANDS.items():
        fns[f"{backend} {name}"] = lambda words=words: trackway(words, env)
    return fns


def psql(url: str):
    """`psql` running the seed query on the ledger, its rows printed as they come: the floor for `trackway sql`."""
    parsed = make_url(url)
    argv = ["psql", "-X", "-q", "-A", "-h", parsed.host or "127.0.0.1", "-p", str(parsed.port or 5432),
            "-U", parsed.username or "postgres", "-d", parsed.database, "-c", SEED_QUERY]
    return lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)


def report(backend: str, times: dict) -> bool:
    figure(f"{backend}: seed query, driver on an open connection", times[f"{backend} driver"])
    figure(f"{backend}: seed query, trackway in-process", times[f"{backend} in-process"],
           baseline=times[f"{backend} driver"], baseline_name="driver")
    ok = figure(f"{backend}: trackway sql <seed query> --json, whole process", times[f"{backend} process"],
                baseline=times[f"{backend} driver"], baseline_name="driver", target=1.0)
    ok &= figure(f"{backend}: trackway runs --json, whole process", times[f"{backend} runs --json"], target=1.0)
    return ok


def main() -> int:
    ok = True
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as pg_url:
        urls = {"sqlite": sqlite_database(Path(tmp)), "postgresql": pg_url}
        for backend, url in urls.items():
            fill(backend, url)
        ledgers = {backend: open_ledger(url) for backend, url in urls.items()}
        conns = {backend: ledger.engine.connect() for backend, ledger in ledgers.items()}
        try:
            fns = {}
            for backend, url in urls.items():
                fns |= timed(backend, url, conns[backend])
            if shutil.which("psql"):
                fns["psql"] = psql(pg_url)
            times = interleaved_medians(fns, repeat=REPEAT)
        finally:
            for backend in urls:
                conns[backend].close()
                ledgers[backend].dispose()
    for backend in urls:
        ok &= report(backend, times)
    for name in COMMANDS:
        ok &= figure(f"postgresql: trackway {name}, whole process", times[f"postgresql {name}"],
                     baseline=times[f"sqlite {name}"], baseline_name="the same on SQLite", target_ratio=1.5)
    if "psql" in times:
        ok &= figure("postgresql: trackway sql <seed query> --json, whole process", times["postgresql process"],
                     baseline=times["psql"], baseline_name="psql -c <seed query>", target_ratio=2.0)
    else:
        print("psql not found: the seed query is not compared with it", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
