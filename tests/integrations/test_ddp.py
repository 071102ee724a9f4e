"""HF Trainer, accelerate and the plain SDK under two ranks (gloo, CPU), driven by the supervisor as a user's
run is: SIGTERM mid-run to the attempt's process group (the launcher and every rank, as the local executor
sends it) → attempt 1 `preempted` → resumed from the checkpoint every rank wrote into → attempt 2 completes
with the final loss of an uninterrupted run; each checkpoint stored once; no hang (each scenario has its
own deadline and kills what it started)."""

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
from trackway.supervisor.loop import Supervisor, handle_of
from trackway.supervisor.submit import RunSpec, submit_run

from preempted_runs import drive_preempted

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "integrations"
BIN = Path(sys.executable).parent
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2"]
DEADLINE_S = 420


def _drive(home, sqlite_url, monkeypatch, command, notice_after: str):
    """Submit a reference run and one that gets a SIGTERM once its log shows `notice_after`; drive both to their end."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    driven = drive_preempted(sqlite_url, monkeypatch, command, notice_after, DEADLINE_S)
    reference, preempted = driven.runs
    attempts = driven.attempts[preempted]
    assert driven.states == {reference: "completed", preempted: "completed"}, {
        run: [(a["attempt_id"], a["termination_reason"], a["termination_evidence"]) for a in driven.attempts[run]]
        for run in driven.runs}
    assert [a["termination_reason"] for a in attempts] == ["preempted", "completed"]
    assert json.loads(attempts[0]["retry_decision"])["action"] == "resume"
    assert attempts[1]["resumed_from_checkpoint"]
    return driven.settings, driven.runs, driven.losses


def _committed(settings, run_id: str) -> list[Path]:
    root = settings.runs_dir / run_id / "checkpoints"
    return sorted(p for p in root.iterdir() if (p / "COMMITTED").exists())


@pytest.mark.slow  # HF Trainer's callback runs in the suite in test_hf_a_notice_after_training_ended_resumes_nothing
def test_hf_trainer_under_torchrun_two_ranks_preempted_resumes_same_loss(home, sqlite_url, monkeypatch, tmp_path):
    pytest.importorskip("transformers", reason="the `frameworks` extra is not installed")

    def command(i):
        return [*TORCHRUN, str(EXAMPLES / "hf_trainer.py"), "--output-dir", str(tmp_path / f"out{i}"),
                "--steps", "12", "--save-steps", "4", "--step-delay", "0.3"]

    settings, (reference, preempted), losses = _drive(home, sqlite_url, monkeypatch, command, "step 6\n")
    assert losses[preempted][-1]["step"] == losses[reference][-1]["step"] == 12
    # Bit-identical: seeded, the DistributedSampler's order depends on seed and epoch only, and every
    # rank's RNG comes back from its own rng_state_N.pth.
    assert losses[preempted][-1]["value"] == losses[reference][-1]["value"]
    committed = _committed(settings, preempted)
    steps = [int(p.name.split("-")[1]) for p in committed]
    assert 4 in steps and 12 in steps and any(4 < s < 12 for s in steps)  # the notice's own save among them
    for path in committed:  # both ranks' files in the one committed directory
        manifest = json.loads((path / "MANIFEST.json").read_text())
        assert {"model.safetensors", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= set(manifest["files"])
    # Stored once: nothing left in HF's output_dir.
    assert not list((tmp_path / "out1").glob("checkpoint-*"))


ACCELERATE_LAUNCHERS = {
    # Port 0: a free port of its own. accelerate's default (29500) is checked, then bound, so the two
    # runs started together can both find it free and one of them meet EADDRINUSE.
    "accelerate-launch-2": [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                            "--main_process_port", "0"],
    "python-1": [sys.executable],
    "torchrun-2": TORCHRUN,
}


@pytest.mark.parametrize("launcher", [
    # accelerate's own multi-process launch is a trial (`make trials`): torchrun's two ranks are in the suite
    # (test_plain_sdk_under_torchrun_…), and one process is accelerate's path through the SDK at the least cost.
    pytest.param("accelerate-launch-2", marks=pytest.mark.slow),
    "python-1",
    pytest.param("torchrun-2", marks=pytest.mark.slow),
])
def test_accelerate_preempted_mid_epoch_resumes_same_loss(home, sqlite_url, monkeypatch, launcher):
    pytest.importorskip("accelerate", reason="the `frameworks` extra is not installed")

    def command(i):
        # `--multi_gpu` is accelerate's multi-process launch (torchrun underneath); Accelerator(cpu=True)
        # makes it gloo on CPU. `--cpu` alone starts one process.
        return [*ACCELERATE_LAUNCHERS[launcher], str(EXAMPLES / "accelerate_loop.py"),
                "--steps", "20", "--checkpoint-every", "5", "--step-delay", "0.3"]

    # The notice after step 6: its save must land before step 10's scheduled one to be told from it, and the driver
    # sees the log line a tick late on a busy machine (after step 8 it once landed at step 10: four workers, loaded).
    settings, (reference, preempted), losses = _drive(home, sqlite_url, monkeypatch, command, "step 6 loss")
    assert losses[preempted][-1]["step"] == losses[reference][-1]["step"] == 20
    # Bit-identical: the seedable sampler's order depends on seed and epoch only, the resumed loop skips
    # the batches served, and every process's RNG comes back from its random_states_N.pkl.
    assert losses[preempted][-1]["value"] == losses[reference][-1]["value"]
    committed = _committed(settings, preempted)
    steps = [int(p.name.split("-")[1]) for p in committed]
    assert 5 in steps and 20 in steps and any(s % 5 for s in steps)  # the notice's own save among them
    processes = 1 if launcher == "python-1" else 2
    for path in committed:  # save_state wrote straight into step-N: every process's part, stored once
        files = set(json.loads((path / "MANIFEST.json").read_text())["files"])
        assert {"model.safetensors", "optimizer.bin"} <= files
        assert {f for f in files if f.startswith("random_states_")} == {f"random_states_{r}.pkl" for r in range(processes)}


def test_plain_sdk_under_torchrun_two_ranks_preempted_resumes_same_loss(home, sqlite_url, monkeypatch):
    def command(i):
        return [*TORCHRUN, str(EXAMPLES / "sdk_ddp.py"), "--steps", "16", "--checkpoint-every", "5",
                "--step-delay", "0.3"]

    settings, (reference, preempted), losses = _drive(home, sqlite_url, monkeypatch, command, "step 7 loss")
    assert losses[preempted][-1]["step"] == losses[reference][-1]["step"] == 16
    # Bit-identical: the data are a function of the step, and each rank's RNG, optimizer and model come back.
    assert losses[preempted][-1]["value"] == losses[reference][-1]["value"]
    committed = _committed(settings, preempted)
    steps = [int(p.name.split("-")[1]) for p in committed]
    assert 5 in steps and 15 in steps and any(s % 5 for s in steps)  # the notice's own save among them
    for path in committed:  # one shard per rank in the one directory
        assert {"state.pt", "rank-00001.pt"} <= set(json.loads((path / "MANIFEST.json").read_text())["files"])


def test_saving_on_rank_0_only_fails_in_seconds_naming_the_call_and_the_rank(home, sqlite_url, monkeypatch):
    """The most common DDP slip ends the attempt with a message, not a silent hang until the stall watcher."""
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    # TRACKWAY_* variables of the submitter are not handed to attempts: the command sets this one.
    spec = RunSpec(command=["env", "TRACKWAY_COLLECTIVE_TIMEOUT_S=3", *TORCHRUN, str(EXAMPLES / "sdk_ddp.py"), "--steps", "40", "--checkpoint-every", "5",
                            "--rank0-only-save"], cwd=Path.cwd())
    run_id = submit_run(ledger, settings, spec)
    start_attempt(ledger, settings, run_id, supervisor.executor("local"))
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            supervisor.tick()
            with ledger.read() as conn:
                attempts = list_attempts(conn, run_id=run_id)
            if attempts[0]["state"] != "running" and attempts[0]["state"] != "pending":
                break
            time.sleep(0.2)
        else:
            pytest.fail("the attempt did not end within 120 s")
    finally:
        with ledger.read() as conn:
            for attempt in list_attempts(conn, run_id=run_id):
                if attempt["state"] == "running":
                    supervisor.executor("local").cancel(handle_of(attempt))
    ledger.dispose()
    attempt = dict(attempts[0])
    # Not retried: the same script would slip the same way. Rank 0's word is the attempt's, not rank 1's
    # "connection closed by peer" that followed it.
    assert attempt["termination_reason"] == "code_error", attempt
    assert json.loads(attempt["retry_decision"])["action"] == "stop"
    said = json.dumps(json.loads(attempt["termination_evidence"]))
    assert "CollectiveCallError" in said and "save(5)" in said and "rank 1 of 2 did not join within 3 s" in said, said
    assert attempt["last_step"] == 5


def test_hf_a_notice_after_training_ended_resumes_nothing(home, sqlite_url, monkeypatch, tmp_path):
    """A pod deleted once its training is done: the SIGTERM comes after on_train_end, which finished the run."""
    pytest.importorskip("transformers", reason="the `frameworks` extra is not installed")
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    command = [sys.executable, str(EXAMPLES / "hf_trainer.py"), "--output-dir", str(tmp_path / "out"),
               "--steps", "6", "--save-steps", "3", "--linger", "4"]
    run_id = submit_run(ledger, settings, RunSpec(command=command, cwd=Path.cwd()))
    start_attempt(ledger, settings, run_id, supervisor.executor("local"))
    sent = False
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            supervisor.tick()
            with ledger.read() as conn:
                state = resolve_run(conn, run_id)["state"]
                attempts = list_attempts(conn, run_id=run_id)
            if state in ("completed", "failed"):
                break
            log = Path(attempts[-1]["log_path"])
            if not sent and log.exists() and "trained\n" in log.read_text():
                os.kill(int(attempts[-1]["executor_job_id"]), signal.SIGTERM)
                sent = True
            time.sleep(0.2)
        else:
            pytest.fail(f"not ended within 180 s: {state}")
    finally:
        with ledger.read() as conn:
            for attempt in list_attempts(conn, run_id=run_id):
                if attempt["state"] == "running":
                    supervisor.executor("local").cancel(handle_of(attempt))
        with ledger.read() as conn:
            attempts = list_attempts(conn, run_id=run_id)
            losses = Reader.over(conn).metric_points(run_id, key="loss")
        ledger.dispose()
    assert sent and state == "completed"
    assert [a["termination_reason"] for a in attempts] == ["completed"]  # no preempted, no second attempt
    assert losses[-1]["step"] == 6  # nothing trained past max_steps
