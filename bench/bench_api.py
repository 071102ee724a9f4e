"""The API where a dashboard feels it: a run's curve of 10M points per key, and the runs list at 100,000 runs.

Targets (issue 16), against a real `trackway serve` process on a SQLite ledger:
- GET /api/runs/RUN/metrics?keys=loss&max_points=2000 on 10M points: ≤ 100 ms, the median after a
  series' first chart (which computes and keeps its min/max blocks, printed apart: ledger/rollups.py);
  the baseline: reading the same points raw with sqlite3, what a chart without downsampling would need;
- GET /api/jobs?limit=100 with 100,000 runs in the ledger: ≤ 200 ms (the baseline: the same 100 rows
  read raw with sqlite3).
TRACKWAY_BENCH_API_POINTS scales the curve (default 10,000,000).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, interleaved_medians  # noqa: E402

from trackway.ledger import open_ledger  # noqa: E402

POINTS = int(os.environ.get("TRACKWAY_BENCH_API_POINTS", "10000000"))
RUNS = 100_000
REPEAT = 5
TOKEN = "bench-token-0123456789abcdef"


def build(path: Path) -> None:
    open_ledger(f"sqlite:///{path}").dispose()  # the schema, by the migrations
    conn = sqlite3.connect(path)
    now = "2026-11-26 00:00:00.000000"
    conn.executemany(  # a run a minute, as a busy team's ledger fills
        "INSERT INTO runs (run_id, name, project, kind, state, command, workdir, resource, executor, gpus, created_at) "
        "VALUES (?, ?, 'bench', 'full', 'completed', '[]', '/w', 'local', 'local', 0, "
        "strftime('%Y-%m-%d %H:%M:%f', '2026-01-01', ? || ' minutes'))",
        ((f"r{i:010x}", f"run-{i}", i) for i in range(RUNS)),
    )
    conn.execute("INSERT INTO attempts (attempt_id, run_id, attempt_number, state, executor, state_dir, log_path, "
                 "gpu_count, started_at, ended_at, first_step, last_step, termination_reason) VALUES "
                 "('r0000000000/1', 'r0000000000', 1, 'ended', 'local', '/s', '/s/log', 0, ?, ?, 0, ?, 'completed')",
                 (now, now, POINTS - 1))
    series = conn.execute("INSERT INTO metric_series (run_id, key) VALUES ('r0000000000', 'loss')").lastrowid
    at = time.time()
    conn.executemany(
        "INSERT INTO metric_points (series_id, step, value, attempt_number, logged_at) VALUES (?, ?, ?, 1, ?)",
        ((series, i, 1.0 / (i + 1), at + i * 1e-3) for i in range(POINTS)),
    )
    conn.commit()
    conn.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ledger.db"
        started = time.perf_counter()
        build(db)
        print(f"  (ledger: {POINTS:,} points, {RUNS:,} runs, built in {time.perf_counter() - started:.0f} s)")
        env = {**os.environ, "TRACKWAY_DB": f"sqlite:///{db}", "TRACKWAY_HOME": str(Path(tmp) / "home"),
               "TRACKWAY_BACKGROUND_SUPERVISOR": "0", "TRACKWAY_SERVER_TOKEN": TOKEN}
        server = subprocess.Popen([sys.executable, "-m", "trackway", "serve", "--port", "0"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            base = f"http://127.0.0.1:{int(server.stdout.readline())}"
            # The access log goes to stdout: drained, or a full pipe would block the server mid-request.
            threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()

            def get(path: str) -> bytes:
                request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {TOKEN}"})
                with urllib.request.urlopen(request, timeout=600) as response:
                    return response.read()

            def chart() -> None:
                assert b'"downsampled":true' in get("/api/runs/r0000000000/metrics?keys=loss&max_points=2000")

            def raw_points() -> None:
                conn = sqlite3.connect(db)
                rows = conn.execute("SELECT step, value FROM metric_points WHERE series_id = 1 ORDER BY step").fetchall()
                conn.close()
                assert len(rows) == POINTS

            def runs_list() -> None:
                assert get("/api/jobs?limit=100").count(b'"id"') == 100

            def raw_runs() -> None:
                conn = sqlite3.connect(db)
                rows = conn.execute("SELECT * FROM runs ORDER BY created_at DESC, run_id DESC LIMIT 100").fetchall()
                conn.close()
                assert len(rows) == 100

            cold = time.perf_counter()
            chart()  # the first chart of a series computes and keeps its min/max blocks (ledger/rollups.py)
            figure(f"GET metrics, {POINTS:,} points, first request (keeps its blocks)", time.perf_counter() - cold)
            timed = interleaved_medians({"chart": chart, "raw": raw_points}, repeat=REPEAT)
            ok = figure(f"GET metrics, {POINTS:,} points → 2,000", timed["chart"], baseline=timed["raw"],
                        baseline_name="raw sqlite3 read of every point", target=0.100)
            timed = interleaved_medians({"list": runs_list, "raw": raw_runs}, repeat=REPEAT)
            ok &= figure(f"GET /api/jobs?limit=100, {RUNS:,} runs", timed["list"], baseline=timed["raw"],
                         baseline_name="raw sqlite3, same 100 rows", target=0.200)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
