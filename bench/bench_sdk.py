"""The SDK's costs in the training loop and the ledger's ingestion rate.

Targets (issue 3): one `run.log({5 scalars}, step=i)` call ≤ 5 µs (median over batches of calls);
end-to-end ingestion of a spool into SQLite ≥ 500k points/s. Baselines, measured in the same
run: appending the same tuple to a plain list (the least a logging call can do), and raw
`sqlite3.executemany` of the same points into a table of the same shape (the least an ingest can do).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report  # noqa: E402

from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.ingest import ingest_attempt  # noqa: E402
from trackway.ledger.records import get_attempt, insert_attempt, insert_run  # noqa: E402
from trackway.sdk.run import AttemptContext, Run  # noqa: E402

BATCH = 1000
BATCHES = 200
INGEST_STEPS = 200_000


def _metrics(i: int) -> dict:
    return {"loss": 1.0 / (i + 1), "lr": 3e-4, "grad_norm": 0.5, "tokens_per_s": 12345.0, "epoch": 1.0}


def time_log_calls(run: Run) -> float:
    """Median seconds per call over batches; metric dicts are built outside the timed region."""
    per_call = []
    step = 0
    for _ in range(BATCHES):
        payloads = [_metrics(step + j) for j in range(BATCH)]
        started = time.perf_counter()
        for payload in payloads:
            run.log(payload, step=step)
            step += 1
        per_call.append((time.perf_counter() - started) / BATCH)
    return statistics.median(per_call)


def time_list_append() -> float:
    sink: list = []
    per_call = []
    for b in range(BATCHES):
        payloads = [_metrics(b * BATCH + j) for j in range(BATCH)]
        started = time.perf_counter()
        for j, payload in enumerate(payloads):
            sink.append((j, time.time(), dict(payload)))
        per_call.append((time.perf_counter() - started) / BATCH)
    return statistics.median(per_call)


def measure_ingest(tmp: Path) -> tuple[float, float, int]:
    url = f"sqlite:///{tmp / 'ledger.db'}"
    ledger = open_ledger(url)
    state_dir = tmp / "attempt"
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rbench", project="bench", kind="full", state="running", command="[]",
                              workdir=str(tmp), resource="local", executor="local", gpus=0, created_at=now))
        insert_attempt(conn, dict(run_id="rbench", attempt_number=1, state="running", executor="local",
                                  state_dir=str(state_dir), log_path=str(state_dir / "output.log"), gpu_count=0))
    context = AttemptContext(run_id="rbench", attempt_id="rbench/1", attempt_number=1,
                             spool_dir=state_dir / "spool", checkpoint_dir=tmp / "ckpt")
    run = Run(context, {}, install_hooks=False)
    for i in range(INGEST_STEPS):
        run.log(_metrics(i), step=i)
    run.finish()
    with ledger.read() as conn:
        attempt = get_attempt(conn, "rbench/1")
    started = time.perf_counter()
    points = ingest_attempt(ledger, attempt).points
    ours = time.perf_counter() - started
    ledger.dispose()

    raw = sqlite3.connect(tmp / "raw.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=NORMAL")
    raw.execute("CREATE TABLE p (series_id INTEGER, step INTEGER, value REAL, attempt_number INTEGER, "
                "logged_at REAL, PRIMARY KEY (series_id, step)) WITHOUT ROWID")
    at = time.time()
    rows = [(s, i, 1.0 / (i + 1), 1, at) for s in range(1, 6) for i in range(INGEST_STEPS)]
    started = time.perf_counter()
    raw.execute("BEGIN")
    raw.executemany("INSERT INTO p VALUES (?, ?, ?, ?, ?)", rows)
    raw.execute("COMMIT")
    baseline = time.perf_counter() - started
    raw.close()
    return ours, baseline, points


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        context = AttemptContext(run_id="rlog", attempt_id="rlog/1", attempt_number=1,
                                 spool_dir=tmp_path / "spool", checkpoint_dir=tmp_path / "ckpt")
        run = Run(context, {}, install_hooks=False)
        ours = time_log_calls(run)
        run.finish()
        baseline = time_list_append()
        ok = report("run.log({5 scalars}, step=i), median per call", ours, target=5e-6, baseline=baseline)
        ingest_s, raw_s, points = measure_ingest(tmp_path)
    rate = points / ingest_s
    print(f"{'ingest spool → SQLite':<58} {points:,} points in {ingest_s:.2f} s = {rate:,.0f} points/s  "
          f"(raw executemany baseline {points / raw_s:,.0f} points/s, {ingest_s / raw_s:.2f}x)  "
          f"target ≥ 500,000 points/s: {'ok' if rate >= 500_000 else 'MISSED'}")
    return 0 if ok and rate >= 500_000 else 1


if __name__ == "__main__":
    os.environ.setdefault("TRACKWAY_HEARTBEAT_S", "5")
    sys.exit(main())
