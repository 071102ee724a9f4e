"""The real tiny model, preempted three times by outside SIGTERMs, completes with four attempts and the same final loss."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from trackway.ledger import open_ledger
from trackway.ledger.reader import Reader
from trackway.ledger.records import list_attempts, resolve_run
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SETS = ["train.steps=90", "train.log_every=5", "train.checkpoint_every=20", "model.hidden=32", "train.batch_size=16"]


def _submit(ledger, settings, corpus: Path) -> str:
    spec = RunSpec(
        # The delay keeps each stretch between notices long enough to aim a SIGTERM at on a busy machine.
        command=[sys.executable, str(EXAMPLES / "train_tiny.py"), "--data-file", str(corpus), "--step-delay", "0.1"],
        cwd=Path.cwd(), config_path=str(EXAMPLES / "tiny.toml"), overrides=SETS,
    )
    run_id = submit_run(ledger, settings, spec)
    start_attempt(ledger, settings, run_id, Supervisor(ledger, settings).executor("local"))
    return run_id


def _final_loss(ledger, run_id: str) -> float:
    with ledger.read() as conn:
        return Reader.over(conn).metric_points(run_id, key="loss")[-1]["value"]


@pytest.mark.slow
def test_three_preemptions_same_final_loss(home, sqlite_url, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    corpus = tmp_path / "corpus.txt"
    os.system(f"{sys.executable} {EXAMPLES / 'make_corpus.py'} {corpus} --lines 3000 > /dev/null")
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)

    reference = _submit(ledger, settings, corpus)
    preempted = _submit(ledger, settings, corpus)
    notices = {1: "step 25 ", 2: "step 50 ", 3: "step 75 "}  # SIGTERM once attempt N has logged this step
    sent: set[int] = set()
    deadline = time.time() + 400
    while time.time() < deadline:
        supervisor.tick()
        with ledger.read() as conn:
            states = {r: resolve_run(conn, r)["state"] for r in (reference, preempted)}
            attempts = list_attempts(conn, run_id=preempted)
        if all(s in ("completed", "failed") for s in states.values()):
            break
        latest = attempts[-1]
        number = latest["attempt_number"]
        log = Path(latest["log_path"])
        if number in notices and number not in sent and latest["state"] == "running" and log.exists():
            if notices[number] in log.read_text():
                os.kill(int(latest["executor_job_id"]), signal.SIGTERM)
                sent.add(number)
        time.sleep(0.2)
    assert states == {reference: "completed", preempted: "completed"}
    assert [a["termination_reason"] for a in attempts] == ["preempted", "preempted", "preempted", "completed"]
    assert all(json.loads(a["retry_decision"])["action"] == "resume" for a in attempts[:3])
    assert _final_loss(ledger, preempted) == _final_loss(ledger, reference)
    # The notice let each attempt save where it stopped: the redone work is the last moments only.
    for attempt in attempts[:3]:
        assert attempt["wasted_gpu_seconds"] <= 0.25 * attempt["gpu_seconds"] + 1.0
    ledger.dispose()
