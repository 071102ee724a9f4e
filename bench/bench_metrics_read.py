"""Metrics back out: one key's points through the read API and `trackway metrics --json/--csv`, up to 10M points.

Targets: in-process, `trackway.Api().history(run, key)` of 100k points ≤ 2× raw `sqlite3` fetching
the same rows from the same ledger (issue 12); the CLI at 100k ≤ 10× `python -c pass` + 2× the
`sqlite3` command-line tool printing the same points as JSON (the sum of its named baselines, issue
12); `trackway metrics RUN --key loss --json` ≤ 1.5× `sqlite3 -json` of the same points at each size
in $TRACKWAY_BENCH_METRICS_POINTS (default 1000000,10000000; issue 39), `--csv` beside it. Every
figure is timed interleaved with its baselines, medians of fresh processes for the CLI; the peak
memory of the largest `--json` is printed (it streams: bounded whatever the size).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, interleaved_medians  # noqa: E402

import trackway  # noqa: E402
from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.records import insert_attempt, insert_run  # noqa: E402

POINTS = 100_000
REPEAT = 7
KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "epoch")
QUERY = ("SELECT step, value, attempt_number, logged_at FROM metric_points WHERE series_id = "
         "(SELECT series_id FROM metric_series WHERE run_id = 'rbench' AND key = 'loss') ORDER BY step")


def sizes() -> list[int]:
    text = os.environ.get("TRACKWAY_BENCH_METRICS_POINTS", "1000000,10000000")
    return [int(float(n)) for n in text.replace(" ", "").split(",") if n]


def build(path: Path, points: int) -> str:
    """A ledger whose run `bench` logged `points` points of each of five keys (filled by SQLite itself: fast at 10M)."""
    url = f"sqlite:///{path}"
    ledger = open_ledger(url)
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rbench", name="bench", project="bench", kind="full", state="completed",
                              command="[]", workdir="/w", resource="local", executor="local", gpus=0, created_at=now))
        insert_attempt(conn, dict(run_id="rbench", attempt_number=1, state="ended", executor="local", state_dir="/s",
                                  log_path="/s/log", gpu_count=0, started_at=now, ended_at=now))
    ledger.dispose()
    conn = sqlite3.connect(path)
    with conn:
        for key in KEYS:
            series = conn.execute("INSERT INTO metric_series (run_id, key, rank) VALUES ('rbench', ?, 0)",
                                  (key,)).lastrowid
            # Values and times with as many digits as real ones (1/(i+1), a clock in milliseconds).
            conn.execute(
                "INSERT INTO metric_points (series_id, step, value, attempt_number, logged_at)"
                " WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < ?)"
                " SELECT ?, i, 1.0 / (i + 1), 1, ? + i * 1e-3 FROM s", (points - 1, series, time.time()))
    conn.close()
    return url


def main() -> int:
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ledger.db"
        url = build(db, POINTS)
        api = trackway.Api(db=url)

        def raw_fetch() -> None:
            conn = sqlite3.connect(db)
            rows = conn.execute(QUERY).fetchall()
            conn.close()
            assert len(rows) == POINTS

        def api_history() -> None:
            assert len(api.history("rbench", "loss")) == POINTS

        inproc = interleaved_medians({"api": api_history, "raw": raw_fetch}, repeat=REPEAT)
        ok &= figure(f"Api.history(run, key), {POINTS:,} points, in-process", inproc["api"], baseline=inproc["raw"],
                     baseline_name="raw sqlite3 fetchall", target_ratio=2.0)
        cli = time_cli(db, url, POINTS, REPEAT, with_pass=True)
        target = 10 * cli["pass"] + 2 * cli["sqlite3"]
        ok &= figure(f"trackway metrics --key loss --json, {POINTS:,} points", cli["json"], baseline=cli["sqlite3"],
                     baseline_name="sqlite3 -json CLI", target=target)
        ok &= figure(f"trackway metrics --key loss --csv, {POINTS:,} points", cli["csv"], baseline=cli["sqlite3"],
                     baseline_name="sqlite3 -json CLI", target=target)
        print(f"  (CLI target = 10 × python -c pass ({cli['pass'] * 1e3:.1f} ms) + 2 × sqlite3 CLI "
              f"({cli['sqlite3'] * 1e3:.1f} ms) = {target * 1e3:.0f} ms)", flush=True)
        db.unlink()

    for points in sizes():
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "ledger.db"
            started = time.perf_counter()
            url = build(db, points)
            print(f"  ({points:,} points of each of {len(KEYS)} keys filled in {time.perf_counter() - started:.1f} s)",
                  flush=True)
            cli = time_cli(db, url, points, REPEAT if points <= 2_000_000 else 3)
            ok &= figure(f"trackway metrics --key loss --json, {points:,} points", cli["json"],
                         baseline=cli["sqlite3"], baseline_name="sqlite3 -json CLI", target_ratio=1.5)
            ok &= figure(f"trackway metrics --key loss --csv, {points:,} points", cli["csv"],
                         baseline=cli["sqlite3"], baseline_name="sqlite3 -json CLI", target_ratio=1.5)
            print(f"  (peak memory of trackway metrics --json at {points:,} points: "
                  f"{peak_rss_mb(url):.0f} MB)", flush=True)
    return 0 if ok else 1


def time_cli(db: Path, url: str, points: int, repeat: int, with_pass: bool = False) -> dict[str, float]:
    env = {**os.environ, "TRACKWAY_DB": url, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    devnull = subprocess.DEVNULL

    def run(argv: list[str]) -> callable:
        return lambda: subprocess.run(argv, env=env, stdout=devnull, check=True)

    lines = subprocess.run([sys.executable, "-m", "trackway", "metrics", "bench", "--key", "loss", "--json"],
                           env=env, capture_output=True, check=True).stdout.count(b"\n")
    assert lines == points + 2, f"--json printed {lines} lines for {points} points"
    fns = {
        "json": run([sys.executable, "-m", "trackway", "metrics", "bench", "--key", "loss", "--json"]),
        "csv": run([sys.executable, "-m", "trackway", "metrics", "bench", "--key", "loss", "--csv"]),
        "sqlite3": run(["sqlite3", "-json", str(db), QUERY]),
    }
    if with_pass:
        fns["pass"] = run([sys.executable, "-c", "pass"])
    return interleaved_medians(fns, repeat=repeat)


# The child's own high-water mark, read from /proc as it exits: wait4's ru_maxrss also counts the
# image it was forked from (this bench, which held a 1M-line --json output), so it said 281 MB.
PEAK = ("import atexit, runpy, sys\n"
        "def peak():\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "    sys.stderr.write('PEAK ' + line.split()[1] + '\\n')\n"
        "atexit.register(peak)\n"
        "sys.argv = ['trackway'] + sys.argv[1:]\n"
        "runpy.run_module('trackway', run_name='__main__')\n")


def peak_rss_mb(url: str) -> float:
    """The largest resident set of one `--json` run, in MB (its own VmHWM)."""
    env = {**os.environ, "TRACKWAY_DB": url, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    done = subprocess.run([sys.executable, "-c", PEAK, "metrics", "bench", "--key", "loss", "--json"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    return int(done.stderr.rsplit("PEAK ", 1)[1].split()[0]) / 1024


if __name__ == "__main__":
    sys.exit(main())
