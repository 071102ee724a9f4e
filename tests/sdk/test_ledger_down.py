"""The ledger locked or down while a script logs: training goes on, and every point arrives once it is back."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from trackway.executors.base import JobPhase
from trackway.ledger import open_ledger
from trackway.ledger.records import get_attempt, latest_attempt, resolve_run
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor, handle_of

from logged_points import logged_points  # noqa: E402  (tests/sdk is on sys.path under importlib mode via conftest)
from tcp_proxy import TcpProxy  # noqa: E402

SCRIPT = str(Path(__file__).parent / "scripts" / "sdk_script.py")
STEPS = 100_000


def _points(ledger) -> int:
    with ledger.read() as conn:
        return logged_points(conn)


def test_sqlite_locked_while_the_script_logs(home, sqlite_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, SCRIPT, "ok", str(STEPS)], cwd=Path.cwd()))
    attempt_id = start_attempt(ledger, settings, run_id, supervisor.executor("local"))
    with ledger.read() as conn:
        attempt = get_attempt(conn, attempt_id)

    lock = sqlite3.connect(make_url(sqlite_url).database, timeout=0, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # nobody else may read or write the ledger now
    executor = supervisor.executor("local")
    deadline = time.time() + 120
    while executor.poll(handle_of(attempt)).phase is JobPhase.RUNNING:
        assert time.time() < deadline, "the script did not finish while the ledger was locked"
        time.sleep(0.1)
    status = executor.poll(handle_of(attempt))
    assert status.exit_code == 0  # it logged 100k steps and finished without the ledger
    lock.execute("ROLLBACK")
    lock.close()

    supervisor.tick()
    with ledger.read() as conn:
        ended = get_attempt(conn, attempt_id)
    assert ended["termination_reason"] == "completed"
    assert _points(ledger) == STEPS * 5
    ledger.dispose()


def test_postgres_down_for_a_script_run_alone(home, pg_url):
    proxy = TcpProxy(("127.0.0.1", 5432))
    proxy.start()
    url = make_url(pg_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    open_ledger(url).dispose()  # migrated while the proxy is up
    proxy.stop()

    env = {**os.environ, "TRACKWAY_DB": url, "SDK_RUN_NAME": "offline", "TRACKWAY_LEDGER_PATIENCE_S": "1"}
    done = subprocess.run([sys.executable, SCRIPT, "ok", str(STEPS)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "could not reach the ledger" in done.stderr

    proxy.start()
    try:
        ledger = open_ledger(url)
        supervisor = Supervisor(ledger, load_settings())
        supervisor.tick()  # registers the pending run, ingests its spool, classifies its end
        with ledger.read() as conn:
            run = resolve_run(conn, "offline")
            attempt = latest_attempt(conn, run["run_id"])
        assert attempt["termination_reason"] == "completed" and run["state"] == "completed"
        assert _points(ledger) == STEPS * 5
        ledger.dispose()
    finally:
        proxy.stop()
