"""Metrics back out: one key's 100k points through the read API and `trackway metrics --json/--csv`.

Targets (issue 12): in-process, `trackway.Api().history(run, key)` ≤ 2× raw `sqlite3` fetching the
same rows from the same ledger; the CLI ≤ 10× `python -c pass` + 2× the `sqlite3` command-line
tool printing the same points as JSON (each target is the sum of its named baselines). Every
figure is timed interleaved with its baselines, medians of fresh processes for the CLI.
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
from trackway.ledger.schema import metric_points, metric_series  # noqa: E402

POINTS = 100_000
REPEAT = 7


def build(path: Path) -> str:
    url = f"sqlite:///{path}"
    ledger = open_ledger(url)
    now = datetime.now(timezone.utc)
    at = time.time()
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rbench", name="bench", project="bench", kind="full", state="completed",
                              command="[]", workdir="/w", resource="local", executor="local", gpus=0, created_at=now))
        insert_attempt(conn, dict(run_id="rbench", attempt_number=1, state="ended", executor="local", state_dir="/s",
                                  log_path="/s/log", gpu_count=0, started_at=now, ended_at=now))
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "epoch"):
            series = conn.execute(metric_series.insert().values(run_id="rbench", key=key)).inserted_primary_key[0]
            conn.execute(metric_points.insert(), [
                dict(series_id=series, step=i, value=1.0 / (i + 1), attempt_number=1, logged_at=at + i * 1e-3)
                for i in range(POINTS)
            ])
    ledger.dispose()
    return url


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ledger.db"
        url = build(db)
        api = trackway.Api(db=url)
        query = ("SELECT step, value, attempt_number, logged_at FROM metric_points WHERE series_id = "
                 "(SELECT series_id FROM metric_series WHERE run_id = 'rbench' AND key = 'loss') ORDER BY step")

        def raw_fetch() -> None:
            conn = sqlite3.connect(db)
            rows = conn.execute(query).fetchall()
            conn.close()
            assert len(rows) == POINTS

        def api_history() -> None:
            assert len(api.history("rbench", "loss")) == POINTS

        inproc = interleaved_medians({"api": api_history, "raw": raw_fetch}, repeat=REPEAT)
        ok = figure(f"Api.history(run, key), {POINTS:,} points, in-process", inproc["api"], baseline=inproc["raw"],
                    baseline_name="raw sqlite3 fetchall", target_ratio=2.0)

        env = {**os.environ, "TRACKWAY_DB": url, "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
        devnull = subprocess.DEVNULL

        def run(argv: list[str]) -> callable:
            return lambda: subprocess.run(argv, env=env, stdout=devnull, check=True)

        cli = interleaved_medians({
            "json": run([sys.executable, "-m", "trackway", "metrics", "bench", "--key", "loss", "--json"]),
            "csv": run([sys.executable, "-m", "trackway", "metrics", "bench", "--key", "loss", "--csv"]),
            "pass": run([sys.executable, "-c", "pass"]),
            "sqlite3": run(["sqlite3", "-json", str(db), query]),
        }, repeat=REPEAT)
        target = 10 * cli["pass"] + 2 * cli["sqlite3"]
        ok &= figure(f"trackway metrics --key loss --json, {POINTS:,} points", cli["json"], baseline=cli["sqlite3"],
                     baseline_name="sqlite3 -json CLI", target=target)
        ok &= figure(f"trackway metrics --key loss --csv, {POINTS:,} points", cli["csv"], baseline=cli["sqlite3"],
                     baseline_name="sqlite3 -json CLI", target=target)
        print(f"  (CLI target = 10 × python -c pass ({cli['pass'] * 1e3:.1f} ms) + 2 × sqlite3 CLI "
              f"({cli['sqlite3'] * 1e3:.1f} ms) = {target * 1e3:.0f} ms)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
