"""A script run alone: init() is quick and imports no ledger code; a process of its own writes the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
from sqlalchemy import func, select

from trackway.ledger import open_ledger
from trackway.ledger.reader import Reader
from trackway.ledger.records import latest_attempt, resolve_run
from trackway.ledger.registration import register_pending
from trackway.ledger.schema import metric_points, runs
from trackway.pending import write_pending
from trackway.spool import decode_metric_line, read_complete_lines

SCRIPTS = Path(__file__).parent / "scripts"


def _alone(env: dict[str, str], steps: int) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPTS / "alone_probe.py"), str(steps)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_script_alone_never_imports_the_ledger_and_reads_packages_once(home, ledger_url, tmp_path):
    env = {**os.environ, "TRACKWAY_DB": ledger_url, "TRACKWAY_CACHE_DIR": str(tmp_path / "cache")}
    first = _alone(env, 300)
    if not (tmp_path / "cache" / "environments").exists():
        first = _alone(env, 300)  # a package changed in the last seconds: that capture was not cached
    second = _alone(env, 200)
    assert not first["sqlalchemy"] and not second["sqlalchemy"]
    assert second["metadata_opened"] == 0  # the environment came from the cache
    ledger = open_ledger(ledger_url)
    try:
        with ledger.read() as conn:
            for probe, steps in ((first, 300), (second, 200)):
                run = resolve_run(conn, probe["run_id"])
                attempt = latest_attempt(conn, probe["run_id"])
                assert run["state"] == "completed" and attempt["termination_reason"] == "completed"
                assert len(Reader.over(conn).metric_points(probe["run_id"], key="loss")) == steps
            first_env, second_env = (latest_attempt(conn, p["run_id"])["environment_sha256"] for p in (first, second))
        assert first_env and first_env == second_env
    finally:
        ledger.dispose()


def test_the_pending_file_the_sdk_writes_is_the_one_the_ledger_registers(home, ledger):
    now = datetime.now(timezone.utc)
    run = dict(run_id="rpending", name="p", project="default", model_family=None, kind="full", state="running",
               command="[]", workdir="/w", resource="local", executor="inline", gpus=0, code_repo=None,
               code_branch=None, code_commit=None, created_at=now)
    attempt = dict(run_id="rpending", attempt_number=1, state="running", executor="inline", executor_job_id="1@0",
                   state_dir="/w/s", log_path="/w/s/output.log", host="h", gpu_count=0, code_commit=None,
                   started_at=now)
    path = write_pending(home, run, attempt, {"config": b'{"lr":0.1}', "environment": b"{}", "git_diff": None})
    assert path.stat().st_mode & 0o777 == 0o600
    assert register_pending(ledger, path) and not path.exists()
    with ledger.read() as conn:
        registered = conn.execute(select(runs).where(runs.c.run_id == "rpending")).mappings().one()
        assert registered["config_sha256"] and registered["created_at"] is not None
        assert latest_attempt(conn, "rpending")["environment_sha256"]


def test_a_script_alone_killed_mid_run_leaves_every_flushed_point_in_the_ledger(home, sqlite_url):
    env = {**os.environ, "TRACKWAY_DB": sqlite_url}
    script = subprocess.Popen([sys.executable, str(SCRIPTS / "log_forever.py")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ledger = open_ledger(sqlite_url)
    try:
        deadline = time.time() + 60
        while True:  # the ingester is at work while the script logs
            with ledger.read() as conn:
                if conn.execute(select(func.count()).select_from(metric_points)).scalar_one() > 10_000:
                    break
            assert script.poll() is None, script.stderr.read()
            assert time.time() < deadline, "nothing reached the ledger while the script ran"
            time.sleep(0.1)
        (ingester,) = psutil.Process(script.pid).children()
        script.send_signal(signal.SIGKILL)
        script.wait(timeout=30)
        gone, _ = psutil.wait_procs([ingester], timeout=60)
        assert gone, "the ingester outlived its script"

        with ledger.read() as conn:
            (run,) = conn.execute(select(runs)).mappings().all()
            attempt = latest_attempt(conn, run["run_id"])
            stored = conn.execute(select(func.count()).select_from(metric_points)).scalar_one()
        assert attempt["state"] == "running"  # the end is for the next trackway command to classify
        lines, _ = read_complete_lines(Path(attempt["state_dir"]) / "spool" / "metrics-r0.jsonl", 0)
        flushed = sum(len(decode_metric_line(line)[0]) * len(decode_metric_line(line)[1]) for line in lines)
        assert stored == flushed
    finally:
        if script.poll() is None:
            script.kill()
        ledger.dispose()
