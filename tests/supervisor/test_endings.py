"""Endings read from the best witness (issue 30): the scheduler's final state, a refused launch, a full disk.

Real processes, a real single-node Slurm (scripts/ensure-slurm.sh), real full tmpfs disks. Each
case was misread before: a node failure or an operator's `scancel` recorded `preempted` from the
SDK's note on the SIGTERM that came with it, a refused retry launch recorded with no decision, a
full disk under the attempt's own files read as a vanished job and resumed into the same disk.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trackway.errors import ExecutorError
from trackway.executors.base import Executor, JobPhase
from trackway.executors.local import LocalExecutor
from trackway.ledger import open_ledger
from trackway.ledger.records import list_attempts, resolve_run
from trackway.settings import load_settings
from trackway.supervisor.classify import Evidence, classify
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.submit import RunSpec, submit_run
from trackway.supervisor.loop import Supervisor
from trackway.taxonomy import TerminationReason as R

# An SDK script: 40 steps of 0.1 s, a checkpoint every 5; exits preempted on a notice. With
# FILL_DISK set, the first attempt fills $FILL_DISK at step 3; with PREEMPT_SELF, it preempts itself there.
TRAINER = """
import os, signal, sys, time
import trackway
run = trackway.init(checkpoint_every_steps=5)
latest = run.checkpoints.latest()
start = int((latest.path / "step.txt").read_text()) + 1 if latest else 0
first = os.environ.get("TRACKWAY_ATTEMPT_NUMBER") == "1"
for step in range(start, int(os.environ.get("STEPS", "40"))):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    print("step", step, flush=True)
    time.sleep(float(os.environ.get("STEP_S", "0.1")))
    if step == 3 and first and os.environ.get("FILL_DISK"):
        try:
            with open(os.path.join(os.environ["FILL_DISK"], "filler.bin"), "wb") as f:
                while True:
                    f.write(b"\\0" * 65536)
                    f.flush()
        except OSError:
            pass
    if step == 3 and first and os.environ.get("PREEMPT_SELF"):
        os.kill(os.getpid(), signal.SIGTERM)
    if (run.checkpoints.due(step) and step > 0) or run.should_stop:
        with run.checkpoints.writing(step) as d:
            (d / "step.txt").write_text(str(step))
    if run.should_stop:
        run.exit_preempted()
