"""A script's ingester over sqlite3 writes the rows registration, ingest and record_attempt_end write, or declines."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest

from trackway.ledger import open_ledger, rollups
from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.records import get_attempt, record_attempt_end
from trackway.ledger.registration import register_pending
from trackway.ledger.script_ingest import ROLLUP_WIDTHS, Declined, ScriptLedger
from trackway.pending import write_pending
from trackway.sdk.context import AttemptContext
from trackway.sdk.run import Run
from trackway.sdk.ingester import Ingester
from trackway.spool import EVENTS_FILE, append_lines
from trackway.taxonomy import TerminationReason

TABLES = ("runs", "attempts", "blobs", "metric_series", "metric_points", "attempt_events", "spool_cursors",
          "metric_rollups")


def _pending(home: Path, state_dir: Path, now: datetime | None = None) -> Path:
    now = now or datetime.now(timezone.utc)
    run = dict(run_id="rscript", name="s", project="default", model_family=None, kind="full", state="running",
               command='["python", "train.py"]', workdir="/w", resource="local", executor="inline", gpus=0,
               code_repo=None, code_branch=None, code_commit=None, created_at=now)
    attempt = dict(run_id="rscript", attempt_number=1, state="running", executor="inline", executor_job_id="1@0",
                   state_dir=str(state_dir), log_path=str(state_dir / "output.log"), host="h", gpu_count=0,
                   code_commit=None, started_at=now)
    blobs = {"config": b'{"lr": 0.1, "api_key": "sk-live-abcdefghijklmnop"}', "environment": b'{"python": "3"}',
             "git_diff": None}
    return write_pending(home, run, attempt, blobs)


def _spool(state_dir: Path) -> None:
    """What a script leaves: two ranks, a step logged twice, keys that change, events, a note, a heartbeat."""
    for rank in (0, 1):
        context = AttemptContext(run_id="rscript", attempt_id="rscript/1", attempt_number=1, rank=rank,
                                 world_size=2, spool_dir=state_dir / "spool", checkpoint_dir=state_dir / "ckpt")
        run = Run(context, {}, install_hooks=False)
        for step in range(3000):
            run.log({"loss": 1.0 / (step + 1), "lr": 0.1} if step % 700 else {"loss": 2.0, "acc": 0.5}, step=step)
        run.log({"loss": 9.0}, step=10)  # logged again: the last value wins
        if rank == 0:
            run.note(TerminationReason.COMPLETED, "run.finish() at step 2999 token=sk-live-abcdefghijklmnop")
        run.finish()


def _rows(path: Path) -> dict[str, list]:
    conn = sqlite3.connect(path)
    try:
        return {table: sorted(map(repr, conn.execute(f"SELECT * FROM {table}"))) for table in TABLES}
    finally:
        conn.close()


def test_a_scripts_ingester_writes_what_the_ledgers_own_modules_write(tmp_path):
    state_dir = tmp_path / "attempt"
    _spool(state_dir)
    ended_at = datetime.now(timezone.utc)
    evidence = json.dumps({"rule": "sdk:note", "lines": ["done token=sk-live-abcdefghijklmnop"], "exit_code": 0,
                           "signal": None})
    paths = {}
    for way in ("alchemy", "sqlite3"):
        home = tmp_path / way
        url = f"sqlite:///{home / 'ledger.db'}"
        open_ledger(url).dispose()
        pending = _pending(home, state_dir, ended_at)
        if way == "alchemy":
            ledger = open_ledger(url)
            register_pending(ledger, pending)
            with ledger.read() as conn:
                ingest_attempt(ledger, get_attempt(conn, "rscript/1"))
            with ledger.write() as conn:
                record_attempt_end(conn, get_attempt(conn, "rscript/1"), ended_at=ended_at,
                                   reason=TerminationReason.COMPLETED, evidence_json=evidence, exit_code=0, signal=None,
                                   cost_per_gpu_hour=2.5, secrets=("sk-live-abcdefghijklmnop",))
            ledger.dispose()
        else:
            script = ScriptLedger.open(url)
            assert script.register(pending)
            assert script.ingest("rscript/1", state_dir / "spool") == 2 * 3000 * 2 + 2
            assert script.record_end("rscript/1", TerminationReason.COMPLETED, evidence, 0, 2.5,
                                     ("sk-live-abcdefghijklmnop",), ended_at=ended_at)
            script.close()
        assert not pending.exists()
        paths[way] = home / "ledger.db"
    alchemy, lean = _rows(paths["alchemy"]), _rows(paths["sqlite3"])
    # Blobs are stored once, at the time each ledger took them.
    alchemy["blobs"] = [row.rsplit(",", 1)[0] for row in alchemy["blobs"]]
    lean["blobs"] = [row.rsplit(",", 1)[0] for row in lean["blobs"]]
    for table in TABLES:
        assert lean[table] == alchemy[table], table
    assert len(alchemy["metric_points"]) == 2 * (3000 + 2995 + 5)


def test_the_rollup_widths_are_the_ledgers():
    assert ROLLUP_WIDTHS == rollups.LEVELS


def test_an_event_it_does_not_handle_hands_the_rest_to_the_ledgers_modules_and_loses_no_point(tmp_path):
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'ledger.db'}"
    open_ledger(url).dispose()
    state_dir = tmp_path / "attempt"
    context = AttemptContext(run_id="rscript", attempt_id="rscript/1", attempt_number=1,
                             spool_dir=state_dir / "spool", checkpoint_dir=state_dir / "ckpt")
    run = Run(context, {}, install_hooks=False)
    for step in range(500):
        run.log({"loss": float(step)}, step=step)
    run._writer.flush()
    ingester = Ingester(url, 0.0, "rscript/1", _pending(home, state_dir), state_dir / "spool")
    assert ingester.sync() and ingester._script is not None  # through sqlite3
    # A resumed attempt's start: ingest.py records what it resumed from, which this module leaves to it.
    append_lines(state_dir / "spool" / EVENTS_FILE, [json.dumps({
        "seq": 99, "t": 1.7e9, "kind": "started", "rank": 0, "resume_from": "step-00000100"}).encode() + b"\n"])
    for step in range(500, 1000):
        run.log({"loss": float(step)}, step=step)
    run.finish()
    assert ingester.finish(0, record_end=True)
    assert ingester._declined
    ledger = open_ledger(url)
    try:
        with ledger.read() as conn:
            attempt = get_attempt(conn, "rscript/1")
        assert attempt["resumed_from_checkpoint"] == "step-00000100"
        assert (attempt["first_step"], attempt["last_step"]) == (0, 999)
    finally:
        ledger.dispose()
    conn = sqlite3.connect(home / "ledger.db")
    try:
        assert conn.execute("SELECT count(*) FROM metric_points").fetchone()[0] == 1000
    finally:
        conn.close()


def test_a_ledger_not_at_the_newest_migration_is_declined(tmp_path):
    path = tmp_path / "ledger.db"
    open_ledger(f"sqlite:///{path}").dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'older'")
    with pytest.raises(Declined):
        ScriptLedger.open(f"sqlite:///{path}")
    with pytest.raises(Declined):
        ScriptLedger.open(f"sqlite:///{tmp_path / 'absent.db'}")  # open_ledger creates and migrates it
    assert not (tmp_path / "absent.db").exists()