run.finish()
"""


class Project:
    """A working directory with its trackway.toml, a ledger, and a supervisor ticked by the test."""

    def __init__(self, work: Path, db_url: str, toml: str, executor_for=None, home: Path | None = None):
        work.mkdir(parents=True, exist_ok=True)
        (work / "trackway.toml").write_text(toml)
        (work / "train.py").write_text(TRAINER)
        self.work = work
        self.settings = load_settings(home=home or work / "home", db=db_url, cwd=work)
        self.ledger = open_ledger(db_url)
        self.supervisor = Supervisor(self.ledger, self.settings, executor_for=executor_for)

    def submit(self, **env: str) -> str:
        spec = RunSpec(command=[sys.executable, "train.py"], cwd=self.work, env=env or None)
        run_id = submit_run(self.ledger, self.settings, spec)
        start_attempt(self.ledger, self.settings, run_id, self.supervisor.executor, first=True)
        return run_id

    def attempts(self, run_id: str) -> list:
        with self.ledger.read() as conn:
            return list_attempts(conn, run_id=run_id)

    def run(self, run_id: str):
        with self.ledger.read() as conn:
            return resolve_run(conn, run_id)

    def until(self, what: str, done, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.supervisor.tick()
            except ExecutorError:
                pass  # a refused launch is recorded on its attempt; the test reads it there
            value = done()
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
            time.sleep(0.2)

    def ended(self, run_id: str, timeout: float = 120.0):
        return self.until(f"run {run_id} to end", lambda: self.run(run_id)["state"] in ("completed", "failed",
                                                                                          "cancelled"), timeout)


def _evidence(attempt) -> dict:
    return json.loads(attempt["termination_evidence"])


def _decision(attempt) -> dict:
    return json.loads(attempt["retry_decision"])


# -- Slurm: the scheduler's final state outranks the SDK's note on the SIGTERM it sent ---------------

SLURM = ('[resources.cluster]\nexecutor = "slurm"\npartition = "test"\ngrace_seconds = 5\nsbatch = ["--mem=1G"]\n'
         "[retry.reasons.infra_transient]\nbackoff_seconds = 0.1\n")


def _node() -> str:
    return socket.gethostname().split(".")[0]


def _running(project: Project, run_id: str, number: int):
    def started():
        attempts = project.attempts(run_id)
        if len(attempts) < number or not attempts[number - 1]["executor_job_id"]:
            return None
        log = Path(attempts[number - 1]["log_path"])
        return attempts[number - 1] if log.exists() and "step 2" in log.read_text() else None

    return project.until(f"attempt {number} to be training", started)


def test_a_node_failure_on_slurm_is_infra_transient_not_the_preemption_the_sdk_noted(slurm_node, tmp_path, sqlite_url):
    project = Project(tmp_path / "work", sqlite_url, SLURM)
    run_id = project.submit(STEPS="30")
    job_id = _running(project, run_id, 1)["executor_job_id"]
    node = _node()
    try:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=trackway-test"],
                       check=True, capture_output=True, timeout=30)
        project.until("the node failure to end attempt 1", lambda: project.attempts(run_id)[0]["state"] == "ended")
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, timeout=30)
    first = project.attempts(run_id)[0]
    evidence = _evidence(first)
    assert first["termination_reason"] == "infra_transient", evidence
    assert evidence["rule"] == "executor:infra_transient"
    assert any(f"slurm job {job_id}: NODE_FAIL" in line for line in evidence["lines"]), evidence
    # The note the SDK wrote on Slurm's SIGTERM is kept, and said to be outranked.
    assert any("the SDK's note said preempted" in line for line in evidence["lines"]), evidence
    assert _decision(first)["action"] == "resume"
    project.ended(run_id, timeout=180)
    assert [a["termination_reason"] for a in project.attempts(run_id)] == ["infra_transient", "completed"]


def test_an_operators_scancel_is_user_cancelled_and_never_resumed(slurm_node, tmp_path, sqlite_url):
    project = Project(tmp_path / "work", sqlite_url, SLURM)
    run_id = project.submit(STEPS="200")
    job_id = _running(project, run_id, 1)["executor_job_id"]
    subprocess.run(["scancel", job_id], check=True, capture_output=True, timeout=30)
    project.ended(run_id)
    (attempt,) = project.attempts(run_id)
    evidence = _evidence(attempt)
    assert (attempt["termination_reason"], evidence["rule"]) == ("user_cancelled", "executor:user_cancelled")
    assert any(line.startswith("cancelled outside trackway") for line in evidence["lines"]), evidence
    assert _decision(attempt)["action"] == "none"
    assert project.run(run_id)["state"] == "cancelled"


# -- a refused launch is an attempt the policy decides ----------------------------------------------


class Refusing(Executor):
    """A local executor whose every new launch is refused, as by a cluster whose hosts stopped answering;
    it still answers for the jobs it started before."""

    name = "local"

    def __init__(self, home: Path):
        self.real = LocalExecutor(home)
        self.refusing = False
        self.refused = 0

    def submit(self, request):
        if not self.refusing:
            self.refusing = True  # the first attempt runs; every retry is refused
            return self.real.submit(request)
        self.refused += 1
        raise ExecutorError(f"attempt {request.attempt_id}: no host of resource here could take it: "
                            "10.0.0.7: ssh: connect to host 10.0.0.7 port 22: Connection timed out")

    def poll(self, handle):
        return self.real.poll(handle)

    def cancel(self, handle):
        self.real.cancel(handle)

    def logs(self, handle):
        return self.real.logs(handle)


def test_a_retry_whose_launch_is_refused_is_decided_by_the_policy_with_its_budget(tmp_path, sqlite_url):
    refusing = Refusing(tmp_path / "work" / "home")
    project = Project(tmp_path / "work", sqlite_url, "[retry.reasons.infra_transient]\nbackoff_seconds = 0.1\n"
                      "backoff_factor = 1\n", executor_for=lambda name: refusing)
    run_id = project.submit(PREEMPT_SELF="1", STEPS="8")
    project.ended(run_id)
    attempts = project.attempts(run_id)
    assert [a["termination_reason"] for a in attempts] == ["preempted"] + ["infra_transient"] * 4
    refused = attempts[1:]
    assert refusing.refused == 4
    for number, attempt in enumerate(refused, start=1):
        evidence = _evidence(attempt)
        assert evidence["rule"] == "executor:submit-refused"
        assert "Connection timed out" in evidence["lines"][0]
        assert attempt["gpu_seconds"] == 0.0
    decisions = [_decision(a) for a in refused]
    assert [d["action"] for d in decisions] == ["resume", "resume", "resume", "stop"]
    assert [d["rule"] for d in decisions[:3]] == [f"infra_transient: resume ({n} of 3)" for n in (1, 2, 3)]
    assert decisions[3]["rule"] == "infra_transient: budget 3 spent"
    assert all(d["delay_s"] > 0 for d in decisions[:3])  # the backoff held each retry back
    assert project.run(run_id)["state"] == "failed"


# -- a full disk under the attempt's own files ---------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MiB tmpfs holding trackway's home: the script fills it and the attempt's own files meet ENOSPC."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"a real full disk needs a tmpfs mount, and it failed: {done.stderr.strip() or done.returncode}")
    yield mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_script_that_completes_on_a_disk_it_filled_is_completed_with_the_full_disk_said(
        tmp_path, sqlite_url, small_disk, monkeypatch):
    # The spool's fallback directory is elsewhere (the test's own, not the machine's temp dir, which every later
    # supervisor there would list): no point is lost. No checkpoint is due after the disk filled (a save there
    # would fail, and rightly end the attempt as disk full).
    fallback = str(tmp_path / "fallback")
    monkeypatch.setenv("TRACKWAY_SPOOL_FALLBACK", fallback)  # the ingester's, in this process
    project = Project(tmp_path / "work", sqlite_url, "", home=small_disk / "home")
    run_id = project.submit(FILL_DISK=str(small_disk), STEPS="5", STEP_S="0.02", TRACKWAY_SPOOL_FALLBACK=fallback)
    project.ended(run_id)
    (attempt,) = project.attempts(run_id)
    evidence = _evidence(attempt)
    # Before: the shim could not write exit.json, the attempt read as vanished and was resumed into the full disk.
    assert attempt["termination_reason"] == "completed" and attempt["exit_code"] == 0, evidence
    assert evidence["executor"][0].startswith("exit.json written into the room reserved at the start (disk full: ")
    assert evidence["executor"][0].endswith(" bytes free)")
    assert attempt["last_step"] == 4


def test_a_retry_launch_into_a_full_disk_stops_naming_the_path(tmp_path, sqlite_url, small_disk):
    # The preemption's retry waits 1 s: the disk fills up in between (another job on the machine).
    project = Project(tmp_path / "work", sqlite_url, "[retry.reasons.preempted]\nbackoff_seconds = 1\n",
                      home=small_disk / "home")
    run_id = project.submit(PREEMPT_SELF="1", STEPS="12", STEP_S="0.02")
    project.until("attempt 1 to end", lambda: project.attempts(run_id)[0]["state"] == "ended")
    _fill(small_disk)
    project.ended(run_id)
    first, second = project.attempts(run_id)
    assert first["termination_reason"] == "preempted" and _decision(first)["action"] == "resume"
    evidence = _evidence(second)
    assert second["termination_reason"] == "infra_transient" and evidence["rule"] == "executor:submit-refused"
    assert evidence["disk_full"]["path"].startswith(str(small_disk / "home" / "runs" / run_id / "attempts" / "2"))
    assert evidence["disk_full"]["free_bytes"] == 0
    decision = _decision(second)
    # Before: an empty decision, and the run failed with nothing said about what to do.
    assert (decision["action"], decision["rule"]) == ("stop", "infra_transient: disk full")
    assert f"free space on the file system holding {small_disk}" in decision["message"]


def _fill(disk: Path) -> None:
    with open(disk / "filler.bin", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_job_that_left_no_exit_status_on_a_full_disk_is_disk_full_and_not_resumed(tmp_path, small_disk):
    from trackway.executors.base import LaunchRequest
    from trackway.executors.local_shim import read_json
    from trackway.supervisor.policy import AttemptOutcome, decide, load_policy

    executor = LocalExecutor(small_disk / "home", gpu_inventory=lambda: [])
    state_dir = small_disk / "home" / "attempt"
    request = LaunchRequest(attempt_id="r0000000000/1", command=[sys.executable, "-c", "import time; time.sleep(60)"],
                            cwd=tmp_path, env={}, state_dir=state_dir, log_path=state_dir / "output.log")
    handle = executor.submit(request).handle
    job = read_json(state_dir / "job.json")
    # The shim and its command killed outright (an OOM killer, a node agent): no exit status, ever.
    os.kill(job["shim_pid"], signal.SIGKILL)
    os.killpg(job["pgid"], signal.SIGKILL)
    _fill(small_disk)
    deadline = time.monotonic() + 30
    while (status := executor.poll(handle)).phase is not JobPhase.VANISHED:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert any(line.startswith(f"disk full: {state_dir}, ") for line in status.evidence), status.evidence
    verdict = classify(Evidence(vanished=True, executor_lines=status.evidence))
    assert (verdict.reason, verdict.rule) == (R.INFRA_TRANSIENT, "executor:vanished:disk-full")
    assert verdict.disk_full.path == str(state_dir)
    stop = decide(load_policy(None), [AttemptOutcome(R.INFRA_TRANSIENT, disk_full=verdict.disk_full)], run_ref="big")
    assert (stop.action, stop.rule) == ("stop", "infra_transient: disk full")


def test_output_the_full_disk_refused_is_counted_and_never_stalls_the_command(tmp_path, small_disk):
    from trackway.executors.base import LaunchRequest

    executor = LocalExecutor(small_disk / "home", gpu_inventory=lambda: [])
    state_dir = small_disk / "home" / "attempt"
    # Fill the disk, then print far more than a pipe holds (64 KiB): a log writer that gave up on the
    # first ENOSPC would leave the command blocked on a full pipe for good.
    code = (f"import sys\nf = open({str(small_disk / 'filler.bin')!r}, 'wb')\n"
            "try:\n    while True:\n        f.write(b'0' * 65536); f.flush()\nexcept OSError:\n    pass\n"
            "for i in range(3000):\n    print('line', i, 'x' * 80)\nprint('finished', flush=True)\n")
    request = LaunchRequest(attempt_id="r0000000000/1", command=[sys.executable, "-c", code], cwd=tmp_path, env={},
                            state_dir=state_dir, log_path=state_dir / "output.log")
    handle = executor.submit(request).handle
    deadline = time.monotonic() + 60
    while (status := executor.poll(handle)).phase is not JobPhase.ENDED:
        assert status.phase is JobPhase.RUNNING and time.monotonic() < deadline, status
        time.sleep(0.1)
    assert status.exit_code == 0
    lost = [line for line in status.evidence if line.startswith("output.log could not take ")]
    assert lost and f"disk full: {state_dir / 'output.log'}" in lost[0], status.evidence
